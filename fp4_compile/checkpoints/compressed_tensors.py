"""compressed-tensors `nvfp4-pack-quantized` (what vLLM, SGLang and llm-compressor load).

Per quantized linear `<m>`:
- `<m>.weight_packed` uint8 [N, K/2]: E2M1 codes, element 2i in the low nibble (minite's bytes),
- `<m>.weight_scale` float8_e4m3fn [N, K/16]: block scales (16x16 tiles repeated over rows),
- `<m>.weight_global_scale` float32 [1]: ENCODE convention; dequantize = e2m1 * scale / global.
  Written so that fp32(1 / global) is minite's decode scale bit for bit (`scales.py`).
- `<m>.input_global_scale` float32 [1]: the static activation global ENCODE scale W4A4 engines
  use. minite quantizes activations with a per-row (per-token) dynamic global scale, which the
  format cannot express; 1.0 is written (uncalibrated: block scales = block amax / 6).
"""

from __future__ import annotations

import torch

from ..format import BLOCK_SIZE
from .plan import QuantizedLinear
from .scales import decode_for_encode, encode_for_decode

FORMAT = "nvfp4-pack-quantized"
INPUT_GLOBAL_SCALE = 1.0


def _args(dynamic) -> dict:
    return {
        "num_bits": 4,
        "type": "float",
        "symmetric": True,
        "group_size": BLOCK_SIZE,
        "strategy": "tensor_group",
        "block_structure": None,
        "dynamic": dynamic,
        "actorder": None,
        "observer": "minmax" if dynamic is False else None,
        "observer_kwargs": {},
    }


def quantization_config(ignore: list[str], minite: dict) -> dict:
    """The `quantization_config` of config.json (weights static, activations dynamic "local":
    per-16 block scales computed at run time under the static `input_global_scale`)."""
    return {
        "quant_method": "compressed-tensors",
        "format": FORMAT,
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": _args(False),
                "input_activations": _args("local"),
                "output_activations": None,
                "format": FORMAT,
            }
        },
        "ignore": ignore,
        "kv_cache_scheme": None,
        "sparsity_config": {},
        "minite": minite,
    }


def tensors(q: QuantizedLinear) -> dict[str, torch.Tensor]:
    return {
        f"{q.name}.weight_packed": q.codes,
        f"{q.name}.weight_scale": q.block_scales,
        f"{q.name}.weight_global_scale": encode_for_decode(q.global_decode).reshape(1),
        f"{q.name}.input_global_scale": torch.tensor([INPUT_GLOBAL_SCALE], dtype=torch.float32),
    }


SUFFIXES = ("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale")


def read(tensors_of_module: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """-> (codes uint8 [N, K/2], block scales E4M3 [N, K/16], global decode FP32 [])."""
    return (
        tensors_of_module["weight_packed"],
        tensors_of_module["weight_scale"],
        decode_for_encode(tensors_of_module["weight_global_scale"]),
    )
