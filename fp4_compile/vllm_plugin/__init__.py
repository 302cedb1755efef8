"""minite's vLLM plugin: vLLM runs every linear through minite's NVFP4 ops, with the recipe's
exact numerics, and takes the learner's NVFP4 bytes in place.

vLLM calls `register` (entry point `vllm.general_plugins`, `pip install -e ".[vllm]"`) in every
process it starts; it registers the quantization method "minite" (`quantization.py`). A model
folder whose config.json carries `quantization_config = {"quant_method": "minite", "recipe":
...}` (`write_model_folder`), or a compressed-tensors folder written by
`fp4_compile.export_checkpoint` (whose quantization config holds the recipe under "minite") and
loaded with `quantization="minite"`, then runs:

- every QKV / o / gate_up / down linear through `fp4_compile::nvfp4_linear`, one call per
  fused shard (q, k, v; gate, up), each shard with its own global scale, exactly as the learner
  quantizes its separate q/k/v/gate/up weights; linears the recipe keeps in BF16 and the lm_head
  through the batch-invariant `fp4_compile::invariant_linear` with the learner's casts;
- weight updates as NVFP4 bytes (`weight_sync.py`: codes, block scales, global scales).

Rows never interact in these ops, so a token's output is the same whatever else vLLM put in its
flattened [num_tokens, K] step. Norms, rotary, attention and the sampler's log-softmax stay
vLLM's ("linears only"), unless the folder names minite's model class (`full=True`: Qwen3
`qwen3.py`, Qwen3-MoE `qwen3_moe.py`), whose forward is the learner's op for op on vLLM's paged
KV cache. Routed MoE experts run minite's NVFP4 GEMMs (`experts.py`) in both. This package imports vLLM only inside `register` and in
`quantization.py`; importing it without vLLM works. CUDA: the same ops dispatch to minite's
Triton kernels; that path has not run under vLLM (vLLM cannot be installed on the lent H200).
"""

from __future__ import annotations

import importlib.util

from .model_folder import FULL_ARCHITECTURES, QUANTIZATION_NAME, RECIPE_KEY, write_model_folder

__all__ = ["QUANTIZATION_NAME", "RECIPE_KEY", "register", "vllm_available", "write_model_folder"]


def vllm_available() -> bool:
    """True when vLLM can be imported in this environment."""
    return importlib.util.find_spec("vllm") is not None


def register() -> None:
    """The `vllm.general_plugins` entry point: registers the "minite" quantization method and
    the "full" model classes (`qwen3.py`). vLLM may call it several times per process."""
    from vllm import ModelRegistry  # lazy: vllm is optional (the vllm extra)

    # lazy: quantization imports vllm, which is optional
    from . import quantization  # noqa: F401  (registers on import)

    for model_type, arch in FULL_ARCHITECTURES.items():
        if arch not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(arch, f"fp4_compile.vllm_plugin.{model_type}:{arch}")
