"""`fp4_compile::invariant_grouped_mm`: the BF16 MoE experts GEMM of the bf16 recipe (and of
BF16-kept MoE layers): tokens sorted by expert with int32 group-end offsets (torch._grouped_mm's
convention), weights [E, N, K].

CPU: each group runs `invariant_linear` (the reference), so every row equals
`invariant_linear(row, weight[e])` whatever the other rows. CUDA: ONE launch for all experts, the
grouped W4A4 kernel in its BF16-operand mode with unit global scales (`gemm_kernel.launch_gemm`:
`(acc * 1) * 1` is `acc`), always with the same pinned tile config (no M bucket): a row's bits
depend only on its own values and its expert's weight, never on the batch. One launch, not a
loop of per-expert launches, whose host time dominated a rollout on the H200
(`benchmarks/results/2026-12-02_rollout_h200_profile_before_weight_cache.md`).

Shape legend: T tokens sorted by expert, K in-features, N out-features, E experts.
"""

from __future__ import annotations

import torch

from ..invariant import gather_rows, linear  # noqa: F401  (registers their ops)
from .reference import expert_groups, grouped_mm_reference


@torch.library.custom_op("fp4_compile::invariant_grouped_mm", mutates_args=())
def invariant_grouped_mm(
    x_TK: torch.Tensor,
    w_ENK: torch.Tensor,
    offsets: torch.Tensor,
    out_dtype: torch.dtype,
    x_index: torch.Tensor | None = None,
) -> torch.Tensor:
    """x_index (int64 / int32 [S], each in 0..rows of x - 1) given: the GEMM of x's rows
    x_index, `gather_rows(x, x_index)` read in the operand load (`passes/fold_expert_gathers.py`):
    the same values, so the same bits, without the gathered copy."""
    _check_index(x_TK, x_index)
    if offsets.dtype != torch.int32 or offsets.dim() != 1 or offsets.numel() != w_ENK.shape[0]:
        raise ValueError(
            f"offsets must be int32 [E={w_ENK.shape[0]}], got {offsets.dtype}{list(offsets.shape)}"
        )
    if x_TK.device.type == "cuda":
        return grouped_kernel(x_TK, w_ENK, offsets, out_dtype, x_index=x_index)
    if x_index is not None:
        x_TK = x_TK[x_index]
    return grouped_mm_reference(x_TK, w_ENK, offsets, out_dtype)


def _check_index(x_TK: torch.Tensor, x_index: torch.Tensor | None) -> None:
    if x_index is not None and (
        x_index.dim() != 1 or x_index.dtype not in (torch.int64, torch.int32)
    ):
        raise ValueError(
            f"x_index must be int64 / int32 [S], got {x_index.dtype}{list(x_index.shape)}"
        )


# the unit global scales of the BF16 mode, one FP32 1.0 per device, made once (outside any CUDA
# graph capture: a tensor made inside one holds nothing until a replay) instead of a fill kernel
# per call
_UNIT_SCALE: dict[torch.device, torch.Tensor] = {}


def unit_scale(device: torch.device) -> torch.Tensor:
    """FP32 [1] 1.0 on `device`, never written (see `_UNIT_SCALE`)."""
    one = _UNIT_SCALE.get(device)
    if one is None:
        one = torch.ones((1,), dtype=torch.float32, device=device)
        if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            _UNIT_SCALE[device] = one
    return one


def grouped_kernel(x_TK, w_ENK, offsets, out_dtype, *, x_index=None) -> torch.Tensor:
    """The one-launch BF16 grouped GEMM (CUDA, or CPU tensors under TRITON_INTERPRET=1);
    x_index: the rows of x it reads (the kernel's A_GATHER)."""
    from ..nvfp4.gemm_kernel import launch_gemm  # lazy: imports triton

    one = unit_scale(x_TK.device)
    # rows_per_group=1: the same pinned config for every call (batch invariance by construction)
    return launch_gemm(
        x_TK,
        one,
        w_ENK,
        one,
        out_dtype=out_dtype,
        offsets=offsets,
        rows_per_group=1,
        a_rows=x_index,
    )


@invariant_grouped_mm.register_fake
def _(x_TK, w_ENK, offsets, out_dtype, x_index=None):
    _check_index(x_TK, x_index)
    rows = x_TK.shape[0] if x_index is None else x_index.shape[0]
    return x_TK.new_empty((rows, w_ENK.shape[1]), dtype=out_dtype)


@torch.library.custom_op("fp4_compile::invariant_grouped_mm_backward", mutates_args=())
def invariant_grouped_mm_backward(
    grad: torch.Tensor, x_TK: torch.Tensor, w_ENK: torch.Tensor, offsets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """dX and dW per expert in FP32 (deterministic; reads the offsets on the host, so it is an
    opaque op rather than traced autograd)."""
    dx = torch.zeros_like(x_TK)
    dw = torch.zeros_like(w_ENK)
    for e, start, end in expert_groups(offsets):
        if end > start:
            g = grad[start:end].to(torch.float32)
            dx[start:end] = (g @ w_ENK[e].to(torch.float32)).to(x_TK.dtype)
            dw[e] = (g.T @ x_TK[start:end].to(torch.float32)).to(w_ENK.dtype)
    return dx, dw


@invariant_grouped_mm_backward.register_fake
def _(grad, x_TK, w_ENK, offsets):
    return x_TK.new_empty(x_TK.shape), w_ENK.new_empty(w_ENK.shape)


def _setup(ctx, inputs, output):
    x, w, offsets, _, x_index = inputs
    ctx.save_for_backward(x, w, offsets, x_index)


def _backward(ctx, grad):
    """x_index given: the gradient of `invariant_grouped_mm(gather_rows(x, x_index), ...)`,
    the gathered rows' dX summed into x's rows by `gather_rows`' own backward."""
    x, w, offsets, x_index = ctx.saved_tensors
    xg = x if x_index is None else x[x_index]
    dx, dw = invariant_grouped_mm_backward(grad.contiguous(), xg, w, offsets)
    if x_index is not None:
        dx = torch.ops.fp4_compile.gather_rows_backward(dx, x_index, x.shape[0])
    return dx, dw, None, None, None


invariant_grouped_mm.register_autograd(_backward, setup_context=_setup)
