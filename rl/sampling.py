"""Seeded sampling that does not depend on batch composition.

Each request owns a generator seeded from (seed, request seed); at every step it draws its own
Gumbel noise on the CPU (device-independent bits), so a prompt sampled alone or inside any batch
gets the same tokens. Temperature is applied exactly as the shared log-prob op applies it:
`logits / temperature` in FP32.
"""

from __future__ import annotations

import torch


class RequestSampler:
    def __init__(self, seeds: list[int], vocab_size: int):
        self.generators = [torch.Generator(device="cpu").manual_seed(int(s)) for s in seeds]
        self.vocab_size = vocab_size

    def gumbel(self, rows: list[int]) -> torch.Tensor:
        """[len(rows), V] FP32 Gumbel noise, one draw per listed request (advancing only those)."""
        noise = []
        for r in rows:
            u = torch.rand(self.vocab_size, generator=self.generators[r], dtype=torch.float64)
            noise.append(-torch.log(-torch.log(u.clamp(min=1e-300))))
        return torch.stack(noise).to(torch.float32)


def filter_logits(scaled_BV: torch.Tensor, *, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to -inf) tokens outside top-k / the top-p nucleus, per row, ties by lower index.
    The nucleus is computed with stock softmax/cumsum in float64 on the sampling side only (it
    picks which tokens may be drawn; log-probs come from the shared op), so top_p < 1 is not part
    of the bitwise contract."""
    if top_k < 0 or not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_k must be >= 0 and 0 < top_p <= 1, got top_k={top_k}, top_p={top_p}")
    out = scaled_BV
    vocab = out.shape[-1]
    if 0 < top_k < vocab:
        order = torch.sort(out, dim=-1, descending=True, stable=True).indices
        keep = torch.zeros_like(out, dtype=torch.bool).scatter_(1, order[:, :top_k], True)
        out = out.masked_fill(~keep, float("-inf"))
    if top_p < 1.0:
        sorted_vals, order = torch.sort(out, dim=-1, descending=True, stable=True)
        probs = torch.softmax(sorted_vals.double(), dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs
        keep_sorted = before < top_p
        keep = torch.zeros_like(out, dtype=torch.bool).scatter_(1, order, keep_sorted)
        out = out.masked_fill(~keep, float("-inf"))
    return out


def sample(scaled_BV: torch.Tensor, noise_BV: torch.Tensor) -> torch.Tensor:
    """Gumbel-max: argmax(scaled logits + noise); ties broken by the lower token id."""
    return torch.argmax(scaled_BV.float().cpu() + noise_BV, dim=-1)
