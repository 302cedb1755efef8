"""`fp4_compile::invariant_rms_norm_pair_rotary`: an attention's q and k norms and the rotary
embedding after them in ONE launch (`passes/fuse_rotary_into_norm_pairs.py`).

Shape legend: B sequences, T positions, Ha / Hb heads of a / b, D head dim (even).

invariant_rms_norm_pair_rotary(a [B, T, Ha, D], a_weight, b [B, T, Hb, D], b_weight, eps,
cos [B | 1, T, D], sin [B | 1, T, D], scaling) -> (q_embed [B, Ha, T, D], k_embed [B, Hb, T, D]),
contiguous, where (ya, yb) = invariant_rms_norm_pair(a, a_weight, b, b_weight, eps) and, as
transformers computes it (the rotary embedding's `(cos * attention_scaling).to(dtype)`, then
Qwen3's attention: the heads transposed, then `apply_rotary_pos_emb`):

    c = (cos * scaling).to(dtype).unsqueeze(1);  s = (sin * scaling).to(dtype).unsqueeze(1)
    q = ya.transpose(1, 2)
    q_embed = (q * c) + (rotate_half(q) * s),   rotate_half(q) = cat(-q[..., D/2:], q[..., :D/2])

(k_embed alike) in the heads' dtype, op by op, as eager PyTorch and Inductor
(`emulate_precision_casts`, pinned in `compiler_pins.py`) compute it: q * c rounded to the dtype,
rotate_half(q) * s rounded, their sum rounded (three roundings, never one fused multiply-add).
cos / sin are the FP32 (or the heads' dtype) tables before that cast: the cast runs in the op,
so the tables need no kernel of their own (`passes/fuse_rotary_into_norm_pairs.py` hands the
op the rotary embedding's `fp4_compile::cos` / `sin` outputs). CPU: the
norms' reference then those torch ops (`rotary_reference`); CUDA: the Triton kernel of
`rms_norm_rotary_kernel.py`. Inference only: no autograd (the pass fuses only graphs that track
no gradient).
"""

from __future__ import annotations

import torch

from . import reference as cpu

_LIB = "fp4_compile"


def rotate_half(y: torch.Tensor) -> torch.Tensor:
    """transformers' rotate_half: cat(-y[..., D/2:], y[..., :D/2])."""
    half = y.shape[-1] // 2
    return torch.cat((-y[..., half:], y[..., :half]), dim=-1)


def rotary_reference(
    y: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, scaling: float
) -> torch.Tensor:
    """The model's torch ops on y [B, T, H, D] (normed heads), cos / sin [B | 1, T, D]: the tables
    scaled and cast to y's dtype, the heads transposed to [B, H, T, D], then
    (q * c) + (rotate_half(q) * s), each op rounded to y's dtype; contiguous."""
    c = (cos * scaling).to(y.dtype).unsqueeze(1)
    s = (sin * scaling).to(y.dtype).unsqueeze(1)
    q = y.transpose(1, 2)
    return ((q * c) + (rotate_half(q) * s)).contiguous()


def _check(a, a_weight, b, b_weight, cos, sin):
    if a.dim() != 4 or b.dim() != 4 or b.shape[:2] != a.shape[:2]:
        raise ValueError(
            f"a and b must be [B, T, heads, D] of the same B and T, got a "
            f"{tuple(a.shape)}, b {tuple(b.shape)}"
        )
    if b.shape[-1] != a.shape[-1] or b.dtype != a.dtype:
        raise ValueError(
            f"b must have a's row length and dtype ({a.shape[-1]}, {a.dtype}), got "
            f"{b.shape[-1]}, {b.dtype}"
        )
    if a.shape[-1] % 2:
        raise ValueError(f"the head dim must be even for the rotary, got {a.shape[-1]}")
    if (a_weight is None) != (b_weight is None):
        raise ValueError("a_weight and b_weight must both be given or both be None")
    want = [(a.shape[0], a.shape[1], a.shape[-1]), (1, a.shape[1], a.shape[-1])]
    for name, t in (("cos", cos), ("sin", sin)):
        if tuple(t.shape) not in want or t.shape != cos.shape:
            raise ValueError(f"{name} must be [B or 1, T, D] {list(want[0])}, got {list(t.shape)}")
        if t.dtype not in (a.dtype, torch.float32):
            raise ValueError(
                f"{name} must be float32 or a's dtype {a.dtype}, got {list(t.shape)} {t.dtype}"
            )


@torch.library.custom_op(f"{_LIB}::invariant_rms_norm_pair_rotary", mutates_args=())
def invariant_rms_norm_pair_rotary(
    a: torch.Tensor,
    a_weight: torch.Tensor | None,
    b: torch.Tensor,
    b_weight: torch.Tensor | None,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    scaling: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    _check(a, a_weight, b, b_weight, cos, sin)
    if a.is_cuda:
        from . import rms_norm_rotary_kernel  # lazy: imports triton

        ya, yb = rms_norm_rotary_kernel.rms_norm_pair_rotary(
            a, a_weight, b, b_weight, eps, cos, sin, scaling
        )
    else:
        ya = rotary_reference(cpu.rms_norm(a, a_weight, None, eps)[0], cos, sin, scaling)
        yb = rotary_reference(cpu.rms_norm(b, b_weight, None, eps)[0], cos, sin, scaling)
    return ya, yb


@invariant_rms_norm_pair_rotary.register_fake
def _(a, a_weight, b, b_weight, eps, cos, sin, scaling):
    _check(a, a_weight, b, b_weight, cos, sin)
    return a.new_empty(a.transpose(1, 2).shape), b.new_empty(b.transpose(1, 2).shape)
