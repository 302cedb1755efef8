"""The NVFP4 buffers minite's vLLM layers hold, built with the learner's quantizer (plain torch:
used on the learner side of a weight sync and inside vLLM's layers).

Linear layers: `minite_codes` uint8 [N, K/2], `minite_scales` uint8 [N, K/16] (E4M3 bytes),
`minite_global_decode` float32 [S], one per fused shard (q/k/v, gate/up): the shards of a fused
layer are the learner's shared-scale group (`NVFP4Recipe.shared_weight_scale`), so they share the
group's global scale exactly as the lowering quantizes them; with the setting off each shard is
quantized alone.
Experts: `minite_w13_*` from gate_up [E, 2I, H] and `minite_w2_*` from down [E, H, I], one
global scale per expert (gate and up together), as the learner quantizes its fused experts.
"""

from __future__ import annotations

import torch

from ..codegen.nvfp4.api import quantize_weight_bytes
from ..recipe import NVFP4Recipe


def linear_buffers(weight_NK: torch.Tensor, shards: tuple[int, ...], recipe: NVFP4Recipe) -> dict:
    """A linear layer's buffers: each row block of `shards` sizes quantized as the learner
    quantizes that weight (under the fused group's shared global scale where the recipe says)."""
    if sum(shards) != weight_NK.shape[0]:
        raise ValueError(f"shards {shards} do not add up to the weight's {weight_NK.shape[0]} rows")
    bounds = [sum(shards[:i]) for i in range(len(shards) + 1)]
    parts = [weight_NK[a:b] for a, b in zip(bounds, bounds[1:])]
    shared = (
        len(parts) > 1 and recipe.shared_weight_scale and recipe.weight.global_scale == "per_tensor"
    )
    codes, scales, gds = [], [], []
    for part in parts:
        c, s, gd = quantize_weight_bytes(
            part, recipe, experts=False, group=parts if shared else None
        )
        codes.append(c)
        scales.append(s.view(torch.uint8))
        gds.append(gd.reshape(1))
    return {
        "minite_codes": torch.cat(codes),
        "minite_scales": torch.cat(scales),
        "minite_global_decode": torch.cat(gds),
    }


def expert_buffers(w13_EKH: torch.Tensor, w2_EHI: torch.Tensor, recipe: NVFP4Recipe) -> dict:
    """A routed-experts layer's buffers from its gate_up and down weights."""
    out = {}
    for name, w in (("w13", w13_EKH), ("w2", w2_EHI)):
        codes, scales, gd = quantize_weight_bytes(w, recipe, experts=True)
        out[f"minite_{name}_codes"] = codes
        out[f"minite_{name}_scales"] = scales.view(torch.uint8)
        out[f"minite_{name}_global_decode"] = gd.reshape(-1)
    return out


def write_buffers(layer: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Write a layer's buffers in place (registered on the first call)."""
    for name, value in tensors.items():
        old = getattr(layer, name, None)
        if old is None:
            layer.register_buffer(name, value.contiguous(), persistent=False)
        elif old.shape != value.shape or old.dtype != value.dtype:
            raise ValueError(
                f"{name}: got {value.dtype}{list(value.shape)}, the layer holds "
                f"{old.dtype}{list(old.shape)}"
            )
        else:
            old.copy_(value)
