"""RL on top of the aligned learner and rollout, imported as `fp4_compile.rl`."""

from .engine import RolloutEngine, RolloutOutput
from .logprobs import sequence_logprobs, token_logprobs

__all__ = ["RolloutEngine", "RolloutOutput", "sequence_logprobs", "token_logprobs"]
