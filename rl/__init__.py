"""RL on top of the aligned learner and rollout, imported as `fp4_compile.rl`."""
