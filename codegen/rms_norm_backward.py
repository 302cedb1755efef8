"""The RMSNorm backward in ONE Triton launch (CUDA; CPU tensors under TRITON_INTERPRET=1), for
`fp4_compile::invariant_rms_norm_backward`. The CPU path (plain PyTorch, `invariant_cpu`) ran
about 15 FP32 kernels per call on the GPU as well; on the H200 learner the nine calls took
7.6 ms of host time and most of the "other elementwise" class (2026-12-03_learner.md).

Math, per row of h [R, H] (the CPU path's formulas):
    rstd = 1 / sqrt(sum(h32^2) / H + eps);  n = h32 * rstd
    dweight += g * fp32(n rounded to h's dtype)           (summed over rows)
    g_w = g * weight;  dh = rstd * (g_w - n * (sum(g_w * n) / H))   -> h's dtype
Contracts: dh of a row depends only on that row (one program walks whole rows, the row sums
have a fixed tree per H); dweight is deterministic: program p sums its fixed block of
ROWS_PER_PROGRAM rows in order, then `torch.sum` adds the [programs, H] partials, a fixed
reduction for a given shape. Not bitwise equal to the CPU path (FP32 sums in another order);
the GPU check compares them within FP32 rounding.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .runtime import check_kernel_device, interpreting

ROWS_PER_PROGRAM = 32


@triton.jit
def _round_to_bf16(x):
    """FP32 -> nearest bf16 (ties to even), kept in FP32; integer ops (the interpreter's cast
    truncates)."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _rms_norm_backward_kernel(
    g_ptr, h_ptr, w_ptr, dh_ptr, dwp_ptr, R, H, eps,
    HAS_W: tl.constexpr, ROUND_N: tl.constexpr, ROWS: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_H)
    live = cols < H
    if HAS_W:
        w = tl.load(w_ptr + cols, mask=live, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for i in range(ROWS):
        row = (pid * ROWS + i).to(tl.int64)
        m = live & ((tl.zeros((BLOCK_H,), dtype=tl.int64) + row) < R)
        h = tl.load(h_ptr + row * H + cols, mask=m, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + row * H + cols, mask=m, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt_rn(tl.sum(h * h, axis=0) / H + eps)
        n = h * rstd
        if HAS_W:
            if ROUND_N == 1:
                n_q = _round_to_bf16(n)
            elif ROUND_N == 2:
                n_q = n.to(h_ptr.dtype.element_ty).to(tl.float32)
            else:
                n_q = n
            dw += g * n_q
            g = g * w
        dh = rstd * (g - n * (tl.sum(g * n, axis=0) / H))
        tl.store(dh_ptr + row * H + cols, dh.to(dh_ptr.dtype.element_ty), mask=m)
    if HAS_W:
        tl.store(dwp_ptr + pid * H + cols, dw, mask=live)


def rms_norm_backward(grad_y, h, weight, eps: float):
    """(dh in h's dtype, dweight in weight's dtype or None): see the module docstring."""
    check_kernel_device(h, "h")
    hdim = h.shape[-1]
    h2 = h.reshape(-1, hdim).contiguous()
    g2 = grad_y.reshape(-1, hdim).contiguous()
    r = h2.shape[0]
    interp = interpreting()
    dh = torch.empty(h2.shape, dtype=torch.float32 if interp else h.dtype, device=h.device)
    programs = max(triton.cdiv(r, ROWS_PER_PROGRAM), 1)
    has_w = weight is not None
    partial = torch.empty((programs, hdim) if has_w else (1,), dtype=torch.float32,
                          device=h.device)  # fmt: skip
    if h.dtype == torch.float32:
        round_n = 0
    elif h.dtype == torch.bfloat16:
        round_n = 1
    else:
        round_n = 2
    block = triton.next_power_of_2(hdim)
    if r:
        _rms_norm_backward_kernel[(programs,)](
            g2, h2, weight if has_w else h2, dh, partial, r, hdim, eps,
            HAS_W=has_w, ROUND_N=round_n, ROWS=ROWS_PER_PROGRAM, BLOCK_H=block,
            num_warps=min(max(block // 256, 1), 8),
        )  # fmt: skip
    elif has_w:
        partial.zero_()
    dh = dh.to(h.dtype).reshape(h.shape)
    dw = partial.sum(0).to(weight.dtype) if has_w else None
    return dh, dw
