"""NVFP4Tensor <-> flat tensor dicts (safetensors), byte for byte."""

from __future__ import annotations

import torch

from .format import NVFP4Tensor

_SUFFIXES = ("codes", "block_scales", "global_decode", "shape")


def nvfp4_to_tensors(t: NVFP4Tensor, prefix: str) -> dict[str, torch.Tensor]:
    """Flat dict of CPU tensors; E4M3 scales travel as their raw bytes (uint8)."""
    return {
        f"{prefix}.codes": t.codes.cpu().contiguous(),
        f"{prefix}.block_scales": t.block_scales.cpu().contiguous().view(torch.uint8),
        f"{prefix}.global_decode": t.global_decode.cpu().contiguous(),
        f"{prefix}.shape": torch.tensor(
            list(t.shape) + [0 if t.block == "1x16" else 1], dtype=torch.int64
        ),
    }


def nvfp4_from_tensors(tensors: dict[str, torch.Tensor], prefix: str) -> NVFP4Tensor:
    missing = [s for s in _SUFFIXES if f"{prefix}.{s}" not in tensors]
    if missing:
        raise KeyError(f"NVFP4 tensor {prefix!r} is missing {missing}")
    meta = tensors[f"{prefix}.shape"].tolist()
    return NVFP4Tensor(
        codes=tensors[f"{prefix}.codes"],
        block_scales=tensors[f"{prefix}.block_scales"].view(torch.float8_e4m3fn),
        global_decode=tensors[f"{prefix}.global_decode"],
        shape=tuple(int(s) for s in meta[:-1]),
        block="1x16" if meta[-1] == 0 else "16x16",
    )
