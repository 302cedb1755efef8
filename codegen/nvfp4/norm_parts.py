"""The per-row NVFP4 operand of a decode GEMM left to the GEMM's prologue: the producer writes the
rows' values and maxima, and the decode GEMM quantizes them itself (`decode_gemm_prologue.py`),
so that no `row_codes` launch runs between them (issue 53). Inference only (no autograd).

Shape legend: M rows (x's leading dims flattened), H hidden (a multiple of 16), N out-features,
P partial maxima per row.

Ops:
- rms_norm_quantize_parts(x, residual, weight, eps, recipe) -> (y, x_ongrid, x_gd, x_parts, h):
  y, x_ongrid, x_gd are `add_rms_norm_quantize(x, residual, ...)`'s (residual given) or
  `rms_norm_quantize(x, ...)`'s (None) with transposed=False, bit for bit; x_parts FP32 [M, 1]
  holds y's row maxima (NaN where a row holds one); h is x + residual ([0] without a residual).
  Where `codes_deferred` holds (few rows, a decode GEMM) the CUDA path runs the norm's split
  form's first launch alone: x_ongrid and x_gd are then NOT written (the consumer below reads
  y and x_parts instead).
- nvfp4_linear_parts(x, x_ongrid, x_gd, x_parts, w_codes, w_scales, w_global_decode, w_ongrid,
  bias) -> y [.., N]: `nvfp4_linear_quantized(x, .., x_ongrid, x_gd)`'s forward (per-row
  activation scales, no X^T), bit for bit: where `codes_deferred` holds, the decode GEMM
  quantizes x from x_parts in its prologue (== `row_codes_from_parts` then the decode GEMM,
  `decode_gemm_prologue.py`), or with an on-grid weight `row_codes_from_parts` then the GEMM;
  else the GEMM on x_ongrid, x_gd.
The two ops decide by one function of (architecture, M), `codes_deferred`, so the consumer reads
the codes exactly where the producer wrote them. CPU: the references (the producer's codes,
`gemm.cpu_linear_quantized`), as the ops they replace. `passes/defer_decode_codes.py` rewrites
an inference graph's producer/consumer pairs into these ops.
"""

from __future__ import annotations

import torch

from ..configs import decode_dispatch
from ..runtime import kernel_target
from . import gemm as impl
from . import rms_norm_quantize as norm_quantize

_LIB = "fp4_compile"


def check_groups(groups: int) -> None:
    if groups < 1:
        raise ValueError(f"groups must be >= 1, got {groups}")


def codes_deferred(arch: str, m: int, groups: int = 1) -> bool:
    """Whether the producer leaves the codes of M rows to the consumer's decode GEMM: the GEMM
    of M rows split over `groups` weights (the experts' down GEMM: its E experts) runs the
    decode kernel at cdiv(M, groups) rows per weight (`configs.decode_dispatch`; the prologue
    reads parts). Producer and consumer pass the same M and groups."""
    check_groups(groups)
    return m > 0 and decode_dispatch(arch, -(-m // groups)) is not None


def _kernels(t: torch.Tensor) -> bool:
    """Whether the ops run their kernels (CUDA; the engine tests route CPU tensors through the
    Triton interpreter by patching this)."""
    return t.device.type == "cuda"


def _rows(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1] if x.shape[-1] else 0


@torch.library.custom_op(f"{_LIB}::rms_norm_quantize_parts", mutates_args=())
def rms_norm_quantize_parts(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor | None,
    eps: float,
    recipe: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    norm_quantize._check(x, weight, recipe)
    if residual is not None:
        norm_quantize._check_residual(x, residual)
    m, hdim = _rows(x), x.shape[-1]
    if not _kernels(x):
        y, a, gd_a, _, _, h = norm_quantize._forward(x, residual, weight, eps, recipe, False)
        parts = y.reshape(m, hdim).abs().amax(dim=1, keepdim=True).to(torch.float32)
    else:
        from . import rms_norm_quantize_kernel as kernel  # lazy: imports triton

        if codes_deferred(kernel_target(x).arch, m):
            y, parts, h = kernel.rms_norm_amax(x, residual, weight, eps)
            a = torch.empty((m, hdim), dtype=torch.bfloat16, device=x.device)  # not written
            gd_a = torch.empty((m, 1), dtype=torch.float32, device=x.device)  # not written
        elif residual is None:
            y, a, gd_a, amax = kernel.rms_norm_quantize(x, weight, eps)
            parts, h = amax.reshape(m, 1), x
        else:
            y, a, gd_a, amax, h = kernel.add_rms_norm_quantize(x, residual, weight, eps)
            parts = amax.reshape(m, 1)
    h = x.new_empty((0,)) if residual is None else h.reshape(x.shape).contiguous()
    return y.reshape(x.shape).contiguous(), a, gd_a.contiguous(), parts.contiguous(), h


@rms_norm_quantize_parts.register_fake
def _(x, residual, weight, eps, recipe):
    norm_quantize._check(x, weight, recipe)
    m, hdim = _rows(x), x.shape[-1]
    return (
        x.new_empty(x.shape),
        x.new_empty((m, hdim), dtype=torch.bfloat16),
        x.new_empty((m, 1), dtype=torch.float32),
        x.new_empty((m, 1), dtype=torch.float32),
        x.new_empty((0,)) if residual is None else x.new_empty(x.shape),
    )


@torch.library.custom_op(f"{_LIB}::nvfp4_linear_parts", mutates_args=())
def nvfp4_linear_parts(
    x: torch.Tensor,
    x_ongrid: torch.Tensor,
    x_gd: torch.Tensor,
    x_parts: torch.Tensor,
    w_codes: torch.Tensor,
    w_scales: torch.Tensor,
    w_global_decode: torch.Tensor,
    w_ongrid: torch.Tensor | None,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    n, k = impl.check_weight(
        x, w_codes, w_scales, w_global_decode, experts=False, w_ongrid=w_ongrid
    )
    m = _rows(x)
    if tuple(x_parts.shape[:1]) != (m,) or x_parts.dtype != torch.float32 or x_parts.dim() != 2:
        raise ValueError(
            f"x_parts must be FP32 [M={m}, P], got {x_parts.dtype}{list(x_parts.shape)}"
        )
    if not _kernels(x):
        w = impl.weight_tensor(w_codes, w_scales, w_global_decode, n, k)
        y = impl.cpu_linear_quantized(x_ongrid, x_gd, w, bias, x.dtype)
    else:
        y = _kernel_linear(
            x.reshape(m, k),
            x_ongrid,
            x_gd,
            x_parts,
            w_codes,
            w_scales,
            w_global_decode,
            w_ongrid,
            bias,
        )
    return y.reshape(*x.shape[:-1], n)


def _kernel_linear(x2, x_ongrid, x_gd, parts, w_codes, w_scales, w_gd, w_ongrid, bias):
    """The GEMM launch(es) of `nvfp4_linear_parts` (module docstring)."""
    target = kernel_target(x2)
    m = x2.shape[0]
    if not codes_deferred(target.arch, m):
        return impl.cuda_linear_quantized(
            x_ongrid, x_gd, w_codes, w_scales, w_gd, w_ongrid, bias, x2.dtype
        )
    x2, parts = x2.contiguous(), parts.contiguous()
    if w_ongrid is None and not impl.forward_uses_ongrid(x2.device.type, m):
        from .decode_gemm_kernel import launch_decode_gemm  # lazy: imports triton

        return launch_decode_gemm(
            x2,
            None,
            (w_codes, w_scales),
            w_gd,
            bias=bias,
            out_dtype=x2.dtype,
            rows_per_group=m,
            a_parts=parts,
        )
    from .row_codes_kernel import row_codes_from_parts  # lazy: imports triton

    ongrid, gd, _ = row_codes_from_parts(x2, parts, target=target)
    return impl.cuda_linear_quantized(
        ongrid, gd.reshape(m, 1), w_codes, w_scales, w_gd, w_ongrid, bias, x2.dtype
    )


@nvfp4_linear_parts.register_fake
def _(x, x_ongrid, x_gd, x_parts, w_codes, w_scales, w_global_decode, w_ongrid, bias):
    n, _ = impl.weight_nk(w_codes, w_ongrid)
    return x.new_empty((*x.shape[:-1], n))
