"""How the GEMM kernels read packed NVFP4 weights: the E4M3 scale bytes [.., N, K/16] as 32-bit
words of 4 (one load the software pipeline can issue ahead: cp.async needs >= 4 contiguous bytes
per thread; a byte load waits out the memory latency in every K step)."""

from __future__ import annotations

import torch


def words_tile_k(scales: torch.Tensor, k: int, block_k: int) -> bool:
    """Whether the scale bytes [.., N, K/16] can be read as 32-bit words of 4 with whole words
    per K step of `block_k`: K and block_k multiples of 64, strides and offset multiples of 4."""
    return (
        block_k % 64 == 0
        and k % 64 == 0
        and scales.storage_offset() % 4 == 0
        and all(st % 4 == 0 for st in scales.stride()[:-1])
    )
