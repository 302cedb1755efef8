"""The NVFP4 quantize ops of the `fp4_compile::` namespace: registrations, fake (meta) kernels.

Shape legend: N rows (out-features of a weight), K in-features, E experts.

Ops (each a `torch.library.custom_op`: opaque to Dynamo and Inductor, which keeps one registered
boundary per GEMM and compiles on CPU, where `triton_op`/`wrap_triton` cannot):
- quantize(x, block, global_scale, static_amax, rounding, seed) -> (codes, block_scales, global_decode)
  global_scale: "per_tensor", "per_row", "per_expert", "static" (static_amax: a calibrated amax)
  or "shared" (static_amax: the amax x's weight group shares, `weight_group_amax`; the same
  numerics as "static", but a function of the weights: a rollout's weight store recomputes it).
- quantize_with_ongrid(same as quantize) -> (codes, block_scales, global_decode, on-grid BF16 copy):
  the lowering's weight quantize where the forward runs the on-grid GEMM (one kernel on CUDA).
- ongrid_weight(w_codes, w_scales) -> the on-grid BF16 copy of a quantized weight (E2M1 x E4M3,
  no global scale; exact), which the lowering passes as `w_ongrid` where the forward runs the
  on-grid GEMM: dequantized once per step, saved for the dgrad instead of decoded again there.
`w_scales` holds the E4M3 scale BYTES as uint8 (`.view(torch.uint8)`: float8 arguments break
opcheck's schema test on CPU).
CPU implementations are the reference (`fp4_compile/reference.py`); CUDA ones the Triton kernels
(`quantize_kernel.py`, `ongrid_weight_kernel.py`; imported lazily).
"""

from __future__ import annotations

import torch

from ... import reference as ref
from ...format import BLOCK_SIZE, decode_e2m1, unpack_codes
from . import gemm as impl

_LIB = "fp4_compile"


def _quantize_global(x, global_scale, static_amax):
    if global_scale in ("static", "shared"):
        if static_amax is None:
            raise ValueError(f"global_scale={global_scale!r} needs static_amax (float32)")
        if global_scale == "shared" and static_amax.numel() != 1:
            raise ValueError(
                "global_scale='shared' needs static_amax = one group amax (float32 []), got "
                f"shape {tuple(static_amax.shape)}"
            )
        return static_amax
    if global_scale not in ("per_tensor", "per_row", "per_expert"):
        raise ValueError(
            "global_scale must be 'per_tensor', 'per_row', 'per_expert', 'static' or 'shared', "
            f"got {global_scale!r}"
        )
    return global_scale


@torch.library.custom_op(f"{_LIB}::quantize", mutates_args=())
def quantize(
    x: torch.Tensor,
    block: str,
    global_scale: str,
    static_amax: torch.Tensor | None,
    rounding: str,
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gs = _quantize_global(x, global_scale, static_amax)
    return _quantize_impl(x, block, gs, rounding, seed)


def _no_packed_bytes(x):
    """The (codes, block scales) of a weight quantized on-grid only: [..., N, 0] each, shapes
    that say so (`gemm.check_weight` then takes K from the on-grid copy)."""
    lead = x.shape[:-1]
    return (
        x.new_empty((*lead, 0), dtype=torch.uint8),
        x.new_empty((*lead, 0), dtype=torch.float8_e4m3fn),
    )


def _quantize_impl(x, block, gs, rounding, seed, with_ongrid=False, packed=True, into=None):
    """-> (codes, block scales, global decode), plus the on-grid BF16 values when with_ongrid
    (on CUDA from the same kernel pass); packed=False (with with_ongrid): the on-grid values
    only, codes and scales empty (`_no_packed_bytes`). into (CUDA): (codes, scale bytes as
    uint8, on-grid) buffers the kernels write instead of new ones (`quantize_into`)."""
    if x.device.type == "cuda":
        from .quantize_kernel import quantize_triton  # lazy: imports triton

        if isinstance(gs, torch.Tensor) and gs.numel() > 1:
            gs = gs.reshape(-1, 1, 1)
        if with_ongrid and not packed:
            ongrid, gd = quantize_triton(
                x,
                block=block,
                global_scale=gs,
                rounding=rounding,
                seed=seed,
                out="ongrid",
                into=into,
            )
            return (*_no_packed_bytes(x), gd.contiguous(), ongrid)
        q = quantize_triton(
            x,
            block=block,
            global_scale=gs,
            rounding=rounding,
            seed=seed,
            out="both" if with_ongrid else "packed",
            into=into,
        )
        if with_ongrid:
            q, ongrid = q
            return q.codes, q.block_scales, q.global_decode, ongrid
    elif gs == "per_expert" or (isinstance(gs, torch.Tensor) and gs.numel() > 1):
        if block != "16x16":
            raise ValueError("per-expert global scales are for 16x16 expert weights [E, N, K]")
        q = ref.quantize_experts(x, global_amax_E=None if gs == "per_expert" else gs.reshape(-1))
    else:
        q = ref.quantize(
            x, block=block, global_scale=gs, rounding=rounding, seed=seed, check_finite=False
        )
    if with_ongrid:
        scale_bytes = q.block_scales.view(torch.uint8)
        ongrid = ongrid_weight(q.codes, scale_bytes)
        codes, scales = (q.codes, q.block_scales) if packed else _no_packed_bytes(x)
        return codes, scales, q.global_decode, ongrid
    return q.codes, q.block_scales, q.global_decode


@torch.no_grad()
def quantize_into(
    x,
    block,
    global_scale,
    static_amax,
    rounding,
    seed,
    *,
    codes,
    scales,
    global_decode,
    ongrid=None,
) -> None:
    """Write what `quantize(x, block, global_scale, static_amax, rounding, seed)` returns
    (ongrid None) or `quantize_with_ongrid(..., packed)` does (packed: codes hold bytes, not
    [..., N, 0]) into the given tensors, which keep their addresses (a weight store's). The
    ops' own implementation with the same arguments, so the same bytes; on CUDA the kernels
    write codes, scales and the on-grid copy in place (no copy of them; the global decode,
    a few bytes, is copied), on CPU the reference's results are copied in."""
    gs = _quantize_global(x, global_scale, static_amax)
    with_ongrid = ongrid is not None
    packed = codes.shape[-1] > 0
    if not (packed or with_ongrid):
        raise ValueError("quantize_into needs packed codes or an on-grid buffer to write")
    cuda = x.device.type == "cuda"
    into = None
    if cuda:
        into = (codes if packed else None, scales.view(torch.uint8) if packed else None, ongrid)
    out = _quantize_impl(x, block, gs, rounding, seed, with_ongrid, packed, into=into)
    mine = (codes, scales, global_decode, ongrid)
    for dst, src in zip(mine, out):
        if dst is not None and dst.numel() and dst.data_ptr() != src.data_ptr():
            dst.copy_(src)


@quantize.register_fake
def _quantize_fake(x, block, global_scale, static_amax, rounding, seed):
    k = x.shape[-1]
    codes = x.new_empty((*x.shape[:-1], k // 2), dtype=torch.uint8)
    scales = x.new_empty((*x.shape[:-1], k // BLOCK_SIZE), dtype=torch.float8_e4m3fn)
    if global_scale == "per_row":
        gd = x.new_empty((*x.shape[:-1], 1), dtype=torch.float32)
    elif global_scale == "per_expert" or (static_amax is not None and static_amax.numel() > 1):
        gd = x.new_empty((x.shape[0], 1, 1), dtype=torch.float32)
    else:
        gd = x.new_empty((), dtype=torch.float32)
    return codes, scales, gd


# ---------------------------------------------------------------------------------------------
# ongrid_weight


def _check_packed_weight(w_codes, w_scales):
    if not isinstance(w_codes, torch.Tensor) or w_codes.dtype != torch.uint8 or w_codes.dim() < 2:
        raise TypeError(
            f"w_codes must be packed E2M1 codes, uint8 [.., N, K/2], got "
            f"{getattr(w_codes, 'dtype', w_codes)}{list(getattr(w_codes, 'shape', []))}"
        )
    impl.require_packed_bytes(w_codes)
    k = w_codes.shape[-1] * 2
    want = (*w_codes.shape[:-1], k // BLOCK_SIZE)
    if not isinstance(w_scales, torch.Tensor) or w_scales.dtype != torch.uint8:
        raise TypeError(f"w_scales must be the E4M3 scale bytes as uint8, got {w_scales!r:.80}")
    if k % BLOCK_SIZE or tuple(w_scales.shape) != want:
        raise ValueError(
            f"w_scales shape {tuple(w_scales.shape)} does not match w_codes "
            f"{tuple(w_codes.shape)} (want {want}, K a multiple of {BLOCK_SIZE})"
        )
    return k


@torch.library.custom_op(f"{_LIB}::ongrid_weight", mutates_args=())
def ongrid_weight(w_codes: torch.Tensor, w_scales: torch.Tensor) -> torch.Tensor:
    k = _check_packed_weight(w_codes, w_scales)
    if w_codes.device.type == "cuda":
        from .ongrid_weight_kernel import ongrid_weight as kernel  # lazy: imports triton

        return kernel(w_codes.contiguous(), w_scales.contiguous())
    values = decode_e2m1(unpack_codes(w_codes))
    scales = w_scales.view(torch.float8_e4m3fn).to(torch.float32)
    out = values * scales.repeat_interleave(BLOCK_SIZE, dim=-1)  # exact (<= 6 significant bits)
    return out.reshape(*w_codes.shape[:-1], k).to(torch.bfloat16)


@ongrid_weight.register_fake
def _(w_codes, w_scales):
    k = _check_packed_weight(w_codes, w_scales)
    return w_codes.new_empty((*w_codes.shape[:-1], k), dtype=torch.bfloat16)


@torch.library.custom_op(f"{_LIB}::quantize_with_ongrid", mutates_args=())
def quantize_with_ongrid(
    x: torch.Tensor,
    block: str,
    global_scale: str,
    static_amax: torch.Tensor | None,
    rounding: str,
    seed: int,
    packed: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`quantize` (same arguments, same first three outputs) plus the on-grid BF16 copy of the
    result, `ongrid_weight(codes, scales)`: on CUDA both from one read of x (one kernel instead
    of quantize, then a second pass decoding the packed bytes). packed=False: no packed bytes
    (codes and scales [..., N, 0]), for a graph whose GEMMs all read the on-grid copy (the
    learner's: `passes/skip_unread_packed_weights.py`); the copy and global decode unchanged."""
    gs = _quantize_global(x, global_scale, static_amax)
    return _quantize_impl(x, block, gs, rounding, seed, with_ongrid=True, packed=packed)


@quantize_with_ongrid.register_fake
def _(x, block, global_scale, static_amax, rounding, seed, packed=True):
    codes, scales, gd = _quantize_fake(x, block, global_scale, static_amax, rounding, seed)
    if not packed:
        codes, scales = _no_packed_bytes(x)
    return codes, scales, gd, x.new_empty(x.shape, dtype=torch.bfloat16)
