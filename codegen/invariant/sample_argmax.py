"""`fp4_compile::sample_argmax`: the rollout's Gumbel-max pick of one token per row (the logits
scaled by the temperature, plus the seeded Gumbel noise, first maximum), in one pass.

Shape legend: B rows, V vocabulary.

sample_argmax(logits [B, V], keys int64 [B] or None, step int64 [] or [B] or None, temperature)
-> int64 [B]
The noise of row b is FP32(-log(-log(u))), u the seeded uniforms of its request key keys[b] at
draw number step (one for every row, or step[b]): `fp4_compile.rollout.sampling.gumbel_noise`;
keys and step None: no noise (greedy, temperature 1).
Contract: on each device the pick is bitwise the torch ops it replaces there,
`argmax(logits.float() / temperature + gumbel_noise(keys, step, V))`
(`decode_reference.sample_argmax`): the CPU computes them (IEEE division); CUDA runs
`sample_argmax_kernel` (one launch instead of five: the uniforms, two FP64 logs and a negation
were four of them), which makes the noise in registers with the same integers and the same FP64
`log` as torch's CUDA ops, and computes the scaling as ATen's CUDA division by a host scalar does
(reciprocal=True). The pick only chooses a token: log-probs stay the shared `invariant_logprobs`
op's.
"""

from __future__ import annotations

import torch

from . import decode_reference


def _check(logits, keys, step, temperature) -> None:
    if not logits.dtype.is_floating_point or logits.dim() != 2 or logits.shape[1] == 0:
        raise TypeError(f"logits must be float [B, V>0], got {logits.dtype}{list(logits.shape)}")
    if (keys is None) != (step is None):
        raise TypeError("keys and step must both be tensors (sampled) or both None (greedy)")
    if keys is not None:
        num = logits.shape[0]
        if keys.dtype != torch.int64 or tuple(keys.shape) != (num,):
            raise TypeError(f"keys must be int64 [{num}], got {keys.dtype}{list(keys.shape)}")
        if step.dtype != torch.int64 or tuple(step.shape) not in ((), (num,)):
            raise TypeError(f"step must be int64 [] or [{num}], got {step.dtype}{list(step.shape)}")
        if keys.device != logits.device or step.device != logits.device:
            raise TypeError(
                f"keys ({keys.device}) and step ({step.device}) must be on the logits' device "
                f"({logits.device})"
            )
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


@torch.library.custom_op("fp4_compile::sample_argmax", mutates_args=())
def sample_argmax(
    logits: torch.Tensor,
    keys: torch.Tensor | None,
    step: torch.Tensor | None,
    temperature: float,
) -> torch.Tensor:
    _check(logits, keys, step, temperature)
    if logits.is_cuda:
        from .sample_argmax_kernel import sample_argmax as launch  # lazy: imports triton

        return launch(logits, keys, step, temperature)
    return decode_reference.sample_argmax(logits, keys, step, temperature)


@sample_argmax.register_fake
def _(logits, keys, step, temperature):
    _check(logits, keys, step, temperature)
    return logits.new_empty(logits.shape[:1], dtype=torch.int64)
