"""`fp4_compile::sample_argmax`: the rollout's Gumbel-max pick of one token per row (the logits
scaled by the temperature, plus the seeded Gumbel noise, first maximum), in one pass.

Shape legend: B rows, V vocabulary.

sample_argmax(logits [B, V], gumbel_loglog FP64 [B, V] or None, temperature) -> int64 [B]
The noise is FP32(-gumbel_loglog), gumbel_loglog = log(-log(u)) from
`fp4_compile.rollout.sampling.gumbel_loglog`; None: no noise (greedy, temperature 1).
Contract: on each device the pick is bitwise the torch ops it replaces there,
`argmax(logits.float() / temperature + gumbel_noise)` (`decode_reference.sample_argmax`): the CPU
computes them (IEEE division); CUDA runs `sample_argmax_kernel` (one launch instead of five),
which computes the scaling as ATen's CUDA division by a host scalar does (reciprocal=True).
The pick only chooses a token: log-probs stay the shared `invariant_logprobs` op's.
"""

from __future__ import annotations

import torch

from . import decode_reference


def _check(logits, gumbel_loglog, temperature) -> None:
    if not logits.dtype.is_floating_point or logits.dim() != 2 or logits.shape[1] == 0:
        raise TypeError(f"logits must be float [B, V>0], got {logits.dtype}{list(logits.shape)}")
    if gumbel_loglog is not None and (
        gumbel_loglog.dtype != torch.float64 or gumbel_loglog.shape != logits.shape
    ):
        raise TypeError(
            f"gumbel_loglog must be float64 {list(logits.shape)}, got "
            f"{gumbel_loglog.dtype}{list(gumbel_loglog.shape)}"
        )
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


@torch.library.custom_op("fp4_compile::sample_argmax", mutates_args=())
def sample_argmax(
    logits: torch.Tensor, gumbel_loglog: torch.Tensor | None, temperature: float
) -> torch.Tensor:
    _check(logits, gumbel_loglog, temperature)
    if logits.is_cuda:
        from .sample_argmax_kernel import sample_argmax as launch  # lazy: imports triton

        return launch(logits, gumbel_loglog, temperature)
    return decode_reference.sample_argmax(logits, gumbel_loglog, temperature)


@sample_argmax.register_fake
def _(logits, gumbel_loglog, temperature):
    _check(logits, gumbel_loglog, temperature)
    return logits.new_empty(logits.shape[:1], dtype=torch.int64)
