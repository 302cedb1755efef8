"""The grouped (MoE experts) NVFP4 GEMM of the `fp4_compile::` namespace: registrations, fake
(meta) kernels, autograd.

Shape legend: T tokens sorted by expert, K in-features, N out-features, E experts.

Ops (each a `torch.library.custom_op`: opaque to Dynamo and Inductor, which keeps one registered
boundary per GEMM and compiles on CPU, where `triton_op`/`wrap_triton` cannot):
- nvfp4_grouped_mm(x, weight, w_codes, w_scales, w_global_decode, offsets, x_amax, recipe, w_ongrid,
  site, x_index, x_perm) -> y, registered from `gemm_call`'s table (`register_gemm`)
- nvfp4_grouped_mm_backward: the backward GEMMs (autograd calls it).
Arguments as `linear.nvfp4_linear`'s (`site`, `recipe`, `w_scales`, `weight`, `w_ongrid`), plus the
int32 group-end `offsets` [E]. CPU implementations are the reference; CUDA ones the Triton kernels
(imported lazily).
"""

from __future__ import annotations

import torch

from ... import reference as ref
from ...sr_stream import site_seed
from ..invariant.gather_rows import gather_rows_backward
from . import gemm as impl
from .gemm_call import GemmCall, input_grads, needs_input_grad, op_inputs, register_gemm
from .linear import backward_seed

_LIB = "fp4_compile"


def _check_grouped(x, offsets, num_experts, x_index=None, x_perm=None, data=True):
    if x_perm is not None:
        from .expert_gather_backward_kernel import check_perm_precondition  # lazy: imports triton

        if x_index is None:
            raise ValueError("x_perm needs x_index (it describes the gather)")
        check_perm_precondition(x_index, x_perm, x.shape[0], data=data)
    if x.dim() != 2:
        raise ValueError(f"x must be [T, K] (tokens sorted by expert), got {tuple(x.shape)}")
    if x_index is not None and (
        x_index.dim() != 1 or x_index.dtype not in (torch.int32, torch.int64)
    ):
        raise ValueError(
            f"x_index must be int32/int64 [T], got {x_index.dtype}{list(x_index.shape)}"
        )
    if not isinstance(offsets, torch.Tensor) or offsets.dtype != torch.int32:
        raise TypeError(
            f"offsets must be an int32 tensor, got {getattr(offsets, 'dtype', offsets)}"
        )
    if offsets.dim() != 1 or offsets.numel() != num_experts:
        raise ValueError(f"offsets must have shape [{num_experts}], got {tuple(offsets.shape)}")


def _groups(offsets: torch.Tensor):
    """(expert, start, end) of each non-empty group (a host read: CPU path and MoE wgrad)."""
    start = 0
    for e, end in enumerate(offsets.cpu().tolist()):
        if end > start:
            yield e, start, end
        start = end


def _grouped_forward(call: GemmCall) -> torch.Tensor:
    """`nvfp4_grouped_mm`: the experts' GEMM over tokens sorted by expert: x [T, K], or (x_index given) the rows
    x[x_index], a zero row where x_index < 0 (the MoE token gather and its masked rows folded
    in, `passes/fold_expert_gathers.py`: bitwise the op on the gathered copy, its backward
    returning the gradient of x with `gather_rows`' position-ordered sums). `x_perm`: the sort
    permutation the gather index came from (x_index[q] == x_perm[q] // k wherever
    x_index[q] >= 0, k = S / T): the forward does not read it; the backward finds each row's
    positions through its inverse instead of sorting x_index (`expert_gather_backward_kernel.py`),
    the same bits."""
    x, offsets, x_amax, w_ongrid, rec = (
        call.x,
        call.offsets,
        call.x_amax,
        call.w_ongrid,
        call.recipe,
    )
    x_index, x_perm = call.x_index, call.x_perm
    w_codes, w_scales, w_global_decode = call.weight_operand()
    n, k = impl.check_weight(x, w_codes, w_scales, w_global_decode, experts=True, w_ongrid=w_ongrid)
    _check_grouped(x, offsets, w_codes.shape[0], x_index, x_perm)
    if x.device.type == "cuda":
        return impl.cuda_linear(
            x,
            w_codes,
            w_scales,
            w_global_decode,
            w_ongrid,
            None,
            rec,
            x_amax,
            offsets=offsets,
            x_index=x_index,
        )
    if x_index is not None:
        x = impl.gather_zero_rows(x, x_index)
    ref.check_offsets(offsets, x.shape[0], w_codes.shape[0])
    w = impl.weight_tensor(w_codes, w_scales, w_global_decode, n, k)
    xq = ref.quantize(
        x, block="1x16", global_scale=impl.act_global(rec, x_amax), check_finite=False
    )
    return ref.nvfp4_grouped_mm(xq, w, offsets).to(x.dtype)


def _grouped_fake(call: GemmCall) -> torch.Tensor:
    x, x_index, w = call.x, call.x_index, call.weight_operand()
    n, _ = impl.check_weight(x, *w, experts=True, w_ongrid=call.w_ongrid)
    _check_grouped(x, call.offsets, w.codes.shape[0], x_index, call.x_perm, data=False)
    return x.new_empty((x.shape[0] if x_index is None else x_index.shape[0], n))


def _scatter_gathered(
    dx_g: torch.Tensor, x_index: torch.Tensor, rows: int, *, x_perm: torch.Tensor | None = None
) -> torch.Tensor:
    """The gradient of x from that of `gather_zero_rows(x, x_index)`: `gather_rows_backward`'s
    position-ordered sums, a zero row's positions sent to one extra row that is dropped. The
    same bits as masking those positions' gradients to +0.0 and summing them in (the unfolded
    graph: masked_fill's backward, then the gather's): each sum starts from +0.0, so it is never
    -0.0, and adding +0.0 to it changes no bit. With x_perm (CUDA, bf16 / fp32): each row's
    positions found through perm's inverse, no sort (`expert_gather_backward_kernel.py`)."""
    if (
        x_perm is not None
        and dx_g.device.type == "cuda"
        and dx_g.dtype in (torch.bfloat16, torch.float32)
    ):
        # lazy: imports triton
        from .expert_gather_backward_kernel import expert_gather_backward_triton

        return expert_gather_backward_triton(dx_g, x_index, x_perm, rows)
    idx = torch.where(x_index >= 0, x_index, rows)
    return gather_rows_backward(dx_g, idx, rows + 1)[:rows]


@torch.library.custom_op(f"{_LIB}::nvfp4_grouped_mm_backward", mutates_args=())
def nvfp4_grouped_mm_backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    w_codes: torch.Tensor,
    w_scales: torch.Tensor,
    w_global_decode: torch.Tensor,
    offsets: torch.Tensor,
    w_ongrid: torch.Tensor | None,
    recipe: str,
    seed: int,
    needs_x: bool,
    needs_w: bool,
    x_index: torch.Tensor | None = None,
    x_perm: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (dX [T, K] in x.dtype or [0], dW [E, N, K] in weight.dtype or [0]). dY is quantized over all T
    tokens for dgrad; wgrad quantizes each expert's dY_e^T and X_e^T separately (seed + 1 + e).
    `seed` is the call site's stream key, as in nvfp4_linear_backward. With `x_index` the
    forward's rows were x[x_index]: dX is the gradient of x (`gather_rows_backward` of the
    gathered rows' gradient) and the wgrad reads X^T through the index."""
    rec = impl.op_recipe(recipe)
    seed = backward_seed(seed, x.device)
    n, k = impl.check_weight(x, w_codes, w_scales, w_global_decode, experts=True, w_ongrid=w_ongrid)
    num_experts = w_codes.shape[0]
    cuda = x.device.type == "cuda"
    x_src = x
    if x_index is not None and not cuda:
        x = impl.gather_zero_rows(x, x_index)  # the reference path works on the gathered copy
    rows = x.shape[0] if x_index is None else x_index.shape[0]
    dx, dw = x.new_empty((0,)), x.new_empty((0,), dtype=weight.dtype)
    dy_rows = dy_amax = None
    if (
        cuda
        and needs_x
        and needs_w
        and rec.dgrad == "nvfp4"
        and rec.wgrad == "nvfp4"
        and rec.grad.global_scale == "per_tensor"
        and grad_out.numel()
    ):
        # one read of dY for both amaxes: the dgrad's per tensor (the max of the row maxima,
        # as `tensor_abs_max`) and the wgrad's per expert (each expert's max of its rows')
        from .abs_max_kernel import row_abs_max, vector_abs_max  # lazy: imports triton

        dy_rows = row_abs_max(grad_out)
        dy_amax = vector_abs_max(dy_rows)
    if needs_x:
        if cuda and rec.dgrad == "nvfp4":
            dx = impl.cuda_dgrad(
                grad_out,
                w_codes,
                w_scales,
                w_global_decode,
                w_ongrid,
                weight,
                rec,
                seed,
                offsets=offsets,
                out_dtype=x.dtype,
                dy_amax=dy_amax,
            )
        else:
            dx = torch.zeros((rows, k), dtype=torch.float32, device=x.device)
            dyq = None if rec.dgrad == "bf16" else impl.q_grad(grad_out, rec, seed)
            w = impl.weight_tensor(w_codes, w_scales, w_global_decode, n, k)
            for e, s, t in _groups(offsets):
                if rec.dgrad == "bf16":
                    dx[s:t] = impl.cpu_dgrad(grad_out[s:t], None, weight[e], rec, seed)
                else:
                    w_e = w[e]
                    w_e = impl.weight_tensor(
                        w_e.codes,
                        w_e.block_scales.view(torch.uint8),
                        w_e.global_decode.reshape(()),
                        n,
                        k,
                    )
                    dx[s:t] = ref.nvfp4_mm(dyq[s:t], impl.transpose_tiled(w_e))
            dx = dx.to(x.dtype)
        if x_index is not None:  # the gradient of x: each row's gathered copies summed
            dx = _scatter_gathered(dx, x_index, x_src.shape[0], x_perm=x_perm)
    if needs_w and cuda and rec.wgrad == "nvfp4":  # all experts at once, == the loop below
        from .grouped_wgrad_kernel import grouped_wgrad  # lazy: imports triton

        dw = grouped_wgrad(
            grad_out,
            x,
            offsets,
            rec,
            seed,
            out_dtype=weight.dtype,
            dy_row_amax=dy_rows,
            x_index=x_index,
        )
    elif needs_w:
        if x_index is not None and cuda:
            x = impl.gather_zero_rows(x, x_index)
        dw = torch.zeros((num_experts, n, k), dtype=torch.float32, device=x.device)
        wgrad = impl.cuda_wgrad if cuda else impl.cpu_wgrad
        for e, s, t in _groups(offsets):
            dw[e] = wgrad(grad_out[s:t], x[s:t], rec, seed + 1 + e)
        dw = dw.to(weight.dtype)
    return dx, dw


@nvfp4_grouped_mm_backward.register_fake
def _(
    grad_out,
    x,
    weight,
    w_codes,
    w_scales,
    w_global_decode,
    offsets,
    w_ongrid,
    recipe,
    seed,
    needs_x,
    needs_w,
    x_index=None,
    x_perm=None,
):
    e, (n, k) = w_codes.shape[0], impl.weight_nk(w_codes, w_ongrid)
    dx = x.new_empty(x.shape) if needs_x else x.new_empty((0,))
    dw = x.new_empty((e, n, k) if needs_w else (0,), dtype=weight.dtype)
    return dx, dw


def grouped_setup_context(ctx, inputs, output, *, op_name: str = "nvfp4_grouped_mm"):
    """Autograd's context of `op_name` (nvfp4_grouped_mm or its `_quantized` twin, whose
    backward is this one's)."""
    a = op_inputs(op_name, inputs)
    ctx.save_for_backward(
        *(
            a[n]
            for n in (
                "x",
                "weight",
                "w_codes",
                "w_scales",
                "w_global_decode",
                "offsets",
                "w_ongrid",
                "x_index",
                "x_perm",
            )
        )
    )
    ctx.recipe = a["recipe"]
    ctx.site = a["site"]
    ctx.weight_dtype = a["weight"].dtype
    ctx.op_name = op_name


def grouped_backward(ctx, grad_out):
    """The gradients of x and the master weight (`nvfp4_grouped_mm_backward`), by name."""
    x, weight, w_codes, w_scales, w_gd, offsets, w_ongrid, x_index, x_perm = ctx.saved_tensors
    needs = needs_input_grad(ctx.op_name, ctx.needs_input_grad)
    rec = impl.op_recipe(ctx.recipe)
    dx, dw = torch.ops.fp4_compile.nvfp4_grouped_mm_backward(
        grad_out,
        x,
        weight,
        w_codes,
        w_scales,
        w_gd,
        offsets,
        w_ongrid,
        ctx.recipe,
        site_seed(rec.seed, ctx.site),
        needs["x"],
        needs["weight"],
        x_index,
        x_perm,
    )
    dx = dx if needs["x"] else None
    dw = dw.to(ctx.weight_dtype) if needs["weight"] else None
    return input_grads(ctx.op_name, x=dx, weight=dw)


nvfp4_grouped_mm = register_gemm(
    "nvfp4_grouped_mm",
    _grouped_forward,
    _grouped_fake,
    setup_context=grouped_setup_context,
    backward=grouped_backward,
)
