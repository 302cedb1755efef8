"""The row-chunked head + log-prob: per-token log-probs (and entropy) of a causal LM's last hidden
states without materializing the [tokens x vocabulary] logits.

Shape legend: M rows (tokens), H hidden, V vocabulary, C rows per chunk.

Forward, per chunk of C rows: logits = the BF16 head exactly as the lowering emits it
(`passes/targets.py` `emit_bf16_linear`: `invariant_linear(bf16(h), bf16(W), None, h.dtype)`),
then `invariant_logprobs(logits, tokens, temperature)`. Both ops compute each row alone, so every
row's (logp, entropy) equals the one of the learner's full-logits forward and of the engine's
one-row head, whatever C. Peak head memory: one chunk's logits (C x V in h's dtype) plus the
log-prob op's FP32 working rows.

Backward recomputes each chunk's logits, then dlogits = `invariant_logprobs_backward` (per row),
rounded to the head's operand dtype (BF16) once, as `invariant_linear_backward` rounds dY. The
two gradient GEMMs keep their bits at every C:
- dh (a row of dlogits times W, a sum over V): on CUDA the batch-invariant linear kernel
  (`linear_kernel.py`, rows never interact); on the CPU one FP32 matmul per ROW_BLOCK rows, the
  blocks aligned to row 0, so every block is the same call whatever C.
- dW (a sum over the M rows, FP32, rounded to BF16 once at the end, as the graph's backward
  rounds it): on CUDA the invariant kernel continuing ONE K chain across
  chunks (`accumulate_into`, chunk edges at multiples of ROW_BLOCK, a multiple of every pinned
  BLOCK_K); on the CPU one FP32 `addmm_` per ROW_BLOCK rows in ascending order. Rounded once to
  W's dtype at the end.
C must be a multiple of ROW_BLOCK. The gradients are deterministic and chunk-invariant; they are
NOT the bits of the full-logits graph's backward (`invariant_linear_backward`: plain matmuls, a
different summation order), only its math.
"""

from __future__ import annotations

import torch

ROW_BLOCK = 256
"""Rows per fixed block of the gradient sums; every chunk size is a multiple of it."""


def check_chunk_rows(chunk_rows: int) -> None:
    if not isinstance(chunk_rows, int) or chunk_rows < ROW_BLOCK or chunk_rows % ROW_BLOCK:
        raise ValueError(
            f"chunk_rows must be a positive multiple of {ROW_BLOCK} (the fixed row block of the "
            f"head's gradient sums), got {chunk_rows!r}"
        )


def _head(h_CH: torch.Tensor, w_VH: torch.Tensor) -> torch.Tensor:
    """The lowering's BF16 head on one chunk (`emit_bf16_linear`)."""
    return torch.ops.fp4_compile.invariant_linear(
        h_CH.to(torch.bfloat16), w_VH.to(torch.bfloat16), None, h_CH.dtype
    )


def _grad_gemms(g_CV, h_CH, w_VH, dh_CH, dw_acc_VH, *, use_kernels: bool) -> None:
    """dh_CH = g @ W (rounded to the operand dtype, as `invariant_linear_backward`); dw_acc +=
    g^T @ h (FP32), see the module doc. g_CV, h_CH and dh_CH share the operand dtype; w_VH is
    in it for the kernels, FP32 on the CPU (converted once per backward, not per chunk)."""
    if use_kernels:
        from .linear_kernel import linear  # lazy: imports triton

        dh_CH.copy_(linear(g_CV, w_VH.t(), None, dh_CH.dtype))
        linear(g_CV.t(), h_CH.t(), None, torch.float32, accumulate_into=dw_acc_VH)
        return
    for r0 in range(0, g_CV.shape[0], ROW_BLOCK):
        g32 = g_CV[r0 : r0 + ROW_BLOCK].to(torch.float32)
        dh_CH[r0 : r0 + ROW_BLOCK] = (g32 @ w_VH).to(dh_CH.dtype)
        dw_acc_VH.addmm_(g32.t(), h_CH[r0 : r0 + ROW_BLOCK].to(torch.float32))


class _HeadLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h_MH, w_VH, tokens_M, temperature, chunk_rows, use_kernels):
        num_rows = h_MH.shape[0]
        logp = torch.empty(num_rows, dtype=torch.float32, device=h_MH.device)
        ent = torch.empty_like(logp)
        for r0 in range(0, num_rows, chunk_rows):
            rows = slice(r0, r0 + chunk_rows)
            logits = _head(h_MH[rows], w_VH)
            logp[rows], ent[rows] = torch.ops.fp4_compile.invariant_logprobs(
                logits, tokens_M[rows], temperature
            )
        ctx.save_for_backward(h_MH, w_VH, tokens_M, logp, ent)
        ctx.temperature, ctx.chunk_rows, ctx.use_kernels = temperature, chunk_rows, use_kernels
        return logp, ent

    @staticmethod
    def backward(ctx, grad_logp, grad_ent):
        h_MH, w_VH, tokens_M, logp, ent = ctx.saved_tensors
        gemm_dtype = torch.bfloat16  # the head's operands (`_head`)
        w_op = w_VH.to(gemm_dtype)
        if not ctx.use_kernels:  # the CPU blocks multiply in FP32 (exact bf16 products)
            w_op = w_op.to(torch.float32)
        dh = torch.empty(h_MH.shape, dtype=gemm_dtype, device=h_MH.device)
        dw_acc = torch.zeros(w_VH.shape, dtype=torch.float32, device=w_VH.device)
        for r0 in range(0, h_MH.shape[0], ctx.chunk_rows):
            rows = slice(r0, r0 + ctx.chunk_rows)
            logits = _head(h_MH[rows], w_VH)
            dlogits = torch.ops.fp4_compile.invariant_logprobs_backward(
                None if grad_logp is None else grad_logp[rows].contiguous(),
                None if grad_ent is None else grad_ent[rows].contiguous(),
                logits,
                tokens_M[rows],
                logp[rows],
                ent[rows],
                ctx.temperature,
            )
            del logits
            _grad_gemms(
                dlogits.to(gemm_dtype),
                h_MH[rows].to(gemm_dtype),
                w_op,
                dh[rows],
                dw_acc,
                use_kernels=ctx.use_kernels,
            )
        # rounded to the operand dtype, then to the caller's (the lowering's cast nodes' backward)
        return dh.to(h_MH.dtype), dw_acc.to(gemm_dtype).to(w_VH.dtype), None, None, None, None


def head_logprobs(
    hidden_MH: torch.Tensor,
    head_weight_VH: torch.Tensor,
    tokens_M: torch.Tensor,
    temperature: float,
    *,
    chunk_rows: int,
    use_kernels: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp, entropy), FP32 [M]: the shared log-prob op of the BF16 head's logits of each row,
    computed `chunk_rows` rows at a time (see the module doc). use_kernels: the Triton gradient
    GEMMs (default: on CUDA; True on CPU runs them in the interpreter, for tests)."""
    if hidden_MH.dim() != 2 or head_weight_VH.dim() != 2:
        raise ValueError(
            f"hidden must be [M, H] and head_weight [V, H], got {list(hidden_MH.shape)} and "
            f"{list(head_weight_VH.shape)}"
        )
    if hidden_MH.shape[1] != head_weight_VH.shape[1]:
        raise ValueError(
            f"hidden has {hidden_MH.shape[1]} features, head_weight {head_weight_VH.shape[1]}"
        )
    if tokens_M.shape != hidden_MH.shape[:1]:
        raise ValueError(f"tokens must be [{hidden_MH.shape[0]}], got {list(tokens_M.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    check_chunk_rows(chunk_rows)
    if use_kernels is None:
        use_kernels = hidden_MH.is_cuda
    return _HeadLogprobs.apply(
        hidden_MH, head_weight_VH, tokens_M, float(temperature), chunk_rows, use_kernels
    )
