"""The A operand of the decode GEMM (`decode_gemm_kernel.py`) quantized in the kernel's prologue
(A_PARTS), so that no `row_codes` launch runs before it.

Shape legend: T token rows of the tile, K in-features (contraction), P partial maxima per row.

The amax producers (`rms_norm_quantize_kernel`'s and `silu_mul_quantize_kernel`'s split forms,
`abs_max_kernel.chunk_abs_max`) write the rows' values y and, per (row, column chunk), max |y|
(NaN where the chunk holds one); `row_codes_kernel.row_codes_from_parts` then writes the on-grid
rows and their global decodes, which the decode GEMM reads. Here the GEMM reads y and the parts
instead and runs `row_codes_kernel`'s own jit helpers on them: `row_scales_from_parts` once per
program (the fold of the P maxima, then the global decode and multiplier of each row), and
`ongrid_blocks` on every [T, BLOCK_K] step of A (the 1x16 blocks are row-local and BLOCK_K is
a multiple of 16, so a K step's blocks are whole blocks of row_codes). The same FP32 operations
on the same values: the on-grid A (exact in BF16) and the global decodes are row_codes' bit for
bit, hence the product is row_codes + the decode GEMM's. Each program of a token tile quantizes
the same A rows again (A is a few rows; the weight stream is the cost).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .row_codes_kernel import ongrid_blocks, row_scales_from_parts


@triton.jit
def a_row_scales(
    part_ptr,
    arows,
    amask,
    P,
    one_sixth,
    BLOCK_T: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """(global decode with 1.0 where a row is masked, as the epilogue's load gives it;
    multiplier) of the tile's A rows `arows` [T] from their partial maxima [M_a, P]."""
    gd, mult, _ = row_scales_from_parts(part_ptr, arows, amask, P, one_sixth, BLOCK_T, BLOCK_P)
    return tl.where(amask, gd, 1.0), mult


@triton.jit
def quantized_a_tile(
    a_base,
    amask,
    k0,
    K,
    gd,
    mult,
    EVEN_K: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_K: tl.constexpr,
    C_ORDER: tl.constexpr,
):
    """The on-grid A (rows at a_base [T], unit stride along K) of the K step from k0 (FP32 [BLOCK_K, T], as the kernel reads A): the
    rows' values y quantized with `ongrid_blocks` (zeros where a row or column is masked, as
    the GEMM's masked load of row_codes' output gives). C_ORDER (the interpreter): laid out
    as the GEMM's load lays out row_codes' output, which numpy's matmul sums in its order."""
    NB: tl.constexpr = BLOCK_K // 16
    k3 = k0 + tl.arange(0, NB)[None, :, None] * 16 + tl.arange(0, 16)[None, None, :]
    mask3 = amask[:, None, None]
    if not EVEN_K:
        mask3 = mask3 & (k3 < K)
    x = tl.load(a_base[:, None, None] + k3, mask=mask3, other=0.0).to(tl.float32)
    val = ongrid_blocks(x, mult, gd)  # [T, NB, 16]
    a_t = tl.trans(tl.reshape(val, (BLOCK_T, BLOCK_K)))
    if C_ORDER:  # the interpreter: numpy's matmul sums a transposed view in another order
        a_t = tl.reshape(tl.reshape(a_t, (BLOCK_K * BLOCK_T,)), (BLOCK_K, BLOCK_T))
    return a_t
