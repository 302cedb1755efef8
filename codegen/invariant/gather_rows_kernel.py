"""`fp4_compile::gather_rows`'s backward on CUDA (the interpreter in tests): one Triton pass over
the rows of grad_x, bitwise `gather_rows.gather_rows_backward_reference`.

Shape legend: R rows of x (= of grad_x), P positions (rows of grad), C = the trailing dims
flattened.

Program (row block, column block): for each of its rows r, the FP32 sum 0.0 + g[p0] + g[p1] + ...
over r's positions in `order` (a stable sort of idx: ascending), one add per step, rows with
fewer positions left as they are (`tl.where`, so a -0.0 term is added exactly as the reference
adds it); then one rounding to grad's dtype. The loop runs to the block's largest count."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..configs import pick_launch, warps_kwargs
from ..runtime import arch_of, check_kernel_device, compile_options
from ..triton_helpers import round_bf16_keep_nan
from .reference import row_segments


@triton.jit
def store_row_sums(out_ptr, acc, rows, cols, rlive, cmask, C, BF16: tl.constexpr):
    """Store FP32 sums acc [rows, cols] of an [R, C] output in its dtype: BF16 rounded to
    nearest even with integer ops (the interpreter's bf16 cast truncates), a NaN kept NaN
    (CUDA's 0x7FFFFFFF would carry into -0.0)."""
    if BF16:
        acc = round_bf16_keep_nan(acc)
    out = rows.to(tl.int64)[:, None] * C + cols[None, :]
    tl.store(out_ptr + out, acc.to(out_ptr.dtype.element_ty), mask=rlive[:, None] & cmask[None, :])


@triton.jit
def _gather_rows_backward_kernel(
    g_ptr,
    order_ptr,
    start_ptr,
    count_ptr,
    out_ptr,
    R,
    C,
    ROW_DIV,
    BF16: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    # position p's gradient is row p // ROW_DIV of g (1: g itself; k: the expanded gradient of
    # a sum over k slots, `moe_combine`, read without the expanded copy)
    pid = tl.program_id(0).to(
        tl.int64
    )  # one grid axis (2**31 programs): rows x column blocks can be many
    num_col_blocks = tl.cdiv(C, BLOCK_C)
    rows = (pid // num_col_blocks) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = (pid % num_col_blocks) * BLOCK_C + tl.arange(0, BLOCK_C)
    rlive = rows < R
    cmask = cols < C
    start = tl.load(start_ptr + rows, mask=rlive, other=0)
    count = tl.load(count_ptr + rows, mask=rlive, other=0)
    acc = tl.zeros((BLOCK_R, BLOCK_C), tl.float32)
    for j in range(0, tl.max(count)):
        live = j < count
        p = tl.load(order_ptr + start + j, mask=live, other=0)
        m = live[:, None] & cmask[None, :]
        g_row = (p // ROW_DIV).to(tl.int64)
        g = tl.load(g_ptr + g_row[:, None] * C + cols[None, :], mask=m, other=0.0).to(tl.float32)
        acc = tl.where(live[:, None], acc + g, acc)
    store_row_sums(out_ptr, acc, rows, cols, rlive, cmask, C, BF16)


def gather_rows_backward_triton(
    grad: torch.Tensor, idx: torch.Tensor, num_rows: int, row_div: int = 1
):
    """The backward of x[idx] (x of `num_rows` rows) given grad, whose row q // row_div is
    position q's gradient (row_div > 1: the expanded gradient of a sum over row_div slots)."""
    check_kernel_device(grad, "grad")
    order, starts, counts = row_segments(idx, num_rows)
    g2 = grad.contiguous().reshape(grad.shape[0], -1)  # the kernel's row stride is C
    c = g2.shape[1]
    out = torch.empty((num_rows, *grad.shape[1:]), dtype=grad.dtype, device=grad.device)
    if num_rows and c:
        lc = pick_launch(arch_of(grad.device), "gather_rows")
        grid = (triton.cdiv(num_rows, lc["block_r"]) * triton.cdiv(c, lc["block_c"]),)
        _gather_rows_backward_kernel[grid](
            g2,
            order,
            starts,
            counts,
            out,
            num_rows,
            c,
            row_div,
            BF16=grad.dtype == torch.bfloat16,
            BLOCK_R=lc["block_r"],
            BLOCK_C=lc["block_c"],
            **warps_kwargs(lc),
            **compile_options(grad.device),
        )
    return out
