"""Triton NVFP4 quantizer (1x16 blocks or 16x16 tiles; per-row, per-tensor or static global).

Shape legend: R rows (leading dims flattened), K the last dim (a multiple of 16).

Bitwise equal to `fp4_compile.reference.quantize`, step for step (see its docstring):
- The global stage (amax, global_encode, global_decode, multiplier): per row, one Triton launch
  (`global_scale_kernel.py`, bitwise the torch ops); per tensor, two (`abs_max_kernel.row_abs_max`, then
  that per-row stage over the row maxima as one row); otherwise (static or per-expert amaxes) a
  handful of torch ops on [] or [E, 1, 1] tensors, the very functions of the reference.
- The kernel does steps 5-8: vec_max (max |x| over 16 elements or a 16x16 tile), ONE FP32
  multiply by the multiplier, clamp to 448, E4M3 round-to-nearest-even done with INTEGER bit
  operations (`e4m3_rne`: the interpreter's fp32->fp8 cast is wrong, and integer code is the same
  on every backend), encode scale = min(div_rn(1, scale * global_decode), FLT_MAX) with an
  IEEE-rounded division (Triton's `/` may be approximate on CUDA), codes by the E2M1 RNE threshold
  table, or stochastic rounding given the reference's uniform stream.
Outputs: packed codes + E4M3 scale bytes (`out="packed"`), or the on-grid values
(E2M1 x E4M3, exact in BF16: `out="ongrid"`) that the GEMM kernels consume.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...format import BLOCK_SIZE, NVFP4Tensor
from ...reference import global_amax, validate_input
from ..configs import pick, pick_launch
from ..runtime import arch_of, check_kernel_device, compile_options, interpreting
from ..triton_helpers import (
    block_encode,
    e2m1_magnitude,
    e2m1_scaled,
    rne_integer,
    rne_ongrid_magnitude,
    signed_value,
    store_packed,
    tile16_max,
)
from .device_seed_kernel import seed_launch_args

FLAT32_LIMIT = 2**31  # flat SR indices below it: int32 arithmetic (tests lower it to cover int64)


@triton.jit
def _mix32(h):
    """The "lowbias32" mixer on uint32 (products wrap mod 2^32), as `sr_stream.mix32`."""
    h = h ^ (h >> 16)
    h = h * 0x7FEB352D
    h = h ^ (h >> 15)
    h = h * 0x846CA68B
    return h ^ (h >> 16)


@triton.jit
def _sr_uniform(flat, key, key_hi):
    """`sr_stream.sr_uniforms` at int64 flat indices, in registers: bitwise the same stream
    (one mixer round; a second where the index's high word is not zero)."""
    lo = (flat & 0xFFFFFFFF).to(tl.uint32)
    hi = (flat >> 32).to(tl.uint32)
    h = _mix32(lo ^ key)
    h = tl.where(hi != 0, _mix32(h ^ hi ^ key_hi), h)
    return (h >> 8).to(tl.float32) * 5.9604644775390625e-08  # 2**-24, exact


@triton.jit
def _sr_uniform32(flat, key):
    """`_sr_uniform` at flat indices below 2**31 held in int32 (their high word is 0): the
    same bits without 64-bit index arithmetic, one mixer round."""
    h = _mix32(flat.to(tl.uint32) ^ key)
    return (h >> 8).to(tl.float32) * 5.9604644775390625e-08  # 2**-24, exact


@triton.jit
def _sr_key_of(s):
    """`sr_stream.sr_key` of int64 seeds s >= 0, as uint32: the key a stream is drawn with."""
    lo = (s & 0xFFFFFFFF).to(tl.uint32)
    hi = (s >> 32).to(tl.uint32)
    return _mix32(_mix32(lo) ^ hi ^ 0x9E3779B9)


@triton.jit(do_not_specialize=["sr_seed"])
def _quantize_kernel(
    x_ptr, mult_ptr, gd_ptr, codes_ptr, scales_ptr, ongrid_ptr,
    R, K, stride_xr, mult_stride, gd_stride, sr_seed, seed_ptr, seed_offset,
    group_ptr, seg_start_ptr, seg_width_ptr, group_stride, src_ptr,
    stride_xc, n_tok,
    TILE16: tl.constexpr, STOCHASTIC: tl.constexpr, ONGRID: tl.constexpr,
    SEGMENTED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
    SEED_FROM_PTR: tl.constexpr = False, PACKED_TOO: tl.constexpr = False,
    ONE_SEGMENT: tl.constexpr = False, FLAT32: tl.constexpr = False,
):  # fmt: skip
    # FLAT32: every stochastic-rounding flat index is below 2**31: the stream is drawn with
    # int32 index arithmetic and one mixer round (`_sr_uniform32`), the same bits.
    # ONGRID: store the on-grid values; else the packed codes and scale bytes. PACKED_TOO (with
    # ONGRID): both, from one read of x (a weight's packed form and its on-grid copy).
    # The SR seed: sr_seed (a host int), or SEED_FROM_PTR: seed_ptr[0] + seed_offset (a seed held
    # on the device: CUDA-graph replays, `sr_stream.DeviceSeed`). The key `sr_key(seed)` is
    # derived here, per program (two mixer rounds on a scalar; no key tensors, no launches).
    # SEGMENTED: the columns are groups laid end to end (16-aligned segments, one per expert);
    # group_ptr[b] is the group of 16-column block b. Global scales are per group (x per row:
    # mult[g * group_stride + row * mult_stride]), and the SR stream of a group is that of its
    # own [R, width] matrix: flat index row * width + (col - start), seed (seed + g). Column c
    # reads x[row, src[c]] (x strided: stride_xr, stride_xc), or zero where src[c] < 0: the
    # quantizer gathers and transposes tokens itself (no padded copy of the operand).
    # ONE_SEGMENT (with SEGMENTED): the layout of one segment of all K columns, column c token c
    # below n_tok (else zero), computed here instead of read from the layout tensors (the
    # dense wgrad's operands: no per-call tensors); keys as in the unsegmented path.
    # Tensors are [BLOCK_M, NB, 16] (NB = BLOCK_K // 16 blocks of 16 columns): the block max is a
    # reduction over the last axis and its scales broadcast back along it, in the same register
    # layout (no reshape, no shuffle through shared memory for the 1x16 path).
    NB: tl.constexpr = BLOCK_K // 16
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    blk = pid_k * NB + tl.arange(0, NB)  # global 16-column block index [NB]
    rows3 = rows[:, None, None]
    cols3 = blk[None, :, None] * 16 + tl.arange(0, 16)[None, None, :]  # [1, NB, 16]
    rmask = rows < R
    mask = (rows3 < R) & (cols3 < K)
    if SEGMENTED:
        if ONE_SEGMENT:
            src = tl.where(cols3 < n_tok, cols3, -1).to(tl.int64)
        else:
            src = tl.load(src_ptr + cols3, mask=cols3 < K, other=-1)
        # (a token-major [BLOCK_K, BLOCK_M] load, transposed in registers, is slower on the
        # H200: benchmarks/results/2026-12-04_learner_1bb6149.md)
        x = tl.load(x_ptr + rows3 * stride_xr + src * stride_xc, mask=mask & (src >= 0),
                    other=0.0)  # fmt: skip
    else:
        x = tl.load(x_ptr + rows3 * stride_xr + cols3, mask=mask, other=0.0)
    x = x.to(tl.float32)
    vmax = tl.max(tl.abs(x), axis=2)  # [BM, NB]
    if TILE16:
        vmax = tile16_max(vmax, BLOCK_M, NB)
    if SEGMENTED:
        bmask = rmask[:, None] & (blk < K // 16)[None, :]
        if ONE_SEGMENT:
            grp = tl.zeros_like(blk)
        else:
            grp = tl.load(group_ptr + blk, mask=blk < K // 16, other=0)
        goff = grp[None, :] * group_stride + rows[:, None] * mult_stride  # [BM, NB]
        mult = tl.load(mult_ptr + goff, mask=bmask, other=1.0)
        gd = tl.load(gd_ptr + goff, mask=bmask, other=1.0)
    else:
        mult = tl.load(mult_ptr + rows * mult_stride, mask=rmask, other=1.0)[:, None]
        gd = tl.load(gd_ptr + rows * gd_stride, mask=rmask, other=1.0)[:, None]
    s_code, s_val, enc = block_encode(vmax, mult, gd)  # [BM, NB]
    v = tl.minimum(tl.maximum(x * enc[:, :, None], -6.0), 6.0)
    mag = tl.abs(v)
    y, base = e2m1_scaled(mag)
    if STOCHASTIC:
        if SEED_FROM_PTR:
            seed0 = tl.load(seed_ptr) + seed_offset
        else:
            seed0 = sr_seed.to(tl.int64)
        if SEGMENTED and not ONE_SEGMENT:
            gblk = tl.load(group_ptr + blk, mask=blk < K // 16, other=0)[None, :, None]
            start = tl.load(seg_start_ptr + gblk)
            width = tl.load(seg_width_ptr + gblk)
            klo = _sr_key_of(seed0 + gblk)
            khi = klo >> 1
            if FLAT32:
                flat = rows3 * width.to(tl.int32) + (cols3 - start.to(tl.int32))
                u = _sr_uniform32(flat, klo)
            else:
                flat = rows3.to(tl.int64) * width + (cols3 - start)
                u = _sr_uniform(flat, klo, khi)
        else:
            klo = _sr_key_of(seed0)
            khi = klo >> 1
            if FLAT32:
                u = _sr_uniform32(rows3 * K + cols3, klo)
            else:
                u = _sr_uniform(rows3.to(tl.int64) * K + cols3, klo, khi)
        # the grid points around |v| are floor(y) and floor(y) + 1 (in units of the spacing), and
        # y - floor(y) is exactly the reference's (|v| - lo) / (hi - lo): round up when u < it
        # (|v| on the grid: 0, never up)
        lo = tl.floor(y)
        up = u < y - lo
        n = lo.to(tl.int32) + up.to(tl.int32)
        n_f = lo + up.to(tl.float32)  # the same integer as FP32 (exact)
    else:
        n, n_f = rne_integer(y)
    # NaN (the interpreter's clamp keeps it) compares false everywhere in the reference: code 0
    idx = tl.where(mag == mag, base + n, 0)
    code = idx | ((v < 0.0).to(tl.int32) << 3)
    if ONGRID:
        # |value| = n grid spacings (0.5, 1 or 2: `e2m1_scaled`), exact, = the magnitude of
        # E2M1 index base + n (`e2m1_magnitude`) without decoding the index; NaN -> code 0
        # (SR with the packed codes too: the index is at hand, decoding it is the shorter code)
        if PACKED_TOO and STOCHASTIC:
            mag_n = e2m1_magnitude(idx)
        elif STOCHASTIC:
            spacing = tl.where(mag < 2.0, 0.5, tl.where(mag < 4.0, 1.0, 2.0))
            mag_n = tl.where(mag == mag, n_f * spacing, 0.0)
        else:
            mag_n = rne_ongrid_magnitude(mag)
        val = signed_value(mag_n, v, s_val)
        tl.store(ongrid_ptr + rows3 * K + cols3, val.to(ongrid_ptr.dtype.element_ty), mask=mask)
    if PACKED_TOO or not ONGRID:
        store_packed(codes_ptr, scales_ptr, code, s_code, rows, rmask, pid_k, blk, K, BLOCK_M,
                      BLOCK_K)  # fmt: skip


def global_stage(x: torch.Tensor, global_scale: str | torch.Tensor):
    """Steps 1-4 of `reference.quantize`, bitwise: -> (global_decode, multiplier), each [] or
    [..., R, 1] (or [E, 1, 1] for "per_expert" / a static amax of shape [E, 1, 1]). The amax in
    one read of x (`abs_max_kernel`), the scales in one launch (`global_scale_kernel.amax_global_stage`)."""
    if isinstance(global_scale, torch.Tensor):
        amax = global_scale.reshape(()) if global_scale.dim() == 0 else global_scale
    elif global_scale == "per_expert":  # [E, N, K] -> one amax per expert, [E, 1, 1]
        # one read of the weight (row maxima), then the max over each expert's rows: bitwise
        # `x.abs().amax(dim=(-2, -1))`, without the full-size |x| (abs_max's docstring)
        from .abs_max_kernel import row_abs_max

        e, n, k = x.shape
        if x.numel():
            amax = row_abs_max(x.reshape(e * n, k)).reshape(e, n).amax(dim=-1).reshape(e, 1, 1)
        else:  # empty: torch's own error for an empty reduction
            amax = x.abs().amax(dim=(-2, -1), keepdim=True).to(torch.float32)
    elif global_scale == "per_tensor" and x.numel():
        # two launches instead of about ten: max |x| per row in one read of x, then the per-row
        # global stage over those maxima as ONE row (its max is the tensor's amax; the same
        # enc / gd / mult roundings as below), bitwise the torch ops of this function
        from .abs_max_kernel import row_abs_max
        from .global_scale_kernel import row_global_stage

        rows = row_abs_max(x.reshape(-1, x.shape[-1]) if x.dim() > 1 else x.reshape(1, -1))
        gd, mult = row_global_stage(rows.reshape(1, -1))
        return gd.reshape(()), mult.reshape(())
    else:
        amax = global_amax(x, global_scale)
    # steps 2-4 in one launch, bitwise `reference.global_scales` (no host->device copy)
    from .global_scale_kernel import amax_global_stage

    return amax_global_stage(amax.to(torch.float32))


def quantize_triton(
    x: torch.Tensor,
    *,
    block: str = "1x16",
    global_scale: str | torch.Tensor = "per_row",
    rounding: str = "rne",
    seed: int | torch.Tensor | None = None,
    out: str = "packed",
    ongrid_dtype: torch.dtype = torch.bfloat16,
    name: str = "x",
    one_read_weights: bool = True,
):
    """Quantize with the Triton kernel. out="packed" -> NVFP4Tensor (bitwise == reference);
    out="ongrid" -> (on-grid values [..., K] in `ongrid_dtype`, global_decode); out="both" ->
    (NVFP4Tensor, on-grid values) from one read of x (a weight's packed form and on-grid copy).
    `seed` (stochastic rounding): an int, or a seed held on x's device (`sr_stream.DeviceSeed`,
    or an int64 [1] tensor: a CUDA-graph call's seed): the same stream either way.
    global_scale "per_expert" (x [E, N, K], 16x16) equals `reference.quantize_experts`; a static
    amax of shape [E, 1, 1] gives one static scale per expert.
    A dense weight's 16x16 RNE quantize with a per-tensor data amax (contiguous x) runs in one
    launch that reads x from HBM once (`weight_quantize_kernel.py`, the same bits); one_read_weights=
    False keeps the two-step form (the amax pass, then this kernel). Per-expert weights keep
    the two-step form unless `configs.LAUNCH`'s weight_quantize_experts names expert groups for
    the architecture (one launch was slower there: `weight_quantize_kernel.py`'s docstring)."""
    validate_input(x, block, name)
    check_kernel_device(x, name)
    if out not in ("packed", "ongrid", "both"):
        raise ValueError(f"out must be 'packed', 'ongrid' or 'both', got {out!r}")
    if isinstance(global_scale, str) and global_scale == "per_expert" and x.dim() != 3:
        raise ValueError(f"global_scale='per_expert' needs {name} of shape [E, N, K]")
    if isinstance(global_scale, str) and global_scale == "per_row" and block == "16x16":
        raise ValueError("global_scale='per_row' with block='16x16' is not allowed (W vs W^T)")
    if rounding not in ("rne", "stochastic"):
        raise ValueError(f"rounding must be 'rne' or 'stochastic', got {rounding!r}")
    if rounding == "stochastic" and seed is None:
        raise ValueError("rounding='stochastic' needs an integer seed")
    groups = pick_launch(arch_of(x.device), "weight_quantize_experts")["expert_groups"]
    one_read = isinstance(global_scale, str) and (
        global_scale == "per_tensor" or (global_scale == "per_expert" and groups > 0)
    )
    if (one_read_weights and one_read and block == "16x16" and rounding == "rne" and x.numel()
            and x.is_contiguous()):  # fmt: skip
        from .weight_quantize_kernel import quantize_weight_tiles

        return quantize_weight_tiles(x, global_scale, out=out, ongrid_dtype=ongrid_dtype,
                                     expert_groups=max(groups, 1))  # fmt: skip
    shape = tuple(x.shape)
    k = shape[-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        raise ValueError(f"{name} must have a unit stride along its last dim")
    r = x2.shape[0]
    gd2 = None
    if isinstance(global_scale, str) and global_scale == "per_row":
        from .global_scale_kernel import row_global_stage  # one launch instead of ~9 torch ops

        gd_r, mult = row_global_stage(x2)
        gd = gd_r.reshape(*shape[:-1], 1)
        gd2, mult2 = gd_r, mult  # per row of x2 (a 3-D x's gd is not a static [E, 1, 1])
    elif isinstance(global_scale, str) and global_scale == "per_expert" and r:
        # the row maxima, then each expert's scales already repeated per row: two launches
        from .abs_max_kernel import row_abs_max
        from .global_scale_kernel import expert_global_stage

        gd_e, _, gd2, mult2 = expert_global_stage(row_abs_max(x2), shape[0])
        gd = gd_e.reshape(shape[0], 1, 1)
    else:
        gd, mult = global_stage(x, global_scale)
    per_row = gd.dim() > 0
    if gd2 is None and gd.dim() == 3:  # static [E, 1, 1]: one value per row of [E*N, K]
        gd2 = gd.expand(*shape[:-1], 1).reshape(-1)
        mult2 = mult.expand(*shape[:-1], 1).reshape(-1)
    elif gd2 is None:
        gd2, mult2 = gd.reshape(-1), mult.reshape(-1)
    dev = x.device
    host_seed, seed_t, seed_off = seed_launch_args(seed, dev) if rounding == "stochastic" else (
        0, None, 0)  # fmt: skip
    if out in ("packed", "both"):
        codes = torch.empty((r, k // 2), dtype=torch.uint8, device=dev)
        scales = torch.empty((r, k // BLOCK_SIZE), dtype=torch.uint8, device=dev)
        ongrid = codes
        if out == "both":
            ongrid = torch.empty((r, k), dtype=ongrid_dtype, device=dev)
    else:
        ongrid = torch.empty((r, k), dtype=ongrid_dtype, device=dev)
        codes = scales = ongrid
    cfg = pick(arch_of(dev), "any", "nvfp4_quantize", r)
    if r and k:
        grid = (triton.cdiv(r, cfg.block_m), triton.cdiv(k, cfg.block_k))
        _quantize_kernel[grid](
            x2, mult2, gd2, codes, scales, ongrid,
            r, k, x2.stride(0), 1 if per_row else 0, 1 if per_row else 0,
            host_seed, gd2 if seed_t is None else seed_t, seed_off,
            gd2, gd2, gd2, 0, gd2, 0, 0,  # no segments
            TILE16=block == "16x16", STOCHASTIC=rounding == "stochastic", ONGRID=out != "packed",
            SEGMENTED=False, BLOCK_M=cfg.block_m, BLOCK_K=cfg.block_k,
            SEED_FROM_PTR=seed_t is not None, PACKED_TOO=out == "both",
            FLAT32=r * k < FLAT32_LIMIT,
            **cfg.launch_kwargs(), **compile_options(dev),
        )  # fmt: skip
    if out == "ongrid":
        return ongrid.reshape(shape), gd
    q = NVFP4Tensor(
        codes=codes.reshape(*shape[:-1], k // 2),
        block_scales=scales.view(torch.float8_e4m3fn).reshape(*shape[:-1], k // BLOCK_SIZE),
        global_decode=gd.contiguous(),
        shape=shape,
        block=block,
    )
    return (q, ongrid.reshape(shape)) if out == "both" else q


def quantize_segments_ongrid(
    x_TD: torch.Tensor,
    src: torch.Tensor,
    block_group: torch.Tensor,
    seg_start: torch.Tensor,
    seg_width: torch.Tensor,
    amax: torch.Tensor,
    *,
    seed=None,
    ongrid_dtype: torch.dtype = torch.bfloat16,
):
    """1x16 quantize of the padded transpose X [D, C] of x [T, D]: column c of X is token
    src[c] of x, or zeros where src[c] < 0 (int64 [C], C % 16 == 0). The columns are G segments
    laid end to end (16-aligned), each quantized as its own [D, width_g] matrix: equal, bitwise,
    to `quantize_triton(X[:, seg_g], out="ongrid")` per segment. block_group int32 [C/16] (the
    segment of each 16-column block), seg_start / seg_width int64 [G], amax FP32 [G] (per
    tensor) or [G, D] (per row of X); seed None (RNE) or the seed of segment 0 (stochastic
    rounding: segment g draws the stream of seed + g; an int or a device seed). -> (on-grid [D, C], global decode [G] or [G, D])."""
    check_kernel_device(x_TD, "x")
    if x_TD.dim() != 2 or src.dim() != 1 or src.shape[0] % BLOCK_SIZE:
        raise ValueError(
            f"x must be [T, D] and src [C] with C % 16 == 0: {x_TD.shape}, {src.shape}"
        )
    c = src.shape[0]
    return _launch_transposed(x_TD, amax, c, seed=seed, layout=(src, block_group, seg_start,
                              seg_width), ongrid_dtype=ongrid_dtype)  # fmt: skip


def quantize_tokens_transposed_ongrid(
    x_TD: torch.Tensor,
    amax: torch.Tensor,
    *,
    seed=None,
    ongrid_dtype: torch.dtype = torch.bfloat16,
):
    """`quantize_segments_ongrid` of ONE segment of all tokens (X = x^T zero-padded to a
    multiple of 16 columns), without layout tensors: the kernel derives column c's token (c,
    or padding from T on). amax FP32 [1] or [1, D]; seed: None (RNE), an int or a device seed
    (`sr_stream.DeviceSeed`, or an int64 [1] tensor). Bitwise the segmented call with src =
    [0..T) + [-1] * pad, one group, start 0, width C (and the same seed)."""
    check_kernel_device(x_TD, "x")
    if x_TD.dim() != 2:
        raise ValueError(f"x must be [T, D], got {tuple(x_TD.shape)}")
    cols = -(-x_TD.shape[0] // BLOCK_SIZE) * BLOCK_SIZE
    return _launch_transposed(x_TD, amax, cols, seed=seed, layout=None, ongrid_dtype=ongrid_dtype)


def _launch_transposed(x_TD, amax, c, *, seed, layout, ongrid_dtype):
    r = x_TD.shape[1]
    if amax.dim() not in (1, 2) or (amax.dim() == 2 and amax.shape[1] != r):
        raise ValueError(f"amax must be [G] or [G, D={r}], got {tuple(amax.shape)}")
    gd, mult = global_stage(x_TD, amax.to(torch.float32))
    gd, mult = gd.contiguous(), mult.contiguous()
    ongrid = torch.empty((r, c), dtype=ongrid_dtype, device=x_TD.device)
    cfg = pick(arch_of(x_TD.device), "any", "nvfp4_quantize_segments", r)
    one = layout is None
    src, block_group, seg_start, seg_width = (gd, gd, gd, gd) if one else layout
    host_seed, seed_t, seed_off = (0, None, 0) if seed is None else seed_launch_args(
        seed, x_TD.device)  # fmt: skip
    if r and c:
        grid = (triton.cdiv(r, cfg.block_m), triton.cdiv(c, cfg.block_k))
        _quantize_kernel[grid](
            x_TD, mult, gd, ongrid, ongrid, ongrid,
            r, c, x_TD.stride(1), 1 if amax.dim() == 2 else 0, 0,
            host_seed, gd if seed_t is None else seed_t, seed_off,
            block_group, seg_start, seg_width, r if amax.dim() == 2 else 1,
            src, x_TD.stride(0), x_TD.shape[0],
            TILE16=False, STOCHASTIC=seed is not None, ONGRID=True, SEGMENTED=True,
            BLOCK_M=cfg.block_m, BLOCK_K=cfg.block_k, ONE_SEGMENT=one,
            FLAT32=r * c < FLAT32_LIMIT, SEED_FROM_PTR=seed_t is not None,
            **cfg.launch_kwargs(), **compile_options(x_TD.device),
        )  # fmt: skip
    return ongrid, gd


__all__ = [
    "quantize_triton",
    "quantize_segments_ongrid",
    "quantize_tokens_transposed_ongrid",
    "global_stage",
    "interpreting",
]
