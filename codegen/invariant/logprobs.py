"""`fp4_compile::invariant_logprobs` and its backward op. Validation and documentation live in
`invariant/api.py` (the public API).

Shape legend: M rows, V vocabulary.

- invariant_logprobs(logits, tokens, temperature) -> (logp, entropy);
  invariant_logprobs_backward(...) -> dlogits
CPU: `invariant/reference.py` (invariant by construction). CUDA: the Triton kernel of
`invariant/logprobs_kernel.py` (imported lazily); the backward in plain PyTorch.
"""

from __future__ import annotations

import torch

from . import reference as cpu

_LIB = "fp4_compile"


@torch.library.custom_op(f"{_LIB}::invariant_logprobs", mutates_args=())
def invariant_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    if logits.is_cuda:
        from . import logprobs_kernel  # lazy: imports triton

        return logprobs_kernel.logprobs(logits, tokens, temperature)
    return cpu.logprobs(logits, tokens, temperature)


@invariant_logprobs.register_fake
def _(logits, tokens, temperature):
    shape = logits.shape[:-1]
    return logits.new_empty(shape, dtype=torch.float32), logits.new_empty(
        shape, dtype=torch.float32
    )


@torch.library.custom_op(f"{_LIB}::invariant_logprobs_backward", mutates_args=())
def invariant_logprobs_backward(
    grad_logp: torch.Tensor | None,
    grad_entropy: torch.Tensor | None,
    logits: torch.Tensor,
    tokens: torch.Tensor,
    logp: torch.Tensor,
    entropy: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    return cpu.logprobs_backward(
        grad_logp, grad_entropy, logits, tokens, logp, entropy, temperature
    )


@invariant_logprobs_backward.register_fake
def _(grad_logp, grad_entropy, logits, tokens, logp, entropy, temperature):
    return torch.empty_like(logits)


def _logprobs_setup(ctx, inputs, output):
    logits, tokens, temperature = inputs
    ctx.save_for_backward(logits, tokens, *output)
    ctx.temperature = temperature


def _logprobs_backward(ctx, grad_logp, grad_entropy):
    logits, tokens, logp, entropy = ctx.saved_tensors
    grad = invariant_logprobs_backward(
        grad_logp, grad_entropy, logits, tokens, logp, entropy, ctx.temperature
    )
    return grad, None, None


invariant_logprobs.register_autograd(_logprobs_backward, setup_context=_logprobs_setup)
