"""`fp4_compile::nvfp4_grouped_mm_parts`: the experts' GEMM (`nvfp4_grouped_mm_quantized`'s
forward) on a producer that left x's per-row codes to it (`norm_parts.rms_norm_quantize_parts`:
the MoE block's normed X, read gathered by expert order; `silu_mul_parts.silu_mul_quantize_parts`
on the halves of the experts' gate/up output: the down GEMM's X). Inference only (no autograd).

Shape legend: M rows of x (tokens, or rows sorted by expert), T rows of the product (x_index: T
gathered rows of x), K in-features, N out-features, E experts, P partial maxima per row of x.

nvfp4_grouped_mm_parts(x, x_ongrid, x_gd, x_parts, w_codes, w_scales, w_global_decode, w_ongrid,
offsets, x_index, groups=1) -> y [T, N] in x.dtype: `nvfp4_grouped_mm_quantized(x, .., offsets,
.., x_index, .., x_ongrid, x_gd)`'s forward, bit for bit. x [.., K] holds the producer's values
(its leading dims flattened to M rows), x_parts FP32 [M, P] their partial maxima; groups the
producer's (the down GEMM after `silu_mul_quantize_parts`: E, so that both decide on the rows
per expert the decode kernel sees, cdiv(M, E); the normed tokens: 1, the norm's M). Where
`norm_parts.codes_deferred(arch, M, groups)` holds - the producer then wrote no codes - the product's
per-expert rows run the decode kernel quantizing the gathered rows of x in its prologue
(`decode_gemm_prologue.py`: row_codes' own jit helpers on the row's values and maxima; a
gathered row's codes are its source row's, the blocks and the scale being row-local), or where
the experts' rows leave the decode buckets or the weight is on-grid, `row_codes_from_parts`
then the same GEMM as the old op; else the GEMM on x_ongrid, x_gd (the old op's launch).
CPU: `gemm.cpu_grouped_quantized` on the producer's codes, as the op it replaces.
`passes/defer_decode_codes.py` inserts it.
"""

from __future__ import annotations

import torch

from ..configs import decode_dispatch
from ..runtime import kernel_target
from . import gemm as impl
from . import grouped_quantized, norm_parts

_LIB = "fp4_compile"


def _kernels(t: torch.Tensor) -> bool:
    """Whether the op runs its kernels (CUDA; tests route CPU tensors through the Triton
    interpreter by patching this)."""
    return t.device.type == "cuda"


def _check(x, x_parts, w_codes, w_scales, w_global_decode, w_ongrid, offsets, x_index):
    n, k = impl.check_weight(x, w_codes, w_scales, w_global_decode, experts=True, w_ongrid=w_ongrid)
    m = x.numel() // k if k else 0
    if tuple(x_parts.shape[:1]) != (m,) or x_parts.dtype != torch.float32 or x_parts.dim() != 2:
        raise ValueError(
            f"x_parts must be FP32 [M={m}, P], got {x_parts.dtype}{list(x_parts.shape)}"
        )
    return n, k, m


@torch.library.custom_op(f"{_LIB}::nvfp4_grouped_mm_parts", mutates_args=())
def nvfp4_grouped_mm_parts(
    x: torch.Tensor,
    x_ongrid: torch.Tensor,
    x_gd: torch.Tensor,
    x_parts: torch.Tensor,
    w_codes: torch.Tensor,
    w_scales: torch.Tensor,
    w_global_decode: torch.Tensor,
    w_ongrid: torch.Tensor | None,
    offsets: torch.Tensor,
    x_index: torch.Tensor | None,
    groups: int = 1,
) -> torch.Tensor:
    n, k, m = _check(x, x_parts, w_codes, w_scales, w_global_decode, w_ongrid, offsets, x_index)
    norm_parts.check_groups(groups)
    x2 = x.reshape(m, k)
    grouped_quantized.check_operands(x2, x_ongrid, x_gd, offsets, w_codes.shape[0], x_index)
    if not _kernels(x):
        w = impl.weight_tensor(w_codes, w_scales, w_global_decode, n, k)
        return impl.cpu_grouped_quantized(x_ongrid, x_gd, w, offsets, x_index).to(x.dtype)
    weight = (w_codes, w_scales, w_global_decode, w_ongrid)
    return _kernel_grouped(x2, x_ongrid, x_gd, x_parts, weight, offsets, x_index, groups)


def _kernel_grouped(x2, x_ongrid, x_gd, parts, weight, offsets, x_index, groups):
    """The GEMM launch(es) of `nvfp4_grouped_mm_parts` (module docstring)."""
    w_codes, w_scales, w_gd, w_ongrid = weight
    target = kernel_target(x2)
    m = x2.shape[0]
    if not norm_parts.codes_deferred(target.arch, m, groups):
        return impl.cuda_grouped_quantized(
            x_ongrid, x_gd, w_codes, w_scales, w_gd, w_ongrid, offsets, x2.dtype, x_index
        )
    x2, parts = x2.contiguous(), parts.contiguous()
    t = m if x_index is None else x_index.shape[0]
    rows = max(1, -(-t // w_codes.shape[0]))  # rows per expert, as cuda_grouped_quantized
    packed = w_ongrid is None and not impl.forward_uses_ongrid(x2.device.type, rows)
    if packed and decode_dispatch(target.arch, rows) is not None:
        from .decode_gemm_kernel import launch_decode_gemm  # lazy: imports triton

        return launch_decode_gemm(
            x2,
            None,
            (w_codes, w_scales),
            w_gd,
            out_dtype=x2.dtype,
            offsets=offsets,
            rows_per_group=rows,
            a_rows=x_index,
            a_parts=parts,
        )
    from .row_codes_kernel import row_codes_from_parts  # lazy: imports triton

    ongrid, gd, _ = row_codes_from_parts(x2, parts, target=target)
    return impl.cuda_grouped_quantized(
        ongrid, gd.reshape(m, 1), w_codes, w_scales, w_gd, w_ongrid, offsets, x2.dtype, x_index
    )


@nvfp4_grouped_mm_parts.register_fake
def _(
    x,
    x_ongrid,
    x_gd,
    x_parts,
    w_codes,
    w_scales,
    w_global_decode,
    w_ongrid,
    offsets,
    x_index,
    groups=1,
):
    n, _, m = _check(x, x_parts, w_codes, w_scales, w_global_decode, w_ongrid, offsets, x_index)
    norm_parts.check_groups(groups)
    return x.new_empty((m if x_index is None else x_index.shape[0], n))
