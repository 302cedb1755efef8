"""`fp4_compile::weight_group_amax`: the amax a group of weights shares (the weight global
scale of `NVFP4Recipe.shared_weight_scale`: q/k/v of one attention, gate/up of one MLP).

weight_group_amax(weights: Tensor[]) -> FP32 []: the max over the members of max |w| (each in
its own dtype, then FP32), bitwise `reference.group_amax`: |w| is exact and max is exact in any
order, so the kernel's tiling cannot change a bit. Each member is then quantized by
`fp4_compile::quantize(w, "16x16", "shared", amax, "rne", 0)`. CPU: the reference; CUDA: one
read of each member (`abs_max_kernel.group_abs_max`).
"""

from __future__ import annotations

import torch

from ... import reference as ref


def _check_weights(weights) -> None:
    if not weights:
        raise ValueError("weights must hold at least one tensor")
    first = weights[0]
    for i, w in enumerate(weights):
        if w.dtype not in ref.INPUT_DTYPES:
            raise TypeError(f"weights[{i}] must be float32, bfloat16 or float16, got {w.dtype}")
        if w.device != first.device:
            raise ValueError(f"weights[{i}] is on {w.device} but weights[0] is on {first.device}")


def _compute(weights: list[torch.Tensor]) -> torch.Tensor:
    if weights[0].device.type == "cuda":
        from .abs_max_kernel import group_abs_max  # lazy: imports triton

        return group_abs_max(weights)
    return ref.group_amax(weights)


@torch.library.custom_op("fp4_compile::weight_group_amax", mutates_args=())
def weight_group_amax(weights: list[torch.Tensor]) -> torch.Tensor:
    _check_weights(weights)
    return _compute(weights)


@weight_group_amax.register_fake
def _(weights):
    _check_weights(weights)
    return weights[0].new_empty((), dtype=torch.float32)
