"""`fp4_compile::invariant_rms_norm`, `::invariant_add_rms_norm` and their backward op.
Validation and documentation live in `invariant/api.py` (the public API).

Shape legend: M rows, H hidden.

- invariant_rms_norm(x, weight, eps) -> y;  invariant_add_rms_norm(x, residual, weight, eps)
  -> (y, h = x + residual);  invariant_rms_norm_backward(grad_y, h, weight, eps) -> (dh, dw)
- invariant_rms_norm_pair(a, a_weight, b, b_weight, eps) -> (invariant_rms_norm(a, a_weight,
  eps), invariant_rms_norm(b, b_weight, eps)) bit for bit, in ONE launch (an attention's q and
  k norms: rows of the same length H; `passes/pair_rms_norms.py`); its backward is the two
  norms' backward ops.
CPU: `invariant/reference.py` (invariant by construction). CUDA: the Triton kernel of
`invariant/rms_norm_kernel.py` (imported lazily); the backward one Triton launch
(`rms_norm_backward_kernel`).
"""

from __future__ import annotations

import torch

from . import reference as cpu

_LIB = "fp4_compile"


def _rms_forward(x, weight, residual, eps):
    if x.is_cuda:
        from . import rms_norm_kernel  # lazy: imports triton

        outs = rms_norm_kernel.rms_norm(x, weight, residual, eps)
    else:
        outs = cpu.rms_norm(x, weight, residual, eps)
    # the fakes promise contiguous outputs; h (x itself without a residual) only with one
    return tuple(o.contiguous() for o in outs[: 1 if residual is None else 2])


@torch.library.custom_op(f"{_LIB}::invariant_rms_norm", mutates_args=())
def invariant_rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    return _rms_forward(x, weight, None, eps)[0]


@invariant_rms_norm.register_fake
def _(x, weight, eps):
    return x.new_empty(x.shape)


@torch.library.custom_op(f"{_LIB}::invariant_add_rms_norm", mutates_args=())
def invariant_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return _rms_forward(x, weight, residual, eps)


@invariant_add_rms_norm.register_fake
def _(x, residual, weight, eps):
    return x.new_empty(x.shape), x.new_empty(x.shape)


@torch.library.custom_op(f"{_LIB}::invariant_rms_norm_backward", mutates_args=())
def invariant_rms_norm_backward(
    grad_y: torch.Tensor, h: torch.Tensor, weight: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dh, dweight); dweight is an empty tensor when weight is None. CUDA: one Triton launch
    (`rms_norm_backward`); CPU: plain PyTorch."""
    if h.is_cuda:
        from .rms_norm_backward_kernel import rms_norm_backward  # lazy: imports triton

        dh, dw = rms_norm_backward(grad_y, h, weight, eps)
    else:
        dh, dw = cpu.rms_norm_backward(grad_y, h, weight, eps)
    # contiguous whatever h's layout (the q/k norms of Gemma3 see a transposed view): the fake
    # promises it
    return dh.contiguous(), (h.new_empty(0) if dw is None else dw.contiguous())


@invariant_rms_norm_backward.register_fake
def _(grad_y, h, weight, eps):
    dw = h.new_empty(0) if weight is None else weight.new_empty(weight.shape)
    return h.new_empty(h.shape), dw


def _rms_setup(ctx, inputs, output):
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _rms_backward(ctx, grad_y):
    x, weight = ctx.saved_tensors
    dx, dw = invariant_rms_norm_backward(grad_y, x, weight, ctx.eps)
    return dx, (dw if weight is not None else None), None


invariant_rms_norm.register_autograd(_rms_backward, setup_context=_rms_setup)


def _add_rms_setup(ctx, inputs, output):
    _, residual, weight, eps = inputs
    ctx.save_for_backward(output[1], weight)
    ctx.eps = eps
    ctx.residual_dtype = residual.dtype


def _add_rms_backward(ctx, grad_y, grad_h):
    h, weight = ctx.saved_tensors
    dh, dw = invariant_rms_norm_backward(grad_y, h, weight, ctx.eps)
    dw = dw if weight is not None else None
    if grad_h is not None:
        dh = dh + grad_h
    return dh, dh.to(ctx.residual_dtype), dw, None


invariant_add_rms_norm.register_autograd(_add_rms_backward, setup_context=_add_rms_setup)


def _check_pair(a, a_weight, b, b_weight):
    if b.shape[-1] != a.shape[-1] or b.dtype != a.dtype:
        raise ValueError(
            f"b must have a's row length and dtype ({a.shape[-1]}, {a.dtype}), got "
            f"{b.shape[-1]}, {b.dtype}"
        )
    if (a_weight is None) != (b_weight is None):
        raise ValueError("a_weight and b_weight must both be given or both be None")


@torch.library.custom_op(f"{_LIB}::invariant_rms_norm_pair", mutates_args=())
def invariant_rms_norm_pair(
    a: torch.Tensor,
    a_weight: torch.Tensor | None,
    b: torch.Tensor,
    b_weight: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    _check_pair(a, a_weight, b, b_weight)
    if a.is_cuda:
        from . import rms_norm_kernel  # lazy: imports triton

        ya, yb = rms_norm_kernel.rms_norm_pair(a, a_weight, b, b_weight, eps)
    else:
        ya, yb = cpu.rms_norm(a, a_weight, None, eps)[0], cpu.rms_norm(b, b_weight, None, eps)[0]
    return ya.contiguous(), yb.contiguous()


@invariant_rms_norm_pair.register_fake
def _(a, a_weight, b, b_weight, eps):
    _check_pair(a, a_weight, b, b_weight)
    return a.new_empty(a.shape), b.new_empty(b.shape)


def _pair_setup(ctx, inputs, output):
    a, a_weight, b, b_weight, eps = inputs
    ctx.save_for_backward(a, a_weight, b, b_weight)
    ctx.eps = eps


def _pair_backward(ctx, grad_a, grad_b):
    a, a_weight, b, b_weight = ctx.saved_tensors
    grads = []
    for x, w, g in ((a, a_weight, grad_a), (b, b_weight, grad_b)):
        if g is None:
            grads += [None, None]
            continue
        dx, dw = invariant_rms_norm_backward(g, x, w, ctx.eps)
        grads += [dx, dw if w is not None else None]
    return grads[0], grads[1], grads[2], grads[3], None


invariant_rms_norm_pair.register_autograd(_pair_backward, setup_context=_pair_setup)
