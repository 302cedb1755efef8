"""The weight tile of the decode GEMM (`decode_gemm_kernel.py`): packed E2M1 codes and E4M3
block scales -> BF16 (CUDA; FP32 lanes in the interpreter) weights w' = w * 2**-WEIGHT_SHIFT,
exact, the decoded weights the kernel's MMA takes.

Shape legend: W weight rows of the tile (out-features), K in-features (contraction).

Two of the kernel's changes that change no bit (numbered as in its docstring):
2. E2M1 by bit placement. A code nibble s|e1 e0 m placed as s -> bit 15, e1 e0 m -> bits 8..6
   of a 16-bit lane is the BF16 number code * 2**-126 (bits 8..7 are the low exponent bits, 6 the
   top mantissa bit; e1 e0 = 0 gives the BF16 subnormal m * 2**-127 = 0.5 * m * 2**-126, the
   E2M1 subnormal): two masks and two shifts per code, no lookup, no convert (the fewest
   instructions per weight of the forms swept: `tools.decode_sass_audit`,
   benchmarks/results/2026-12-05_decode_gemm_43f05e0.md).
3. Scales folded once. The E4M3 block scale s is turned into the BF16 number s * 2**118 (exact:
   4 significant bits; 2**-9 * 2**118 .. 448 * 2**118 lies inside BF16's normal range) from its
   bits, once per 16 weights. One BF16 multiply gives w' = code * s * 2**-8: exact (at most 6
   significant bits, and |w'| >= 2**-19 is normal), so w' = w * 2**-8 for every weight.
   Then every product a * w' is exactly (a * w) * 2**-8, and every partial sum of the FP32
   accumulation is the learner's partial sum times 2**-8: FP32 rounding commutes with an exact
   power-of-two scale as long as nothing leaves the normal range, and it cannot here (a nonzero
   on-grid product is a multiple of 2**-20, so every nonzero partial sum of the scaled products
   is at least 2**-28 in magnitude; |sum| <= K * 2688**2 is far below 2**127). The epilogue's
   first step, acc * 2**8, is therefore exact and restores the learner's accumulator bit for
   bit; the rest of the epilogue is the learner's, in the same order.
"""

from __future__ import annotations

import triton
import triton.language as tl

WEIGHT_SHIFT = 8  # w' = w * 2**-WEIGHT_SHIFT (see 3. above)


@triton.jit
def _scale_times_2_118(sbyte):
    """E4M3 scale byte (int32, sign 0) -> FP32 value * 2**118, exact; subnormals too."""
    e = (sbyte >> 3) & 15
    m = sbyte & 7
    normal = (((e + 238) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    # subnormal: m * 2**-9 * 2**118 = m * 2**109
    return tl.where(e == 0, m.to(tl.float32) * 6.490371073168535e32, normal)


@triton.jit
def _fp32_codes_times_2_126(byte):
    """Packed bytes (low nibble = even k) -> (low, high) E2M1 values * 2**-126 by bit placement,
    as FP32 lanes: the interpreter's form (it has no BF16 arithmetic; the same numbers, FP32 is
    BF16 << 16)."""
    b = byte.to(tl.int32)
    lo = (((b & 0x8) << 28) | ((b & 0x7) << 22)).to(tl.float32, bitcast=True)
    hi = (((b & 0x80) << 24) | ((b & 0x70) << 18)).to(tl.float32, bitcast=True)
    return lo, hi


@triton.jit
def _pair_halves(word, SHIFT: tl.constexpr):
    """Nibbles j and j + 4 of each 32-bit word (SHIFT = 4 j) placed as two BF16 values * 2**-126
    in one 32-bit op chain (nibble j + 4 sits 16 bits above nibble j), split into the halves."""
    v = word >> SHIFT
    pair = ((v << 12) & -2147450880) | ((v << 6) & 0x01C001C0)  # 0x80008000 as int32
    lo = pair.to(tl.int16).to(tl.bfloat16, bitcast=True)
    hi = (pair >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return lo, hi


@triton.jit
def _word_codes_times_2_126(word, BLOCK_W: tl.constexpr, BLOCK_K: tl.constexpr):
    """[W, K/8] words of 8 codes -> [W, K] BF16 codes * 2**-126, in k order."""
    n0, n4 = _pair_halves(word, 0)
    n1, n5 = _pair_halves(word, 4)
    n2, n6 = _pair_halves(word, 8)
    n3, n7 = _pair_halves(word, 12)
    # join adds the LAST dim: [W, K/8, a, b, c] = code 4 a + 2 b + c of the word
    even = tl.join(tl.join(n0, n4), tl.join(n2, n6))
    odd = tl.join(tl.join(n1, n5), tl.join(n3, n7))
    return tl.reshape(tl.join(even, odd), (BLOCK_W, BLOCK_K))


@triton.jit
def weight_tile(
    b_base,
    s_base,
    k0,
    K,
    cmask,
    WORDS: tl.constexpr,
    SCALE_WORDS: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """[W, BLOCK_K] decoded weights w' = w * 2**-8 (exact, 2. and 3. above) of K step k0: b_base
    and s_base point at the tile's rows of codes and scales ([W, 1] pointers), cmask [W] its
    live rows. WORDS (CUDA): the codes as 32-bit words of 8, BF16 lanes; else (the interpreter)
    bytes, FP32 lanes. SCALE_WORDS: the scale bytes as 32-bit words of 4. EVEN_K: K a multiple
    of BLOCK_K (no K masks: 16-byte copies)."""
    if SCALE_WORDS:  # [W, BLOCK_K / 64] words; byte j of word q = scale 4 q + j
        kq = k0 // 64 + tl.arange(0, BLOCK_K // 64)
        s_mask = cmask[:, None]
        if not EVEN_K:
            s_mask = s_mask & (kq < K // 64)[None, :]
        sword = tl.load(s_base + kq[None, :], mask=s_mask, other=0, eviction_policy="evict_first")
        sbyte = (sword[:, :, None] >> (tl.arange(0, 4) * 8)[None, None, :]) & 0xFF
        sbyte = tl.reshape(sbyte, (BLOCK_W, BLOCK_K // 16))
    else:
        ks = k0 // 16 + tl.arange(0, BLOCK_K // 16)
        s_mask = cmask[:, None]
        if not EVEN_K:
            s_mask = s_mask & (ks < K // 16)[None, :]
        sbyte = tl.load(
            s_base + ks[None, :], mask=s_mask, other=0, eviction_policy="evict_first"
        ).to(tl.int32)
    s = _scale_times_2_118(sbyte)
    if WORDS:  # CUDA: 32-bit words of 8 codes (nibble j = code k0 + 8 i + j), BF16 lanes
        s = s.to(tl.bfloat16)  # exact: 4 significant bits
        kw = k0 // 8 + tl.arange(0, BLOCK_K // 8)
        w_mask = cmask[:, None]
        if not EVEN_K:
            w_mask = w_mask & (kw < K // 8)[None, :]
        word = tl.load(b_base + kw[None, :], mask=w_mask, other=0, eviction_policy="evict_first")
        code = _word_codes_times_2_126(word, BLOCK_W, BLOCK_K)
    else:  # the interpreter: bytes, FP32 lanes
        kb = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        b_mask = cmask[:, None]
        if not EVEN_K:
            b_mask = b_mask & (kb < K // 2)[None, :]
        byte = tl.load(b_base + kb[None, :], mask=b_mask, other=0)
        lo, hi = _fp32_codes_times_2_126(byte)
        code = tl.reshape(tl.join(lo, hi), (BLOCK_W, BLOCK_K))
    s_full = tl.reshape(
        tl.broadcast_to(s[:, :, None], (BLOCK_W, BLOCK_K // 16, 16)), (BLOCK_W, BLOCK_K)
    )
    return code * s_full
