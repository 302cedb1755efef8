"""`fp4_compile::repeat_kv`: grouped-query attention's key/value repeat, x [B, H, 1, T, D] ->
[B, H * n_rep, T, D] (head h * n_rep + r is head h), with an opaque backward that sums the
n_rep gradient copies in a fixed written-out order: ((g0 + g1) + g2) + ... in FP32, one rounding
to x's dtype at the end. Left to autograd, `expand`'s backward is a stock sum over the group,
reduced in one order by eager ATen and in another by Inductor's generated kernel: the dK / dV of
every GQA layer could differ in the last bit between a compiled step and the eager lowered graph
(the bf16 recipe's 30B-shaped row at 4096 tokens on the H200). The forward is a copy:
its bits are the inputs' (on CUDA one Triton pass, `repeat_kv_kernel`). On CUDA (FP32, BF16) the backward is one Triton pass
(`group_sum_kernel`), the same roundings."""

from __future__ import annotations

import torch


def _check(x: torch.Tensor, n_rep: int) -> None:
    if x.dim() != 5 or x.shape[2] != 1:
        raise ValueError(f"repeat_kv needs x of shape [B, H, 1, T, D], got {tuple(x.shape)}")
    if not isinstance(n_rep, int) or n_rep < 1:
        raise ValueError(f"n_rep must be a positive int, got {n_rep!r}")


@torch.library.custom_op("fp4_compile::repeat_kv", mutates_args=())
def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    _check(x, n_rep)
    b, h, _, t, d = x.shape
    if x.device.type == "cuda":  # one read, vector stores (the stock copy of the expand is scalar)
        from .repeat_kv_kernel import repeat_rows

        return repeat_rows(x.reshape(b * h, 1, t * d), n_rep).reshape(b, h * n_rep, t, d)
    return x.expand(b, h, n_rep, t, d).reshape(b, h * n_rep, t, d).contiguous()


@repeat_kv.register_fake
def _(x, n_rep):
    _check(x, n_rep)
    b, h, _, t, d = x.shape
    return x.new_empty((b, h * n_rep, t, d))


@torch.library.custom_op("fp4_compile::repeat_kv_backward", mutates_args=())
def repeat_kv_backward(grad: torch.Tensor, n_rep: int, x_dtype: torch.dtype) -> torch.Tensor:
    """grad [B, H * n_rep, T, D] -> [B, H, 1, T, D] in x_dtype: the group's copies summed in
    order r = 0, 1, ..., n_rep - 1, in FP32, then one rounding."""
    b, hn, t, d = grad.shape
    if hn % n_rep:
        raise ValueError(f"grad has {hn} heads, not a multiple of n_rep={n_rep}")
    from .group_sum_kernel import KERNEL_DTYPES, group_sum

    if grad.device.type == "cuda" and grad.dtype in KERNEL_DTYPES and x_dtype in KERNEL_DTYPES:
        out = group_sum(grad.reshape(b * (hn // n_rep), n_rep, t * d), round_each=False,
                        out_dtype=x_dtype)  # fmt: skip
        return out.reshape(b, hn // n_rep, 1, t, d)
    return repeat_kv_backward_torch(grad, n_rep, x_dtype)


def repeat_kv_backward_torch(grad: torch.Tensor, n_rep: int, x_dtype: torch.dtype):
    """The backward's math as torch ops (CPU; the kernel's reference)."""
    b, hn, t, d = grad.shape
    g = grad.reshape(b, hn // n_rep, n_rep, t, d)
    acc = g[:, :, 0].to(torch.float32)
    for r in range(1, n_rep):
        acc = acc + g[:, :, r].to(torch.float32)
    return acc.to(x_dtype).unsqueeze(2).contiguous()


@repeat_kv_backward.register_fake
def _(grad, n_rep, x_dtype):
    b, hn, t, d = grad.shape
    return grad.new_empty((b, hn // n_rep, 1, t, d), dtype=x_dtype)


def _setup(ctx, inputs, output):
    x, n_rep = inputs
    ctx.n_rep, ctx.x_dtype = n_rep, x.dtype


def _backward(ctx, grad):
    return repeat_kv_backward(grad.contiguous(), ctx.n_rep, ctx.x_dtype), None


repeat_kv.register_autograd(_backward, setup_context=_setup)
