"""The RMSNorm backward in one Triton launch, plus one small launch that adds dweight's per-program
partials (CUDA; CPU tensors under TRITON_INTERPRET=1), for
`fp4_compile::invariant_rms_norm_backward`, in place of the CPU path (plain PyTorch,
`invariant/reference.py`: about 15 FP32 kernels per call on the GPU,
benchmarks/results/2026-12-03_learner.md).

Math, per row of h [R, H] (the CPU path's formulas):
    rstd = 1 / sqrt(sum(h32^2) / H + eps);  n = h32 * rstd
    dweight += g * fp32(n rounded to h's dtype)           (summed over rows)
    g_w = g * weight;  dh = rstd * (g_w - n * (sum(g_w * n) / H))   -> h's dtype
Contracts: dh of a row depends only on that row (its sums reduce one row of a tile whose shape
follows H only, never R); dweight is deterministic: program p sums its fixed block of rows tile
after tile (each tile's rows as one fixed tree), then `partial_sum_kernel.partial_sum` adds the
[programs, H] FP32 partials in an order fixed by the number of programs (a function of the shape
only: interleaved sequential chains, then a pairwise tree; `partial_sum_reference` writes it out
as torch adds) and stores weight's dtype with one round-to-nearest-even cast. Not bitwise equal
to the CPU path (FP32 sums in another order); the GPU check compares them within FP32 rounding.

Speed: a tile of rows per loop step (one row per step makes every program wait on one small
load after another), and grad_y read through its strides (q_norm / k_norm gradients arrive as a
transposed view: no `.contiguous()` copy); dweight's partials added and cast in one launch
(`partial_sum_kernel`), not a stock sum and a cast.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..configs import pick_launch
from ..runtime import check_kernel_device, interpreting
from ..triton_helpers import round_bf16
from .partial_sum_kernel import partial_sum


def tiling(hdim: int) -> tuple[int, int, int]:
    """(BLOCK_H, rows per tile, warps) for a row length H: a function of H only, so a row's
    bits never depend on how many rows there are (`configs.LAUNCH`'s "rms_norm_backward")."""
    lc = pick_launch("any", "rms_norm_backward")
    block = triton.next_power_of_2(hdim)
    rows = max(1, min(lc["max_tile_rows"], lc["tile_elements"] // block))
    return block, rows, min(max(rows * block // lc["elements_per_warp"], 1), lc["max_warps"])


def tiles_per_program() -> int:
    """Tiles of rows one program walks (its partial dweight sums them: part of the bits)."""
    return pick_launch("any", "rms_norm_backward")["tiles_per_program"]


@triton.jit
def _rms_norm_backward_kernel(
    g_ptr,
    h_ptr,
    w_ptr,
    dh_ptr,
    dwp_ptr,
    R,
    H,
    eps,
    g_d1,
    g_d2,
    g_s0,
    g_s1,
    g_s2,
    HAS_W: tl.constexpr,
    ROUND_N: tl.constexpr,
    TILE_R: tl.constexpr,
    TILES: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    # grad_y row r = (i0 * g_d1 + i1) * g_d2 + i2 lives at i0 * g_s0 + i1 * g_s1 + i2 * g_s2
    # (its elements unit-strided); h and dh are contiguous [R, H]
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    live = cols < H
    if HAS_W:
        w = tl.load(w_ptr + cols, mask=live, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for t in range(TILES):
        rows = (pid * TILES + t) * TILE_R + tl.arange(0, TILE_R).to(tl.int64)
        m = (rows < R)[:, None] & live[None, :]
        i2 = rows % g_d2
        i1 = (rows // g_d2) % g_d1
        i0 = rows // g_d2 // g_d1
        g_row = i0 * g_s0 + i1 * g_s1 + i2 * g_s2
        h = tl.load(h_ptr + rows[:, None] * H + cols[None, :], mask=m, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + g_row[:, None] + cols[None, :], mask=m, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt_rn(tl.sum(h * h, axis=1) / H + eps)
        n = h * rstd[:, None]
        if HAS_W:
            if ROUND_N == 1:
                n_q = round_bf16(n)
            elif ROUND_N == 2:
                n_q = n.to(h_ptr.dtype.element_ty).to(tl.float32)
            else:
                n_q = n
            dw += tl.sum(g * n_q, axis=0)
            g = g * w[None, :]
        dh = rstd[:, None] * (g - n * (tl.sum(g * n, axis=1) / H)[:, None])
        tl.store(dh_ptr + rows[:, None] * H + cols[None, :], dh.to(dh_ptr.dtype.element_ty), mask=m)
    if HAS_W:
        tl.store(dwp_ptr + pid * H + cols, dw, mask=live)


def _row_view(g: torch.Tensor, hdim: int):
    """grad_y as rows of three index levels with strides ((d1, d2), (s0, s1, s2)), its elements
    unit-strided; a layout that does not fit is copied to contiguous rows first."""
    if g.stride(-1) == 1 or g.shape[-1] == 1:
        lead = [(n, s) for n, s in zip(g.shape[:-1], g.stride()[:-1]) if n != 1]
        if len(lead) <= 3:
            lead = [(1, 0)] * (3 - len(lead)) + lead
            return g, (lead[1][0], lead[2][0]), (lead[0][1], lead[1][1], lead[2][1])
    g = g.reshape(-1, hdim).contiguous()
    return g, (1, g.shape[0]), (0, 0, hdim)


def rms_norm_backward(grad_y, h, weight, eps: float):
    """(dh in h's dtype, dweight in weight's dtype or None): see the module docstring."""
    check_kernel_device(h, "h")
    hdim = h.shape[-1]
    h2 = h.reshape(-1, hdim).contiguous()
    if grad_y.shape != h.shape:
        raise ValueError(f"grad_y must have h's shape {tuple(h.shape)}, got {tuple(grad_y.shape)}")
    g, (d1, d2), (s0, s1, s2) = _row_view(grad_y, hdim)
    r = h2.shape[0]
    interp = interpreting()
    dh = torch.empty(h2.shape, dtype=torch.float32 if interp else h.dtype, device=h.device)
    block, tile_r, warps = tiling(hdim)
    tiles = tiles_per_program()
    rows_per_program = tile_r * tiles
    programs = max(triton.cdiv(r, rows_per_program), 1)
    has_w = weight is not None
    partial = torch.empty((programs, hdim) if has_w else (1,), dtype=torch.float32, device=h.device)
    if h.dtype == torch.float32:
        round_n = 0
    elif h.dtype == torch.bfloat16:
        round_n = 1
    else:
        round_n = 2
    if r:
        _rms_norm_backward_kernel[(programs,)](
            g,
            h2,
            weight if has_w else h2,
            dh,
            partial,
            r,
            hdim,
            eps,
            d1,
            d2,
            s0,
            s1,
            s2,
            HAS_W=has_w,
            ROUND_N=round_n,
            TILE_R=tile_r,
            TILES=tiles,
            BLOCK_H=block,
            num_warps=warps,
        )
    elif has_w:
        partial.zero_()
    dh = dh.to(h.dtype).reshape(h.shape)
    dw = partial_sum(partial, weight.dtype) if has_w else None
    return dh, dw
