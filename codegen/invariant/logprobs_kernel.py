"""Triton kernel of `fp4_compile::invariant_logprobs`' forward (log-softmax at the sampled tokens
and the entropy, per row), and its launcher.

Shape legend: M rows, V vocabulary.

Invariance: one row per program; the row max (exact in any order), then the sums over fixed
BLOCK_V vocabulary blocks from entry 0, in order (`configs.LAUNCH`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..configs import pick_launch, warps_kwargs
from ..runtime import arch_of, check_kernel_device


@triton.jit
def _logprobs_kernel(x_ptr, t_ptr, lp_ptr, ent_ptr, V, sx, temperature, BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * sx
    cols = tl.arange(0, BLOCK_V)
    m_vec = tl.full((BLOCK_V,), float("-inf"), tl.float32)
    for v0 in range(0, V, BLOCK_V):  # pass 1: the row max (exact in any order)
        z = tl.load(base + v0 + cols, mask=v0 + cols < V, other=float("-inf")).to(tl.float32)
        m_vec = tl.maximum(m_vec, z / temperature)
    m = tl.max(m_vec, axis=0)
    l_sum = 0.0
    ez_sum = 0.0
    for v0 in range(0, V, BLOCK_V):  # pass 2: sums over fixed vocabulary blocks, in order
        live = v0 + cols < V
        zm = tl.load(base + v0 + cols, mask=live, other=0.0).to(tl.float32) / temperature - m
        e = tl.where(live, tl.exp(zm), 0.0)
        l_sum += tl.sum(e, axis=0)
        ez_sum += tl.sum(e * zm, axis=0)
    tok = tl.load(t_ptr + row)
    z_tok = tl.load(base + tok).to(tl.float32) / temperature - m
    log_l = tl.log(l_sum)
    tl.store(lp_ptr + row, z_tok - log_l)
    tl.store(ent_ptr + row, log_l - ez_sum / l_sum)


def logprobs(logits_MV, tokens_M, temperature: float):
    check_kernel_device(logits_MV, "logits")
    m, vocab = logits_MV.shape
    logits_MV = logits_MV if logits_MV.stride(1) == 1 else logits_MV.contiguous()
    lp = torch.empty(m, dtype=torch.float32, device=logits_MV.device)
    ent = torch.empty_like(lp)
    lc = pick_launch(arch_of(logits_MV.device), "logprobs")
    _logprobs_kernel[(m,)](
        logits_MV,
        tokens_M.contiguous(),
        lp,
        ent,
        vocab,
        logits_MV.stride(0),
        float(temperature),
        BLOCK_V=lc["block_v"],
        **warps_kwargs(lc),
    )
    return lp, ent
