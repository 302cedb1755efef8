"""minite inside the trainers RL users already run. Each integration imports its trainer library
lazily (an optional extra: `minite[trl]`); importing this package imports none of them.

- `fp4_compile.integrations.trl`: TRL's GRPOTrainer with minite's learner and rollout engine
  (docs/trl.md).
"""
