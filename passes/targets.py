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
    return json.dumps(recipe.to_dict(), sort_keys=True)


def _recipe(arg: str) -> NVFP4Recipe:
    return NVFP4Recipe.from_dict(json.loads(arg))


def _quantize_weight(weight, recipe_json):
    from .. import quantize, quantize_experts

    w = weight.detach()
    if w.dim() == 3:
        q = quantize_experts(w)
    else:
        q = quantize(w, block="16x16", global_scale="per_tensor")
    return q.codes, q.block_scales, q.global_decode


def _nvfp4_linear(x, weight, wq, bias, recipe_json):
    from ..format import NVFP4Tensor
    from ..reference import nvfp4_mm, quantize

    recipe = _recipe(recipe_json)
    codes, scales, gd = wq
    w_q = NVFP4Tensor(codes=codes, block_scales=scales, global_decode=gd, shape=tuple(weight.shape), block="16x16")
    x2 = x.reshape(-1, x.shape[-1])
    x_q = quantize(x2.detach(), global_scale=recipe.activation.global_scale, check_finite=False)
    y = nvfp4_mm(x_q, w_q)
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype).reshape(*x.shape[:-1], weight.shape[0])


def _bf16_linear(x, weight, bias):
    return torch.nn.functional.linear(x, weight, bias)


def _nvfp4_grouped(x, weight, wq, offsets, recipe_json):
    raise NotImplementedError("nvfp4 grouped mm op not bound yet")


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
