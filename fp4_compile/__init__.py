"""minite: native NVFP4 RL of LLMs. The import package is `fp4_compile`.

Public API so far: the recipe, the NVFP4 format and its reference numerics. Triton is never
imported here (codegen imports it lazily).
"""

from .compile_api import compile, explain
from .export import RolloutArtifact, RolloutArtifactError, export_rollout, load_rollout
from .format import NVFP4Tensor
from .recipe import NVFP4Recipe, QuantSpec
from .reference import dequantize, nvfp4_grouped_mm, nvfp4_mm, quantize, quantize_experts
from .swizzle import from_swizzled, to_swizzled

__version__ = "0.1.0"

__all__ = [
    "NVFP4Recipe",
    "NVFP4Tensor",
    "QuantSpec",
    "compile",
    "dequantize",
    "explain",
    "export_rollout",
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
