"""ModelOpt NVFP4 (`quant_algo: NVFP4`; TensorRT-LLM, vLLM `modelopt_fp4`, SGLang).

Per quantized linear `<m>`:
- `<m>.weight` uint8 [N, K/2]: E2M1 codes, element 2i in the low nibble (minite's bytes),
- `<m>.weight_scale` float8_e4m3fn [N, K/16]: block scales (16x16 tiles repeated over rows),
- `<m>.weight_scale_2` float32 []: DECODE convention (amax / (6*448)) = minite's decode scale,
- `<m>.input_scale` float32 []: the static activation global DECODE scale W4A4 engines use
  (alpha = input_scale * weight_scale_2). minite's activation scale is per row and dynamic; 1.0
  is written (uncalibrated: block scales = block amax / 6), the same choice as compressed-tensors.
"""

from __future__ import annotations

import torch

from ..format import BLOCK_SIZE
from .plan import QuantizedLinear

QUANT_CONFIG_FILE = "hf_quant_config.json"
INPUT_SCALE = 1.0


def quantization(exclude: list[str]) -> dict:
    return {
        "quant_algo": "NVFP4",
        "kv_cache_quant_algo": None,
        "group_size": BLOCK_SIZE,
        "exclude_modules": exclude,
    }


def hf_quant_config(exclude: list[str], version: str) -> dict:
    """The `hf_quant_config.json` ModelOpt writes (producer + quantization)."""
    return {
        "producer": {"name": "minite", "version": version},
        "quantization": quantization(exclude),
    }


def quantization_config(exclude: list[str], minite: dict) -> dict:
    """The `quantization_config` of config.json."""
    return {"quant_method": "modelopt", **quantization(exclude), "minite": minite}


def tensors(q: QuantizedLinear) -> dict[str, torch.Tensor]:
    return {
        f"{q.name}.weight": q.codes,
        f"{q.name}.weight_scale": q.block_scales,
        f"{q.name}.weight_scale_2": q.global_decode.reshape(()).clone(),
        f"{q.name}.input_scale": torch.tensor(INPUT_SCALE, dtype=torch.float32),
    }


SUFFIXES = ("weight", "weight_scale", "weight_scale_2", "input_scale")


def read(tensors_of_module: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """-> (codes uint8 [N, K/2], block scales E4M3 [N, K/16], global decode FP32 [])."""
    return (
        tensors_of_module["weight"],
        tensors_of_module["weight_scale"],
        tensors_of_module["weight_scale_2"].reshape(()).to(torch.float32),
    )
