"""`fp4_compile::cos` / `fp4_compile::sin`: the rotary embedding's cos and sin as opaque ops, so
the learner's compiled graph, the eager lowered graph, the rollout graphs and the vLLM plugin's
model class all compute them with ONE implementation: ATen's elementwise kernel of the input's
dtype on its device.

Why: left in the graph, Inductor generates cos / sin itself; on CPU its vectorized code (SLEEF)
rounds about 30% of FP32 cos values differently from ATen's eager kernel (measured here on
rotary angles and on uniform [-100, 100]). A rotary computed eagerly outside the graph (the vLLM
plugin's flattened step) then differs from the learner's by an ulp on those elements, and on
the rare element where that ulp moves q or k across a BF16 rounding boundary, a log-prob differs
(one of 512 in the Qwen3-MoE gap run; `tests/vllm_plugin/test_full_qwen3.py` keeps that request).
ATen's CPU kernels give every element the same bits whatever its offset, stride or the tensor's
length (checked in `tests/codegen/invariant/test_trig.py`), which is what a ragged rollout step needs.

Backward, eager autograd's formulas with these ops: d cos(x) = grad * -sin(x),
d sin(x) = grad * cos(x)."""

from __future__ import annotations

import torch


def _check(x: torch.Tensor, name: str) -> None:
    if not x.dtype.is_floating_point:
        raise TypeError(f"fp4_compile::{name} is for floating tensors, got x {x.dtype}")


@torch.library.custom_op("fp4_compile::cos", mutates_args=())
def cos(x: torch.Tensor) -> torch.Tensor:
    _check(x, "cos")
    return torch.cos(x)


@torch.library.custom_op("fp4_compile::sin", mutates_args=())
def sin(x: torch.Tensor) -> torch.Tensor:
    _check(x, "sin")
    return torch.sin(x)


@cos.register_fake
def _(x):
    _check(x, "cos")
    return torch.empty_like(x)


@sin.register_fake
def _(x):
    _check(x, "sin")
    return torch.empty_like(x)


def _save_input(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0])


def _cos_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * -torch.ops.fp4_compile.sin(x)


def _sin_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * torch.ops.fp4_compile.cos(x)


cos.register_autograd(_cos_backward, setup_context=_save_input)
sin.register_autograd(_sin_backward, setup_context=_save_input)
