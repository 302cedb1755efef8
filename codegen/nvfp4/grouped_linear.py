"""The NVFP4 ops of the `fp4_compile::` namespace: registrations, fake (meta) kernels, autograd.

Shape legend: M tokens, T tokens sorted by expert, K in-features, N out-features, E experts.

Ops (each a `torch.library.custom_op`: opaque to Dynamo and Inductor, which keeps one registered
boundary per GEMM and compiles on CPU, where `triton_op`/`wrap_triton` cannot):
- quantize(x, block, global_scale, static_amax, rounding, seed) -> (codes, block_scales, global_decode)
- nvfp4_linear(x, weight, w_codes, w_scales, w_global_decode, bias, x_amax, recipe, w_ongrid, site) -> y
- nvfp4_grouped_mm(x, weight, w_codes, w_scales, w_global_decode, offsets, x_amax, recipe, w_ongrid,
  site)
`site` (`sr_stream.site_id` of the GEMM's module path, set by the lowering) keys the backward's
stochastic-rounding streams; it does not change the forward.
- nvfp4_linear_backward / nvfp4_grouped_mm_backward: the backward GEMMs (autograd calls them).
- quantize_with_ongrid(same as quantize) -> (codes, block_scales, global_decode, on-grid BF16 copy):
  the lowering's weight quantize where the forward runs the on-grid GEMM (one kernel on CUDA).
- ongrid_weight(w_codes, w_scales) -> the on-grid BF16 copy of a quantized weight (E2M1 x E4M3,
  no global scale; exact), which the lowering passes as `w_ongrid` where the forward runs the
  on-grid GEMM: dequantized once per step, saved for the dgrad instead of decoded again there.
`w_scales` holds the E4M3 scale BYTES as uint8 (`.view(torch.uint8)`: float8 arguments break
opcheck's schema test on CPU); `recipe` is the recipe's numerics key (`NVFP4Recipe.numerics_key`; position `op_args.GemmArg.NUMERICS`); `weight` is the high-precision master
weight, passed so that autograd returns its gradient (straight-through); `w_ongrid` optionally holds
the on-grid BF16 copy of the quantized weight (same values, faster GEMM on CUDA).
CPU implementations are the reference; CUDA ones the Triton kernels (imported lazily).
"""

from __future__ import annotations

import torch

from ... import reference as ref
from ...format import BLOCK_SIZE, decode_e2m1, unpack_codes
from ...sr_stream import DeviceSeed, call_seed, site_seed
from ..invariant.gather_rows import gather_rows_backward
from . import gemm as impl
from .op_args import GemmArg as Arg
from .weight_cache import active_cache

_LIB = "fp4_compile"


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


def capturing(device: torch.device) -> bool:
    """True while `device`'s current stream is capturing a CUDA graph."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def backward_seed(site_key: int, device: torch.device) -> int | DeviceSeed:
    """This call's stochastic-rounding seed: from the site's host counter (`call_seed`), or,
    inside a CUDA-graph capture, from its device counter (a `DeviceSeed`, bitwise
    `sr_stream.device_call_seed`, in one launch): a replay runs no Python, so only a counter the
    graph itself advances gives each replay fresh noise."""
    if capturing(device):
        from .device_seed_kernel import next_device_seed

        return next_device_seed(site_key, device)
    return call_seed(site_key)


# ---------------------------------------------------------------------------------------------
# quantize


def _quantize_global(x, global_scale, static_amax):
    if global_scale == "static":
        if static_amax is None:
            raise ValueError("global_scale='static' needs static_amax (float32)")
        return static_amax
    if global_scale not in ("per_tensor", "per_row", "per_expert"):
        raise ValueError(
            f"global_scale must be 'per_tensor', 'per_row', 'per_expert' or 'static', got {global_scale!r}"
        )
    return global_scale


@torch.library.custom_op(f"{_LIB}::quantize", mutates_args=())
def quantize(
    x: torch.Tensor,
    block: str,
    global_scale: str,
    static_amax: torch.Tensor | None,
    rounding: str,
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gs = _quantize_global(x, global_scale, static_amax)
    cached = _cached_weight(x, block, gs, rounding, seed)
    return cached if cached is not None else _quantize_impl(x, block, gs, rounding, seed)


def _cached_weight(x, block, gs, rounding, seed):
    """The rollout weight cache's (codes, scales, global decode) of x when a cache is active
    and x is a weight it holds (16x16, RNE, a data amax), computed on a miss; else None."""
    cache = active_cache()
    if cache is None or block != "16x16" or rounding != "rne" or not isinstance(gs, str):
        return None
    return cache.get(x, gs, lambda: _quantize_impl(x, block, gs, rounding, seed))


def _no_packed_bytes(x):
    """The (codes, block scales) of a weight quantized on-grid only: [..., N, 0] each, shapes
    that say so (`gemm.check_weight` then takes K from the on-grid copy)."""
    lead = x.shape[:-1]
    return (x.new_empty((*lead, 0), dtype=torch.uint8),
            x.new_empty((*lead, 0), dtype=torch.float8_e4m3fn))  # fmt: skip


def _quantize_impl(x, block, gs, rounding, seed, with_ongrid=False, packed=True):
    """-> (codes, block scales, global decode), plus the on-grid BF16 values when with_ongrid
    (on CUDA from the same kernel pass); packed=False (with with_ongrid): the on-grid values
    only, codes and scales empty (`_no_packed_bytes`)."""
    if x.device.type == "cuda":
        from .quantize_kernel import quantize_triton

        if isinstance(gs, torch.Tensor) and gs.numel() > 1:
            gs = gs.reshape(-1, 1, 1)
        if with_ongrid and not packed:
            ongrid, gd = quantize_triton(x, block=block, global_scale=gs, rounding=rounding,
                                         seed=seed, out="ongrid")  # fmt: skip
            return (*_no_packed_bytes(x), gd.contiguous(), ongrid)
        q = quantize_triton(x, block=block, global_scale=gs, rounding=rounding, seed=seed,
                            out="both" if with_ongrid else "packed")  # fmt: skip
        if with_ongrid:
            q, ongrid = q
            return q.codes, q.block_scales, q.global_decode, ongrid
    elif gs == "per_expert" or (isinstance(gs, torch.Tensor) and gs.numel() > 1):
        if block != "16x16":
            raise ValueError("per-expert global scales are for 16x16 expert weights [E, N, K]")
        q = ref.quantize_experts(x, global_amax_E=None if gs == "per_expert" else gs.reshape(-1))
    else:
        q = ref.quantize(x, block=block, global_scale=gs, rounding=rounding, seed=seed,
                         check_finite=False)  # fmt: skip
    if with_ongrid:
        scale_bytes = q.block_scales.view(torch.uint8)
        ongrid = ongrid_weight(q.codes, scale_bytes)
        codes, scales = (q.codes, q.block_scales) if packed else _no_packed_bytes(x)
        return codes, scales, q.global_decode, ongrid
    return q.codes, q.block_scales, q.global_decode


@quantize.register_fake
def _quantize_fake(x, block, global_scale, static_amax, rounding, seed):
    k = x.shape[-1]
    codes = x.new_empty((*x.shape[:-1], k // 2), dtype=torch.uint8)
    scales = x.new_empty((*x.shape[:-1], k // BLOCK_SIZE), dtype=torch.float8_e4m3fn)
    if global_scale == "per_row":
        gd = x.new_empty((*x.shape[:-1], 1), dtype=torch.float32)
    elif global_scale == "per_expert" or (static_amax is not None and static_amax.numel() > 1):
        gd = x.new_empty((x.shape[0], 1, 1), dtype=torch.float32)
    else:
        gd = x.new_empty((), dtype=torch.float32)
    return codes, scales, gd


# ---------------------------------------------------------------------------------------------
# ongrid_weight


def _check_packed_weight(w_codes, w_scales):
    if not isinstance(w_codes, torch.Tensor) or w_codes.dtype != torch.uint8 or w_codes.dim() < 2:
        raise TypeError(
            f"w_codes must be packed E2M1 codes, uint8 [.., N, K/2], got "
            f"{getattr(w_codes, 'dtype', w_codes)}{list(getattr(w_codes, 'shape', []))}"
        )
    impl.require_packed_bytes(w_codes)
    k = w_codes.shape[-1] * 2
    want = (*w_codes.shape[:-1], k // BLOCK_SIZE)
    if not isinstance(w_scales, torch.Tensor) or w_scales.dtype != torch.uint8:
        raise TypeError(f"w_scales must be the E4M3 scale bytes as uint8, got {w_scales!r:.80}")
    if k % BLOCK_SIZE or tuple(w_scales.shape) != want:
        raise ValueError(
            f"w_scales shape {tuple(w_scales.shape)} does not match w_codes "
            f"{tuple(w_codes.shape)} (want {want}, K a multiple of {BLOCK_SIZE})"
        )
    return k


@torch.library.custom_op(f"{_LIB}::ongrid_weight", mutates_args=())
def ongrid_weight(w_codes: torch.Tensor, w_scales: torch.Tensor) -> torch.Tensor:
    k = _check_packed_weight(w_codes, w_scales)
    if w_codes.device.type == "cuda":
        from .gemm_kernel import ongrid_weight as kernel

        return kernel(w_codes.contiguous(), w_scales.contiguous())
    values = decode_e2m1(unpack_codes(w_codes))
    scales = w_scales.view(torch.float8_e4m3fn).to(torch.float32)
    out = values * scales.repeat_interleave(BLOCK_SIZE, dim=-1)  # exact (<= 6 significant bits)
    return out.reshape(*w_codes.shape[:-1], k).to(torch.bfloat16)


@ongrid_weight.register_fake
def _(w_codes, w_scales):
    k = _check_packed_weight(w_codes, w_scales)
    return w_codes.new_empty((*w_codes.shape[:-1], k), dtype=torch.bfloat16)


@torch.library.custom_op(f"{_LIB}::quantize_with_ongrid", mutates_args=())
def quantize_with_ongrid(
    x: torch.Tensor,
    block: str,
    global_scale: str,
    static_amax: torch.Tensor | None,
    rounding: str,
    seed: int,
    packed: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`quantize` (same arguments, same first three outputs) plus the on-grid BF16 copy of the
    result, `ongrid_weight(codes, scales)`: on CUDA both from one read of x (one kernel instead
    of quantize, then a second pass decoding the packed bytes). packed=False: no packed bytes
    (codes and scales [..., N, 0]), for a graph whose GEMMs all read the on-grid copy (the
    learner's: `passes/skip_unread_packed_weights.py`); the copy and global decode unchanged."""
    gs = _quantize_global(x, global_scale, static_amax)
    cached = _cached_weight(x, block, gs, rounding, seed)
    if cached is not None:
        codes, scales, gd = cached
        ongrid = ongrid_weight(codes, scales.view(torch.uint8))
        return (codes, scales, gd, ongrid) if packed else (*_no_packed_bytes(x), gd, ongrid)
    return _quantize_impl(x, block, gs, rounding, seed, with_ongrid=True, packed=packed)


@quantize_with_ongrid.register_fake
def _(x, block, global_scale, static_amax, rounding, seed, packed=True):
    codes, scales, gd = _quantize_fake(x, block, global_scale, static_amax, rounding, seed)
    if not packed:
        codes, scales = _no_packed_bytes(x)
    return codes, scales, gd, x.new_empty(x.shape, dtype=torch.bfloat16)


# ---------------------------------------------------------------------------------------------
# nvfp4_linear


@torch.library.custom_op(f"{_LIB}::nvfp4_linear", mutates_args=())
def nvfp4_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    w_codes: torch.Tensor,
    w_scales: torch.Tensor,
    w_global_decode: torch.Tensor,
    bias: torch.Tensor | None,
    x_amax: torch.Tensor | None,
    recipe: str,
    w_ongrid: torch.Tensor | None = None,
    site: int = 0,
) -> torch.Tensor:
    rec = impl.op_recipe(recipe)
    n, k = impl.check_weight(x, w_codes, w_scales, w_global_decode, experts=False,
                             w_ongrid=w_ongrid)  # fmt: skip
    x2 = _flat(x)
    if x.device.type == "cuda":
        y = impl.cuda_linear(x2, w_codes, w_scales, w_global_decode, w_ongrid, bias, rec, x_amax)
    else:
        w = impl.weight_tensor(w_codes, w_scales, w_global_decode, n, k)  # needs packed bytes
        y = impl.cpu_linear(x2, w, bias, rec, x_amax)
    return y.reshape(*x.shape[:-1], n)


@nvfp4_linear.register_fake
def _(x, weight, w_codes, w_scales, w_global_decode, bias, x_amax, recipe, w_ongrid=None, site=0):
    n, _ = impl.check_weight(x, w_codes, w_scales, w_global_decode, experts=False,
                             w_ongrid=w_ongrid)  # fmt: skip
    return x.new_empty((*x.shape[:-1], n))


@torch.library.custom_op(f"{_LIB}::nvfp4_linear_backward", mutates_args=())
def nvfp4_linear_backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    w_codes: torch.Tensor,
    w_scales: torch.Tensor,
    w_global_decode: torch.Tensor,
    w_ongrid: torch.Tensor | None,
    recipe: str,
    seed: int,
    needs_x: bool,
    needs_w: bool,
    needs_bias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (dX in x.dtype or [0], dW [N, K] in weight.dtype or [0], dbias float32 [N] or [0]).
    `seed` is the call site's stream key (`sr_stream.site_seed`); each call draws a fresh seed
    from it (`sr_stream.call_seed`), so steps and layers never share rounding noise."""
    rec = impl.op_recipe(recipe)
    seed = backward_seed(seed, x.device)
    n, k = impl.check_weight(x, w_codes, w_scales, w_global_decode, experts=False,
                             w_ongrid=w_ongrid)  # fmt: skip
    dy2, x2 = _flat(grad_out), _flat(x)
    cuda = x.device.type == "cuda"
    empty = x.new_empty((0,), dtype=torch.float32)
    dx, dw, db = x.new_empty((0,)), empty, empty
    dy_amax = impl.grad_amax(dy2, rec) if cuda and needs_x and needs_w else None
    if needs_x:
        if cuda:
            dx2 = impl.cuda_dgrad(dy2, w_codes, w_scales, w_global_decode, w_ongrid, weight, rec,
                                  seed, out_dtype=x.dtype, dy_amax=dy_amax)  # fmt: skip
        else:
            w = impl.weight_tensor(w_codes, w_scales, w_global_decode, n, k)
            dx2 = impl.cpu_dgrad(dy2, w, weight, rec, seed)
        dx = dx2.to(x.dtype).reshape(x.shape)
    if needs_w:
        if cuda:
            dw = impl.cuda_wgrad(dy2, x2, rec, seed + 1, out_dtype=weight.dtype, dy_amax=dy_amax)
        else:
            dw = impl.cpu_wgrad(dy2, x2, rec, seed + 1).to(weight.dtype)
    if needs_bias:
        db = dy2.to(torch.float32).sum(0)
    return dx, dw, db


@nvfp4_linear_backward.register_fake
def _(grad_out, x, weight, w_codes, w_scales, w_global_decode, w_ongrid, recipe, seed,
      needs_x, needs_w, needs_bias):  # fmt: skip
    n, k = impl.weight_nk(w_codes, w_ongrid)
    dx = x.new_empty(x.shape) if needs_x else x.new_empty((0,))
    dw = x.new_empty((n, k) if needs_w else (0,), dtype=weight.dtype)
    db = x.new_empty((n,) if needs_bias else (0,), dtype=torch.float32)
    return dx, dw, db


def _linear_setup_context(ctx, inputs, output):
    x, weight, w_codes, w_scales, w_gd, bias, x_amax, recipe, w_ongrid, site = inputs
    ctx.save_for_backward(x, weight, w_codes, w_scales, w_gd, w_ongrid)
    ctx.recipe = recipe
    ctx.site = site
    ctx.weight_dtype = weight.dtype
    ctx.bias_dtype = None if bias is None else bias.dtype


def _linear_backward(ctx, grad_out):
    x, weight, w_codes, w_scales, w_gd, w_ongrid = ctx.saved_tensors
    needs = ctx.needs_input_grad
    rec = impl.op_recipe(ctx.recipe)
    dx, dw, db = torch.ops.fp4_compile.nvfp4_linear_backward(
        grad_out, x, weight, w_codes, w_scales, w_gd, w_ongrid, ctx.recipe,
        site_seed(rec.seed, ctx.site), needs[Arg.X], needs[Arg.WEIGHT],
        needs[Arg.BIAS] and ctx.bias_dtype is not None,
    )  # fmt: skip
    dx = dx if needs[Arg.X] else None
    dw = dw.to(ctx.weight_dtype) if needs[Arg.WEIGHT] else None
    db = db.to(ctx.bias_dtype) if (needs[Arg.BIAS] and ctx.bias_dtype is not None) else None
    return dx, dw, None, None, None, db, None, None, None, None


nvfp4_linear.register_autograd(_linear_backward, setup_context=_linear_setup_context)


# ---------------------------------------------------------------------------------------------
# nvfp4_grouped_mm (MoE experts)


def _check_grouped(x, offsets, num_experts, x_index=None, x_perm=None, data=True):
    if x_perm is not None:
        from .expert_gather_backward_kernel import check_perm_precondition

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


@torch.library.custom_op(f"{_LIB}::nvfp4_grouped_mm", mutates_args=())
def nvfp4_grouped_mm(
    x: torch.Tensor,
    weight: torch.Tensor,
    w_codes: torch.Tensor,
    w_scales: torch.Tensor,
    w_global_decode: torch.Tensor,
    offsets: torch.Tensor,
    x_amax: torch.Tensor | None,
    recipe: str,
    w_ongrid: torch.Tensor | None = None,
    site: int = 0,
    x_index: torch.Tensor | None = None,
    x_perm: torch.Tensor | None = None,
) -> torch.Tensor:
    """The experts' GEMM over tokens sorted by expert: x [T, K], or (x_index given) the rows
    x[x_index], a zero row where x_index < 0 (the MoE token gather and its masked rows folded
    in, `passes/fold_expert_gathers.py`: bitwise the op on the gathered copy, its backward
    returning the gradient of x with `gather_rows`' position-ordered sums). `x_perm`: the sort
    permutation the gather index came from (x_index[q] == x_perm[q] // k wherever
    x_index[q] >= 0, k = S / T): the forward does not read it; the backward finds each row's
    positions through its inverse instead of sorting x_index (`expert_gather_backward_kernel.py`),
    the same bits."""
    rec = impl.op_recipe(recipe)
    n, k = impl.check_weight(x, w_codes, w_scales, w_global_decode, experts=True,
                             w_ongrid=w_ongrid)  # fmt: skip
    _check_grouped(x, offsets, w_codes.shape[0], x_index, x_perm)
    if x.device.type == "cuda":
        return impl.cuda_linear(x, w_codes, w_scales, w_global_decode, w_ongrid, None, rec,
                                x_amax, offsets=offsets, x_index=x_index)  # fmt: skip
    if x_index is not None:
        x = impl.gather_zero_rows(x, x_index)
    ref.check_offsets(offsets, x.shape[0], w_codes.shape[0])
    w = impl.weight_tensor(w_codes, w_scales, w_global_decode, n, k)
    xq = ref.quantize(
        x, block="1x16", global_scale=impl.act_global(rec, x_amax), check_finite=False
    )
    return ref.nvfp4_grouped_mm(xq, w, offsets).to(x.dtype)


@nvfp4_grouped_mm.register_fake
def _(x, weight, w_codes, w_scales, w_global_decode, offsets, x_amax, recipe, w_ongrid=None,
      site=0, x_index=None, x_perm=None):  # fmt: skip
    n, _ = impl.check_weight(x, w_codes, w_scales, w_global_decode, experts=True,
                             w_ongrid=w_ongrid)  # fmt: skip
    _check_grouped(x, offsets, w_codes.shape[0], x_index, x_perm, data=False)
    return x.new_empty((x.shape[0] if x_index is None else x_index.shape[0], n))


def _scatter_gathered(dx_g: torch.Tensor, x_index: torch.Tensor, rows: int, *,
                      x_perm: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """The gradient of x from that of `gather_zero_rows(x, x_index)`: `gather_rows_backward`'s
    position-ordered sums, a zero row's positions sent to one extra row that is dropped. The
    same bits as masking those positions' gradients to +0.0 and summing them in (the unfolded
    graph: masked_fill's backward, then the gather's): each sum starts from +0.0, so it is never
    -0.0, and adding +0.0 to it changes no bit. With x_perm (CUDA, bf16 / fp32): each row's
    positions found through perm's inverse, no sort (`expert_gather_backward_kernel.py`)."""
    if x_perm is not None and dx_g.device.type == "cuda" and dx_g.dtype in (
        torch.bfloat16, torch.float32):  # fmt: skip
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
    n, k = impl.check_weight(x, w_codes, w_scales, w_global_decode, experts=True,
                             w_ongrid=w_ongrid)  # fmt: skip
    num_experts = w_codes.shape[0]
    cuda = x.device.type == "cuda"
    x_src = x
    if x_index is not None and not cuda:
        x = impl.gather_zero_rows(x, x_index)  # the reference path works on the gathered copy
    rows = x.shape[0] if x_index is None else x_index.shape[0]
    dx, dw = x.new_empty((0,)), x.new_empty((0,), dtype=weight.dtype)
    dy_rows = dy_amax = None
    if (cuda and needs_x and needs_w and rec.dgrad == "nvfp4" and rec.wgrad == "nvfp4"
            and rec.grad.global_scale == "per_tensor" and grad_out.numel()):  # fmt: skip
        # one read of dY for both amaxes: the dgrad's per tensor (the max of the row maxima,
        # as `tensor_abs_max`) and the wgrad's per expert (each expert's max of its rows')
        from .abs_max_kernel import row_abs_max, vector_abs_max

        dy_rows = row_abs_max(grad_out)
        dy_amax = vector_abs_max(dy_rows)
    if needs_x:
        if cuda and rec.dgrad == "nvfp4":
            dx = impl.cuda_dgrad(grad_out, w_codes, w_scales, w_global_decode, w_ongrid, weight,
                                 rec, seed, offsets=offsets, out_dtype=x.dtype,
                                 dy_amax=dy_amax)  # fmt: skip
        else:
            dx = torch.zeros((rows, k), dtype=torch.float32, device=x.device)
            dyq = None if rec.dgrad == "bf16" else impl.q_grad(grad_out, rec, seed)
            w = impl.weight_tensor(w_codes, w_scales, w_global_decode, n, k)
            for e, s, t in _groups(offsets):
                if rec.dgrad == "bf16":
                    dx[s:t] = impl.cpu_dgrad(grad_out[s:t], None, weight[e], rec, seed)
                else:
                    w_e = w[e]
                    w_e = impl.weight_tensor(w_e.codes, w_e.block_scales.view(torch.uint8),
                                             w_e.global_decode.reshape(()), n, k)  # fmt: skip
                    dx[s:t] = ref.nvfp4_mm(dyq[s:t], impl.transpose_tiled(w_e))
            dx = dx.to(x.dtype)
        if x_index is not None:  # the gradient of x: each row's gathered copies summed
            dx = _scatter_gathered(dx, x_index, x_src.shape[0], x_perm=x_perm)
    if needs_w and cuda and rec.wgrad == "nvfp4":  # all experts at once, == the loop below
        from .grouped_wgrad_kernel import grouped_wgrad

        dw = grouped_wgrad(grad_out, x, offsets, rec, seed, out_dtype=weight.dtype,
                           dy_row_amax=dy_rows, x_index=x_index)  # fmt: skip
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
def _(grad_out, x, weight, w_codes, w_scales, w_global_decode, offsets, w_ongrid, recipe, seed,
      needs_x, needs_w, x_index=None, x_perm=None):  # fmt: skip
    e, (n, k) = w_codes.shape[0], impl.weight_nk(w_codes, w_ongrid)
    dx = x.new_empty(x.shape) if needs_x else x.new_empty((0,))
    dw = x.new_empty((e, n, k) if needs_w else (0,), dtype=weight.dtype)
    return dx, dw


def _grouped_setup_context(ctx, inputs, output):
    x, weight, w_codes, w_scales, w_gd, offsets, x_amax, recipe, w_ongrid, site, x_index, x_perm = (
        inputs)  # fmt: skip
    ctx.save_for_backward(x, weight, w_codes, w_scales, w_gd, offsets, w_ongrid, x_index, x_perm)
    ctx.recipe = recipe
    ctx.site = site
    ctx.weight_dtype = weight.dtype


def _grouped_backward(ctx, grad_out):
    x, weight, w_codes, w_scales, w_gd, offsets, w_ongrid, x_index, x_perm = ctx.saved_tensors
    needs = ctx.needs_input_grad
    rec = impl.op_recipe(ctx.recipe)
    dx, dw = torch.ops.fp4_compile.nvfp4_grouped_mm_backward(
        grad_out, x, weight, w_codes, w_scales, w_gd, offsets, w_ongrid, ctx.recipe,
        site_seed(rec.seed, ctx.site), needs[Arg.X], needs[Arg.WEIGHT], x_index, x_perm,
    )  # fmt: skip
    dx = dx if needs[Arg.X] else None
    dw = dw.to(ctx.weight_dtype) if needs[Arg.WEIGHT] else None
    return dx, dw, None, None, None, None, None, None, None, None, None, None


nvfp4_grouped_mm.register_autograd(_grouped_backward, setup_context=_grouped_setup_context)
