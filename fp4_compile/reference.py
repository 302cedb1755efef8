"""Reference NVFP4 numerics in plain PyTorch. Every kernel in minite is compared with this file.

Shape legend: M rows of A (tokens), N rows of B (out-features), K the contraction dimension,
E experts, T tokens sorted by expert.

Quantization, step by step (TransformerEngine's kernel-matching reference, op for op; every
operation below is one FP32 operation unless stated otherwise):

1. ``amax``: max |x| over the tensor (``per_tensor``) or over each row (``per_row``), taken in
   x's own dtype, then converted to FP32. For ``static`` the caller passes amax (a calibrated FP32
   scalar). NaN/Inf in x are rejected before anything else.
2. ``global_encode = (448 * 6) / amax``; then ``min(global_encode, FLT_MAX)`` (so amax == 0 gives
   FLT_MAX, not inf); then 1.0 where global_encode == 0 exactly (infinite amax, static only).
3. ``global_decode = 1 / global_encode``.
4. ``multiplier = global_encode * (1 / 6)``, the reciprocal of 6 taken in FP32 first. Easy to
   "simplify" wrongly: ``vec_max * global_encode / 6`` rounds twice and differs in the last ulp,
   which can flip an E4M3 rounding and change all 16 values of the block.
5. ``vec_max``: max |x| over the block (16 consecutive elements along K, or a 16x16 tile whose
   maximum is repeated for its 16 rows), in x's dtype, then FP32.
6. ``decode_scale = vec_max * multiplier`` (ONE rounding), ``min(., FLT_MAX)``, clamp to
   [-448, 448], cast to float8_e4m3fn with round-to-nearest-even (subnormals included).
7. ``encode_scale = min(1 / (float(decode_scale) * global_decode), FLT_MAX)``: the product is one
   rounding, the reciprocal another. A zero block scale gives FLT_MAX.
8. ``codes = E2M1(clamp(float32(x) * encode_scale, -6, 6))`` with round-to-nearest-even on the
   codes: |v| <= 0.25 -> 0, < 0.75 -> 0.5, <= 1.25 -> 1, < 1.75 -> 1.5, <= 2.5 -> 2, < 3.5 -> 3,
   <= 5 -> 4, else 6 (ties go to the even code). The sign bit is set for v < 0, so -0.0 encodes as
   code 0 and values in [-0.25, 0) as code 8 (-0).
   ``stochastic`` rounding (gradients only) rounds |v| up to the next grid point with probability
   (|v| - lo) / (hi - lo), u < that probability with u from ``sr_stream.sr_uniforms(shape, seed)``
   (a counter-based integer hash of (seed, flat index), exact on any device).

Dequantization: ``(E2M1(code) * float(decode_scale)) * global_decode``. The first product is exact
(at most 6 significant bits: exact in BF16), the second is one FP32 rounding.

GEMM contract for Hopper (minite's, not TE's alpha formulation): D = (acc * gd_a) * gd_b in FP32,
where acc is the dot product of the on-grid operands. Here acc is computed EXACTLY (integer
arithmetic, independent of summation order) and rounded to FP32 once; kernels accumulate in FP32
on tensor cores and are compared with this oracle through error budgets, with each other bitwise.
"""

from __future__ import annotations

import torch

from .format import (
    BLOCK_SHAPES,
    BLOCK_SIZE,
    E2M1_MAGNITUDES,
    E2M1_MAX,
    E4M3_MAX,
    FLT_MAX,
    ROUNDING_MODES,
    NVFP4Tensor,
    pack_codes,
)
from .sr_stream import sr_uniforms

INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# on-grid value * 2**10 is an integer: E2M1 is a multiple of 0.5, E4M3 of 2**-9.
_GRID_INT_SHIFT = 10


def _check_finite(x: torch.Tensor, name: str) -> None:
    bad = ~torch.isfinite(x)
    if bool(bad.any()):
        first = tuple(int(i) for i in bad.nonzero()[0].tolist())
        raise ValueError(
            f"{name} contains NaN or Inf (first at index {first}, value {x[first].item()}); "
            "NVFP4 has no encoding for it"
        )


def validate_input(x: torch.Tensor, block: str, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(f"{name} must be float32, bfloat16 or float16, got {x.dtype}")
    if block not in BLOCK_SHAPES:
        raise ValueError(f"block must be one of {BLOCK_SHAPES}, got {block!r}")
    if x.dim() < 1:
        raise ValueError(f"{name} must have at least one dimension, got a scalar")
    if x.shape[-1] % BLOCK_SIZE:
        raise ValueError(
            f"{name} last dimension must be a multiple of {BLOCK_SIZE} (no implicit padding), "
            f"got shape {tuple(x.shape)}"
        )
    if block == "16x16":
        if x.dim() < 2 or x.shape[-2] % BLOCK_SIZE:
            raise ValueError(
                f"block='16x16' needs {name} rows (dim -2) to be a multiple of {BLOCK_SIZE}, "
                f"got shape {tuple(x.shape)}"
            )


def global_encode_from_amax(amax: torch.Tensor) -> torch.Tensor:
    """Steps 2: FP32 amax -> FP32 global encode scale (448*6/amax, capped, inf amax -> 1)."""
    amax = amax.to(torch.float32)
    enc = torch.tensor(E4M3_MAX * E2M1_MAX, dtype=torch.float32, device=amax.device) / amax
    enc = torch.clamp(enc, max=FLT_MAX)
    return torch.where(enc == 0, torch.ones_like(enc), enc)


def global_scales(amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Steps 2-4: FP32 amax -> (global_encode, global_decode = 1 / encode, multiplier =
    encode * fp32(1/6)), each one IEEE-rounded FP32 operation, elementwise."""
    global_encode = global_encode_from_amax(amax)
    one = torch.tensor(1.0, dtype=torch.float32, device=amax.device)
    global_decode = one / global_encode
    multiplier = global_encode * torch.tensor(1.0 / 6.0, dtype=torch.float32, device=amax.device)
    return global_encode, global_decode, multiplier


def global_amax(x: torch.Tensor, mode: str) -> torch.Tensor:
    """Step 1: amax in x's dtype, then FP32; [] for per_tensor, [..., R, 1] for per_row."""
    if mode == "per_tensor":
        return x.abs().amax().to(torch.float32) if x.numel() else torch.zeros((), device=x.device)
    if mode == "per_row":
        if x.shape[-1] == 0:
            return torch.zeros((*x.shape[:-1], 1), device=x.device)
        return x.abs().amax(dim=-1, keepdim=True).to(torch.float32)
    raise ValueError(f"global_scale mode {mode!r} has no data-derived amax")


def group_amax(weights: list[torch.Tensor] | tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Step 1 for a group of weights sharing one global scale (`NVFP4Recipe.shared_weight_scale`):
    FP32 [] = the max of the members' per-tensor amaxes. Max is exact, so this equals the
    per-tensor amax of the members stacked along N: quantizing each member with it as a static
    amax gives the bytes `quantize(stacked, block="16x16", global_scale="per_tensor")` gives."""
    if not isinstance(weights, (list, tuple)) or not weights:
        raise ValueError(f"weights must be a non-empty list of tensors, got {weights!r:.80}")
    amaxes = [global_amax(w, "per_tensor") for w in weights]
    return torch.stack(amaxes).amax()


def _block_amax(x: torch.Tensor, block: str) -> torch.Tensor:
    """Step 5: [..., K/16] FP32 block maxima (16x16 tiles repeated over their 16 rows)."""
    k = x.shape[-1]
    blocks = x.abs().reshape(*x.shape[:-1], k // BLOCK_SIZE, BLOCK_SIZE).amax(dim=-1)
    if block == "16x16":
        r = x.shape[-2]
        tiles = blocks.reshape(*x.shape[:-2], r // BLOCK_SIZE, BLOCK_SIZE, k // BLOCK_SIZE)
        tiles = tiles.amax(dim=-2, keepdim=True).expand_as(tiles)
        blocks = tiles.reshape(*x.shape[:-2], r, k // BLOCK_SIZE)
    return blocks.to(torch.float32)


def e2m1_round_rne(v: torch.Tensor) -> torch.Tensor:
    """Step 8: FP32 values in [-6, 6] -> uint8 codes, round-to-nearest-even on the codes."""
    mag = v.abs()
    idx = (
        (mag > 0.25).to(torch.uint8)
        + (mag >= 0.75)
        + (mag > 1.25)
        + (mag >= 1.75)
        + (mag > 2.5)
        + (mag >= 3.5)
        + (mag > 5.0)
    ).to(torch.uint8)
    return idx | ((v < 0).to(torch.uint8) << 3)


def e2m1_round_stochastic(v: torch.Tensor, seed: int) -> torch.Tensor:
    """Stochastic rounding of FP32 values in [-6, 6] to E2M1 codes, reproducible from `seed`."""
    grid = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=v.device)
    mag = v.abs()
    hi_idx = torch.searchsorted(grid, mag.contiguous(), right=False).clamp(max=7)
    lo_idx = torch.where(grid[hi_idx] == mag, hi_idx, (hi_idx - 1).clamp(min=0))
    lo, hi = grid[lo_idx], grid[hi_idx]
    u = sr_uniforms(v.shape, seed, v.device)
    span = torch.where(hi > lo, hi - lo, torch.ones_like(hi))
    up = u < (mag - lo) / span
    idx = torch.where(up, hi_idx, lo_idx).to(torch.uint8)
    return idx | ((v < 0).to(torch.uint8) << 3)


def quantize(
    x: torch.Tensor,
    *,
    block: str = "1x16",
    global_scale: str | torch.Tensor = "per_tensor",
    rounding: str = "rne",
    seed: int | None = None,
    check_finite: bool = True,
    name: str = "x",
) -> NVFP4Tensor:
    """Quantize x to NVFP4 (the reference; see the module docstring for every step).

    Args:
        x: float32 / bfloat16 / float16, last dim a multiple of 16 (no implicit padding).
        block: "1x16" (activations, gradients) or "16x16" (weights: W and W^T quantize alike).
        global_scale: "per_tensor", "per_row" (one FP32 scale per row of the last dim), or a
            float32 scalar tensor holding a calibrated static amax.
        rounding: "rne" or "stochastic" (needs `seed`).
        check_finite: reject NaN/Inf (costs a host sync; kernels on hot paths skip it).
    """
    validate_input(x, block, name)
    if isinstance(global_scale, torch.Tensor):
        if global_scale.dtype != torch.float32:
            raise TypeError(f"static global_scale must be float32, got {global_scale.dtype}")
        if global_scale.device != x.device:
            raise TypeError(
                f"static global_scale is on {global_scale.device} but {name} is on {x.device}"
            )
        if global_scale.numel() != 1:
            raise ValueError(
                f"static global_scale must hold one amax, got shape {tuple(global_scale.shape)}"
            )
        if check_finite and bool(global_scale.reshape(()) < 0):
            raise ValueError(f"static global_scale (amax) must be >= 0, got {global_scale.item()}")
        amax = global_scale.reshape(())
    elif global_scale in ("per_tensor", "per_row"):
        if global_scale == "per_row" and block == "16x16":
            raise ValueError(
                "global_scale='per_row' with block='16x16' would quantize W and W^T differently; "
                "use 'per_tensor' or 'static' for 16x16 weights"
            )
        amax = None
    else:
        raise ValueError(
            f"global_scale must be 'per_tensor', 'per_row' or a float32 tensor, got {global_scale!r}"
        )
    if rounding not in ROUNDING_MODES:
        raise ValueError(f"rounding must be one of {ROUNDING_MODES}, got {rounding!r}")
    if rounding == "stochastic" and seed is None:
        raise ValueError("rounding='stochastic' needs an integer seed (reproducibility)")
    if check_finite and x.numel():
        _check_finite(x, name)

    if amax is None:
        amax = global_amax(x, global_scale)
    _, global_decode, multiplier = global_scales(amax)

    vec_max = _block_amax(x, block)  # [..., K/16]
    decode_scale = vec_max * multiplier  # multiplier broadcasts: [] or [..., R, 1]
    decode_scale = torch.clamp(decode_scale, min=-E4M3_MAX, max=E4M3_MAX)
    block_scales = decode_scale.to(torch.float8_e4m3fn)

    encode_scale = torch.tensor(1.0, dtype=torch.float32, device=x.device) / (
        block_scales.to(torch.float32) * global_decode
    )
    encode_scale = torch.clamp(encode_scale, max=FLT_MAX)
    encode_full = encode_scale.repeat_interleave(BLOCK_SIZE, dim=-1)
    v = torch.clamp(x.to(torch.float32) * encode_full, -E2M1_MAX, E2M1_MAX)
    if rounding == "rne":
        codes = e2m1_round_rne(v)
    else:
        codes = e2m1_round_stochastic(v, seed)
    return NVFP4Tensor(
        codes=pack_codes(codes),
        block_scales=block_scales,
        global_decode=global_decode.contiguous(),
        shape=tuple(x.shape),
        block=block,
    )


def dequantize(t: NVFP4Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(E2M1 x E4M3, exact) x global_decode (one FP32 rounding), then cast to `dtype`."""
    if not isinstance(t, NVFP4Tensor):
        raise TypeError(f"dequantize expects an NVFP4Tensor, got {type(t).__name__}")
    return (t.on_grid(torch.float32) * t.global_decode).to(dtype)


def _grid_ints(t: NVFP4Tensor) -> torch.Tensor:
    """On-grid values times 2**10, as exact float64 integers below 2**22 in magnitude."""
    return t.on_grid(torch.float64) * float(2**_GRID_INT_SHIFT)


def _exact_int_mm(a_int: torch.Tensor, b_int: torch.Tensor) -> torch.Tensor:
    """Exact integer a @ b.T for integer-valued float64 inputs with |entries| < 2**22.

    Splits a into 11-bit halves so that every partial sum of either float64 GEMM is an integer
    below 2**53 (for K <= 2**19): each GEMM is then exact in ANY summation order, and the halves
    recombine exactly in int64.
    """
    k = a_int.shape[-1]
    if k > 2**19:
        raise ValueError(f"exact reference GEMM supports K <= 2**19, got K={k}")
    a_hi = torch.trunc(a_int / 2048.0)
    a_lo = a_int - a_hi * 2048.0
    hi = (a_hi @ b_int.transpose(-1, -2)).to(torch.int64)
    lo = (a_lo @ b_int.transpose(-1, -2)).to(torch.int64)
    return hi * 2048 + lo


def _check_mm_operands(a: NVFP4Tensor, b: NVFP4Tensor, b_rank: int) -> None:
    if not isinstance(a, NVFP4Tensor) or not isinstance(b, NVFP4Tensor):
        raise TypeError("operands must be NVFP4Tensor (quantize them first)")
    if len(a.shape) != 2 or len(b.shape) != b_rank:
        raise ValueError(f"expected a [M, K] and b of rank {b_rank}, got {a.shape} and {b.shape}")
    if a.shape[-1] != b.shape[-1]:
        raise ValueError(f"contraction dims differ: a {a.shape} vs b {b.shape}")
    if a.device != b.device:
        raise TypeError(f"operands on different devices: {a.device} vs {b.device}")


def exact_dot_fp32(a: NVFP4Tensor, b: NVFP4Tensor) -> torch.Tensor:
    """The on-grid dot products a @ b.T, computed exactly and rounded to FP32 once. [M, N]."""
    acc_int = _exact_int_mm(_grid_ints(a), _grid_ints(b))
    # int64 -> float32 is one round-to-nearest-even; the power-of-two rescale is exact.
    return acc_int.to(torch.float32) * float(2 ** (-2 * _GRID_INT_SHIFT))


def exact_dot_ongrid(a_ongrid: torch.Tensor, b_ongrid: torch.Tensor) -> torch.Tensor:
    """`exact_dot_fp32` of operands given as their on-grid values (E2M1 x E4M3, no global
    scale, e.g. BF16 from `NVFP4Tensor.on_grid`): a [.., M, K], b [.., N, K] -> FP32 [.., M, N],
    the same bits as `exact_dot_fp32` of the NVFP4 tensors those values come from."""
    shift = float(2**_GRID_INT_SHIFT)
    acc_int = _exact_int_mm(a_ongrid.to(torch.float64) * shift, b_ongrid.to(torch.float64) * shift)
    return acc_int.to(torch.float32) * float(2 ** (-2 * _GRID_INT_SHIFT))


def apply_global_scales(acc: torch.Tensor, gd_a: torch.Tensor, gd_b: torch.Tensor) -> torch.Tensor:
    """The FP32 epilogue every kernel implements: (acc * gd_a) * gd_b, gd_a [M,1] or [],
    gd_b [N,1] or [] (transposed to a row vector here)."""
    if gd_b.dim() > 0:
        gd_b = gd_b.reshape(1, -1)
    return (acc * gd_a) * gd_b


def nvfp4_mm(a: NVFP4Tensor, b: NVFP4Tensor) -> torch.Tensor:
    """Reference W4A4 GEMM: a [M, K], b [N, K] -> float32 [M, N] = (exact_dot * gd_a) * gd_b."""
    _check_mm_operands(a, b, 2)
    return apply_global_scales(exact_dot_fp32(a, b), a.global_decode, b.global_decode)


def check_offsets(offsets: torch.Tensor, num_tokens: int, num_experts: int) -> None:
    """Validate `torch._grouped_mm`-style offsets: int32 [E], cumulative group ends, last == T."""
    if not isinstance(offsets, torch.Tensor) or offsets.dtype != torch.int32:
        raise TypeError(
            f"offsets must be an int32 tensor, got {getattr(offsets, 'dtype', offsets)}"
        )
    if offsets.dim() != 1 or offsets.numel() != num_experts:
        raise ValueError(f"offsets must have shape [{num_experts}], got {tuple(offsets.shape)}")
    if num_experts:
        ends = offsets.cpu()
        starts = torch.cat([ends.new_zeros(1), ends[:-1]])
        if bool((ends < starts).any()) or int(ends[-1]) != num_tokens:
            raise ValueError(
                f"offsets must be non-decreasing group ends with offsets[-1] == T={num_tokens}, "
                f"got {ends.tolist()}"
            )


def nvfp4_grouped_mm(a: NVFP4Tensor, b: NVFP4Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Reference grouped W4A4 GEMM (MoE experts).

    a: [T, K] tokens sorted by expert; b: [E, N, K] expert weights (per-tensor global per expert
    is stored as global_decode [E, 1, 1], or one [] for all); offsets: int32 [E], offsets[e] is
    the END of expert e's rows (the `torch._grouped_mm` convention). Returns float32 [T, N],
    equal to a per-expert loop of `nvfp4_mm` by construction.
    """
    _check_mm_operands(a, b, 3)
    num_experts = b.shape[0]
    check_offsets(offsets, a.shape[0], num_experts)
    out = torch.empty((a.shape[0], b.shape[1]), dtype=torch.float32, device=a.device)
    start = 0
    for e, end in enumerate(offsets.cpu().tolist()):
        if end > start:
            b_e = b[e]
            if b_e.global_decode.dim() > 1:  # [1, 1] per-expert scale -> scalar
                b_e = NVFP4Tensor(
                    codes=b_e.codes,
                    block_scales=b_e.block_scales,
                    global_decode=b_e.global_decode.reshape(()),
                    shape=b_e.shape,
                    block=b_e.block,
                )
            out[start:end] = nvfp4_mm(a[start:end], b_e)
        start = end
    return out


def quantize_experts(
    w_ENK: torch.Tensor, *, global_amax_E: torch.Tensor | None = None
) -> NVFP4Tensor:
    """Quantize stacked expert weights [E, N, K] with 16x16 tiles and one global scale per
    expert (stored as global_decode [E, 1, 1]); each expert equals quantize(w[e], 16x16)."""
    if not isinstance(w_ENK, torch.Tensor) or w_ENK.dim() != 3:
        raise ValueError(
            f"w_ENK must be a 3D tensor [E, N, K], got {getattr(w_ENK, 'shape', w_ENK)}"
        )
    parts = []
    for e in range(w_ENK.shape[0]):
        gs = "per_tensor" if global_amax_E is None else global_amax_E[e].reshape(())
        parts.append(quantize(w_ENK[e], block="16x16", global_scale=gs, name=f"w_ENK[{e}]"))
    return NVFP4Tensor(
        codes=torch.stack([p.codes for p in parts]),
        block_scales=torch.stack([p.block_scales for p in parts]),
        global_decode=torch.stack([p.global_decode for p in parts]).reshape(-1, 1, 1),
        shape=tuple(w_ENK.shape),
        block="16x16",
    )
