"""Python-level API of the NVFP4 ops (what the pass pipeline and users call).

Shape legend: M tokens, T tokens sorted by expert, K in-features, N out-features, E experts.

    w_q = quantize_weight(weight, recipe)            # once per weight version (16x16 tiles)
    y   = nvfp4_linear(x, weight, bias, recipe=recipe, w_q=w_q)
    y   = nvfp4_grouped_linear(x_TK, w_ENK, offsets, recipe=recipe, w_q=w_q)

Each call is exactly one `torch.ops.fp4_compile.*` op (plus its backward op under autograd).
"""

from __future__ import annotations

import torch

from ...format import NVFP4Tensor
from ...recipe import NVFP4Recipe, as_recipe
from ...weight_policy import weight_quantize_mode
from .gemm_call import GemmCall
from .quantize import quantize_into  # noqa: F401  (the runtimes' weight stores write with it)


def _static_amax(amax, name: str) -> torch.Tensor | None:
    if amax is None:
        return None
    if not isinstance(amax, torch.Tensor) or amax.dtype != torch.float32:
        raise TypeError(f"{name} must be a float32 tensor, got {getattr(amax, 'dtype', amax)!r}")
    return amax


def quantize_op(
    x: torch.Tensor,
    *,
    block: str = "1x16",
    global_scale: str | torch.Tensor = "per_row",
    rounding: str = "rne",
    seed: int | None = None,
) -> NVFP4Tensor:
    """`torch.ops.fp4_compile.quantize` as an NVFP4Tensor; bitwise equal to `reference.quantize`.
    global_scale: "per_row", "per_tensor", "per_expert" (x [E, N, K], = `quantize_experts`), or a
    float32 static amax ([] , or [E] per expert)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if rounding == "stochastic" and seed is None:
        raise ValueError("rounding='stochastic' needs an integer seed (reproducibility)")
    if isinstance(global_scale, torch.Tensor):
        mode, amax = "static", _static_amax(global_scale, "global_scale")
    else:
        mode, amax = global_scale, None
    codes, scales, gd = torch.ops.fp4_compile.quantize(
        x, block, mode, amax, rounding, 0 if seed is None else int(seed)
    )
    return NVFP4Tensor(
        codes=codes, block_scales=scales, global_decode=gd, shape=tuple(x.shape), block=block
    )


def quantize_weight(
    weight: torch.Tensor,
    recipe: NVFP4Recipe | dict | None = None,
    *,
    static_amax=None,
    group: list[torch.Tensor] | None = None,
) -> NVFP4Tensor:
    """Quantize a weight once per weight version: 16x16 tiles, recipe.weight's global scale.
    [N, K] -> one global scale; [E, N, K] (experts) -> one per expert (global_decode [E, 1, 1]).
    A static recipe needs `static_amax` (float32 [] or [E]). `group`: the [N, K] weights of the
    fused group `weight` belongs to (q/k/v, gate/up; `weight` among them), quantized as the
    lowering does when `recipe.shared_weight_scale`: under the group's one global scale."""
    rec = as_recipe(recipe)
    if not isinstance(weight, torch.Tensor) or weight.dim() not in (2, 3):
        raise ValueError(
            f"weight must be [N, K] or [E, N, K], got {getattr(weight, 'shape', weight)}"
        )
    w = weight.detach()
    if group is not None and rec.shared_weight_scale and rec.weight.global_scale == "per_tensor":
        if not any(m is weight for m in group) or any(m.dim() != 2 for m in group):
            raise ValueError("group must hold [N, K] weights, `weight` among them")
        amax = torch.ops.fp4_compile.weight_group_amax([m.detach() for m in group])
        codes, scales, gd = torch.ops.fp4_compile.quantize(w, "16x16", "shared", amax, "rne", 0)
        return NVFP4Tensor(
            codes=codes, block_scales=scales, global_decode=gd, shape=tuple(w.shape), block="16x16"
        )
    if rec.weight.global_scale == "static":
        if static_amax is None:
            raise ValueError("recipe.weight.global_scale='static' needs static_amax")
        gs = _static_amax(static_amax, "static_amax")
    else:
        gs = "per_expert" if w.dim() == 3 else "per_tensor"
    return quantize_op(w, block="16x16", global_scale=gs)


def quantize_weight_bytes(
    weight: torch.Tensor, recipe: NVFP4Recipe, *, experts: bool, group: list | None = None
):
    """(codes, E4M3 scales, global decode): the exact bytes the lowered graph's weight-quantize
    nodes produce for this weight (16x16 tiles, RNE; the global-scale mode of the weight policy,
    `weight_policy.weight_quantize_mode`); `group`: the tensors of its shared-scale group
    (weight among them, `weight_policy.shared_scale_groups`), when it has one. What the rollout
    export, the checkpoint export and the vLLM plugin store, so their bytes are the learner's."""
    ops = torch.ops.fp4_compile
    if group:
        amax = ops.weight_group_amax.default([w.detach() for w in group])
        return ops.quantize.default(weight.detach(), "16x16", "shared", amax, "rne", 0)
    mode = weight_quantize_mode(recipe, 3 if experts else 2)
    codes, scales, gd = ops.quantize.default(weight.detach(), "16x16", mode, None, "rne", 0)
    return codes, scales, gd


def ongrid_weight(w_q: NVFP4Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The on-grid copy (E2M1 x E4M3, no global scale; exact in BF16) of a quantized weight, for
    the faster BF16-operand GEMM path on CUDA. Same values as the packed bytes: same result."""
    return w_q.on_grid(dtype)


def _weight_q(weight, recipe, w_q) -> NVFP4Tensor:
    if w_q is None:
        return quantize_weight(weight, recipe)
    if not isinstance(w_q, NVFP4Tensor) or w_q.block != "16x16":
        raise TypeError(f"w_q must be a 16x16 NVFP4Tensor from quantize_weight, got {w_q!r}")
    if tuple(w_q.shape) != tuple(weight.shape):
        raise ValueError(f"w_q shape {list(w_q.shape)} != weight shape {list(weight.shape)}")
    return w_q


def nvfp4_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    recipe: NVFP4Recipe | dict | None = None,
    w_q: NVFP4Tensor | None = None,
    w_ongrid: torch.Tensor | None = None,
    x_amax: torch.Tensor | None = None,
) -> torch.Tensor:
    """W4A4 linear: y = ((dot(q(x), W_q)) * gd_x) * gd_w + bias in x.dtype, with autograd to x,
    weight (straight-through) and bias. x [*, K]; weight [N, K] (master); recipe.activation
    decides x's quantization (x_amax for a static recipe)."""
    rec = as_recipe(recipe)
    wq = _weight_q(weight, rec, w_q)
    return GemmCall(
        x=x,
        weight=weight,
        w=wq,
        recipe=rec,
        bias=bias,
        w_ongrid=w_ongrid,
        x_amax=_static_amax(x_amax, "x_amax"),
    ).run()


def nvfp4_grouped_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    offsets: torch.Tensor,
    *,
    recipe: NVFP4Recipe | dict | None = None,
    w_q: NVFP4Tensor | None = None,
    w_ongrid: torch.Tensor | None = None,
    x_amax: torch.Tensor | None = None,
) -> torch.Tensor:
    """MoE experts in one launch: x [T, K] sorted by expert, weight [E, N, K] (gate_up
    [E, 2I, H] or down [E, H, I]), offsets int32 [E] group ends. Returns [T, N] in x.dtype, equal
    bitwise to a loop of `nvfp4_linear` over the groups (per-row or static activation scales)."""
    rec = as_recipe(recipe)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 3:
        raise ValueError(f"weight must be [E, N, K], got {getattr(weight, 'shape', weight)}")
    if not isinstance(offsets, torch.Tensor):
        raise TypeError(f"offsets must be an int32 tensor, got {type(offsets).__name__}")
    wq = _weight_q(weight, rec, w_q)
    return GemmCall(
        x=x,
        weight=weight,
        w=wq,
        recipe=rec,
        offsets=offsets,
        w_ongrid=w_ongrid,
        x_amax=_static_amax(x_amax, "x_amax"),
    ).run()
