"""The dense NVFP4 linear of the `fp4_compile::` namespace: registrations, fake (meta) kernels,
autograd.

Shape legend: M tokens, K in-features, N out-features.

Ops (each a `torch.library.custom_op`: opaque to Dynamo and Inductor, which keeps one registered
boundary per GEMM and compiles on CPU, where `triton_op`/`wrap_triton` cannot):
- nvfp4_linear(x, weight, w_codes, w_scales, w_global_decode, bias, x_amax, recipe, w_ongrid, site) -> y
  registered from `gemm_call`'s table (`register_gemm`): its forward and fake take a `GemmCall`;
- nvfp4_linear_backward: the backward GEMMs (autograd calls it).
`site` (`sr_stream.site_id` of the GEMM's module path, set by the lowering) keys the backward's
stochastic-rounding streams; it does not change the forward. `w_scales` holds the E4M3 scale
BYTES as uint8; `recipe` is the encoded recipe (`gemm_call.encode_recipe`; the arguments by name:
`gemm_call.GemmCall`); `weight` is the high-precision master weight, passed so that autograd
returns its gradient (straight-through); `w_ongrid` optionally holds the on-grid BF16 copy of the
quantized weight (same values, faster GEMM on CUDA; `quantize.ongrid_weight`).
CPU implementations are the reference; CUDA ones the Triton kernels (imported lazily). The
backward's seed (`backward_seed`) is shared with `grouped_linear.py`.
"""

from __future__ import annotations

import torch

from ...sr_stream import DeviceSeed, call_seed, site_seed
from . import gemm as impl
from .gemm_call import GemmCall, input_grads, needs_input_grad, op_inputs, register_gemm

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
        from .device_seed_kernel import next_device_seed  # lazy: imports triton

        return next_device_seed(site_key, device)
    return call_seed(site_key)


# ---------------------------------------------------------------------------------------------
# nvfp4_linear


def _linear_forward(call: GemmCall) -> torch.Tensor:
    x, bias, x_amax, w_ongrid, rec = call.x, call.bias, call.x_amax, call.w_ongrid, call.recipe
    w_codes, w_scales, w_global_decode = call.weight_operand()
    n, k = impl.check_weight(
        x, w_codes, w_scales, w_global_decode, experts=False, w_ongrid=w_ongrid
    )
    x2 = _flat(x)
    if x.device.type == "cuda":
        y = impl.cuda_linear(x2, w_codes, w_scales, w_global_decode, w_ongrid, bias, rec, x_amax)
    else:
        w = impl.weight_tensor(w_codes, w_scales, w_global_decode, n, k)  # needs packed bytes
        y = impl.cpu_linear(x2, w, bias, rec, x_amax)
    return y.reshape(*x.shape[:-1], n)


def _linear_fake(call: GemmCall) -> torch.Tensor:
    x = call.x
    n, _ = impl.check_weight(x, *call.weight_operand(), experts=False, w_ongrid=call.w_ongrid)
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
    n, k = impl.check_weight(
        x, w_codes, w_scales, w_global_decode, experts=False, w_ongrid=w_ongrid
    )
    dy2, x2 = _flat(grad_out), _flat(x)
    cuda = x.device.type == "cuda"
    empty = x.new_empty((0,), dtype=torch.float32)
    dx, dw, db = x.new_empty((0,)), empty, empty
    dy_amax = impl.grad_amax(dy2, rec) if cuda and needs_x and needs_w else None
    if needs_x:
        if cuda:
            dx2 = impl.cuda_dgrad(
                dy2,
                w_codes,
                w_scales,
                w_global_decode,
                w_ongrid,
                weight,
                rec,
                seed,
                out_dtype=x.dtype,
                dy_amax=dy_amax,
            )
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
def _(
    grad_out,
    x,
    weight,
    w_codes,
    w_scales,
    w_global_decode,
    w_ongrid,
    recipe,
    seed,
    needs_x,
    needs_w,
    needs_bias,
):
    n, k = impl.weight_nk(w_codes, w_ongrid)
    dx = x.new_empty(x.shape) if needs_x else x.new_empty((0,))
    dw = x.new_empty((n, k) if needs_w else (0,), dtype=weight.dtype)
    db = x.new_empty((n,) if needs_bias else (0,), dtype=torch.float32)
    return dx, dw, db


def _linear_setup_context(ctx, inputs, output):
    a = op_inputs("nvfp4_linear", inputs)
    ctx.save_for_backward(
        a["x"], a["weight"], a["w_codes"], a["w_scales"], a["w_global_decode"], a["w_ongrid"]
    )
    ctx.recipe = a["recipe"]
    ctx.site = a["site"]
    ctx.weight_dtype = a["weight"].dtype
    ctx.bias_dtype = None if a["bias"] is None else a["bias"].dtype


def _linear_backward(ctx, grad_out):
    x, weight, w_codes, w_scales, w_gd, w_ongrid = ctx.saved_tensors
    needs = needs_input_grad("nvfp4_linear", ctx.needs_input_grad)
    rec = impl.op_recipe(ctx.recipe)
    dx, dw, db = torch.ops.fp4_compile.nvfp4_linear_backward(
        grad_out,
        x,
        weight,
        w_codes,
        w_scales,
        w_gd,
        w_ongrid,
        ctx.recipe,
        site_seed(rec.seed, ctx.site),
        needs["x"],
        needs["weight"],
        needs["bias"] and ctx.bias_dtype is not None,
    )
    dx = dx if needs["x"] else None
    dw = dw.to(ctx.weight_dtype) if needs["weight"] else None
    db = db.to(ctx.bias_dtype) if (needs["bias"] and ctx.bias_dtype is not None) else None
    return input_grads("nvfp4_linear", x=dx, weight=dw, bias=db)


nvfp4_linear = register_gemm(
    "nvfp4_linear",
    _linear_forward,
    _linear_fake,
    setup_context=_linear_setup_context,
    backward=_linear_backward,
)
