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


def packed_weight(b: tuple[torch.Tensor, torch.Tensor], k: int):
    """The decode GEMM's packed B = (codes [.., N, K/2] uint8, E4M3 scale bytes [.., N, K/16]),
    checked (contiguous along K, K's extents) -> (codes, scale bytes as uint8), each [E, N, ..]."""
    codes, scales = b
    if codes.dim() == 2:
        codes, scales = codes.unsqueeze(0), scales.unsqueeze(0)
    scales = scales.view(torch.uint8)
    if codes.dtype != torch.uint8 or codes.stride(-1) != 1 or scales.stride(-1) != 1:
        raise ValueError("packed weight codes (uint8) and scales must be contiguous along K")
    if codes.shape[2] * 2 != k or scales.shape[2] * 16 != k:
        raise ValueError(
            f"packed weight codes {tuple(codes.shape)} / scales {tuple(scales.shape)} do not "
            f"match K={k} (K/2 and K/16)"
        )
    return codes, scales


def weight_words(codes: torch.Tensor, scales: torch.Tensor, k: int, block_k: int, words: bool):
    """-> (codes, scales, scale_words): the codes as 32-bit words of 8 nibbles where `words`
    (CUDA), the scale bytes as 32-bit words of 4 where whole words tile a K step of block_k
    (one pipelined load; `words_tile_k`)."""
    if words:
        if codes.stride(1) % 4 or codes.stride(0) % 4 or codes.storage_offset() % 4:
            raise ValueError(
                f"the decode GEMM reads the codes as 32-bit words: codes strides {codes.stride()} and offset "
                f"{codes.storage_offset()} must be multiples of 4 bytes"
            )
        codes = codes.view(torch.int32)
    scale_words = words_tile_k(scales, k, block_k)
    return codes, scales.view(torch.int32) if scale_words else scales, scale_words
