"""minite: native NVFP4 RL of LLMs, one lowering for the learner and the rollout. Import package `fp4_compile`.

The public API: `compile` / `explain` (the `minite` torch.compile backend), `export_rollout` /
`load_rollout` (the rollout side, `fp4_compile.rollout`), `export_checkpoint` /
`load_nvfp4_checkpoint` (NVFP4 checkpoints engines load, `fp4_compile.checkpoints`), `NVFP4Recipe` (all numerics), and the
NVFP4 format with its reference numerics (`quantize`, `dequantize`, `nvfp4_mm`,
`nvfp4_grouped_mm`). Importing it loads no Triton (codegen imports Triton lazily) and no `rl`.
"""

from .checkpoints import export_checkpoint, load_nvfp4_checkpoint
from .compile_api import compile, explain
from .format import NVFP4Tensor
from .recipe import NVFP4Recipe, QuantSpec
from .reference import dequantize, nvfp4_grouped_mm, nvfp4_mm, quantize, quantize_experts
from .rollout import RolloutArtifact, RolloutArtifactError, export_rollout, load_rollout
from .swizzle import from_swizzled, to_swizzled
from .version import __version__ as __version__

__all__ = [
    "NVFP4Recipe",
    "NVFP4Tensor",
    "QuantSpec",
    "compile",
    "dequantize",
    "explain",
    "export_checkpoint",
    "export_rollout",
    "load_nvfp4_checkpoint",
    "load_rollout",
    "RolloutArtifact",
    "RolloutArtifactError",
    "from_swizzled",
    "nvfp4_grouped_mm",
    "nvfp4_mm",
    "quantize",
    "quantize_experts",
    "to_swizzled",
]
