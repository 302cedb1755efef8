"""Triton kernel of `fp4_compile::invariant_linear`'s forward (BF16 GEMM), and its launcher.

Shape legend: M rows, K in-features, N out-features.

Invariance (see `invariant/api.py` for the contract): one output tile per program, the K loop
sequential in BLOCK_K chunks from 0 (BLOCK_K one value per architecture: `configs.PINNED`); rows
never interact. `accumulate_into=acc` (FP32 [M, N]) starts each tile's chain from acc instead of
zero and stores the FP32 sum back into acc: K split at multiples of BLOCK_K over successive calls
then continues ONE chain, so the result equals one call over the whole K (the row-chunked head's
weight gradient, `invariant/head_logprobs.py`). Offsets are int64 (`codegen/runtime.py`). Interpreter: operands are loaded as FP32 and the dot dtype is a constexpr (bf16 on
CUDA, fp32 in the interpreter, where bf16 `tl.dot` is wrong); the FP32 result is cast by torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import configs as cfgs
from ..runtime import arch_of, check_kernel_device, interpreting
from ..triton_helpers import dot_dtype


@triton.jit
def _linear_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    M,
    N,
    K,
    sxm,
    sxk,
    swn,
    swk,
    sym,
    syn,
    HAS_BIAS: tl.constexpr,
    ACC_IN: tl.constexpr,
    DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m, pid_n = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K).to(tl.int64)
    y_off = rm[:, None] * sym + rn[None, :] * syn
    y_mask = (rm[:, None] < M) & (rn[None, :] < N)
    if ACC_IN:  # continue the chain of an earlier call (FP32 acc)
        acc = tl.load(y_ptr + y_off, mask=y_mask, other=0.0)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):  # sequential K loop: the reduction order never follows M
        kk = k0 + rk
        a = tl.load(
            x_ptr + rm[:, None] * sxm + kk[None, :] * sxk,
            mask=(rm[:, None] < M) & (kk[None, :] < K),
            other=0.0,
        ).to(tl.float32)
        b = tl.load(
            w_ptr + rn[None, :] * swn + kk[:, None] * swk,
            mask=(rn[None, :] < N) & (kk[:, None] < K),
            other=0.0,
        ).to(tl.float32)
        acc = tl.dot(a.to(DOT), b.to(DOT), acc, input_precision="ieee")
    if HAS_BIAS:
        acc = acc + tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + y_off, acc.to(y_ptr.dtype.element_ty), mask=y_mask)


def linear(x_MK, w_NK, bias_N, out_dtype, *, accumulate_into=None):
    """y = x @ w.T (+ bias) in out_dtype; or, with accumulate_into (FP32 [M, N], no bias), the
    chain continued from it, stored back in it (returned)."""
    check_kernel_device(x_MK, "x")
    m, k = x_MK.shape
    n = w_NK.shape[0]
    cfg = cfgs.pick(arch_of(x_MK.device), "any", "invariant_linear", m)
    store_dtype = torch.float32 if interpreting() else out_dtype
    if accumulate_into is not None:
        if accumulate_into.dtype != torch.float32 or tuple(accumulate_into.shape) != (m, n):
            raise ValueError(
                f"accumulate_into must be FP32 [{m}, {n}], got "
                f"{accumulate_into.dtype}{list(accumulate_into.shape)}"
            )
        if bias_N is not None:
            raise ValueError("accumulate_into takes no bias (add it once, after the last call)")
    y = (
        accumulate_into
        if accumulate_into is not None
        else torch.empty((m, n), dtype=store_dtype, device=x_MK.device)
    )
    grid = (triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n))
    _linear_kernel[grid](
        x_MK,
        w_NK,
        bias_N if bias_N is not None else y,
        y,
        m,
        n,
        k,
        x_MK.stride(0),
        x_MK.stride(1),
        w_NK.stride(0),
        w_NK.stride(1),
        y.stride(0),
        y.stride(1),
        HAS_BIAS=bias_N is not None,
        ACC_IN=accumulate_into is not None,
        DOT=dot_dtype(),
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        **cfg.launch_kwargs(),
    )
    return y if accumulate_into is not None else y.to(out_dtype)
