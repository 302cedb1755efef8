"""`fp4_compile::moe_combine`: the MoE experts' top-k combine as ONE op,
  out[t] = ordered_sum over j < k of row_scale(x, w)[idx[t * k + j]]
(x [S, H] the experts' outputs sorted by expert, w [S, 1] their routing weights, idx [S] the
slots' rows in token order, S = T * k), which the lowering had as four ops
(`passes/fold_moe_combine.py`): `row_scale`, `gather_rows`, a view [T, k, H] and `ordered_sum`
over k. Bitwise their composition, by definition: the CPU implementation IS the composition of
their reference functions, and the CUDA kernels repeat their roundings step for step:
- forward: per token, each slot's product x[p] * w[p] in FP32, rounded to the result dtype
  (promote(x, w), as `row_scale`), summed in slot order from slot 0's value, every partial sum
  rounded to that dtype (`ordered_sum`); one pass over x instead of four over [S, H];
- backward: the gradient of row_scale's output is `gather_rows`' position-ordered FP32 sum of
  the slots' gradients, where slot q's gradient is grad[q // k] (`ordered_sum`'s backward is an
  expand): the sum reads grad's rows directly (no expanded [S, H] copy), then `row_scale`'s own
  backward (`row_scale_backward`: grad_x, and grad_w in its fixed tree order).
"""

from __future__ import annotations

import torch

from ..invariant.gather_rows import KERNEL_DTYPES as GATHER_KERNEL_DTYPES
from .reference import (
    ROW_SCALE_BLOCK,
    moe_combine_reference,
    row_scale_backward_reference,
    slot_grad_sums_reference,
)
from .row_scale import KERNEL_DTYPES as ROW_SCALE_KERNEL_DTYPES
from .row_scale import row_scale_backward

KERNEL_DTYPES = (torch.bfloat16, torch.float32)


def _check_inverse(idx: torch.Tensor, idx_inverse) -> None:
    """idx_inverse: int [S] with idx[idx_inverse[r]] == r for every r (so both are permutations
    of 0..S-1). Checked in full on the CPU; on CUDA (a check would synchronize, and a CUDA-graph
    capture refuses it) its shape and dtype only: the pass that attaches it proves it from the
    graph (`passes/attach_combine_inverse.py`)."""
    if idx_inverse is None:
        return
    if idx_inverse.dtype not in (torch.int32, torch.int64) or idx_inverse.shape != idx.shape:
        raise ValueError(
            f"idx_inverse must be int [S={idx.shape[0]}], got {idx_inverse.dtype} "
            f"{tuple(idx_inverse.shape)}"
        )
    if idx.device.type == "cpu" and idx.numel():
        s = idx.shape[0]
        valid = bool(((idx_inverse >= 0) & (idx_inverse < s)).all())
        if not valid or not torch.equal(idx[idx_inverse], torch.arange(s, dtype=idx.dtype)):
            raise ValueError(
                "idx_inverse must be the inverse permutation of idx "
                "(idx[idx_inverse[r]] == r for every r)"
            )


def check_combine_args(
    x: torch.Tensor, w: torch.Tensor, idx: torch.Tensor, k: int, row_mask=None
) -> None:
    if row_mask is not None and (
        row_mask.dtype != torch.bool
        or tuple(row_mask.shape) not in ((x.shape[0],), (x.shape[0], 1))
    ):
        raise ValueError(
            f"row_mask must be bool [S] or [S, 1] (S={x.shape[0]}), got "
            f"{row_mask.dtype} {tuple(row_mask.shape)}"
        )
    if x.dim() != 2 or not x.dtype.is_floating_point:
        raise ValueError(f"moe_combine needs x floating [S, H], got {x.dtype} {tuple(x.shape)}")
    if w.shape != (x.shape[0], 1) or not w.dtype.is_floating_point:
        raise ValueError(f"moe_combine needs w floating [S, 1], got {w.dtype} {tuple(w.shape)}")
    if idx.dim() != 1 or idx.shape[0] != x.shape[0] or idx.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"moe_combine needs idx int [S={x.shape[0]}], got {idx.dtype} {tuple(idx.shape)}"
        )
    if not isinstance(k, int) or k < 1 or x.shape[0] % k:
        raise ValueError(f"k must be a positive int dividing S={x.shape[0]}, got {k!r}")


@torch.library.custom_op("fp4_compile::moe_combine", mutates_args=())
def moe_combine(
    x: torch.Tensor,
    w: torch.Tensor,
    idx: torch.Tensor,
    k: int,
    row_mask: torch.Tensor | None = None,
    idx_inverse: torch.Tensor | None = None,
) -> torch.Tensor:
    """`row_mask` (bool [S] / [S, 1]): the combine of `x.masked_fill(row_mask, 0)` without that
    copy (transformers' sentinel post-mask folded in: `passes/fold_row_masks.py`).
    `idx_inverse` (int [S], idx[idx_inverse[r]] == r): idx is a permutation and this is its
    inverse; the forward does not read it, the backward reads each slot's gradient through it
    (one pass, no sort: `passes/attach_combine_inverse.py`), the same bits."""
    check_combine_args(x, w, idx, k, row_mask)
    _check_inverse(idx, idx_inverse)
    out_dtype = torch.promote_types(x.dtype, w.dtype)
    on_kernel = x.dtype in KERNEL_DTYPES and w.dtype in KERNEL_DTYPES
    if x.device.type == "cuda" and on_kernel and x.numel():
        from .combine_kernel import moe_combine_triton  # lazy: imports triton

        return moe_combine_triton(x, w, idx, k, out_dtype, row_mask)
    return moe_combine_reference(x, w, idx, k, row_mask).contiguous()


@moe_combine.register_fake
def _(x, w, idx, k, row_mask=None, idx_inverse=None):
    check_combine_args(x, w, idx, k, row_mask)
    out_dtype = torch.promote_types(x.dtype, w.dtype)
    return x.new_empty((x.shape[0] // k, x.shape[1]), dtype=out_dtype)


def slot_grad_sums_from_inverse(grad: torch.Tensor, idx_inverse: torch.Tensor, k: int):
    """`slot_grad_sums_reference` where idx is a permutation with inverse `idx_inverse`: each
    row's sum has ONE term, grad[idx_inverse[r] // k], added to the FP32 +0.0 it starts from
    (so -0.0 becomes +0.0) and rounded back (exact)."""
    rows = grad.index_select(0, torch.div(idx_inverse, k, rounding_mode="floor"))
    return (rows.to(torch.float32) + 0.0).to(grad.dtype)


def _fused_backward_kernel(grad, x, w, idx_inverse) -> bool:
    """The slot gradients read in place by `row_scale`'s backward kernel (CUDA, its dtypes)."""
    return (
        idx_inverse is not None
        and x.device.type == "cuda"
        and x.numel() > 0
        and all(t.dtype in ROW_SCALE_KERNEL_DTYPES for t in (grad, x, w))
    )


@torch.library.custom_op("fp4_compile::moe_combine_backward", mutates_args=())
def moe_combine_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    w: torch.Tensor,
    idx: torch.Tensor,
    k: int,
    row_mask: torch.Tensor | None = None,
    idx_inverse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_x in x.dtype, grad_w in w.dtype); with `row_mask`, through the folded masked_fill
    (masked rows: x read as zeros, grad_x +0.0). With `idx_inverse` (idx's inverse
    permutation) the slot sums are one term each, read in place: one kernel, no sort."""
    _check_inverse(idx, idx_inverse)
    if _fused_backward_kernel(grad, x, w, idx_inverse):
        from .row_scale_kernel import row_scale_backward_triton  # lazy: imports triton

        return row_scale_backward_triton(
            grad, x, w, ROW_SCALE_BLOCK, row_mask, grad_rows=idx_inverse, row_div=k
        )
    # the slot sums on the kernel for every dtype `gather_rows`' backward has one for (fp16 too:
    # its torch reference reads a count on the host, which a CUDA-graph capture refuses)
    if idx_inverse is not None:
        g1 = slot_grad_sums_from_inverse(grad, idx_inverse, k)
    elif grad.device.type == "cuda" and grad.dtype in GATHER_KERNEL_DTYPES and grad.numel():
        # lazy: imports triton
        from ..invariant.gather_rows_kernel import gather_rows_backward_triton

        g1 = gather_rows_backward_triton(grad, idx, x.shape[0], row_div=k)
    else:
        g1 = slot_grad_sums_reference(grad, idx, k)
    if row_mask is None:
        return row_scale_backward(g1, x, w)
    on_kernel = all(t.dtype in ROW_SCALE_KERNEL_DTYPES for t in (g1, x, w))
    if x.device.type == "cuda" and x.shape[-1] and on_kernel:
        from .row_scale_kernel import row_scale_backward_triton  # lazy: imports triton

        return row_scale_backward_triton(g1, x, w, ROW_SCALE_BLOCK, row_mask)
    return row_scale_backward_reference(g1, x, w, row_mask)


@moe_combine_backward.register_fake
def _(grad, x, w, idx, k, row_mask=None, idx_inverse=None):
    return torch.empty_like(x), torch.empty_like(w)


def _setup(ctx, inputs, output):
    x, w, idx, k, mask, inverse = inputs  # custom_op fills the defaults
    ctx.save_for_backward(x, w, idx, mask, inverse)
    ctx.k = k


def _backward(ctx, grad):
    x, w, idx, mask, inverse = ctx.saved_tensors
    grad_x, grad_w = moe_combine_backward(grad.contiguous(), x, w, idx, ctx.k, mask, inverse)
    return grad_x, grad_w, None, None, None, None


moe_combine.register_autograd(_backward, setup_context=_setup)
