"""Batch-invariant ops for everything that is not an NVFP4 GEMM: the public API.

Shape legend: M rows (tokens), K in-features, N out-features, H hidden, V vocabulary,
E experts, B sequences, Hq / Hkv query / key-value heads, Tq queries, Tk keys (cache slots),
D head dim.

    y        = linear(x, weight, bias, out_dtype=torch.float32)      # lm_head, router, BF16 layers
    y        = rms_norm(x, weight, eps)                              # or (y, h) with residual=
    out      = attention(q, k, v, q_start=pos_B, kv_len=len_B)       # learner, prefill, decode
    logp, H  = logprobs(logits, tokens, temperature)                 # learner AND rollout
    w, ids   = route(router_logits, top_k, norm_topk_prob=True)
    order, offsets = sort_by_expert(ids, num_experts)                # for the grouped GEMM

Each call is one `torch.ops.fp4_compile.invariant_*` op (plus its backward op under autograd).

Why each op computes a row the same way whatever else is in the batch:
- linear: each output element is ONE accumulator walked over k = 0..K-1 in a fixed order. CPU:
  rank-1 updates (exact bf16 products, see `invariant/fixed_order.py`). CUDA: pinned tiles from
  `configs`, the same BLOCK_K for every M, no split-K, rows never interact.
- rms_norm: one row per program (CUDA) or a fixed pairwise tree over the row (CPU); the
  residual add is elementwise.
- attention: per query row, keys are visited in fixed-size blocks from position 0 in the same
  order (CUDA: online softmax over BLOCK_N keys; CPU: exact max, then fixed-order sums), and
  masked keys are exact no-ops, so a row's bits depend only on its own visible keys: the
  learner's full forward, prefill in one piece or in chunks, and decode agree bitwise. No
  length-dependent split-KV. Grouped-query attention reads each KV head in place (query head h
  reads KV head h // G): pass k, v with their Hkv heads, never repeated.
- logprobs: per row, max over the vocabulary (exact), then sums over fixed vocabulary blocks
  from entry 0; never materializes [M, V] in FP32 beyond a bounded chunk of rows.
- routing: softmax per row in a fixed order, top-k by a stable sort (the lower expert index
  wins ties), renormalization by a sequential sum over the k values.

Ragged batches and the KV cache: sequences are RIGHT-padded (every sequence stores its keys
from slot 0, as a static cache [B, Hkv, S_max, D] does). `q_start[b]` is the absolute position
of q's first row of sequence b, `kv_len[b]` the number of valid key slots; key j is visible to
query i iff j < kv_len[b] and j <= q_start[b] + i (causal), and `mask[b, h, i, j]` if given.
Slots at or beyond kv_len may hold anything finite or not: they are never read into a result.
Rows past a sequence's real tokens (padding queries) compute finite values that never reach
real rows; rows with no visible key give 0.
"""

from __future__ import annotations

import math

import torch

from .attention import invariant_attention
from .linear import invariant_linear
from .logprobs import invariant_logprobs
from .rms_norm import invariant_add_rms_norm, invariant_rms_norm
from .routing import invariant_routing

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
ATTENTION_DTYPES = (torch.bfloat16, torch.float16)


def _check_tensor(t, name: str, dtypes=FLOAT_DTYPES) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype in {dtypes}, got {t.dtype}")


def _check_same_device(ref: torch.Tensor, **tensors) -> None:
    for name, t in tensors.items():
        if t is not None and t.device != ref.device:
            raise ValueError(f"{name} is on {t.device} but the first input is on {ref.device}")


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """y[..., N] = x[..., K] @ weight[N, K].T + bias, FP32 accumulation, batch-invariant.
    out_dtype defaults to x's dtype (FP32 keeps lm_head logits unrounded)."""
    _check_tensor(x, "x")
    _check_tensor(weight, "weight")
    if weight.dim() != 2:
        raise ValueError(f"weight must be [N, K], got shape {tuple(weight.shape)}")
    if x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"x's last dim must equal weight's K={weight.shape[1]}, got x shape {tuple(x.shape)}"
        )
    if x.dtype != weight.dtype:
        raise TypeError(f"x ({x.dtype}) and weight ({weight.dtype}) must have the same dtype")
    if bias is not None:
        _check_tensor(bias, "bias")
        if tuple(bias.shape) != (weight.shape[0],):
            raise ValueError(f"bias must be [{weight.shape[0]}], got {tuple(bias.shape)}")
    if out_dtype is not None and out_dtype not in FLOAT_DTYPES:
        raise TypeError(f"out_dtype must be one of {FLOAT_DTYPES}, got {out_dtype}")
    _check_same_device(x, weight=weight, bias=bias)
    return invariant_linear(x, weight, bias, out_dtype or x.dtype)


def mm(a: torch.Tensor, b: torch.Tensor, *, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """a[M, K] @ b[K, N] (torch.mm's convention), batch-invariant over M."""
    if not isinstance(b, torch.Tensor) or b.dim() != 2:
        raise ValueError(f"b must be a 2D tensor [K, N], got {getattr(b, 'shape', b)}")
    if not isinstance(a, torch.Tensor) or a.dim() != 2:
        raise ValueError(f"a must be a 2D tensor [M, K], got {getattr(a, 'shape', a)}")
    return linear(a, b.t(), out_dtype=out_dtype)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    *,
    residual: torch.Tensor | None = None,
):
    """transformers' RMSNorm over the last dim, batch-invariant. With `residual`, returns
    (rms_norm(x + residual), x + residual) (the sum in x's dtype, as the model adds it)."""
    _check_tensor(x, "x")
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"x must have a non-empty last dim, got shape {tuple(x.shape)}")
    if weight is not None:
        _check_tensor(weight, "weight")
        if tuple(weight.shape) != (x.shape[-1],):
            raise ValueError(f"weight must be [{x.shape[-1]}], got {tuple(weight.shape)}")
    if not isinstance(eps, (float, int)) or not eps >= 0:
        raise ValueError(f"eps must be a non-negative float, got {eps!r}")
    _check_same_device(x, weight=weight, residual=residual)
    if residual is None:
        return invariant_rms_norm(x, weight, float(eps))
    _check_tensor(residual, "residual")
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(
            f"residual must match x ({x.dtype}{list(x.shape)}), got "
            f"{residual.dtype}{list(residual.shape)}"
        )
    return invariant_add_rms_norm(x, residual, weight, float(eps))


def _positions(t, name: str, batch: int, device, default: int) -> torch.Tensor:
    if t is None:
        return torch.full((batch,), default, dtype=torch.int64, device=device)
    if isinstance(t, int):
        return torch.full((batch,), t, dtype=torch.int64, device=device)
    if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be an int or an int32/int64 tensor [B], got {t!r}")
    if tuple(t.shape) != (batch,):
        raise ValueError(
            f"{name} must have shape [{batch}] (one per sequence), got {tuple(t.shape)}"
        )
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but q is on {device}")
    return t.to(torch.int64)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = True,
    q_start: torch.Tensor | int | None = None,
    kv_len: torch.Tensor | int | None = None,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    return_lse: bool = False,
):
    """Batch-invariant GQA attention. q [B, Hq, Tq, D]; k, v [B, Hkv, Tk, D] (Hq % Hkv == 0),
    bf16 or fp16; FP32 softmax statistics. Positions as in the module docstring: q_start [B]
    (default 0, and required when Tq != Tk with causal=True), kv_len [B] (default Tk),
    mask optional boolean [B or 1, Hq or 1, Tq, Tk] (True = attend), scale default D**-0.5.
    Decode: Tq = 1, q_start = t, kv_len = t + 1. Returns out [B, Hq, Tq, D] (and lse
    [B, Hq, Tq] FP32 with return_lse)."""
    _check_tensor(q, "q", ATTENTION_DTYPES)
    _check_tensor(k, "k", ATTENTION_DTYPES)
    _check_tensor(v, "v", ATTENTION_DTYPES)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"q, k, v must be 4D [B, H, T, D], got {tuple(q.shape)}, {tuple(k.shape)}, "
            f"{tuple(v.shape)}"
        )
    b, hq, tq, d = q.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d:
        raise ValueError(
            f"k and v must be [B={b}, Hkv, Tk, D={d}], got {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k.shape[1] == 0 or hq % k.shape[1]:
        raise ValueError(f"query heads ({hq}) must be a multiple of kv heads ({k.shape[1]})")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    tk = k.shape[2]
    if tk == 0:
        raise ValueError("k has no key slots (Tk = 0)")
    _check_same_device(q, k=k, v=v, mask=mask)
    if q_start is None and causal and tq != tk:
        raise ValueError(
            f"q_start is required when causal and Tq ({tq}) != Tk ({tk}): give the absolute "
            "position of q's first row per sequence (decode: q_start = t, kv_len = t + 1)"
        )
    q_start_B = _positions(q_start, "q_start", b, q.device, 0)
    kv_len_B = _positions(kv_len, "kv_len", b, q.device, tk)
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 4:
            raise TypeError(f"mask must be a 4D boolean tensor (True = attend), got {mask!r:.80}")
        if (
            mask.shape[0] not in (1, b)
            or mask.shape[1] not in (1, hq)
            or mask.shape[2:] != (tq, tk)
        ):
            raise ValueError(
                f"mask must broadcast as [{b}, {hq}, {tq}, {tk}], got {tuple(mask.shape)}"
            )
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    out, lse = invariant_attention(q, k, v, q_start_B, kv_len_B, mask, bool(causal), float(scale))
    return (out, lse) if return_lse else out


def logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0):
    """(logp, entropy), FP32 [...]: log_softmax(float32(logits) / temperature) at `tokens`, and
    the entropy of that distribution. THE one function the learner and the rollout both call.
    logits [..., V] (any float dtype), tokens int64/int32 [...] in [0, V)."""
    _check_tensor(logits, "logits")
    if not isinstance(tokens, torch.Tensor) or tokens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"tokens must be an int32/int64 tensor, got {tokens!r:.80}")
    if logits.dim() < 1 or tuple(tokens.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            f"tokens must have logits' leading shape {tuple(logits.shape[:-1])}, got {tuple(tokens.shape)}"
        )
    if not isinstance(temperature, (float, int)) or not temperature > 0 or math.isinf(temperature):
        raise ValueError(f"temperature must be a positive finite float, got {temperature!r}")
    _check_same_device(logits, tokens=tokens)
    vocab = logits.shape[-1]
    if vocab == 0:
        raise ValueError("logits has an empty vocabulary dim")
    flat_logits = logits.reshape(-1, vocab)
    flat_tokens = tokens.reshape(-1).to(torch.int64)
    logp, ent = invariant_logprobs(flat_logits, flat_tokens, float(temperature))
    return logp.reshape(tokens.shape), ent.reshape(tokens.shape)


def route(logits: torch.Tensor, top_k: int, *, norm_topk_prob: bool = True):
    """Qwen3-MoE routing of router logits [M, E] (e.g. `linear(x, router_weight)`): FP32 softmax,
    top-k (ties: lower expert index wins), renormalized if norm_topk_prob. Returns
    (weights FP32 [M, k], experts int64 [M, k])."""
    _check_tensor(logits, "logits")
    if logits.dim() != 2:
        raise ValueError(f"logits must be [M, E], got shape {tuple(logits.shape)}")
    if not isinstance(top_k, int) or not 1 <= top_k <= logits.shape[1]:
        raise ValueError(f"top_k must be an int in [1, E={logits.shape[1]}], got {top_k!r}")
    return invariant_routing(logits, top_k, bool(norm_topk_prob))


def sort_by_expert(experts_MK: torch.Tensor, num_experts: int):
    """Group the (token, slot) pairs by expert for the grouped GEMM. Returns (order int64 [M*k]:
    flat indices into experts_MK.reshape(-1) sorted by expert, ties in ascending flat order, so
    token = order // k; offsets int32 [E]: the END of each expert's group, the
    `torch._grouped_mm` convention). Deterministic (stable sort)."""
    if not isinstance(experts_MK, torch.Tensor) or experts_MK.dtype not in (
        torch.int32,
        torch.int64,
    ):
        raise TypeError(f"experts_MK must be an int32/int64 tensor, got {experts_MK!r:.80}")
    if not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"num_experts must be a positive int, got {num_experts!r}")
    flat = experts_MK.reshape(-1).to(torch.int64)
    order = torch.sort(flat, stable=True).indices
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts = counts.scatter_add(0, flat, torch.ones_like(flat))
    return order, torch.cumsum(counts, 0).to(torch.int32)
