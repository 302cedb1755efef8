"""Seeded sampling that does not depend on batch composition, drawn on the device.

Request r's Gumbel noise at its n-th sampled token is a pure function of (its seed, n, token id):
a counter-based integer hash (`sr_stream`'s "lowbias32" mixer, exact int64 arithmetic on the
logits' own device), so a prompt sampled alone or inside any batch gets the same tokens, and the
whole batch draws in a few vectorized launches with no host round trip (per-request CPU
generators cost ~0.1 ms per request per token: 2048 `torch.rand` calls per 32-token call at
batch 64 were a third of the H200 engine's host time).

u = ((h >> 8) + 0.5) * 2^-24 in (0, 1), noise = -log(-log(u)) in FP64, rounded to FP32. On CUDA
the hash and u are one Triton launch (`codegen/invariant/gumbel_noise_kernel.py`: uint32
registers instead of about 80 int64 torch launches per token, the same exact integers, so the
same u), and the decode program's pick (`fp4_compile::sample_argmax`) makes the noise itself in
registers, logs included; the torch form (`gumbel_uniforms_reference`, in
`codegen/invariant/decode_reference.py`) is the CPU path and the kernels' reference. CPU and
GPU give the same noise unless their FP64 `log` differ by an ulp right at an FP32 rounding
boundary (odds ~2^-29 per value). Temperature is applied exactly as the shared log-prob op applies
it: `logits / temperature` in FP32.
"""

from __future__ import annotations

import operator

import torch

from ..codegen.invariant.decode_reference import gumbel_uniforms as gumbel_uniforms_reference
from ..engine_api import check_filter
from ..sr_stream import sr_key

__all__ = [
    "check_draw",
    "filter_logits",
    "gumbel_loglog",
    "gumbel_noise",
    "gumbel_uniforms_reference",
    "request_keys",
    "sample",
]


def request_keys(seeds: list[int], device) -> torch.Tensor:
    """int64 [B]: the 32-bit stream key of each request's seed (non-negative ints)."""
    keys = []
    for i, s in enumerate(seeds):
        try:
            s = operator.index(s)
        except TypeError:
            raise TypeError(f"seed[{i}] must be an int, got {type(s).__name__}") from None
        if s < 0:
            raise ValueError(f"seed[{i}] must be non-negative, got {s}")
        keys.append(sr_key(s))
    return torch.tensor(keys, dtype=torch.int64, device=device)


def gumbel_noise(keys_B: torch.Tensor, step: int | torch.Tensor, vocab_size: int) -> torch.Tensor:
    """FP32 [B, V] Gumbel noise of draw number `step` of each request (`keys_B` from
    `request_keys`), on keys_B's device: FP32(-gumbel_loglog(...)). Row r depends only on
    (keys_B[r], its step). Arguments as `gumbel_loglog`'s."""
    return (-gumbel_loglog(keys_B, step, vocab_size)).to(torch.float32)


def gumbel_loglog(keys_B: torch.Tensor, step: int | torch.Tensor, vocab_size: int) -> torch.Tensor:
    """FP64 [B, V] log(-log(u)): the Gumbel noise of `gumbel_noise` before its negation (exact)
    and its rounding to FP32. The decode program's pick (`fp4_compile::sample_argmax`) makes the
    same values in its own pass from (keys_B, step), without this tensor.

    `step`: a Python int, an int64 0-dim tensor on keys_B's device (a device-side step counter:
    no host read), or an int64 [B] tensor there: one draw number per row (a continuously batched
    decode program, whose rows run different requests at different token indices). The step's
    key is the same exact integer arithmetic on the host or on the device, per row or shared, so
    a row's noise at draw n has the same bits whichever form carries n."""
    check_draw(keys_B, step, vocab_size)
    if keys_B.device.type == "cuda":
        from ..codegen.invariant.gumbel_noise_kernel import gumbel_uniforms  # lazy: imports triton

        u = gumbel_uniforms(keys_B, step, vocab_size)
    else:
        u = gumbel_uniforms_reference(keys_B, step, vocab_size)
    return torch.log(-torch.log(u))


def check_draw(keys_B: torch.Tensor, step: int | torch.Tensor, vocab_size: int) -> None:
    """`gumbel_loglog`'s argument check (its docstring says what each may be)."""
    if keys_B.dtype != torch.int64 or keys_B.dim() != 1:
        raise TypeError(f"keys_B must be int64 [B], got {keys_B.dtype}{list(keys_B.shape)}")
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    if isinstance(step, torch.Tensor):
        per_row = step.dim() == 1 and step.shape[0] == keys_B.shape[0]
        if (
            step.dtype != torch.int64
            or not (step.dim() == 0 or per_row)
            or (step.device != keys_B.device)
        ):
            raise TypeError(
                f"a tensor step must be int64 [] or [B={keys_B.shape[0]}] on {keys_B.device}, "
                f"got {step.dtype}{list(step.shape)} on {step.device}"
            )
    elif step < 0:
        raise ValueError(f"step must be >= 0, got {step}")


def filter_logits(scaled_BV: torch.Tensor, *, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to -inf) tokens outside top-k / the top-p nucleus, per row, ties by lower index.
    The nucleus is computed with stock softmax/cumsum in float64 on the sampling side only (it
    picks which tokens may be drawn; log-probs come from the shared op), so top_p < 1 is not part
    of the bitwise contract."""
    check_filter(top_k, top_p)
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
    """Gumbel-max on the logits' device: argmax(scaled logits + noise), int64 [B]; ties go to the
    lower token id (torch.argmax returns the first maximum on every device)."""
    return torch.argmax(scaled_BV.float() + noise_BV, dim=-1)
