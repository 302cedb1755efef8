"""Triton kernel of `fp4_compile::rotary_tables` (transformers' rotary cos / sin tables of
positions in one launch), and its launcher.

Shape legend: R rows (the positions, flattened), F inverse frequencies, BLOCK_F = pow2(F).

One program per row: its position converted to FP32 (round to nearest, as torch's `.float()`),
times each inverse frequency (one FP32 product: the graph's angle), then libdevice's cos and sin
of it written to both halves of the row's tables (the `cat((angles, angles), -1)`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..configs import pick_launch, warps_kwargs
from ..runtime import interpreting, kernel_target


@triton.jit
def _cos_sin(x, INTERP: tl.constexpr):
    """cosf / sinf: libdevice's (the CUDA math library's accurate functions, which ATen's
    kernels call), not approximations; the interpreter has no libdevice and takes numpy's."""
    if INTERP:
        return tl.cos(x), tl.sin(x)
    return libdevice.cos(x), libdevice.sin(x)


@triton.jit
def _rotary_tables_kernel(
    pos_ptr,
    inv_ptr,
    cos_ptr,
    sin_ptr,
    T,
    F,
    s_pr,
    s_pt,
    BLOCK_F: tl.constexpr,
    INTERP: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    p = tl.load(pos_ptr + (row // T) * s_pr + (row % T) * s_pt).to(tl.float32)
    f = tl.arange(0, BLOCK_F)
    live = f < F
    angle = p * tl.load(inv_ptr + f, mask=live, other=0.0).to(tl.float32)  # exact upcast
    c, s = _cos_sin(angle, INTERP)
    out = row * 2 * F + f
    tl.store(cos_ptr + out, c, mask=live)
    tl.store(cos_ptr + out + F, c, mask=live)
    tl.store(sin_ptr + out, s, mask=live)
    tl.store(sin_ptr + out + F, s, mask=live)


def rotary_tables(positions: torch.Tensor, inv_freq: torch.Tensor):
    """`decode_reference.rotary_tables` in one launch (arguments checked by the op)."""
    target = kernel_target(positions, "positions")
    num_f = inv_freq.shape[0]
    inv = inv_freq.contiguous()
    rows2d = positions.reshape(-1, positions.shape[-1]) if positions.dim() else positions.view(1, 1)
    shape = (*positions.shape, 2 * num_f)
    cos = torch.empty(shape, dtype=torch.float32, device=positions.device)
    sin = torch.empty(shape, dtype=torch.float32, device=positions.device)
    rows = rows2d.shape[0] * rows2d.shape[1]
    if rows and num_f:
        lc = pick_launch(target.arch, "rotary_tables")
        _rotary_tables_kernel[(rows,)](
            rows2d,
            inv,
            cos,
            sin,
            rows2d.shape[1],
            num_f,
            rows2d.stride(0),
            rows2d.stride(1),
            BLOCK_F=triton.next_power_of_2(num_f),
            INTERP=interpreting(),
            **warps_kwargs(lc),
            **target.options,
        )
    return cos, sin
