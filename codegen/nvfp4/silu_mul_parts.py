"""`fp4_compile::silu_mul_quantize_parts`: a dense MLP's SwiGLU leaving its down projection's
codes to the decode GEMM's prologue (`norm_parts.py` is the norm's form and the consumer,
`nvfp4_linear_parts`). Inference only (no autograd).

Shape legend: M rows, C columns (a multiple of 16), P = cdiv(C, PART_COLUMNS) partial maxima.

silu_mul_quantize_parts(a, b, row_mask, recipe, groups=1) -> (y, x_ongrid, x_gd, x_parts): y,
x_ongrid, x_gd are `silu_mul_quantize(a, b, row_mask, recipe, False)`'s, bit for bit; x_parts
FP32 [M, P] holds max |y| over each PART_COLUMNS-column chunk of a row (NaN where the chunk
holds one). groups: the weights the consumer splits the M rows over (the experts' down GEMM,
`nvfp4_grouped_mm_parts` with the same groups: its E experts, whose decode kernel sees
cdiv(M, E) rows per expert; 1 for a dense GEMM). Where `norm_parts.codes_deferred(arch, M,
groups)` holds, the kernel path runs the SwiGLU's split form's first
launch alone (its column tile PART_COLUMNS on every architecture, so that P is one function of C
for the fake too; y is elementwise: no tile changes a bit): x_ongrid and x_gd are NOT written,
`nvfp4_linear_parts` reads y and x_parts instead; elsewhere x_parts is not written (the
consumer reads the codes). CPU: `silu_mul_quantize`'s reference, the maxima by torch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..runtime import kernel_target
from . import norm_parts
from . import silu_mul_quantize as silu_quantize

_LIB = "fp4_compile"
PART_COLUMNS = 128  # the CUDA split form's own column tile (`launch_table`'s split_block_c)


def _parts_of(y2: torch.Tensor) -> torch.Tensor:
    """max |y| of each PART_COLUMNS chunk of y2's rows (NaN propagates), FP32 [M, P]."""
    m, c = y2.shape
    pad = -c % PART_COLUMNS
    t = F.pad(y2.abs().to(torch.float32), (0, pad))
    return t.reshape(m, -1, PART_COLUMNS).amax(dim=2) if m else t.new_empty((0, _p(c)))


def _p(c: int) -> int:
    return -(-c // PART_COLUMNS)


def _kernels(t: torch.Tensor) -> bool:
    """Whether the op runs its kernels (CUDA; tests route CPU tensors through the Triton
    interpreter by patching this)."""
    return t.device.type == "cuda"


def _kernel_rows(a, b):
    """(a, b) as [M, C] views the split kernel takes (unit inner stride), or None."""
    if a.dtype not in silu_quantize.KERNEL_DTYPES or a.stride(-1) != 1 or b.stride(-1) != 1:
        return None
    try:
        return a.view(-1, a.shape[-1]), b.view(-1, b.shape[-1])
    except RuntimeError:
        return None


@torch.library.custom_op(f"{_LIB}::silu_mul_quantize_parts", mutates_args=())
def silu_mul_quantize_parts(
    a: torch.Tensor, b: torch.Tensor, row_mask: torch.Tensor | None, recipe: str, groups: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    silu_quantize._check_pair(a, b, recipe)
    norm_parts.check_groups(groups)
    c = a.shape[-1]
    m = a.numel() // c
    rows = _kernel_rows(a, b) if _kernels(a) else None
    deferred = _kernels(a) and norm_parts.codes_deferred(kernel_target(a).arch, m, groups)
    if rows is not None and deferred:
        from .silu_mul_quantize_kernel import silu_mul_quantize as kernel  # lazy: imports triton

        y2, _, _, parts = kernel(
            *rows, row_mask, split=True, codes=False, parts_block_c=PART_COLUMNS
        )
        x_ongrid = torch.empty((m, c), dtype=torch.bfloat16, device=a.device)  # not written
        x_gd = torch.empty((m, 1), dtype=torch.float32, device=a.device)  # not written
        return y2.reshape(a.shape), x_ongrid, x_gd, parts
    y, x_ongrid, x_gd, _, _ = torch.ops.fp4_compile.silu_mul_quantize(a, b, row_mask, recipe, False)
    if _kernels(a) and not deferred:
        parts = torch.empty((m, _p(c)), dtype=torch.float32, device=a.device)  # not read
    else:
        parts = _parts_of(y.reshape(m, c))
    return y, x_ongrid, x_gd, parts.contiguous()


@silu_mul_quantize_parts.register_fake
def _(a, b, row_mask, recipe, groups=1):
    silu_quantize._check_pair(a, b, recipe)
    norm_parts.check_groups(groups)
    c = a.shape[-1]
    m = a.numel() // c
    return (
        a.new_empty(a.shape),
        a.new_empty((m, c), dtype=torch.bfloat16),
        a.new_empty((m, 1), dtype=torch.float32),
        a.new_empty((m, _p(c)), dtype=torch.float32),
    )
