"""`load_nvfp4_checkpoint`: an exported folder (either format) -> a transformers model whose
linear weights are the dequantized NVFP4 values, in the master dtype.

Decoding: E2M1 x E4M3 (exact in FP32) x the global DECODE scale (one FP32 rounding), the global
decode scale being `weight_scale_2` (ModelOpt) or fp32(1 / weight_global_scale)
(compressed-tensors, inverted once as vLLM does). For minite's exports this is bitwise
`fp4_compile.dequantize` of the learner's quantized weight.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import torch
from safetensors.torch import load_file

from ..format import BLOCK_SIZE, decode_e2m1, unpack_codes
from . import compressed_tensors, modelopt
from .export import CONFIG, WEIGHTS, master_dtype
from .plan import split_expert_name

READERS = {"compressed-tensors": compressed_tensors, "modelopt": modelopt}


def decode_weight(
    codes: torch.Tensor, block_scales: torch.Tensor, global_decode: torch.Tensor
) -> torch.Tensor:
    """FP32 [N, K]: e2m1(code) * float(E4M3 scale), exact, then * global decode (one rounding)."""
    values = decode_e2m1(unpack_codes(codes))
    scales = block_scales.to(torch.float32).repeat_interleave(BLOCK_SIZE, dim=-1)
    return (values * scales) * global_decode.reshape(()).to(torch.float32)


def checkpoint_format(config: dict) -> str:
    qc = config.get("quantization_config") or {}
    method = qc.get("quant_method")
    if method == "compressed-tensors" and qc.get("format") == compressed_tensors.FORMAT:
        return "compressed-tensors"
    if method == "modelopt" and qc.get("quant_algo") == "NVFP4":
        return "modelopt"
    raise ValueError(
        f"config.json: quantization_config is not NVFP4 compressed-tensors or "
        f"ModelOpt (quant_method={method!r})"
    )


def read_weights(path: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config dict, state dict of dequantized FP32 linears + dense tensors as stored)."""
    folder = Path(path)
    config = json.loads((folder / CONFIG).read_text())
    reader = READERS[checkpoint_format(config)]
    raw = load_file(str(folder / WEIGHTS))
    modules: dict[str, dict[str, torch.Tensor]] = defaultdict(dict)
    state = {}
    for name, tensor in raw.items():
        prefix, _, suffix = name.rpartition(".")
        if suffix in reader.SUFFIXES and f"{prefix}.{reader.SUFFIXES[1]}" in raw:
            modules[prefix][suffix] = tensor
        else:
            state[name] = tensor
    for prefix, parts in modules.items():
        state[f"{prefix}.weight"] = decode_weight(*reader.read(parts))
    return config, state


def _fuse_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """experts.{e}.gate_proj/up_proj/down_proj -> experts.gate_up_proj [E, 2I, H], down_proj."""
    experts: dict[str, dict[int, dict[str, torch.Tensor]]] = defaultdict(lambda: defaultdict(dict))
    out = {}
    for name, tensor in state.items():
        split = (
            split_expert_name(name.removesuffix(".weight")) if name.endswith(".weight") else None
        )
        if split is None:
            out[name] = tensor
        else:
            path, e, proj = split
            experts[path][e][proj] = tensor
    for path, by_expert in experts.items():
        ids = sorted(by_expert)
        if ids != list(range(len(ids))):
            raise ValueError(f"{path}: expert ids {ids} are not 0..E-1")
        gate_up = [torch.cat([by_expert[e]["gate_proj"], by_expert[e]["up_proj"]]) for e in ids]
        out[f"{path}.gate_up_proj"] = torch.stack(gate_up)
        out[f"{path}.down_proj"] = torch.stack([by_expert[e]["down_proj"] for e in ids])
    return out


def load_nvfp4_checkpoint(path: str | Path, *, dtype: torch.dtype | None = None):
    """A transformers causal LM from an exported folder, linears dequantized (master dtype, or
    `dtype`). Needs the `hf` extra."""
    # lazy: transformers is optional (the hf extra) and costs seconds at import
    from transformers import AutoConfig, AutoModelForCausalLM

    config_dict, state = read_weights(path)
    dtype = dtype or master_dtype(config_dict)
    config = AutoConfig.from_pretrained(str(path))
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantized: a plain model
    # built in `dtype` as transformers' from_pretrained builds it (buffers such as the rotary
    # frequencies stay FP32), so a BF16 load computes what transformers' own BF16 load computes
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    state = {k: v.to(dtype) for k, v in _fuse_experts(state).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    missing = [m for m in missing if m not in tied]
    if missing or unexpected:
        raise ValueError(
            f"{str(path)!r} does not match the model its config builds: missing {missing}, "
            f"unexpected {unexpected}"
        )
    return model.eval()
