"""The rollout runtime: the generation side of the one lowering, imported as `fp4_compile.rollout`.

Export and load of rollout artifacts, the rollout step, static KV cache, seeded sampling, the
decode program (one CUDA graph per batch bucket), the weight store of quantized weights, sequence
log-probs and the embedded `RolloutEngine`; the engines' shared interface and output
(`RolloutEngineProtocol`, `RolloutOutput`, from the core's `fp4_compile/engine_api.py`). Imports the core (recipe, backend,
passes, codegen), never `fp4_compile.rl`; engine bridges (vLLM) sit beside it and import it.
"""

from ..engine_api import RolloutEngineProtocol, RolloutOutput
from .engine import RolloutEngine
from .export import RolloutArtifact, RolloutArtifactError, export_rollout, load_rollout
from .logprobs import sequence_logprobs, token_logprobs

__all__ = [
    "RolloutArtifact",
    "RolloutArtifactError",
    "RolloutEngine",
    "RolloutEngineProtocol",
    "RolloutOutput",
    "export_rollout",
    "load_rollout",
    "sequence_logprobs",
    "token_logprobs",
]
