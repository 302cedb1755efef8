"""Triton kernel: the uniforms of the rollout's seeded Gumbel noise in ONE launch (imports
triton).

Shape legend: B requests, V vocabulary.

`fp4_compile.rollout.sampling.gumbel_noise` draws u[b, v] = ((h >> 8) + 0.5) * 2^-24 (FP64) with
h a counter-based hash of (request key, step, token id): the "lowbias32" mixer of `sr_stream`.
Its torch form is about 80 integer launches per token on int64 tensors (a 16-bit split of every
32-bit product, the step's key on 0-dim tensors); here each program hashes one row's BLOCK_V
tokens in uint32 registers (products wrap mod 2^32: the same integers), the step's key included
(read from a device counter: no host read, CUDA-graph safe; one counter for every row, or one
per row for a continuously batched decode program: stride 1). Integer arithmetic and the FP64
u are exact, so u is bitwise the torch form's on every device; the two logs stay torch's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..configs import pick_launch, warps_kwargs
from ..runtime import kernel_target
from ..triton_helpers import mix32


@triton.jit
def _gumbel_uniforms_kernel(keys_ptr, step_ptr, step_stride, u_ptr, V, BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    n = tl.load(step_ptr + row * step_stride).to(tl.int64)  # stride 0: one step for every row
    lo, hi = (n & 0xFFFFFFFF).to(tl.uint32), (n >> 32).to(tl.uint32)
    step_key = mix32(mix32(lo) ^ hi ^ 0x85EBCA6B)  # the step's key, salt and all as the torch form
    key = (tl.load(keys_ptr + row) & 0xFFFFFFFF).to(tl.uint32)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_V + tl.arange(0, BLOCK_V)
    h = mix32(cols.to(tl.uint32) ^ key)
    h = mix32(h ^ ((key >> 1) ^ step_key))
    u = ((h >> 8).to(tl.float64) + 0.5) * 5.9604644775390625e-08  # 2**-24: every step exact
    tl.store(u_ptr + row * V + cols, u, mask=cols < V)


def gumbel_uniforms(keys_B: torch.Tensor, step: int | torch.Tensor, vocab_size: int):
    """FP64 [B, V] uniforms of draw `step` (a host int >= 0, an int64 0-dim tensor on the keys'
    device, or an int64 [B] tensor there: one draw number per row) for the int64 [B] stream keys
    `keys_B` (each in [0, 2^32)): bitwise the torch form in `sampling.gumbel_noise` (module
    docstring). Arguments are checked by the caller."""
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
            BLOCK_V=lc["block_v"],
            **warps_kwargs(lc),
            **target.options,
        )
    return u
