"""Fixed-order sums over one small middle dimension in ONE Triton pass, for the CUDA paths of
`fp4_compile::ordered_sum` (the MoE top-k combine) and the attention backward's GQA group sum
of per-query-head dK / dV (`attention_backward_kernel.kv_group_sum`). The interpreter runs it in
tests.

Shape legend: x [A, N, C] contiguous -> out [A, C]; the sum runs over N in order
n = 0, 1, ..., N - 1, starting from x[:, 0] (no identity element: a sum of -0.0 stays -0.0).

Two roundings, bitwise the torch ops they replace:
- ROUND_EACH (ordered_sum): every partial sum is rounded to x's dtype, as `acc = acc + x[:, n]`
  in BF16 (ATen adds BF16 in FP32 and rounds each result) or FP32 does;
- otherwise (the GQA group sum): FP32 partial sums, one rounding to the output dtype at the end.
BF16 rounding is done on the FP32 bits (round to nearest even, `triton_helpers.round_bf16`;
NaN kept: NaN payloads follow no rule in ATen either), so the interpreter, whose fp32 -> bf16 casts truncate, stores
exact values. FP32 and BF16 only: the launchers keep the torch ops for other dtypes. The torch
ops launched N - 1 adds (each a full read and write of the partial sum) plus the casts; this
reads x once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..configs import pick_launch, warps_kwargs
from ..runtime import arch_of, check_kernel_device, compile_options
from ..triton_helpers import round_bf16_keep_nan

KERNEL_DTYPES = (torch.float32, torch.bfloat16)


@triton.jit
def _group_sum_kernel(
    x_ptr,
    out_ptr,
    N,
    C,
    ROUND_EACH_BF16: tl.constexpr,
    ROUND_END_BF16: tl.constexpr,
    BLOCK: tl.constexpr,
):
    a = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < C
    base = x_ptr + a * N * C + cols
    acc = tl.load(base, mask=mask, other=0.0).to(tl.float32)
    for n in range(1, N):
        acc = acc + tl.load(base + n * C, mask=mask, other=0.0).to(tl.float32)
        if ROUND_EACH_BF16:
            acc = round_bf16_keep_nan(acc)
    if ROUND_END_BF16:
        acc = round_bf16_keep_nan(acc)
    tl.store(out_ptr + a * C + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


def group_sum(x_ANC: torch.Tensor, *, round_each: bool, out_dtype: torch.dtype) -> torch.Tensor:
    """x [A, N, C] (FP32 or BF16) -> [A, C] in out_dtype (FP32 or BF16): the ordered sum over N
    (module docstring). round_each: every partial sum rounded to x's dtype (then out_dtype must
    be x's dtype); else FP32 partial sums and one rounding to out_dtype."""
    check_kernel_device(x_ANC, "x")
    if x_ANC.dim() != 3 or x_ANC.shape[1] < 1:
        raise ValueError(f"x must be [A, N >= 1, C], got {tuple(x_ANC.shape)}")
    if x_ANC.dtype not in KERNEL_DTYPES or out_dtype not in KERNEL_DTYPES:
        raise ValueError(f"x and out dtypes must be FP32 or BF16, got {x_ANC.dtype}, {out_dtype}")
    if round_each and out_dtype != x_ANC.dtype:
        raise ValueError("round_each sums in x's dtype: out_dtype must be x's dtype")
    x = x_ANC.contiguous()
    a, n, c = x.shape
    out = torch.empty((a, c), dtype=out_dtype, device=x.device)
    if a and c:
        lc = pick_launch(arch_of(x.device), "group_sum")
        block = lc["block"]
        to_bf16 = out_dtype == torch.bfloat16
        _group_sum_kernel[(a, triton.cdiv(c, block))](
            x,
            out,
            n,
            c,
            ROUND_EACH_BF16=round_each and to_bf16,
            ROUND_END_BF16=not round_each and to_bf16,
            BLOCK=block,
            **warps_kwargs(lc),
            **compile_options(x.device),
        )
    return out
