"""The NVFP4 linear on a pre-quantized activation, and the activation quantize it reads: one
quantization of X shared by every GEMM that reads X with the same recipe (q/k/v of one normed X,
gate/up), for the forward (X, 1x16 blocks) and the backward's wgrad (X^T).

Shape legend: M tokens (x's leading dims flattened), M16 = M rounded up to a multiple of 16,
K in-features, N out-features.

Ops (`torch.library.custom_op`s, as `linear.py`'s):
- quantize_activation(x, recipe, x_amax, transposed) -> (x_ongrid, x_gd, xt_ongrid, xt_gd):
  x's forward operand, on-grid BF16 [M, K] with its global decode ([M, 1] per row, [] per tensor
  or static), and, when `transposed`, the wgrad's X^T operand, on-grid BF16 [K, M16] (zero tokens
  pad M) with its per-tensor global decode [] (else both [0]). Exactly the operands
  `nvfp4_linear` quantizes for itself (`gemm.cpu_activation_operands`, `gemm.cuda_activation_operands`). Not differentiable:
  the lowering feeds it a detached x.
- nvfp4_linear_quantized(x, weight, w_codes, w_scales, w_global_decode, bias, x_amax, recipe,
  w_ongrid, site, x_ongrid, x_gd, xt_ongrid, xt_gd) -> y (registered from `gemm_call`'s table): `nvfp4_linear` (the same first ten
  arguments, `gemm_call.OP_ARGS`) reading x's operands instead of quantizing
  x; x itself is an input so autograd returns dX (straight-through, as for the weight). Bitwise
  `nvfp4_linear`: the same quantizer, the same exact CPU dot products, the same CUDA GEMM launch.
  Its backward reads X^T's operand when given (else quantizes X^T itself, as `nvfp4_linear`).
- nvfp4_linear_quantized_backward: the backward GEMMs (autograd calls it).
"""

from __future__ import annotations

import torch

from ...sr_stream import site_seed
from . import gemm as impl
from .gemm_call import GemmCall, input_grads, needs_input_grad, op_inputs, register_gemm
from .linear import backward_seed

_LIB = "fp4_compile"


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


def _padded_tokens(m):
    return ((m + 15) // 16) * 16


def _check_activation(x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor) or x.dtype not in impl.X_DTYPES:
        raise TypeError(
            f"x must be a bfloat16/float32/float16 tensor, got {getattr(x, 'dtype', x)}"
        )
    if x.dim() < 1 or x.shape[-1] % 16:
        raise ValueError(f"x last dim must be a multiple of 16, got shape {tuple(x.shape)}")


# ---------------------------------------------------------------------------------------------
# quantize_activation


@torch.library.custom_op(f"{_LIB}::quantize_activation", mutates_args=())
def quantize_activation(
    x: torch.Tensor, recipe: str, x_amax: torch.Tensor | None, transposed: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    _check_activation(x)
    rec = impl.op_recipe(recipe)
    operands = (
        impl.cuda_activation_operands if x.device.type == "cuda" else impl.cpu_activation_operands
    )
    a, gd_a, xt, gd_t = operands(_flat(x), rec, x_amax, transposed=transposed)
    return a, gd_a.contiguous(), xt, gd_t.contiguous()


@quantize_activation.register_fake
def _(x, recipe, x_amax, transposed):
    _check_activation(x)
    rec = impl.op_recipe(recipe)
    k = x.shape[-1]
    m = x.numel() // k if k else 0
    a = x.new_empty((m, k), dtype=torch.bfloat16)
    per_row = rec.activation.global_scale == "per_row"
    gd_a = x.new_empty((m, 1) if per_row else (), dtype=torch.float32)
    if transposed:
        xt = x.new_empty((k, _padded_tokens(m)), dtype=torch.bfloat16)
        gd_t = x.new_empty((), dtype=torch.float32)
    else:
        xt = x.new_empty((0,), dtype=torch.bfloat16)
        gd_t = x.new_empty((0,), dtype=torch.float32)
    return a, gd_a, xt, gd_t


# ---------------------------------------------------------------------------------------------
# nvfp4_linear_quantized


def _check_operands(x, x_ongrid, x_gd, xt_ongrid, xt_gd) -> None:
    m = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if x_ongrid.dtype != torch.bfloat16 or tuple(x_ongrid.shape) != (m, x.shape[-1]):
        raise ValueError(
            f"x_ongrid must be bfloat16 [M={m}, K={x.shape[-1]}] (quantize_activation of x), "
            f"got {x_ongrid.dtype}{list(x_ongrid.shape)}"
        )
    if x_gd.dtype != torch.float32 or xt_gd.dtype != torch.float32:
        raise TypeError(f"x_gd and xt_gd must be float32, got {x_gd.dtype} and {xt_gd.dtype}")
    if xt_ongrid.numel() and tuple(xt_ongrid.shape) != (x.shape[-1], _padded_tokens(m)):
        raise ValueError(
            f"xt_ongrid must be [K={x.shape[-1]}, M16={_padded_tokens(m)}] or empty, "
            f"got {list(xt_ongrid.shape)}"
        )


def _linear_quantized_forward(call: GemmCall) -> torch.Tensor:
    x, bias, w_ongrid = call.x, call.bias, call.w_ongrid
    w_codes, w_scales, w_global_decode = call.weight_operand()
    x_ongrid, x_gd, xt_ongrid, xt_gd = call.x_operands
    n, k = impl.check_weight(
        x, w_codes, w_scales, w_global_decode, experts=False, w_ongrid=w_ongrid
    )
    _check_operands(x, x_ongrid, x_gd, xt_ongrid, xt_gd)
    if x.device.type == "cuda":
        y = impl.cuda_linear_quantized(
            x_ongrid, x_gd, w_codes, w_scales, w_global_decode, w_ongrid, bias, x.dtype
        )
    else:
        w = impl.weight_tensor(w_codes, w_scales, w_global_decode, n, k)
        y = impl.cpu_linear_quantized(x_ongrid, x_gd, w, bias, x.dtype)
    return y.reshape(*x.shape[:-1], n)


def _linear_quantized_fake(call: GemmCall) -> torch.Tensor:
    x = call.x
    n, _ = impl.check_weight(x, *call.weight_operand(), experts=False, w_ongrid=call.w_ongrid)
    return x.new_empty((*x.shape[:-1], n))


@torch.library.custom_op(f"{_LIB}::nvfp4_linear_quantized_backward", mutates_args=())
def nvfp4_linear_quantized_backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    w_codes: torch.Tensor,
    w_scales: torch.Tensor,
    w_global_decode: torch.Tensor,
    w_ongrid: torch.Tensor | None,
    xt_ongrid: torch.Tensor,
    xt_gd: torch.Tensor,
    recipe: str,
    seed: int,
    needs_x: bool,
    needs_w: bool,
    needs_bias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`linear.nvfp4_linear_backward`, the wgrad reading X^T's operand when xt_ongrid holds one
    (else, and for a BF16 wgrad, X itself): the same outputs, bit for bit."""
    if not xt_ongrid.numel():
        return torch.ops.fp4_compile.nvfp4_linear_backward(
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
        )
    rec = impl.op_recipe(recipe)
    if rec.wgrad == "bf16":
        raise ValueError("xt_ongrid is given but recipe.wgrad is 'bf16' (it reads X itself)")
    seed = backward_seed(seed, x.device)  # one draw per call, as nvfp4_linear_backward
    n, k = impl.check_weight(
        x, w_codes, w_scales, w_global_decode, experts=False, w_ongrid=w_ongrid
    )
    dy2 = _flat(grad_out)
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
            dw = impl.cuda_wgrad_quantized(
                dy2, xt_ongrid, xt_gd, rec, seed + 1, out_dtype=weight.dtype, dy_amax=dy_amax
            )
        else:
            dw = impl.cpu_wgrad_quantized(dy2, xt_ongrid, xt_gd, rec, seed + 1).to(weight.dtype)
    if needs_bias:
        db = dy2.to(torch.float32).sum(0)
    return dx, dw, db


@nvfp4_linear_quantized_backward.register_fake
def _(
    grad_out,
    x,
    weight,
    w_codes,
    w_scales,
    w_global_decode,
    w_ongrid,
    xt_ongrid,
    xt_gd,
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


def _setup_context(ctx, inputs, output):
    a = op_inputs("nvfp4_linear_quantized", inputs)
    x, weight, bias, xt_ongrid = a["x"], a["weight"], a["bias"], a["xt_ongrid"]
    # with X^T's operand given the backward reads only x's shape, dtype and device: a
    # zero-stride stand-in, so that autograd keeps the operand alive instead of x as well
    x_kept = x.new_zeros(()).expand(x.shape) if xt_ongrid.numel() else x
    ctx.save_for_backward(
        x_kept,
        weight,
        a["w_codes"],
        a["w_scales"],
        a["w_global_decode"],
        a["w_ongrid"],
        xt_ongrid,
        a["xt_gd"],
    )
    ctx.recipe = a["recipe"]
    ctx.site = a["site"]
    ctx.weight_dtype = weight.dtype
    ctx.bias_dtype = None if bias is None else bias.dtype


def _backward(ctx, grad_out):
    x, weight, w_codes, w_scales, w_gd, w_ongrid, xt_ongrid, xt_gd = ctx.saved_tensors
    needs = needs_input_grad("nvfp4_linear_quantized", ctx.needs_input_grad)
    rec = impl.op_recipe(ctx.recipe)
    dx, dw, db = torch.ops.fp4_compile.nvfp4_linear_quantized_backward(
        grad_out,
        x,
        weight,
        w_codes,
        w_scales,
        w_gd,
        w_ongrid,
        xt_ongrid,
        xt_gd,
        ctx.recipe,
        site_seed(rec.seed, ctx.site),
        needs["x"],
        needs["weight"],
        needs["bias"] and ctx.bias_dtype is not None,
    )
    dx = dx if needs["x"] else None
    dw = dw.to(ctx.weight_dtype) if needs["weight"] else None
    db = db.to(ctx.bias_dtype) if (needs["bias"] and ctx.bias_dtype is not None) else None
    return input_grads("nvfp4_linear_quantized", x=dx, weight=dw, bias=db)


nvfp4_linear_quantized = register_gemm(
    "nvfp4_linear_quantized",
    _linear_quantized_forward,
    _linear_quantized_fake,
    setup_context=_setup_context,
    backward=_backward,
)
