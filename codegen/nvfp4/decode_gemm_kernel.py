"""Triton W4A4 GEMM for few rows (decode, small MoE groups): packed weights streamed, not ALU-bound.

Shape legend: M rows of A (tokens), N out-features, K in-features (contraction), E experts.

Computes exactly what `gemm_kernel._nvfp4_gemm_kernel` computes with packed B,
D[m, n] = ((sum_k A[m, k] * B[n, k]) * gd_a[m]) * gd_b (+ bias[n]), with three changes that make
the weight stream cheap, none of which changes a bit:

1. Swapped operands. The product is computed as D^T = B @ A^T: the decoded weight tile [BLOCK_W,
   BLOCK_K] is the MMA's left operand, taken from registers (no shared-memory round trip of the
   decoded weights), and the few tokens are its right operand. On sm_90 both this kernel and the
   learner's GEMM issue wgmma (the left operand has BLOCK_W >= 64 rows, asserted in configs.py):
   the same products, accumulated over K in the same ascending order, one FP32 accumulator per
   output element and K chunk (4. below). (`DecodeConfig.weights_right` keeps the learner's own
   orientation instead: tokens left, padded to >= 64 rows, the decoded weights right, through
   shared memory; `configs.check_decode_config` refuses tiles that would not issue wgmma.)
2. E2M1 by bit placement and 3. scales folded once (`decode_gemm_tiles.py`, whose docstring
   proves both exact): the weight tile is decoded to w' = w * 2**-8, so every product and
   partial sum of the FP32 accumulation is the learner's times 2**-8, and the epilogue's first
   step, acc * 2**8, restores the learner's accumulator bit for bit; the rest of the epilogue
   is the learner's, in the same order.
4. The K chunks (configs.py 1., `K_CHUNK`): the learner sums K in chunks of KC, each from zero,
   and folds the chunk partials ((p0 + p1) + p2) + ... from p0. Each chunk here walks the same
   ascending chain from zero, so its partial is the learner's times 2**-8 (3.: the argument
   holds per chunk, each starting from zero). SPLIT == 1: the fold runs here, on the scaled
   partials: each add is fl(x 2**-8 + y 2**-8) = fl(x + y) 2**-8 (the same range argument), so
   the folded total is the learner's times 2**-8, restored exactly by the epilogue. SPLIT > 1:
   the programs along grid axis 1 each take a run of whole chunks and store every chunk
   partial, restored (x 2**8, exact), to an FP32 buffer [chunks, M, N]; `k_chunks.fold_chunks`
   then folds them in the learner's order and applies the learner's epilogue. Which program
   computed a chunk changes no bit: the split count is speed only.
A_PARTS (`decode_gemm_prologue.py`): A quantized in the prologue, bitwise as `row_codes` does.
So D here equals the learner's D bitwise; tests/gpu/test_gpu_decode_gemm.py checks it on the
H200 on cancellation-heavy rows at every pinned bucket, and tests/codegen checks the decode and
the epilogue in the interpreter (FP32 lanes there: the interpreter has no BF16 arithmetic).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..configs import check_decode_config, k_chunk, pick_decode, pick_launch
from ..runtime import arch_of, check_kernel_device, compile_options, interpreting
from ..triton_helpers import ONE_SIXTH_F32
from .decode_gemm_prologue import a_row_scales, quantized_a_tile
from .decode_gemm_tiles import weight_tile
from .gemm_tile import gathered_rows, row_global_decodes, scaled_store, tile_rows
from .k_chunks import chunk_count, fold_chunks
from .packed_layout import packed_weight, weight_words


@triton.jit
def _nvfp4_decode_gemm_kernel(
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
    stride_se,
    stride_sn,
    gda_stride,
    gdb_stride,
    stride_om,
    stride_on,
    part_ptr,
    stride_pc,
    chunks_per_split,
    a_part_ptr,
    P,
    gd_out_ptr,
    one_sixth,
    GROUPED: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    WORDS: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_E: tl.constexpr,
    A_GATHER: tl.constexpr,
    GDA_SHARED: tl.constexpr,
    SCALE_WORDS: tl.constexpr,
    EVEN_K: tl.constexpr,
    WEIGHTS_RIGHT: tl.constexpr,
    K_CHUNK: tl.constexpr,
    SPLIT: tl.constexpr,
    A_PARTS: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    # grid: token tiles x weight tiles, the weight tiles of one token tile adjacent in launch
    # order (the programs in flight share their A rows). A_GATHER / GDA_SHARED / GROUPED have
    # the meaning they have in gemm_kernel._nvfp4_gemm_kernel (tokens = its rows).
    # Every load of the K loop is one the software pipeline can issue stages ahead (cp.async of
    # >= 4 contiguous bytes): the scale bytes are read as 32-bit words of 4 (SCALE_WORDS; a byte
    # load is not pipelined, and its full memory latency then stalls every K step of a program),
    # and EVEN_K (K a multiple of BLOCK_K) drops the K masks so that the copies are 16 bytes wide.
    # WEIGHTS_RIGHT: the learner's orientation (tokens the MMA's left operand, BLOCK_T >= 64 on
    # sm_90; the decoded weights its right operand, through shared memory) instead of 1. above.
    # A_PARTS: A quantized here from the rows' values and partial maxima (a_part_ptr), gd_a not
    # read (`decode_gemm_prologue.py`); split K: weight tile 0 writes gd_out_ptr for the fold.
    w_tiles = tl.cdiv(N, BLOCK_W)
    t = tl.program_id(0).to(tl.int64) // w_tiles
    pid_w = tl.program_id(0).to(tl.int64) % w_tiles
    e, rows, row_end = tile_rows(t, group_end_ptr, M, E, BLOCK_T, BLOCK_E, GROUPED)
    if GROUPED:
        if e >= E:
            return
    e64 = e.to(tl.int64) if GROUPED else 0
    rows, rmask, arows, amask = gathered_rows(rows, row_end, a_rows_ptr, A_GATHER)
    cols = pid_w * BLOCK_W + tl.arange(0, BLOCK_W)
    cmask = cols < N
    b_base = b_ptr + e64 * stride_be + cols.to(tl.int64)[:, None] * stride_bn
    s_base = bs_ptr + e64 * stride_se + cols.to(tl.int64)[:, None] * stride_sn
    if A_PARTS:  # the rows' global decodes and multipliers, once per program
        gd_rows, mult_rows = a_row_scales(a_part_ptr, arows, amask, P, one_sixth, BLOCK_T, BLOCK_P)
        a_base = a_ptr + arows * stride_am  # [T] row pointers (unit stride along K)
        if SPLIT > 1:  # (a vector mask: the interpreter's; a repeated gathered row: equal values)
            first = amask & ((arows * 0 + pid_w + tl.program_id(1).to(tl.int64)) == 0)
            tl.store(gd_out_ptr + arows, gd_rows, mask=first)
    if WEIGHTS_RIGHT:
        acc = tl.zeros((BLOCK_T, BLOCK_W), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_W, BLOCK_T), dtype=tl.float32)
    total = acc  # the fold of the chunks so far (SPLIT == 1)
    if SPLIT > 1:  # this program's run of whole chunks (4. above)
        k_lo = tl.program_id(1).to(tl.int64) * chunks_per_split * K_CHUNK
        k_hi = tl.minimum(k_lo + chunks_per_split * K_CHUNK, K)
    else:
        k_lo = 0
        k_hi = K
    for k0 in range(k_lo, k_hi, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        a_mask = amask[None, :]
        if not EVEN_K:
            a_mask = a_mask & (kk < K)[:, None]
        if A_PARTS:
            a_t = quantized_a_tile(
                a_base, amask, k0, K, gd_rows, mult_rows, EVEN_K, BLOCK_T, BLOCK_K, not WORDS
            )
        else:
            a_t = tl.load(
                a_ptr + arows[None, :] * stride_am + kk[:, None] * stride_ak, mask=a_mask, other=0.0
            )
        w = weight_tile(b_base, s_base, k0, K, cmask, WORDS, SCALE_WORDS, EVEN_K, BLOCK_W, BLOCK_K)
        if WORDS and WEIGHTS_RIGHT:
            acc = tl.dot(tl.trans(a_t.to(tl.bfloat16)), tl.trans(w), acc)
        elif WORDS:
            acc = tl.dot(w, a_t.to(tl.bfloat16), acc)
        elif WEIGHTS_RIGHT:
            acc = tl.dot(tl.trans(a_t.to(tl.float32)), tl.trans(w), acc, input_precision="ieee")
        else:
            acc = tl.dot(w, a_t.to(tl.float32), acc, input_precision="ieee")
        if K_CHUNK > 0:
            if ((k0 + BLOCK_K) % K_CHUNK == 0) | (k0 + BLOCK_K >= K):  # a chunk ends here
                if SPLIT > 1:  # its partial, restored (x 2**8, exact), to [chunk, row, col]
                    p_base = part_ptr + (k0 // K_CHUNK) * stride_pc
                    if WEIGHTS_RIGHT:
                        tl.store(
                            p_base + rows[:, None] * N + cols[None, :],
                            acc * 256.0,
                            mask=rmask[:, None] & cmask[None, :],
                        )
                    else:
                        tl.store(
                            p_base + rows[None, :] * N + cols[:, None],
                            acc * 256.0,
                            mask=rmask[None, :] & cmask[:, None],
                        )
                else:
                    total = tl.where(k0 < K_CHUNK, acc, total + acc)  # chunk 0 starts the fold
                acc = tl.zeros_like(acc)
    if SPLIT > 1:  # k_chunks.fold_chunks applies the epilogue
        return
    if K_CHUNK > 0:
        acc = total
    if WEIGHTS_RIGHT:
        acc = tl.trans(acc)  # [W, T], as the epilogue reads it
    acc = acc * 256.0  # 2**WEIGHT_SHIFT (decode_gemm_tiles): exact, the learner's accumulator
    if not A_PARTS:  # (else the prologue's, in registers)
        gd_rows = row_global_decodes(gda_ptr, gda_stride, rows, rmask, arows, amask, GDA_SHARED)
    scaled_store(
        acc,
        gd_rows,
        rows,
        rmask,
        cols,
        cmask,
        e,
        gdb_ptr,
        gdb_stride,
        bias_ptr,
        out_ptr,
        stride_om,
        stride_on,
        HAS_BIAS,
        False,
    )


def launch_decode_gemm(
    a_MK: torch.Tensor,
    gd_a: torch.Tensor,
    b: tuple[torch.Tensor, torch.Tensor],
    gd_b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype,
    offsets: torch.Tensor | None = None,
    rows_per_group: int | None = None,
    a_rows: torch.Tensor | None = None,
    config=None,
    splits: int | None = None,
    a_parts: torch.Tensor | None = None,
) -> torch.Tensor:
    """`gemm_kernel.launch_gemm` for packed B = (codes [.., N, K/2], E4M3 scale bytes
    [.., N, K/16]) and few rows, bitwise the same result. `config` (a `DecodeConfig`) overrides
    the pinned one, `splits` the config's split count (at most one program per K chunk); both
    for the tuner's sweeps and the tests: no bit depends on them. `a_parts` (gd_a None): a_MK
    holds rows' values and a_parts their partial maxima (`row_codes_from_parts`'s arguments),
    quantized in the prologue: bitwise row_codes_from_parts, then this GEMM on its output."""
    check_kernel_device(a_MK, "x")
    dev = a_MK.device
    if a_rows is not None and (a_rows.dim() != 1 or a_rows.dtype not in (torch.int32, torch.int64)):
        raise ValueError(f"a_rows must be int32/int64 [M], got {a_rows.dtype}{list(a_rows.shape)}")
    k = a_MK.shape[1]
    codes, scales = packed_weight(b, k)
    num_experts, n = codes.shape[0], codes.shape[1]
    m = a_MK.shape[0] if a_rows is None else a_rows.shape[0]
    if a_parts is not None:  # the prologue's global decodes (written only where K splits)
        if not a_parts.is_contiguous() or a_parts.shape[0] != a_MK.shape[0] or gd_a is not None:
            raise ValueError(f"a_parts [M_a, P] contiguous with gd_a None, got {a_parts.shape}")
        if a_MK.stride(1) != 1 and k > 1:
            raise ValueError("a_parts: the rows' values must have unit stride along K")
        gd_a = torch.empty((a_MK.shape[0],), dtype=torch.float32, device=dev)
    gd_a, gd_b = gd_a.reshape(-1), gd_b.reshape(-1)
    if gd_a.numel() not in (1, a_MK.shape[0]) or gd_b.numel() not in (1, num_experts):
        raise ValueError(
            f"global scales: gd_a {tuple(gd_a.shape)} for M={m}, gd_b {tuple(gd_b.shape)}"
        )
    grouped = offsets is not None
    cfg = config or pick_decode(arch_of(dev), rows_per_group or m)
    if config is not None:
        check_decode_config(arch_of(dev), config)
    interp = interpreting()
    out = torch.empty((m, n), dtype=torch.float32 if interp else out_dtype, device=dev)
    if m == 0 or n == 0:
        return out.to(out_dtype)
    if grouped:
        if offsets.dtype != torch.int32:
            raise TypeError(f"offsets must be int32, got {offsets.dtype}")
        ends = offsets
        t_tiles = triton.cdiv(m, cfg.block_t) + num_experts
    else:
        ends = gd_a  # an unused pointer
        t_tiles = triton.cdiv(m, cfg.block_t)
    tile_programs = t_tiles * triton.cdiv(n, cfg.block_w)
    kc = k_chunk(arch_of(dev), "nvfp4_gemm")  # the learner's forward order
    chunks = chunk_count(k, kc)
    if chunks > 1 and kc % cfg.block_k:
        raise ValueError(f"{cfg}: BLOCK_K={cfg.block_k} must divide the K chunk KC={kc} (K={k})")
    if splits is None:
        splits = cfg.splits(tile_programs, chunks)
    if not 1 <= splits <= chunks:
        raise ValueError(f"splits={splits}: between 1 and the {chunks} K chunks of K={k}, KC={kc}")
    chunks_per_split = -(-chunks // splits)
    splits = -(-chunks // chunks_per_split)  # no program without a chunk
    partials = out
    if splits > 1:
        partials = torch.empty((chunks, m, n), dtype=torch.float32, device=dev)
    codes, scales, scale_words = weight_words(codes, scales, k, cfg.block_k, not interp)
    _nvfp4_decode_gemm_kernel[(tile_programs, splits)](
        a_MK,
        codes,
        scales,
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
        codes.stride(0),
        codes.stride(1),
        scales.stride(0),
        scales.stride(1),
        1 if gd_a.numel() > 1 else 0,
        1 if gd_b.numel() > 1 else 0,
        out.stride(0),
        out.stride(1),
        partials,
        m * n,
        chunks_per_split,
        a_parts if a_parts is not None else gd_a,
        a_parts.shape[1] if a_parts is not None else 0,
        gd_a,
        ONE_SIXTH_F32,
        GROUPED=grouped,
        HAS_BIAS=bias is not None,
        WORDS=not interp,
        BLOCK_T=cfg.block_t,
        BLOCK_W=cfg.block_w,
        BLOCK_K=cfg.block_k,
        BLOCK_E=max(triton.next_power_of_2(num_experts), 2),
        A_GATHER=a_rows is not None,
        GDA_SHARED=gd_a.numel() == 1,
        SCALE_WORDS=scale_words,
        WEIGHTS_RIGHT=cfg.weights_right,
        EVEN_K=k % cfg.block_k == 0,
        K_CHUNK=kc,
        SPLIT=splits,
        A_PARTS=a_parts is not None,
        BLOCK_P=pick_launch(arch_of(dev), "row_codes")["block_p"],
        **cfg.launch_kwargs(),
        **compile_options(dev),
    )
    if splits > 1:
        fold_chunks(
            partials,
            gd_a,
            gd_b,
            out,
            bias=bias,
            offsets=offsets if grouped else None,
            a_rows=a_rows,
        )
    return out.to(out_dtype) if interp else out
