"""`fp4_compile::rotary_tables`: transformers' rotary cos / sin tables of positions in one op,
from the positions and the inverse frequencies (no angle tensor between them).

Shape legend: P the positions' shape ([B, T]), F the inverse frequencies (head dim / 2).

- rotary_tables(positions P int, inv_freq [F] float) -> (cos, sin), float32 [*P, 2F]:
    angles = positions.float()[..., None] * inv_freq.float()   (one FP32 product per element;
    a BF16 / FP16 inv_freq, a model cast whole, upcasts exactly)
    emb = cat((angles, angles), -1);  cos = cos(emb), sin = sin(emb)
  what transformers' rotary embedding computes before its attention scaling and cast (those stay
  in the graph: `passes/fuse_rotary_into_norm_pairs.py` folds them into the q / k norms).
Inserted by `passes/fuse_rotary_tables.py` (inference graphs) where the graph computed the
angles, then `fp4_compile::cos` and `fp4_compile::sin`: 3 launches become 1.
CPU: `decode_reference.rotary_tables` (those very ops: ATen's cos / sin, `trig.py`). CUDA:
`rotary_tables_kernel` (one launch; cos / sin are libdevice's `__nv_cosf` / `__nv_sinf`, the CUDA
math library's cosf / sinf that ATen's CUDA kernels call: equal bits is a GPU test,
tests/gpu/test_gpu_rotary_tables.py, every position up to 131,072 at Qwen3's frequencies). Not
differentiable (inference graphs only; positions are integers).
"""

from __future__ import annotations

import torch

from . import decode_reference

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _check(positions: torch.Tensor, inv_freq: torch.Tensor) -> None:
    if positions.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"positions must be int64 or int32, got {positions.dtype}")
    if inv_freq.dtype not in _FLOATS or inv_freq.dim() != 1:
        raise ValueError(
            f"inv_freq must be a 1-D float32 / bfloat16 / float16 tensor, got {inv_freq.dtype} "
            f"{list(inv_freq.shape)}"
        )


@torch.library.custom_op("fp4_compile::rotary_tables", mutates_args=())
def rotary_tables(
    positions: torch.Tensor, inv_freq: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    _check(positions, inv_freq)
    if positions.is_cuda:
        from .rotary_tables_kernel import rotary_tables as launch  # lazy: imports triton

        return launch(positions, inv_freq)
    return decode_reference.rotary_tables(positions, inv_freq)


@rotary_tables.register_fake
def _(positions, inv_freq):
    _check(positions, inv_freq)
    shape = (*positions.shape, 2 * inv_freq.shape[0])
    f32 = dict(dtype=torch.float32)
    return inv_freq.new_empty(shape, **f32), inv_freq.new_empty(shape, **f32)
