"""The RL application, imported as `fp4_compile.rl`: GRPO trainer, loss, tasks, presets, diagnostics.
May import anything of fp4_compile (core, rollout runtime, checkpoints); nothing below imports it
(the `minite` CLI excepted). RolloutEngine, VLLMRolloutEngine (needs vLLM when constructed) and
the log-prob functions are re-exported for RL code.
"""

from ..rollout import RolloutEngine, RolloutOutput, sequence_logprobs, token_logprobs
from ..vllm_plugin.engine import VLLMRolloutEngine

__all__ = [
    "RolloutEngine",
    "RolloutOutput",
    "VLLMRolloutEngine",
    "sequence_logprobs",
    "token_logprobs",
]
