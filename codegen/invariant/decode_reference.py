"""CPU references of the decode program's two ops (`sample_argmax.py`, `decode_advance.py`):
plain PyTorch, the very ops `fp4_compile/rollout/decode_program.py` ran eagerly before they were
fused, so the fused forms are checked against what they replace (the seeded Gumbel noise
included: `gumbel_uniforms`, `gumbel_loglog`, which `fp4_compile/rollout/sampling.py` draws
with); of the step's KV-cache write (`kv_cache_write.py`: the two `index_put_` that
`fp4_compile/rollout/kv_cache.py` ran); and of the step's position mask (`position_mask.py`:
the mask `fp4_compile/rollout/kv_cache.py` built, with what the attentions read of it); and of
the rotary tables of positions (`rotary_tables.py`: transformers' angles, cos and sin).

Shape legend: B rows (slots), V vocabulary, T token columns of a row's record (max_tokens).
"""

from __future__ import annotations

import torch

from ...sr_stream import M32, mix32, mix32_int
from .reference import attention_mask_args


def scale_logits(logits_BV: torch.Tensor, temperature: float, *, reciprocal: bool) -> torch.Tensor:
    """FP32 [B, V] logits / temperature as torch computes `logits.float() / temperature`:
    reciprocal=False, CPU's IEEE division; reciprocal=True, what CUDA computes for a host scalar
    divisor (ATen's `div_true_kernel_cuda`: x * (1 / b), 1 / b rounded to FP32 on the host from
    b rounded to FP32), which differs from the division in the last bit for most temperatures."""
    x = logits_BV.float()
    if not reciprocal:
        return x / temperature
    one = torch.tensor(1.0, dtype=torch.float32)
    inv = (one / torch.tensor(temperature, dtype=torch.float32)).item()
    return x * torch.tensor(inv, dtype=torch.float32, device=x.device)


def gumbel_uniforms(keys_B: torch.Tensor, step: int | torch.Tensor, vocab_size: int):
    """FP64 [B, V] u of `sampling.gumbel_noise` in torch ops (arguments checked by the caller):
    the CPU path and the reference of the CUDA kernel (`gumbel_noise_kernel.py`). Exact integer
    arithmetic on int64 (products split so that none overflows) and an exact u. A per-row step
    [B] gives each row its own step key (the same integers as that row's step alone)."""
    if isinstance(step, torch.Tensor):
        step_key = mix32((mix32(step & M32) ^ (step >> 32) ^ 0x85EBCA6B) & M32)
        if step_key.dim() == 1:
            step_key = step_key[:, None]
    else:
        step_key = mix32_int((mix32_int(step & M32) ^ (step >> 32) ^ 0x85EBCA6B) & M32)
    tok = torch.arange(vocab_size, dtype=torch.int64, device=keys_B.device)
    h = mix32(tok[None, :] ^ keys_B[:, None])
    h = mix32(h ^ ((keys_B[:, None] >> 1) ^ step_key))
    return ((h >> 8).to(torch.float64) + 0.5) * (1.0 / 16777216.0)


def gumbel_loglog(keys_B: torch.Tensor, step: int | torch.Tensor, vocab_size: int):
    """FP64 [B, V] log(-log(u)) of `gumbel_uniforms`, torch's FP64 logs on keys_B's device."""
    return torch.log(-torch.log(gumbel_uniforms(keys_B, step, vocab_size)))


def sample_argmax(
    logits_BV: torch.Tensor,
    keys_B: torch.Tensor | None,
    step: torch.Tensor | None,
    temperature: float,
    *,
    reciprocal: bool = False,
) -> torch.Tensor:
    """int64 [B]: the first maximum (lower id wins ties; a NaN beats any number, as
    torch.argmax) over v of

        scaled[b, v] = FP32(logits[b, v]) / temperature       (`scale_logits`: one rounding)
        loglog[b, v] = log(-log(u[b, v]))                     (`gumbel_loglog`: FP64, exact -)
        noise[b, v]  = FP32(-loglog[b, v])                    (negation exact; RNE to FP32)
        key[b, v]    = scaled[b, v] + noise[b, v]             (one FP32 add; no FMA)

    u the seeded uniforms of row b's request key and draw number (`step`: int64 [] or [B]);
    no noise when keys_B is None (greedy: the argmax of the logits, temperature 1).
    This is `sampling.sample(logits.float() / T, gumbel_noise(keys, step, V))`, with
    gumbel_noise = FP32(-log(-log(u))) = FP32(-loglog)."""
    scaled = scale_logits(logits_BV, temperature, reciprocal=reciprocal)
    if keys_B is not None:
        loglog = gumbel_loglog(keys_B, step, logits_BV.shape[1])
        scaled = scaled + (-loglog).to(torch.float32)
    return torch.argmax(scaled, dim=-1)


def decode_advance(
    picked_B: torch.Tensor,
    logp_B: torch.Tensor,
    eos: torch.Tensor,
    budget_B: torch.Tensor,
    tokens_BT: torch.Tensor,
    logps_BT: torch.Tensor,
    n_B: torch.Tensor,
    finished_B: torch.Tensor,
    ids_B1: torch.Tensor,
    positions_B1: torch.Tensor,
    kv_len_B: torch.Tensor,
) -> None:
    """One decode token's bookkeeping, in place: each row's token n and its log-prob recorded
    (a finished row writes at its n, past its last token), n advanced on live rows, the finished
    flag raised at EOS or at the budget, and the next step's inputs (token, position, kv length)
    advanced on the rows still running (a row that just finished keeps its last step)."""
    live = ~finished_B
    index = n_B[:, None]
    tokens_BT.scatter_(1, index, picked_B[:, None])
    logps_BT.scatter_(1, index, logp_B[:, None])
    n_B.add_(live)
    finished_B |= live & ((picked_B == eos) | (n_B >= budget_B))
    running = ~finished_B
    ids_B1.copy_(torch.where(running, picked_B, ids_B1[:, 0])[:, None])
    positions_B1.add_(running[:, None])
    kv_len_B.add_(running)


def kv_cache_write(k_cache, v_cache, positions_BT, k, v, block_table=None) -> None:
    """k_cache[b, h, positions[b, t]] = k[b, h, t], the same for v (in place): the indices of
    every (b, h, t) broadcast to [B, H_kv, Tq], so `index_put_` takes [B, H_kv, Tq, D] as it is.
    Paged (block_table [B, P], caches [N, H_kv, PAGE, D]): page block_table[b, p // PAGE],
    slot p % PAGE."""
    b, h = positions_BT.shape[0], k_cache.shape[1]
    heads = torch.arange(h, device=k_cache.device)[None, :, None]
    if block_table is None:
        rows, slots = torch.arange(b, device=k_cache.device)[:, None, None], positions_BT
    else:
        page = k_cache.shape[2]
        rows = torch.gather(block_table, 1, positions_BT // page)[:, None, :]
        slots = positions_BT % page
    index = (rows, heads, slots[:, None, :])
    k_cache.index_put_(index, k)
    v_cache.index_put_(index, v)


def position_mask(positions_BT: torch.Tensor, kv_len_B: torch.Tensor, max_seq_len: int):
    """Boolean [B, 1, Tq, S_max] (the torch ops the step ran): key j is visible to the query at
    position p iff j <= p and j < kv_len; every row sees key 0."""
    keys = torch.arange(max_seq_len, device=positions_BT.device)
    visible = keys[None, None, :] <= positions_BT[:, :, None]
    visible &= keys[None, None, :] < kv_len_B[:, None, None]
    visible[..., 0] = True
    return visible[:, None]


def position_mask_args(positions_BT: torch.Tensor, kv_len_B: torch.Tensor, max_seq_len: int):
    """(mask, words, intervals, flag, q_start, kv_keys): `position_mask`, its kernel arguments
    (`reference.attention_mask_args` at Tq = positions' width, Tk = max_seq_len) and the
    lengths an attention over the mask takes: int64 [B] zeros and [B] max_seq_len."""
    mask = position_mask(positions_BT, kv_len_B, max_seq_len)
    words, intervals, flag = attention_mask_args(mask, positions_BT.shape[1], max_seq_len)
    b, dev = positions_BT.shape[0], positions_BT.device
    q_start = torch.zeros(b, dtype=torch.int64, device=dev)
    kv_keys = torch.full((b,), max_seq_len, dtype=torch.int64, device=dev)
    return mask, words, intervals, flag, q_start, kv_keys


def rotary_tables(positions: torch.Tensor, inv_freq: torch.Tensor):
    """(cos, sin) FP32 [*positions.shape, 2F] of transformers' rotary embedding before its
    scaling and cast: angles = positions.float()[..., None] * inv_freq.float() (FP32), the tables of
    cat((angles, angles), -1) by ATen's cos / sin (`fp4_compile::cos` / `sin`'s kernels)."""
    angles = positions.float()[..., None] * inv_freq.float()
    emb = torch.cat((angles, angles), dim=-1)
    return torch.cos(emb), torch.sin(emb)
