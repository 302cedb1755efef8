"""The invariant attention forward's per-key-block steps (`attention_kernel._attention_kernel`
calls them; Triton inlines them): `attend_block`, one BLOCK_N block of keys folded into a row
tile's online-softmax state, and `key_block_base`, where that block's keys lie (the sequence's own
cache, or a page of the rollout's paged cache through its block table); `out_abs_max`, the
decode epilogue's partial row maxima of the output (`invariant_attention_parts`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..triton_helpers import round_bf16, round_bf16_keep_nan


@triton.jit
def attend_block(
    q,
    k_ptr,
    v_ptr,
    kv_base,
    skt,
    j,
    key_live,
    d,
    vis,
    m_i,
    acc,
    l_acc,
    ones,
    scale,
    DOT: tl.constexpr,
):
    """One key block of the forward: scores, online softmax, the numerator and the row sum
    on the MMA (see `_attention_kernel`). -> (m_i, acc, l_acc)."""
    k = tl.load(
        k_ptr + kv_base + j[:, None] * skt + d[None, :], mask=key_live[:, None], other=0.0
    ).to(DOT)
    v = tl.load(
        v_ptr + kv_base + j[:, None] * skt + d[None, :], mask=key_live[:, None], other=0.0
    ).to(DOT)
    s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
    s = tl.where(vis, s, float("-inf"))
    any_vis = tl.max(vis.to(tl.int32), axis=1) > 0
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(any_vis, m_new, 0.0)
    p = tl.where(vis, tl.exp(s - m_safe[:, None]), 0.0)
    # a block with no visible key leaves the row's state untouched, bit for bit: its
    # alpha is 1 and its p all zeros, which the MMAs add exactly
    alpha = tl.where(m_i == float("-inf"), 0.0, tl.exp(m_i - m_safe))
    alpha = tl.where(any_vis, alpha, 1.0)
    p_hi = round_bf16(p)
    p16 = p_hi.to(DOT)
    acc = tl.dot(p16, v, acc * alpha[:, None], input_precision="ieee")
    l_acc = tl.dot(p16, ones, l_acc * alpha[:, None], input_precision="ieee")
    l_acc = tl.dot(round_bf16(p - p_hi).to(DOT), ones, l_acc, input_precision="ieee")
    m_i = tl.where(any_vis, m_new, m_i)
    return m_i, acc, l_acc


@triton.jit
def key_block_base(
    kv_base, n0, bt_ptr, b64, sbt, spage, skt, PAGED: tl.constexpr, PAGE: tl.constexpr
):
    """The offset that `attend_block` adds to `j * skt` for the key block starting at n0: the
    sequence's own cache (kv_base), or (PAGED) the page of the block table holding keys
    [n0, n0 + BLOCK_N) (PAGE a multiple of BLOCK_N: a block never straddles two pages), its
    slot n0 % PAGE. The same keys, in the same blocks and order, as the contiguous layout."""
    base = kv_base
    if PAGED:
        page = tl.load(bt_ptr + b64 * sbt + n0 // PAGE).to(tl.int64)  # int64: pool offsets
        base = page * spage + kv_base + (n0 % PAGE - n0) * skt
    return base


@triton.jit
def out_abs_max(out, OUT_DTYPE: tl.constexpr, ROUND: tl.constexpr):
    """Each row's max |out| of one program's output tile [BLOCK_M, D] as it is stored (cast to
    OUT_DTYPE; ROUND: the interpreter's FP32 store, rounded to BF16 with integer ops as the
    launcher's torch cast rounds it), FP32 [BLOCK_M], NaN where the row holds one: the
    attention output's partial row maxima (a max: exact in any order or grouping)."""
    v = out.to(OUT_DTYPE).to(tl.float32)
    if ROUND:
        v = round_bf16_keep_nan(v)
    amax = tl.max(tl.abs(v), axis=1)
    nan = tl.max((v != v).to(tl.int32), axis=1)
    return tl.where(nan > 0, float("nan"), amax)
