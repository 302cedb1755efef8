"""What the lowering passes insert: one place that binds graph nodes to fp4_compile ops.

TEMPORARY: until the codegen ops land these are plain-PyTorch stand-ins (reference math, not
batch-invariant by construction for the BF16 pieces). They are replaced by torch.ops.fp4_compile
overloads.
"""

from __future__ import annotations

import operator

import torch

from ..recipe import NVFP4Recipe
from .graph_utils import fake, insert_call


def recipe_arg(recipe: NVFP4Recipe) -> str:
    from ..codegen.nvfp4_impl import recipe_to_json

    return recipe_to_json(recipe)


def _ops():
    from .. import codegen  # noqa: F401  (registers the fp4_compile ops)

    return torch.ops.fp4_compile


def weight_quantize_mode(recipe: NVFP4Recipe, weight_dim: int) -> str:
    if recipe.weight.global_scale == "static":
        raise NotImplementedError("static weight scales are not lowered by the pass pipeline yet")
    return "per_expert" if weight_dim == 3 else "per_tensor"


def emit_quantize_weight(graph, weight, recipe: NVFP4Recipe):
    """Nodes quantizing `weight` (16x16 tiles) right after its definition:
    detach -> fp4_compile.quantize -> (codes, block-scale bytes, global decode)."""
    dim = fake(weight).dim()
    det = insert_call(graph, torch.ops.aten.detach.default, (weight,), after=weight, like=weight)
    q = insert_call(graph, _ops().quantize.default, (det, "16x16", weight_quantize_mode(recipe, dim), None, "rne", 0),
                    after=det, like=weight)
    codes = insert_call(graph, operator.getitem, (q, 0), after=q, like=weight)
    scales = insert_call(graph, operator.getitem, (q, 1), after=codes, like=weight)
    gd = insert_call(graph, operator.getitem, (q, 2), after=scales, like=weight)
    scales_u8 = insert_call(graph, torch.ops.aten.view.dtype, (scales, torch.uint8), after=gd, like=weight)
    return codes, scales_u8, gd


def emit_nvfp4_linear(graph, node, x, weight, wq, bias, recipe: NVFP4Recipe):
    codes, scales, gd = wq
    args = (x, weight, codes, scales, gd, bias, None, recipe_arg(recipe), None)
    return insert_call(graph, _ops().nvfp4_linear.default, args, before=node, like=node)


def emit_nvfp4_grouped(graph, node, x, weight, wq, offsets, recipe: NVFP4Recipe):
    codes, scales, gd = wq
    args = (x, weight, codes, scales, gd, offsets, None, recipe_arg(recipe), None)
    return insert_call(graph, _ops().nvfp4_grouped_mm.default, args, before=node, like=node)


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


def bf16_linear_target():
    return _bf16_linear


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
    quantize = _ops().quantize.default
    out = []
    for node in program.graph.nodes:
        if node.op == "call_function" and node.target is quantize:
            src = node.args[0]
            if src.op == "call_function" and src.target is torch.ops.aten.detach.default:
                src = src.args[0]
            if src.op == "placeholder" and src.name in to_param:
                out.append((to_param[src.name], fake(src).dim() == 3))
    return out


def quantize_weight_bytes(weight: torch.Tensor, recipe: NVFP4Recipe, *, experts: bool):
    """The exact bytes the graph's quantize-weight nodes produce for this weight."""
    mode = weight_quantize_mode(recipe, 3 if experts else 2)
    codes, scales, gd = _ops().quantize.default(weight.detach(), "16x16", mode, None, "rne", 0)
    return codes, scales, gd
