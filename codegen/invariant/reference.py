"""CPU implementations of the batch-invariant ops (the reference kernels; plain PyTorch).

Shape legend: M rows (tokens), K in-features, N out-features, H hidden, V vocabulary,
B sequences, Hq / Hkv query / key-value heads, G = Hq / Hkv, Tq queries, Tk keys, D head dim,
E experts.

Every forward here is built from `invariant/fixed_order.py` (see its docstring for why that is invariant
by construction); each function states the fixed order it uses. Backward functions need
determinism only (not invariance) and use plain PyTorch in FP32.
"""

from __future__ import annotations

import torch

from . import fixed_order as im

MM_CHUNK_M = 128
MM_CHUNK_N = 2048
SOFTMAX_BLOCK = 32  # keys per block in attention's sums (fixed; from key 0)
VOCAB_BLOCK = 1024  # vocabulary entries per block in logprobs' sums (fixed; from entry 0)
ROWS_PER_CHUNK_ELEMS = 1 << 22  # logprobs: rows per chunk so that rows * V <= this


# ------------------------------------------------------------------------------------------ mm
def linear(x_MK, w_NK, bias_N, out_dtype):
    """y = x @ w.T (+ bias): FP32 accumulation over k = 0..K-1 in order, bias added once in
    FP32, one final rounding to out_dtype."""
    acc = im.rank1_mm(x_MK, w_NK, chunk_m=MM_CHUNK_M, chunk_n=MM_CHUNK_N)
    if bias_N is not None:
        acc = acc + bias_N.to(torch.float32)
    return acc.to(out_dtype)


# ------------------------------------------------------------------------------------ rms_norm
def rms_norm(x, weight, residual, eps: float):
    """h = x + residual (in x's dtype, as the model adds it), then transformers' RMSNorm:
    y = weight * (h32 * (1 / sqrt(tree_sum(h32 * h32) / H + eps))).to(dtype).
    Returns (y, h); h is x when there is no residual."""
    h = x if residual is None else x + residual
    h32 = h.to(torch.float32)
    var = im.tree_sum(h32 * h32) / h.shape[-1]
    rstd = 1.0 / torch.sqrt(var + eps)
    y = (h32 * rstd[..., None]).to(h.dtype)
    if weight is not None:
        y = weight * y
    return y, h


def rms_norm_backward(grad_y, h, weight, eps: float):
    """d/dh and d/dweight of rms_norm (FP32, deterministic; not batch-invariant for dweight)."""
    h32 = h.to(torch.float32)
    rstd = torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + eps)
    n = h32 * rstd
    g = grad_y.to(torch.float32)
    grad_w = None
    if weight is not None:
        grad_w = (g * n.to(h.dtype).to(torch.float32)).reshape(-1, h.shape[-1]).sum(0)
        grad_w = grad_w.to(weight.dtype)
        g = g * weight.to(torch.float32)
    grad_h = rstd * (g - n * (g * n).mean(-1, keepdim=True))
    return grad_h.to(h.dtype), grad_w


# ----------------------------------------------------------------------------------- attention
def visible_keys(q_start_B, kv_len_B, mask, causal: bool, tq: int, tk: int):
    """Boolean [B, 1 or Hq, Tq, Tk]: key j is visible to query i of sequence b iff
    j < kv_len[b], (not causal or j <= q_start[b] + i), and mask[b, h, i, j] (if given)."""
    dev = q_start_B.device
    j = torch.arange(tk, device=dev)
    vis = j[None, None, :] < kv_len_B[:, None, None]  # [B, 1, Tk]
    if causal:
        pos = q_start_B[:, None] + torch.arange(tq, device=dev)[None, :]  # [B, Tq]
        vis = vis & (j[None, None, :] <= pos[:, :, None])
    else:
        vis = vis.expand(-1, tq, -1)
    vis = vis[:, None]
    if mask is not None:
        vis = vis & mask
    return vis


def attention_mask_args(mask, tq: int, tk: int):
    """(words, intervals, flag) int32 of a bool mask broadcast to [mb, mh, tq, tk], a row per
    (b, h, query): words [rows, ceil(tk / 32)], bit i of word w = key 32 w + i; intervals [rows,
    2] = [first seen key, last + 1) ([tk, 0) if none); flag [1]: all rows exactly intervals."""
    m = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape)).to(torch.bool)
    rows, w, dev = m.shape[0] * m.shape[1] * tq, -(-tk // 32), m.device
    m = m.expand(m.shape[0], m.shape[1], tq, tk).reshape(rows, tk)
    bits = torch.nn.functional.pad(m.to(torch.int64), (0, w * 32 - tk)).view(rows, w, 32)
    bits = (bits << torch.arange(32, device=dev)).sum(-1)  # disjoint bits: < 2**32, exact
    words = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)  # bit 31: the sign
    key, edge = torch.arange(tk, device=dev), torch.full((rows, 1), tk, device=dev)
    lo = torch.cat([torch.where(m, key, tk), edge], 1).amin(1)
    hi = torch.cat([torch.where(m, key + 1, 0), edge * 0], 1).amax(1)
    exact = m.sum(1) == (hi - lo).clamp_min(0)
    return words, torch.stack([lo, hi], 1).to(torch.int32), exact.all().to(torch.int32)[None]


def key_end(vis: torch.Tensor) -> int:
    """1 + the last key any row of `visible_keys` sees (0 when none). The keys past it are
    invisible to every row: exact zeros in every sum of the forward (trailing zeros of
    `block_sum`, +0 products in the PV sum), so stopping there changes no bit."""
    seen = vis.reshape(-1, vis.shape[-1]).any(0)
    return int(seen.nonzero().max()) + 1 if bool(seen.any()) else 0


def attention(q, k, v, q_start_B, kv_len_B, mask, causal: bool, scale: float):
    """Causal GQA attention, two-pass softmax in a fixed order. Returns (out, lse FP32).

    Per query row: s_j = (sum over d = 0..D-1 in order of q_d k_jd) * scale (rank-1 updates,
    exact bf16 products); m = max over visible s_j (exact); p_j = exp(s_j - m), 0 if masked;
    l = block_sum(p, SOFTMAX_BLOCK) from key 0; out = (sum over j = 0.. in order of
    bf16(p_j) v_j) / l; lse = m + log(l). Masked keys add exact zeros (v is zeroed beyond
    kv_len, so stale cache slots cannot inject NaN), hence a row's bits depend only on its
    visible keys: the full forward, prefill in any chunks, and decode agree bitwise.
    Rows with no visible key give out = 0 and lse = -inf.

    Grouped-query attention without copies: query head h reads key / value head h // G (q is
    viewed as [B * Hkv, G * Tq, D]); each row's arithmetic is the same as against k, v
    repeated G times. Keys are computed up to the last one any row sees (`key_end`: kv_len,
    causal and the mask, e.g. the filled part of a static cache in decode).
    """
    b, hq, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    g = hq // hkv
    vis = visible_keys(q_start_B, kv_len_B, mask, causal, tq, tk)  # [B, 1|Hq, Tq, Tk]
    tk_eff = max(key_end(vis), 1)
    vis = vis[..., :tk_eff].expand(b, hq, tq, tk_eff).reshape(b * hkv, g * tq, tk_eff)
    k_live = (torch.arange(tk_eff, device=k.device)[None, :] < kv_len_B[:, None])[:, None, :, None]
    k = k[:, :, :tk_eff]
    v = torch.where(k_live, v[:, :, :tk_eff], torch.zeros((), dtype=v.dtype, device=v.device))
    q3 = q.reshape(b * hkv, g * tq, d)
    s = im.rank1_bmm(q3, k.reshape(b * hkv, tk_eff, d)) * scale
    neg_inf = torch.tensor(float("-inf"), device=q.device)
    s = torch.where(vis, s, neg_inf)
    m = s.amax(dim=-1, keepdim=True)
    any_vis = vis.any(dim=-1, keepdim=True)
    m = torch.where(any_vis, m, torch.zeros_like(m))
    p = torch.where(vis, im.exp(s - m), torch.zeros((), device=q.device))
    l_sum = im.block_sum(p, SOFTMAX_BLOCK)[..., None]
    p16 = p.to(v.dtype)  # the PV operand is rounded to the input dtype, as the GPU kernel does
    acc = im.rank1_bmm(p16, v.reshape(b * hkv, tk_eff, d).mT)  # sum over keys j in order
    out = torch.where(any_vis, acc / torch.where(any_vis, l_sum, 1.0), 0.0)
    lse = torch.where(any_vis, m + im.log(l_sum), neg_inf)
    return out.to(q.dtype).reshape(b, hq, tq, d), lse.reshape(b, hq, tq)


def attention_backward(
    grad_out, q, k, v, out, lse, q_start_B, kv_len_B, mask, causal, scale, kv_grad_dtype=None
):
    """FP32 attention gradients from the saved lse (deterministic; plain PyTorch matmuls).
    dK and dV are computed per QUERY head (against k, v repeated per query head), each rounded
    to k's dtype, then each group's G heads summed in a fixed order (`kv_group_sum`, one
    rounding to kv_grad_dtype, default k's dtype): bit for bit the gradients of repeating k
    and v and attending, what the learner computed before attention read the KV heads in place.
    -> (dq, dk, dv), dk and dv of k's shape."""
    b, hq, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    g = hq // hkv
    vis = visible_keys(q_start_B, kv_len_B, mask, causal, tq, tk).expand(b, hq, tq, tk)
    q32, do = q.to(torch.float32), grad_out.to(torch.float32)
    k32 = k.to(torch.float32).repeat_interleave(g, dim=1)
    v32 = v.to(torch.float32).repeat_interleave(g, dim=1)
    s = (q32 @ k32.transpose(-1, -2)) * scale
    lse_safe = torch.where(torch.isfinite(lse), lse, 0.0)[..., None]
    p = torch.where(vis, torch.exp(s - lse_safe), 0.0)
    dv = p.transpose(-1, -2) @ do
    dp = do @ v32.transpose(-1, -2)
    delta = (do * out.to(torch.float32)).sum(-1, keepdim=True)
    ds = p * (dp - delta) * scale
    dq = ds @ k32
    dk = ds.transpose(-1, -2) @ q32
    # per query head; the sum over the singleton dim turns -0.0 into +0.0, as this reference
    # always has (kept for its bits)
    dk = dk.reshape(b, hq, 1, tk, d).sum(2).to(k.dtype)
    dv = dv.reshape(b, hq, 1, tk, d).sum(2).to(v.dtype)
    kv_dtype = kv_grad_dtype or k.dtype
    return dq.to(q.dtype), kv_group_sum(dk, g, kv_dtype), kv_group_sum(dv, g, kv_dtype)


def kv_group_sum(grad_BHqTD: torch.Tensor, g: int, out_dtype: torch.dtype) -> torch.Tensor:
    """Per-query-head gradients [B, Hkv * G, T, D] -> [B, Hkv, T, D] in out_dtype: each
    group's G heads summed in order r = 0, 1, ..., G - 1 in FP32, starting from head 0 (no
    identity element: -0.0 stays -0.0), one rounding at the end (CUDA: `group_sum_kernel`,
    the same roundings). G = 1: the gradient itself, cast to out_dtype if it differs."""
    b, hn, t, d = grad_BHqTD.shape
    if g == 1:
        return grad_BHqTD.to(out_dtype)
    parts = grad_BHqTD.reshape(b, hn // g, g, t, d)
    acc = parts[:, :, 0].to(torch.float32)
    for r in range(1, g):
        acc = acc + parts[:, :, r].to(torch.float32)
    return acc.to(out_dtype).contiguous()


# ------------------------------------------------------------------------------------ logprobs
def _row_chunks(num_rows: int, vocab: int):
    step = max(1, ROWS_PER_CHUNK_ELEMS // max(vocab, 1))
    return range(0, num_rows, step), step


def logprobs(logits_MV, tokens_M, temperature: float):
    """Per row, z = float32(logits) / temperature; m = max z (exact); e = exp(z - m);
    l = block_sum(e, VOCAB_BLOCK) from entry 0; logp = (z[token] - m) - log(l);
    entropy = log(l) - block_sum(e * (z - m)) / l. Rows are processed in chunks (never the
    whole [M, V] in FP32); chunking over rows cannot change a row's arithmetic."""
    num_rows, vocab = logits_MV.shape
    logp = torch.empty(num_rows, dtype=torch.float32, device=logits_MV.device)
    ent = torch.empty_like(logp)
    starts, step = _row_chunks(num_rows, vocab)
    for r0 in starts:
        z = logits_MV[r0 : r0 + step].to(torch.float32) / temperature
        m = z.amax(dim=-1, keepdim=True)
        zm = z - m
        e = im.exp(zm)
        log_l = im.log(im.block_sum(e, VOCAB_BLOCK))
        tok = tokens_M[r0 : r0 + step, None]
        logp[r0 : r0 + step] = zm.gather(-1, tok)[:, 0] - log_l
        ent[r0 : r0 + step] = log_l - im.block_sum(e * zm, VOCAB_BLOCK) / im.exp(log_l)
    return logp, ent


def logprobs_backward(grad_logp, grad_ent, logits_MV, tokens_M, logp, ent, temperature):
    """d/dlogits of (logp, entropy), in row chunks (FP32 math, result in logits' dtype):
    dz = g_lp (onehot - p) - g_H p (log p + H); dlogits = dz / temperature."""
    num_rows, vocab = logits_MV.shape
    grad = torch.empty_like(logits_MV)
    starts, step = _row_chunks(num_rows, vocab)
    for r0 in starts:
        rows = slice(r0, r0 + step)
        z = logits_MV[rows].to(torch.float32) / temperature
        log_l = (z.gather(-1, tokens_M[rows, None]) - logp[rows, None]).to(torch.float32)
        log_p = z - log_l
        p = torch.exp(log_p)
        dz = torch.zeros_like(z)
        if grad_logp is not None:
            gl = grad_logp[rows, None].to(torch.float32)
            dz = dz - gl * p
            dz = dz.scatter_add(-1, tokens_M[rows, None], gl)
        if grad_ent is not None:
            ge = grad_ent[rows, None].to(torch.float32)
            dz = dz - ge * p * (log_p + ent[rows, None])
        grad[rows] = (dz / temperature).to(logits_MV.dtype)
    return grad


# ------------------------------------------------------------------------------------- routing
def routing(logits_ME, top_k: int, norm_topk_prob: bool):
    """Qwen3-MoE routing: p = softmax(float32(logits)) with exp and tree_sum in a fixed order;
    top-k by a STABLE descending sort (ties: the lower expert index wins); optional
    renormalization by the sequential sum of the k selected values. Returns (weights FP32 [M, k],
    experts int64 [M, k])."""
    z = logits_ME.to(torch.float32)
    e = im.exp(z - z.amax(dim=-1, keepdim=True))
    p = e / im.tree_sum(e)[:, None]
    vals, idx = torch.sort(p, dim=-1, descending=True, stable=True)
    vals, idx = vals[:, :top_k], idx[:, :top_k]
    if norm_topk_prob:
        total = vals[:, 0]
        for i in range(1, top_k):
            total = total + vals[:, i]
        vals = vals / total[:, None]
    return vals.contiguous(), idx.contiguous()


# ---------------------------------------------------------------------------------------------
# gather_rows' backward: each row's positions summed in ascending position order


def row_segments(idx: torch.Tensor, num_rows: int):
    """(order, starts, counts): positions of idx grouped by row (stable: ascending within a
    row), the first entry of row r in `order` and how many there are (int64, on idx's device).
    The row ids are sorted in the narrowest integer type that holds them (int16 below 2**15
    rows, else int32 / int64): CUDA's radix sort makes one 8-bit pass per key byte (int64: 8),
    and a stable sort's order is fixed by the key order alone, so `order` is the same."""
    idx = torch.where(idx < 0, idx + num_rows, idx)  # x[idx] wraps negatives
    key = torch.int16 if num_rows <= 2**15 else torch.int32 if num_rows <= 2**31 else torch.int64
    sorted_idx, order = torch.sort(idx.to(key), stable=True)
    rows = torch.arange(num_rows, device=idx.device, dtype=key)
    starts = torch.searchsorted(sorted_idx, rows)
    counts = torch.searchsorted(sorted_idx, rows, right=True) - starts
    return order, starts, counts


def gather_rows_backward_reference(grad: torch.Tensor, idx: torch.Tensor, num_rows: int):
    """The backward's math as torch ops (the CPU implementation; the kernel's reference)."""
    order, starts, counts = row_segments(idx, num_rows)
    acc = torch.zeros((num_rows, *grad.shape[1:]), dtype=torch.float32, device=grad.device)
    most = int(counts.max()) if num_rows else 0
    for j in range(most):  # one FP32 add per row per step, in position order
        rows = (counts > j).nonzero().squeeze(1)
        acc[rows] = acc[rows] + grad[order[starts[rows] + j]].to(torch.float32)
    return acc.to(grad.dtype)


# ------------------------------------------------------------------------------------ silu_mul
def _row_column(a: torch.Tensor, row_mask: torch.Tensor) -> torch.Tensor:
    return row_mask.reshape(*a.shape[:-1], 1)


def _rows_zeroed(t: torch.Tensor, row_mask: torch.Tensor) -> torch.Tensor:
    """t with the masked rows +0.0, in t's own strides: ATen's CPU silu rounds differently on
    a strided view than on a contiguous copy (FP32), and the unfolded graph hands it the
    strided halves of the masked tensor."""
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    return out.copy_(t).masked_fill_(_row_column(t, row_mask), 0.0)


def silu_mul(a, b, row_mask=None):
    """Eager `F.silu(a) * b` (ATen's ops, so its roundings), of a and b with the rows of
    `row_mask` zeroed first; contiguous (the layout the op's fake promises, whatever a's is)."""
    if row_mask is not None:
        a, b = _rows_zeroed(a, row_mask), _rows_zeroed(b, row_mask)
    return (torch.nn.functional.silu(a) * b).contiguous()


def silu_mul_backward(grad, a, b, row_mask=None):
    """Eager autograd's backward of F.silu(a) * b, as ATen ops (the CPU implementation); with
    `row_mask`, of `F.silu(a_m) * b_m` through `masked_fill` (a_m = a.masked_fill(m, 0))."""
    if row_mask is not None:
        col = _row_column(a, row_mask)
        a, b = _rows_zeroed(a, row_mask), _rows_zeroed(b, row_mask)
    grad_b = grad * torch.nn.functional.silu(a)
    grad_a = torch.ops.aten.silu_backward(grad * b, a)
    if row_mask is not None:
        grad_a, grad_b = grad_a.masked_fill(col, 0.0), grad_b.masked_fill(col, 0.0)
    return grad_a.contiguous(), grad_b.contiguous()


# ---------------------------------------------------------------------------- partial sums
PARTIAL_SUM_CHAINS = 64  # part of the numerics: the order of the sum (`partial_sum_kernel`)


def partial_sum(
    partial_PH: torch.Tensor, out_dtype: torch.dtype, *, chains: int = PARTIAL_SUM_CHAINS
) -> torch.Tensor:
    """`partial_sum_kernel.partial_sum`'s order as torch FP32 adds (any device): each chain a
    loop over its rows, then the pairwise tree, then one cast."""
    p = partial_PH.float()
    nodes = []
    for c in range(min(chains, p.shape[0])):
        acc = p[c].clone()
        for row in range(c + chains, p.shape[0], chains):
            acc = acc + p[row]
        nodes.append(acc)
    while len(nodes) > 1:
        pairs = [nodes[j : j + 2] for j in range(0, len(nodes), 2)]
        nodes = [pair[0] + pair[1] if len(pair) == 2 else pair[0] for pair in pairs]
    return nodes[0].to(out_dtype)
