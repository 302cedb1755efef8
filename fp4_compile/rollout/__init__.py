"""The rollout runtime: the generation side of the one lowering, imported as `fp4_compile.rollout`.

Export and load of rollout artifacts, the rollout step, static KV cache, seeded sampling, the
decode program (one CUDA graph per batch bucket), the weight store of quantized weights, sequence
log-probs and the embedded `RolloutEngine`. Imports the core (recipe, backend,
passes, codegen), never `fp4_compile.rl`; engine bridges (vLLM) sit beside it and import it.
"""

from .engine import RolloutEngine, RolloutOutput
from .export import RolloutArtifact, RolloutArtifactError, export_rollout, load_rollout
from .logprobs import sequence_logprobs, token_logprobs

__all__ = [
    "RolloutArtifact",
    "RolloutArtifactError",
    "RolloutEngine",
    "RolloutOutput",
    "export_rollout",
    "load_rollout",
    "sequence_logprobs",
    "token_logprobs",
]
