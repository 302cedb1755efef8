"""What the lowering passes insert: one place that binds graph nodes to fp4_compile ops.

TEMPORARY: until the codegen ops land these are plain-PyTorch stand-ins (reference math, not
batch-invariant by construction for the BF16 pieces). They are replaced by torch.ops.fp4_compile
overloads.
"""

from __future__ import annotations

import json

import torch

from ..recipe import NVFP4Recipe


def recipe_arg(recipe: NVFP4Recipe) -> str:
    from ..codegen.nvfp4_impl import recipe_to_json

    return recipe_to_json(recipe)


def _recipe(arg: str) -> NVFP4Recipe:
    return NVFP4Recipe.from_dict(json.loads(arg))


def _ops():
    from .. import codegen  # noqa: F401  (registers the fp4_compile ops)

    return torch.ops.fp4_compile


def _quantize_weight(weight, recipe_json):
    recipe = _recipe(recipe_json)
    if recipe.weight.global_scale == "static":
        raise NotImplementedError("static weight scales are not lowered by the pass pipeline yet")
    mode = "per_expert" if weight.dim() == 3 else "per_tensor"
    codes, scales, gd = _ops().quantize.default(torch.ops.aten.detach.default(weight), "16x16", mode, None, "rne", 0)
    return codes, scales.view(torch.uint8), gd


def _nvfp4_linear(x, weight, wq, bias, recipe_json):
    codes, scales, gd = wq
    return _ops().nvfp4_linear.default(x, weight, codes, scales, gd, bias, None, recipe_json, None)


def _nvfp4_grouped(x, weight, wq, offsets, recipe_json):
    codes, scales, gd = wq
    return _ops().nvfp4_grouped_mm.default(x, weight, codes, scales, gd, offsets, None, recipe_json, None)


def _bf16_linear(x, weight, bias):
    return torch.nn.functional.linear(x, weight, bias)


def _bf16_grouped(x, weight, offsets):
    raise NotImplementedError("bf16 grouped mm op not bound yet")


def _rms_norm(x, weight, eps, out_dtype):
    x32 = x.float()
    y = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (weight * y if weight is not None else y).to(out_dtype or y.dtype)


def _attention(q, k, v, mask, is_causal, scale):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale)


def _routing(logits, k):
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    return torch.topk(probs, k, dim=-1)


def quantize_weight_target(experts: bool = False):
    return _quantize_weight


def nvfp4_linear_target():
    return _nvfp4_linear


def bf16_linear_target():
    return _bf16_linear


def nvfp4_grouped_target():
    return _nvfp4_grouped


def bf16_grouped_target():
    return _bf16_grouped


def rms_norm_target():
    return _rms_norm


def attention_target():
    return _attention


def routing_target():
    return _routing


def quantized_weight_inputs(program) -> list[tuple[str, bool]]:
    """(state_dict name, is_experts) of every weight an exported, lowered program quantizes."""
    to_param = dict(program.graph_signature.inputs_to_parameters)
    out = []
    for node in program.graph.nodes:
        if node.op == "call_function" and node.target is _quantize_weight:
            src = node.args[0]
            if src.op == "placeholder" and src.name in to_param:
                out.append((to_param[src.name], fake_dim(src) == 3))
    return out


def fake_dim(node) -> int:
    val = node.meta.get("val")
    return val.dim() if isinstance(val, torch.Tensor) else -1


def quantize_weight_bytes(weight: torch.Tensor, recipe: NVFP4Recipe, *, experts: bool):
    """The exact bytes the graph's quantize-weight node produces for this weight."""
    return _quantize_weight(weight, recipe_arg(recipe))
