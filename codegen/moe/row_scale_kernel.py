"""`fp4_compile::row_scale` on CUDA as Triton passes (the interpreter in tests): the forward
x * w (one FP32 product rounded to the result dtype, bitwise torch's broadcast multiply, which
takes ATen's slow broadcasting path at MoE sizes), and the backward in one pass.

Shape legend: R rows (x's leading dims flattened), H the last dim.

grad_x = grad * w (one FP32 product, then one rounding to x's dtype), and
grad_w = block_sum(grad * x) over H, bitwise `row_scale.row_scale_backward`'s torch ops
(`fixed_order.block_sum` with BLOCK = 64): inside each block of 64 the pairwise tree
x[j] + x[j + 32], then + [j + 16], ... (each level one FP32 add of two values, written with
`tl.split` so that no other association is possible), the block sums added in order from
block 0 (the accumulator starts as block 0's sum, so a sum of negative zeros keeps its
sign); masked columns past H are +0.0 products, like the reference's padding.
No FMA (`compile_options`): every product is rounded before it is added.
The torch ops launch about 45 kernels per call and write FP32 copies of grad and x (MoE
[32768, 2048]: ~1 ms per call on the H200); this reads grad and x once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import configs
from ..runtime import arch_of, check_kernel_device, compile_options, interpreting, row_mask_bytes


@triton.jit
def _halve(v, BLOCK_R: tl.constexpr, HALF: tl.constexpr):
    """[BLOCK_R, 2 * HALF] -> [BLOCK_R, HALF]: v[:, j] + v[:, j + HALF] (one add each)."""
    lo, hi = tl.split(tl.permute(tl.reshape(v, (BLOCK_R, 2, HALF)), (0, 2, 1)))
    return lo + hi


@triton.jit
def _tree64(p, ROWS: tl.constexpr):
    """[ROWS, 64] -> [ROWS]: the pairwise tree of each row's 64 values (module docstring)."""
    p = _halve(p, ROWS, 32)
    p = _halve(p, ROWS, 16)
    p = _halve(p, ROWS, 8)
    p = _halve(p, ROWS, 4)
    p = _halve(p, ROWS, 2)
    p = _halve(p, ROWS, 1)
    return tl.reshape(p, (ROWS,))


@triton.jit
def _column2(s, J: tl.constexpr):
    """s[:, J] of s [R, 2], exactly (`tl.split`: no arithmetic, a -0.0 or NaN kept)."""
    a, b = tl.split(s)
    if J == 0:
        return a
    else:
        return b


@triton.jit
def _column4(s, J: tl.constexpr, BLOCK_R: tl.constexpr):
    even, odd = tl.split(tl.reshape(s, (BLOCK_R, 2, 2)))  # s[:, 0::2], s[:, 1::2]
    if J % 2 == 0:
        return _column2(even, J // 2)
    else:
        return _column2(odd, J // 2)


@triton.jit
def _column8(s, J: tl.constexpr, BLOCK_R: tl.constexpr):
    even, odd = tl.split(tl.reshape(s, (BLOCK_R, 4, 2)))
    if J % 2 == 0:
        return _column4(even, J // 2, BLOCK_R)
    else:
        return _column4(odd, J // 2, BLOCK_R)


@triton.jit
def _column(s, J: tl.constexpr, BLOCK_R: tl.constexpr, NB: tl.constexpr):
    """s[:, J] of the block sums s [BLOCK_R, NB] (NB in 1, 2, 4, 8), without arithmetic."""
    if NB == 1:
        return tl.reshape(s, (BLOCK_R,))
    elif NB == 2:
        return _column2(s, J)
    elif NB == 4:
        return _column4(s, J, BLOCK_R)
    else:
        tl.static_assert(NB == 8, "1, 2, 4 or 8 blocks per step")
        return _column8(s, J, BLOCK_R)


@triton.jit
def _add_block_sums(acc, s, START: tl.constexpr, BLOCK_R: tl.constexpr, NB: tl.constexpr):
    """acc + s[:, START] + s[:, START + 1] + ... + s[:, NB - 1]: one FP32 add each, in block
    order (the order of the one-block-per-step loop)."""
    for j in tl.static_range(START, NB):
        acc = acc + _column(s, j, BLOCK_R, NB)
    return acc


@triton.jit
def _row_scale_backward_block(
    g_ptr,
    x_ptr,
    gx_ptr,
    w,
    r64,
    g64,
    rmask,
    keep,
    h0,
    H,
    BLOCK_R: tl.constexpr,
    BLOCK: tl.constexpr,
    NB: tl.constexpr,
    ROW_MASK: tl.constexpr,
    G_GATHER: tl.constexpr,
):
    """Store grad_x for columns [h0, h0 + NB * BLOCK) and return the tree sums of grad * x of
    those NB blocks, [BLOCK_R, NB] (ROW_MASK: rows where `keep` is false read x as +0.0 and
    store a +0.0 grad_x). grad's row of row r is g64[r] (G_GATHER: read as the one-term FP32
    sum `gather_rows`' backward makes of it, +0.0 + g, so a -0.0 reads as +0.0) or r."""
    cols = h0 + tl.arange(0, NB * BLOCK)
    mask = rmask[:, None] & (cols < H)[None, :]
    offs = r64[:, None] * H + cols[None, :]
    if G_GATHER:
        g = tl.load(g_ptr + g64[:, None] * H + cols[None, :], mask=mask, other=0.0)
        g = g.to(tl.float32)
        g = tl.where(g == 0.0, 0.0, g)  # +0.0 + (-0.0) = +0.0: the sum's first add
    else:
        g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if ROW_MASK:
        x = tl.load(x_ptr + offs, mask=mask & keep[:, None], other=0.0).to(tl.float32)
        gx = tl.where(keep[:, None], g * w[:, None], 0.0)
    else:
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        gx = g * w[:, None]
    tl.store(gx_ptr + offs, gx.to(gx_ptr.dtype.element_ty), mask=mask)
    # row r's block b is row r * NB + b of the [BLOCK_R * NB, 64] view
    p = tl.reshape(g * x, (BLOCK_R * NB, BLOCK))
    return tl.reshape(_tree64(p, BLOCK_R * NB), (BLOCK_R, NB))


@triton.jit
def _row_scale_backward_kernel(
    g_ptr,
    x_ptr,
    w_ptr,
    gx_ptr,
    gw_ptr,
    m_ptr,
    gi_ptr,
    R,
    H,
    row_div,
    BLOCK_R: tl.constexpr,
    BLOCK: tl.constexpr,
    NB: tl.constexpr = 1,
    ROW_MASK: tl.constexpr = False,
    G_GATHER: tl.constexpr = False,
):
    # ROW_MASK: the backward of row_scale(x.masked_fill(m, 0), w) through the masked_fill: rows
    # with m[r] != 0 read x as zeros, and their grad_x is +0.0 (masked_fill's backward).
    # G_GATHER: row r's gradient is grad[gi[r] // row_div] (`moe_combine`'s backward through a
    # known inverse permutation: the slot sums' one term each, read in place).
    # NB: 64-column blocks per loop step, more bytes in flight per step (H is a multiple of
    # NB * 64 when NB > 1: a block wholly past H would add a +0.0 sum the reference does not
    # have, turning a -0.0 accumulator positive); the block sums are added in block order.
    tl.static_assert(BLOCK == 64, "the tree below is written for blocks of 64")
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < R
    r64 = rows.to(tl.int64)
    g64 = r64
    if G_GATHER:
        g64 = tl.load(gi_ptr + rows, mask=rmask, other=0).to(tl.int64) // row_div
    w = tl.load(w_ptr + rows, mask=rmask, other=0.0).to(tl.float32)
    keep = rmask
    if ROW_MASK:
        keep = tl.load(m_ptr + rows, mask=rmask, other=1) == 0
    # the first block's sum starts the accumulator (no identity constant: a -0.0 literal came
    # out as +0.0 on the H200, turning a sum of negative zeros positive)
    sums = _row_scale_backward_block(
        g_ptr, x_ptr, gx_ptr, w, r64, g64, rmask, keep, 0, H, BLOCK_R, BLOCK, NB, ROW_MASK, G_GATHER
    )
    acc = _add_block_sums(_column(sums, 0, BLOCK_R, NB), sums, 1, BLOCK_R, NB)
    # a plain loop: as a cp.async software pipeline (tl.range num_stages=3) this kernel took
    # 1.10 ms instead of 0.26 ms for the learner's two calls on the H200 (83327b7)
    for h0 in range(NB * BLOCK, H, NB * BLOCK):
        sums = _row_scale_backward_block(
            g_ptr,
            x_ptr,
            gx_ptr,
            w,
            r64,
            g64,
            rmask,
            keep,
            h0,
            H,
            BLOCK_R,
            BLOCK,
            NB,
            ROW_MASK,
            G_GATHER,
        )
        acc = _add_block_sums(acc, sums, 0, BLOCK_R, NB)
    tl.store(gw_ptr + rows, acc, mask=rmask)


@triton.jit
def _row_scale_kernel(x_ptr, w_ptr, y_ptr, R, H, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)
    rmask = rows < R
    mask = rmask[:, None] & (cols < H)[None, :]
    offs = rows.to(tl.int64)[:, None] * H + cols[None, :]
    w = tl.load(w_ptr + rows, mask=rmask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, (x * w[:, None]).to(y_ptr.dtype.element_ty), mask=mask)


def row_scale_triton(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x * w for w of shape x.shape[:-1] + (1,), in promote_types(x, w): bitwise torch's."""
    check_kernel_device(x, "x")
    h = x.shape[-1]
    x2 = x.reshape(-1, h).contiguous()
    w1 = w.reshape(-1).contiguous()
    r = x2.shape[0]
    out_dtype = torch.promote_types(x.dtype, w.dtype)
    interp = interpreting()
    y = torch.empty(x2.shape, dtype=torch.float32 if interp else out_dtype, device=x.device)
    if r and h:
        lc = configs.pick_launch(arch_of(x.device), "row_scale")
        grid = (triton.cdiv(r, lc["block_r"]), triton.cdiv(h, lc["block_h"]))
        _row_scale_kernel[grid](
            x2,
            w1,
            y,
            r,
            h,
            BLOCK_R=lc["block_r"],
            BLOCK_H=lc["block_h"],
            **configs.warps_kwargs(lc),
            **compile_options(x.device),
        )
    return y.to(out_dtype).reshape(x.shape)


def blocks_per_step(h: int, most: int) -> int:
    """The 64-column blocks the backward takes per loop step for rows of h columns: the largest
    power of two <= `most` (1, 2, 4 or 8) whose width divides h (1 where h % 128 != 0)."""
    if most not in (1, 2, 4, 8):
        raise ValueError(f"blocks per step must be 1, 2, 4 or 8, got {most!r}")
    nb = most
    while nb > 1 and h % (64 * nb):
        nb //= 2
    return nb


def row_scale_backward_triton(
    grad: torch.Tensor,
    x: torch.Tensor,
    w: torch.Tensor,
    block: int = 64,
    row_mask=None,
    *,
    grad_rows: torch.Tensor | None = None,
    row_div: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_x in x.dtype, grad_w in w.dtype), bitwise `row_scale.row_scale_backward` (with
    `row_mask`, bool [R]: `row_scale_backward_reference(..., row_mask)`). With `grad_rows`
    (int [R]), row r's gradient is `+0.0 + grad[grad_rows[r] // row_div]` (FP32, rounded back:
    a -0.0 reads as +0.0): the one-term slot sums of `moe_combine`'s backward, read in place."""
    check_kernel_device(grad, "grad")
    if block != 64:
        raise ValueError(f"block must be 64 (the kernel's tree), got {block}")
    h = x.shape[-1]
    g2 = grad.reshape(-1, h).contiguous()
    x2 = x.reshape(-1, h).contiguous()
    w1 = w.reshape(-1).contiguous()
    r = x2.shape[0]
    if grad_rows is not None:
        if grad_rows.shape != (r,) or grad_rows.dtype not in (torch.int32, torch.int64):
            raise ValueError(
                f"grad_rows must be int32/int64 [{r}], got {grad_rows.dtype} "
                f"{tuple(grad_rows.shape)}"
            )
        if not isinstance(row_div, int) or row_div < 1 or g2.shape[0] * row_div != r:
            raise ValueError(
                f"row_div must be a positive int with grad rows * row_div == {r}, "
                f"got {row_div!r} and grad {tuple(grad.shape)}"
            )
    elif g2.shape != x2.shape:
        raise ValueError(
            f"grad {tuple(grad.shape)}, x {tuple(x.shape)} and w {tuple(w.shape)} disagree"
        )
    if w1.shape[0] != r or g2.shape[1] != h:
        raise ValueError(
            f"grad {tuple(grad.shape)}, x {tuple(x.shape)} and w {tuple(w.shape)} disagree"
        )
    interp = interpreting()  # its fp32 -> bf16 casts truncate: store FP32, let torch round
    gx = torch.empty(x2.shape, dtype=torch.float32 if interp else x.dtype, device=x.device)
    gw = torch.empty((r,), dtype=torch.float32, device=x.device)
    m = row_mask_bytes(row_mask, r)
    if r:
        lc = configs.pick_launch(arch_of(x.device), "row_scale_backward")
        block_r, most_blocks = lc["block_r"], lc["most_blocks"]
        _row_scale_backward_kernel[(triton.cdiv(r, block_r),)](
            g2,
            x2,
            w1,
            gx,
            gw,
            m if m is not None else gw,
            grad_rows.contiguous() if grad_rows is not None else gw,
            r,
            h,
            row_div,
            BLOCK_R=block_r,
            BLOCK=block,
            NB=blocks_per_step(h, most_blocks),
            ROW_MASK=m is not None,
            G_GATHER=grad_rows is not None,
            **configs.warps_kwargs(lc),
            **compile_options(x.device),
        )
    return gx.to(x.dtype).reshape(x.shape), gw.to(w.dtype).reshape(w.shape)
