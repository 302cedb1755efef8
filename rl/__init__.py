"""The RL application, imported as `fp4_compile.rl`: GRPO trainer, loss, tasks, presets, diagnostics.

It sits on top of the rollout runtime (`fp4_compile.rollout`) and the core; nothing below imports it.
The engine and log-prob names are re-exported here because RL code reaches for them here.
"""

from ..rollout import RolloutEngine, RolloutOutput, sequence_logprobs, token_logprobs

__all__ = ["RolloutEngine", "RolloutOutput", "sequence_logprobs", "token_logprobs"]
