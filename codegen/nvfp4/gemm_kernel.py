"""Triton W4A4 GEMM for sm_90 (emulated NVFP4: BF16 tensor cores, FP32 accumulation).

Shape legend: M rows of A (tokens), N out-features, K in-features (contraction), E experts.

D[m, n] = ((sum_k A[m, k] * B[n, k]) * gd_a[m]) * gd_b  (+ bias[n]),  FP32, then cast to out dtype.

- A is the ON-GRID activation (E2M1 x E4M3, exact in BF16) written by the quantize kernel, with
  its FP32 global decode scale gd_a ([] or [M, 1]).
- B is either PACKED (uint8 codes [N, K/2] + E4M3 scale bytes [N, K/16], dequantized in
  registers: exact) or ON-GRID BF16 [N, K] (the weight dequantized once per weight version, or
  W^T as a strided view for dgrad). Both give the same operand values.
- The K summation order is chunked (configs.py 1.; K_CHUNK = KC of the op, 0 = one chain): the
  loop walks K in BLOCK_K steps (`acc = tl.dot(a, b, acc)`, one ascending MMA chain), and at the
  end of every KC chunk (and of K) adds the chunk's accumulator to the running total, the first
  chunk's accumulator BEING the total (((p0 + p1) + p2) + ..., starting from p0), then restarts
  the chunk accumulator from zero. The loop stays flat (the chunk-end add sits behind a
  branch taken once per KC / BLOCK_K steps), so the software pipeline never restarts. The
  decode GEMM (`decode_gemm_kernel`) computes each chunk partial with the same chain and folds
  the partials in the same order, also when it splits K over programs (`k_chunks`).
- Epilogue exactly `reference.apply_global_scales`: (acc * gd_a) * gd_b, then + bias, with FMA
  contraction disabled on CUDA (runtime.compile_options).
- One kernel serves the dense and the grouped (MoE) GEMM: GROUPED=False is one group of M rows,
  so `nvfp4_grouped_mm` equals a loop of `nvfp4_linear` by construction (same per-row code).

Error budget against the exact reference (reference.exact_dot_fp32): the kernel sums K products
(each exact in FP32: 6-bit x 6-bit significands) in FP32, so |acc - exact| <= K * u * sum|a*b|
(u = 2**-24, a loose Higham bound, gamma_K), then the epilogue adds 2 roundings on the scaled
value: |D - D_ref| <= (K * u * sum_k|a_k b_k|) * |gd_a gd_b| + 3 * u * |D_ref| (+ output cast).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..configs import decode_dispatch, k_chunk, pick
from ..runtime import arch_of, check_kernel_device, compile_options, interpreting
from ..triton_helpers import e2m1_value, e4m3_value
from .decode_gemm_kernel import launch_decode_gemm
from .gemm_tile import gathered_rows, tile_epilogue, tile_rows
from .packed_layout import words_tile_k


@triton.jit
def _nvfp4_gemm_kernel(
    a_ptr,
    b_ptr,
    bs_ptr,
    gda_ptr,
    gdb_ptr,
    bias_ptr,
    out_ptr,
    group_end_ptr,
    a_rows_ptr,
    M,
    N,
    K,
    E,
    stride_am,
    stride_ak,
    stride_be,
    stride_bn,
    stride_bk,
    stride_se,
    stride_sn,
    gda_stride,
    gdb_stride,
    stride_om,
    stride_on,
    GROUPED: tl.constexpr,
    B_PACKED: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    DOT_F32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_E: tl.constexpr,
    A_GATHER: tl.constexpr = False,
    GDA_SHARED: tl.constexpr = False,
    SCALE_WORDS: tl.constexpr = False,
    K_CHUNK: tl.constexpr = 0,
):
    # SCALE_WORDS (packed B): the scale bytes read as 32-bit words of 4 (stride_sn in words), a
    # load the software pipeline issues stages ahead (a byte load is not pipelined, and its
    # memory latency then stalls every K step).
    # A_GATHER: row r of the product reads row a_rows[r] of A (and of a per-row gd_a), a zero
    # row where a_rows[r] < 0: the MoE experts' token gather (and its masked rows) done by the
    # operand load (A quantized once per token, not per copy). A zero row's product is
    # (+0.0 * gd_a) * gd_b: a per-row gd_a of a zero row is finite (its own amax is 0), so any
    # finite stand-in gives the same +0.0; a shared gd_a (per tensor, static) is loaded for the
    # zero row too, as the gathered copy's row uses it (a NaN amax must still give NaN)
    # one grid axis, the N tiles of an M tile adjacent in launch order: the programs in flight
    # share their A rows (L2 hits) instead of re-reading all of A once per N tile (A is the
    # largest operand of the MoE GEMMs: [T * k, K]). The order of tiles changes no bits.
    n_tiles = tl.cdiv(N, BLOCK_N)
    t = tl.program_id(0).to(tl.int64) // n_tiles
    pid_n = tl.program_id(0).to(tl.int64) % n_tiles
    e, rows, row_end = tile_rows(t, group_end_ptr, M, E, BLOCK_M, BLOCK_E, GROUPED)
    if GROUPED:
        if e >= E:
            return
    e64 = e.to(tl.int64) if GROUPED else 0
    rows, rmask, arows, amask = gathered_rows(rows, row_end, a_rows_ptr, A_GATHER)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    b_base = b_ptr + e64 * stride_be
    s_base = bs_ptr + e64 * stride_se
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # the fold of the chunks so far
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        kmask = kk < K
        a = tl.load(
            a_ptr + arows[:, None] * stride_am + kk[None, :] * stride_ak,
            mask=amask[:, None] & kmask[None, :],
            other=0.0,
        )
        if B_PACKED:
            kb = k0 // 2 + tl.arange(0, BLOCK_K // 2)
            byte = tl.load(
                b_base + cols[:, None] * stride_bn + kb[None, :],
                mask=cmask[:, None] & (kb < K // 2)[None, :],
                other=0,
            ).to(tl.int32)
            codes = tl.reshape(tl.join(byte & 15, byte >> 4), (BLOCK_N, BLOCK_K))
            if SCALE_WORDS:  # [BN, BLOCK_K / 64] words; byte j of word q = scale 4 q + j
                kq = k0 // 64 + tl.arange(0, BLOCK_K // 64)
                sword = tl.load(
                    s_base + cols[:, None] * stride_sn + kq[None, :],
                    mask=cmask[:, None] & (kq < K // 64)[None, :],
                    other=0,
                )
                sbyte = (sword[:, :, None] >> (tl.arange(0, 4) * 8)[None, None, :]) & 0xFF
                sbyte = tl.reshape(sbyte, (BLOCK_N, BLOCK_K // 16))
            else:
                ks = k0 // 16 + tl.arange(0, BLOCK_K // 16)
                sbyte = tl.load(
                    s_base + cols[:, None] * stride_sn + ks[None, :],
                    mask=cmask[:, None] & (ks < K // 16)[None, :],
                    other=0,
                ).to(tl.int32)
            sval = e4m3_value(sbyte)
            s_full = tl.reshape(
                tl.broadcast_to(sval[:, :, None], (BLOCK_N, BLOCK_K // 16, 16)), (BLOCK_N, BLOCK_K)
            )
            b = tl.trans(e2m1_value(codes) * s_full)  # [BK, BN], exact
        else:
            b = tl.load(
                b_base + cols[None, :] * stride_bn + kk[:, None] * stride_bk,
                mask=cmask[None, :] & kmask[:, None],
                other=0.0,
            )
        if DOT_F32:
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
        if K_CHUNK > 0:
            if ((k0 + BLOCK_K) % K_CHUNK == 0) | (k0 + BLOCK_K >= K):  # a chunk ends here
                total = tl.where(k0 < K_CHUNK, acc, total + acc)  # chunk 0 starts the fold
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if K_CHUNK > 0:
        acc = total
    tile_epilogue(
        acc,
        rows,
        rmask,
        arows,
        amask,
        cols,
        cmask,
        e,
        gda_ptr,
        gda_stride,
        gdb_ptr,
        gdb_stride,
        bias_ptr,
        out_ptr,
        stride_om,
        stride_on,
        HAS_BIAS,
        GDA_SHARED,
        True,
    )


def _dot_key(device: torch.device) -> str:
    return "bf16" if device.type == "cuda" else "fp32"


def launch_gemm(
    a_MK: torch.Tensor,
    gd_a: torch.Tensor,
    b: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    gd_b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype,
    offsets: torch.Tensor | None = None,
    rows_per_group: int | None = None,
    config_op: str | None = None,
    a_rows: torch.Tensor | None = None,
    config=None,
    k_chunk_override: int | None = None,
) -> torch.Tensor:
    """Launch the GEMM. b: on-grid [N, K] / [E, N, K] (any strides), or packed (codes, scale
    bytes) [.., N, K/2] and [.., N, K/16]. offsets (int32 [E] group ends) selects the grouped
    kernel; `rows_per_group` (a static estimate of M per expert) picks the config bucket of the
    pinned table `config_op` (default: "nvfp4_gemm" for packed B, "nvfp4_gemm_ongrid" for
    on-grid B; the weight gradient passes "nvfp4_wgrad"). Packed B with few rows per weight
    (`configs.decode_dispatch`) runs the decode kernel (`decode_gemm_kernel`), bitwise the same
    product. `a_rows` (int32 / int64 [M]): row r of
    the product reads row a_rows[r] of a_MK (and of a per-row gd_a), which may then have any
    number of rows, or is a zero row where a_rows[r] < 0: a gather of A's rows in the operand
    load. `config` (a TileConfig) and `k_chunk_override` (KC; 0 = one chain) replace the pinned
    tile and K order: benchmarks only (`benchmarks.decode_gemm --learner-forward`), as KC
    changes the bits."""
    check_kernel_device(a_MK, "x")
    dev = a_MK.device
    k = a_MK.shape[1]
    if a_rows is not None and (a_rows.dim() != 1 or a_rows.dtype not in (torch.int32, torch.int64)):
        raise ValueError(f"a_rows must be int32/int64 [M], got {a_rows.dtype}{list(a_rows.shape)}")
    m = a_MK.shape[0] if a_rows is None else a_rows.shape[0]
    m_a = a_MK.shape[0]
    packed = isinstance(b, tuple)
    if packed and config_op is None and config is None:
        decode = decode_dispatch(arch_of(dev), rows_per_group or m)
        if decode is not None:  # few rows: the weight-streaming kernel, the same bits
            return launch_decode_gemm(
                a_MK,
                gd_a,
                b,
                gd_b,
                bias=bias,
                out_dtype=out_dtype,
                offsets=offsets,
                rows_per_group=rows_per_group,
                a_rows=a_rows,
                config=decode,
            )
    b_main = b[0] if packed else b
    grouped = offsets is not None
    if b_main.dim() == 2:
        b_main = b_main.unsqueeze(0)
    num_experts, n = b_main.shape[0], b_main.shape[1]
    if packed:
        b_scales = b[1] if b[1].dim() == 3 else b[1].unsqueeze(0)
        b_scales = b_scales.view(torch.uint8)
        stride_bk = 1
        if b_main.stride(-1) != 1 or b_scales.stride(-1) != 1:
            raise ValueError("packed weight codes and scales must be contiguous along K")
        stride_se, stride_sn = b_scales.stride(0), b_scales.stride(1)
    else:
        b_scales = b_main
        stride_bk = b_main.stride(2)
        stride_se = stride_sn = 0
    gd_a = gd_a.reshape(-1)
    gd_b = gd_b.reshape(-1)
    if gd_a.numel() not in (1, m_a) or gd_b.numel() not in (1, num_experts):
        raise ValueError(
            f"global scales: gd_a {tuple(gd_a.shape)} for M={m}, gd_b {tuple(gd_b.shape)}"
        )
    op = config_op or ("nvfp4_gemm" if packed else "nvfp4_gemm_ongrid")
    cfg = config or pick(
        arch_of(dev), _dot_key(dev), op, rows_per_group or m, n=None if grouped else n
    )
    kc = k_chunk(arch_of(dev), op) if k_chunk_override is None else k_chunk_override
    if kc % cfg.block_k:
        raise ValueError(f"{cfg}: BLOCK_K={cfg.block_k} must divide the K chunk KC={kc}")
    interp = interpreting()
    out = torch.empty((m, n), dtype=torch.float32 if interp else out_dtype, device=dev)
    if m == 0 or n == 0:
        return out.to(out_dtype)
    if grouped:
        if offsets.dtype != torch.int32:
            raise TypeError(f"offsets must be int32, got {offsets.dtype}")
        ends = offsets
        num_m_tiles = triton.cdiv(m, cfg.block_m) + num_experts
    else:
        ends = gd_a  # an unused pointer
        num_m_tiles = triton.cdiv(m, cfg.block_m)
    grid = (num_m_tiles * triton.cdiv(n, cfg.block_n),)
    scale_words = packed and words_tile_k(b_scales, k, cfg.block_k)
    if scale_words:
        b_scales = b_scales.view(torch.int32)
        stride_se, stride_sn = b_scales.stride(0), b_scales.stride(1)
    _nvfp4_gemm_kernel[grid](
        a_MK,
        b_main,
        b_scales,
        gd_a,
        gd_b,
        bias if bias is not None else gd_b,
        out,
        ends,
        a_rows if a_rows is not None else ends,
        m,
        n,
        k,
        num_experts,
        a_MK.stride(0),
        a_MK.stride(1),
        b_main.stride(0),
        b_main.stride(1),
        stride_bk,
        stride_se,
        stride_sn,
        1 if gd_a.numel() > 1 else 0,
        1 if gd_b.numel() > 1 else 0,
        out.stride(0),
        out.stride(1),
        GROUPED=grouped,
        B_PACKED=packed,
        HAS_BIAS=bias is not None,
        DOT_F32=dev.type != "cuda",
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        BLOCK_E=max(triton.next_power_of_2(num_experts), 2),
        A_GATHER=a_rows is not None,
        GDA_SHARED=gd_a.numel() == 1,
        SCALE_WORDS=scale_words,
        K_CHUNK=kc,
        **cfg.launch_kwargs(),
        **compile_options(dev),
    )
    return out.to(out_dtype) if interp else out
