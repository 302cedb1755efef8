"""Triton kernel: the uniforms of the rollout's seeded Gumbel noise in ONE launch (imports
triton), and the `@triton.jit` steps of the noise that `sample_argmax_kernel` computes in place.

Shape legend: B requests, V vocabulary.

`fp4_compile.rollout.sampling.gumbel_noise` draws u[b, v] = ((h >> 8) + 0.5) * 2^-24 (FP64) with
h a counter-based hash of (request key, step, token id): the "lowbias32" mixer of `sr_stream`.
Its torch form is about 80 integer launches per token on int64 tensors (a 16-bit split of every
32-bit product, the step's key on 0-dim tensors); here each program hashes one row's BLOCK_V
tokens in uint32 registers (products wrap mod 2^32: the same integers), the step's key included
(read from a device counter: no host read, CUDA-graph safe; one counter for every row, or one
per row for a continuously batched decode program: stride 1). Integer arithmetic and the FP64
u are exact, so u is bitwise the torch form's on every device.

`gumbel_loglog`: log(-log(u)) in FP64 as torch's CUDA ops compute it. ATen's CUDA `log` on
double calls the CUDA math library's `log(double)`; Triton's `libdevice.log` on FP64 calls
`__nv_log` of libdevice, which is that same CUDA math library function in bitcode: the same
bits (tests/gpu/test_gpu_decode_ops.py checks it on the GPU). The negation between the logs is
exact. The interpreter has no libdevice and takes numpy's log (as torch's CPU log, correctly
rounded in practice; the CPU path itself runs the torch ops).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..configs import pick_launch, warps_kwargs
from ..runtime import interpreting, kernel_target
from ..triton_helpers import mix32


@triton.jit
def gumbel_row_key(keys_ptr, step_ptr, step_stride, row):
    """(the request's 32-bit key, the key of its draw number) of row `row` (int64)."""
    n = tl.load(step_ptr + row * step_stride).to(tl.int64)  # stride 0: one step for every row
    lo, hi = (n & 0xFFFFFFFF).to(tl.uint32), (n >> 32).to(tl.uint32)
    step_key = mix32(mix32(lo) ^ hi ^ 0x85EBCA6B)  # the step's key, salt and all as the torch form
    key = (tl.load(keys_ptr + row) & 0xFFFFFFFF).to(tl.uint32)
    return key, step_key


@triton.jit
def gumbel_uniform(cols, key, step_key):
    """FP64 u of token ids `cols` (exact: the torch form's integers, then two exact steps)."""
    h = mix32(cols.to(tl.uint32) ^ key)
    h = mix32(h ^ ((key >> 1) ^ step_key))
    return ((h >> 8).to(tl.float64) + 0.5) * 5.9604644775390625e-08  # 2**-24: every step exact


@triton.jit
def gumbel_loglog(u, INTERP: tl.constexpr):
    """FP64 log(-log(u)): torch's CUDA `torch.log(-torch.log(u))` (module docstring)."""
    if INTERP:
        return tl.log(-tl.log(u))
    return libdevice.log(-libdevice.log(u))


@triton.jit
def _gumbel_uniforms_kernel(
    keys_ptr,
    step_ptr,
    step_stride,
    u_ptr,
    V,
    LOGLOG: tl.constexpr,
    INTERP: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    key, step_key = gumbel_row_key(keys_ptr, step_ptr, step_stride, row)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_V + tl.arange(0, BLOCK_V)
    u = gumbel_uniform(cols, key, step_key)
    if LOGLOG:
        u = gumbel_loglog(u, INTERP)
    tl.store(u_ptr + row * V + cols, u, mask=cols < V)


def gumbel_uniforms(
    keys_B: torch.Tensor, step: int | torch.Tensor, vocab_size: int, *, loglog: bool = False
):
    """FP64 [B, V] uniforms of draw `step` (a host int >= 0, an int64 0-dim tensor on the keys'
    device, or an int64 [B] tensor there: one draw number per row) for the int64 [B] stream keys
    `keys_B` (each in [0, 2^32)): bitwise the torch form in `sampling.gumbel_noise` (module
    docstring); loglog=True: their log(-log(u)) instead, the noise `sample_argmax_kernel`
    computes in place (its GPU check). Arguments are checked by the caller."""
    target = kernel_target(keys_B, "keys_B")
    num = keys_B.shape[0]
    u = torch.empty((num, vocab_size), dtype=torch.float64, device=keys_B.device)
    lc = pick_launch(target.arch, "gumbel_noise")
    if not isinstance(step, torch.Tensor):  # a host step: one int64 on the device
        step = torch.tensor(step, dtype=torch.int64).to(keys_B.device)
    if num and vocab_size:
        _gumbel_uniforms_kernel[(num, triton.cdiv(vocab_size, lc["block_v"]))](
            keys_B.contiguous(),
            step,
            step.stride(0) if step.dim() else 0,
            u,
            vocab_size,
            LOGLOG=loglog,
            INTERP=interpreting(),
            BLOCK_V=lc["block_v"],
            **warps_kwargs(lc),
            **target.options,
        )
    return u
