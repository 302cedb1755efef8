"""The batch-invariant (non-NVFP4) ops of the `fp4_compile::` namespace: registrations, fake
kernels, autograd. Validation and documentation live in `invariant/api.py` (the public API).

Shape legend: M rows, K in-features, N out-features, H hidden, V vocabulary, E experts,
B sequences, Hq / Hkv heads, Tq queries, Tk keys, D head dim.

Ops (each a `torch.library.custom_op`, opaque to Dynamo/Inductor, so compiled and exported
graphs call exactly these numerics; `triton_op` would not compile on CPU):
- invariant_linear(x, weight, bias, out_dtype) -> y
- invariant_rms_norm(x, weight, eps) -> y;  invariant_add_rms_norm(x, residual, weight, eps)
  -> (y, h = x + residual);  invariant_rms_norm_backward(grad_y, h, weight, eps) -> (dh, dw)
- invariant_attention(q, k, v, q_start, kv_len, mask, causal, scale) -> (out, lse);
  invariant_attention_backward(...) -> (dq, dk, dv)
- invariant_logprobs(logits, tokens, temperature) -> (logp, entropy);
  invariant_logprobs_backward(...) -> dlogits
- invariant_routing(logits, top_k, norm_topk_prob) -> (weights, experts)
CPU: `invariant/reference.py` (invariant by construction). CUDA: the Triton kernels of
`invariant/forward_kernels.py` (imported lazily); backward passes in plain PyTorch, except the RMSNorm
backward (one Triton launch on CUDA, `rms_norm_backward`), the attention backward (two
launches on CUDA, `attention_backward`) and the routing backward (one launch on CUDA,
`routing_backward_kernel`).
"""

from __future__ import annotations

import torch

from . import reference as cpu

_LIB = "fp4_compile"


def _kernels():
    from . import forward_kernels as invariant_kernels  # lazy: imports triton

    return invariant_kernels


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


# ------------------------------------------------------------------------------------ linear
@torch.library.custom_op(f"{_LIB}::invariant_linear", mutates_args=())
def invariant_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype
) -> torch.Tensor:
    x2 = _flat(x)
    if x.is_cuda:
        y = _kernels().linear(x2, weight, bias, out_dtype)
    else:
        y = cpu.linear(x2, weight, bias, out_dtype)
    return y.reshape(*x.shape[:-1], weight.shape[0])


@invariant_linear.register_fake
def _(x, weight, bias, out_dtype):
    return x.new_empty((*x.shape[:-1], weight.shape[0]), dtype=out_dtype)


def _linear_setup(ctx, inputs, output):
    x, weight, bias, _ = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None
    ctx.bias_dtype = bias.dtype if bias is not None else None


@torch.library.custom_op(f"{_LIB}::invariant_linear_backward", mutates_args=())
def invariant_linear_backward(
    grad_y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, has_bias: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dX = dY @ W, dW = dY^T @ X, db = sum(dY), with plain matmuls accumulating in FP32, each
    rounded to its operand's dtype: deterministic, not invariant. BF16/FP16 operands (x and W of
    one 16-bit dtype): dY is rounded to that dtype and the GEMMs run in it (tensor cores, FP32
    accumulation: what a BF16 layer's backward does; an FP32 lm_head backward was 5 ms of a
    74 ms H200 learner step); otherwise FP32. ONE opaque op, so Inductor cannot fuse away the
    roundings (eager, Inductor and export give the same bits)."""
    g = _flat(grad_y)
    half = x.dtype == weight.dtype and x.dtype in (torch.bfloat16, torch.float16)
    gemm_dtype = x.dtype if half else torch.float32
    # dY in the GEMM dtype: one rounding from its exact value (no copy when it already is;
    # through FP32 it was two [T, N] copies, 0.1 ms per step for the learner's lm_head)
    g_op = g.to(gemm_dtype)
    dx = (g_op @ weight.to(gemm_dtype)).to(x.dtype).reshape(x.shape)
    dw = (g_op.t() @ _flat(x).to(gemm_dtype)).to(weight.dtype)
    db = g.to(torch.float32).sum(0) if has_bias else g.new_zeros(0, dtype=torch.float32)
    return dx.contiguous(), dw.contiguous(), db


@invariant_linear_backward.register_fake
def _(grad_y, x, weight, has_bias):
    db = grad_y.new_empty((weight.shape[0],) if has_bias else (0,), dtype=torch.float32)
    return x.new_empty(x.shape), weight.new_empty(weight.shape), db


def _linear_backward(ctx, grad_y):
    x, weight = ctx.saved_tensors
    dx, dw, db = invariant_linear_backward(grad_y.contiguous(), x, weight, ctx.has_bias)
    return dx, dw, (db.to(ctx.bias_dtype) if ctx.has_bias else None), None


invariant_linear.register_autograd(_linear_backward, setup_context=_linear_setup)


# ---------------------------------------------------------------------------------- rms_norm
def _rms_forward(x, weight, residual, eps):
    if x.is_cuda:
        outs = _kernels().rms_norm(x, weight, residual, eps)
    else:
        outs = cpu.rms_norm(x, weight, residual, eps)
    return tuple(o.contiguous() for o in outs)  # the fakes promise contiguous outputs


@torch.library.custom_op(f"{_LIB}::invariant_rms_norm", mutates_args=())
def invariant_rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    return _rms_forward(x, weight, None, eps)[0]


@invariant_rms_norm.register_fake
def _(x, weight, eps):
    return x.new_empty(x.shape)


@torch.library.custom_op(f"{_LIB}::invariant_add_rms_norm", mutates_args=())
def invariant_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return _rms_forward(x, weight, residual, eps)


@invariant_add_rms_norm.register_fake
def _(x, residual, weight, eps):
    return x.new_empty(x.shape), x.new_empty(x.shape)


@torch.library.custom_op(f"{_LIB}::invariant_rms_norm_backward", mutates_args=())
def invariant_rms_norm_backward(
    grad_y: torch.Tensor, h: torch.Tensor, weight: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dh, dweight); dweight is an empty tensor when weight is None. CUDA: one Triton launch
    (`rms_norm_backward`); CPU: plain PyTorch."""
    if h.is_cuda:
        from .rms_norm_backward_kernel import rms_norm_backward

        dh, dw = rms_norm_backward(grad_y, h, weight, eps)
    else:
        dh, dw = cpu.rms_norm_backward(grad_y, h, weight, eps)
    return dh, (h.new_empty(0) if dw is None else dw)


@invariant_rms_norm_backward.register_fake
def _(grad_y, h, weight, eps):
    return torch.empty_like(h), (h.new_empty(0) if weight is None else torch.empty_like(weight))


def _rms_setup(ctx, inputs, output):
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _rms_backward(ctx, grad_y):
    x, weight = ctx.saved_tensors
    dx, dw = invariant_rms_norm_backward(grad_y, x, weight, ctx.eps)
    return dx, (dw if weight is not None else None), None


invariant_rms_norm.register_autograd(_rms_backward, setup_context=_rms_setup)


def _add_rms_setup(ctx, inputs, output):
    _, residual, weight, eps = inputs
    ctx.save_for_backward(output[1], weight)
    ctx.eps = eps
    ctx.residual_dtype = residual.dtype


def _add_rms_backward(ctx, grad_y, grad_h):
    h, weight = ctx.saved_tensors
    dh, dw = invariant_rms_norm_backward(grad_y, h, weight, ctx.eps)
    dw = dw if weight is not None else None
    if grad_h is not None:
        dh = dh + grad_h
    return dh, dh.to(ctx.residual_dtype), dw, None


invariant_add_rms_norm.register_autograd(_add_rms_backward, setup_context=_add_rms_setup)


# --------------------------------------------------------------------------------- attention
@torch.library.custom_op(f"{_LIB}::invariant_attention", mutates_args=())
def invariant_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_start: torch.Tensor,
    kv_len: torch.Tensor,
    mask: torch.Tensor | None,
    causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    if q.is_cuda:
        out, lse = _kernels().attention(q, k, v, q_start, kv_len, mask, causal, scale)
    else:
        out, lse = cpu.attention(q, k, v, q_start, kv_len, mask, causal, scale)
    return out.contiguous(), lse.contiguous()  # the fake promises contiguous outputs


@invariant_attention.register_fake
def _(q, k, v, q_start, kv_len, mask, causal, scale):
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op(f"{_LIB}::invariant_attention_backward", mutates_args=())
def invariant_attention_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    q_start: torch.Tensor,
    kv_len: torch.Tensor,
    mask: torch.Tensor | None,
    causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if q.is_cuda:
        from .attention_backward_kernel import attention_backward  # lazy: imports triton

        grads = attention_backward(
            grad_out, q, k, v, out, lse, q_start, kv_len, mask, causal, scale
        )
    else:
        grads = cpu.attention_backward(
            grad_out, q, k, v, out, lse, q_start, kv_len, mask, causal, scale
        )
    return tuple(g.contiguous() for g in grads)


@invariant_attention_backward.register_fake
def _(grad_out, q, k, v, out, lse, q_start, kv_len, mask, causal, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _attn_setup(ctx, inputs, output):
    q, k, v, q_start, kv_len, mask, causal, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, q_start, kv_len, mask)
    ctx.causal, ctx.scale = causal, scale
    ctx.mark_non_differentiable(lse)


def _attn_backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse, q_start, kv_len, mask = ctx.saved_tensors
    dq, dk, dv = invariant_attention_backward(
        grad_out, q, k, v, out, lse, q_start, kv_len, mask, ctx.causal, ctx.scale
    )
    return dq, dk, dv, None, None, None, None, None


invariant_attention.register_autograd(_attn_backward, setup_context=_attn_setup)


# ---------------------------------------------------------------------------------- logprobs
@torch.library.custom_op(f"{_LIB}::invariant_logprobs", mutates_args=())
def invariant_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    if logits.is_cuda:
        return _kernels().logprobs(logits, tokens, temperature)
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


# ----------------------------------------------------------------------------------- routing
@torch.library.custom_op(f"{_LIB}::invariant_routing", mutates_args=())
def invariant_routing(
    logits: torch.Tensor, top_k: int, norm_topk_prob: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    if logits.is_cuda:
        return _kernels().routing(logits, top_k, norm_topk_prob)
    return cpu.routing(logits, top_k, norm_topk_prob)


@invariant_routing.register_fake
def _(logits, top_k, norm_topk_prob):
    m = logits.shape[0]
    return (
        logits.new_empty((m, top_k), dtype=torch.float32),
        logits.new_empty((m, top_k), dtype=torch.int64),
    )


def _routing_setup(ctx, inputs, output):
    logits, _, norm = inputs
    ctx.save_for_backward(logits, output[1])
    ctx.norm = norm


@torch.library.custom_op(f"{_LIB}::invariant_routing_backward", mutates_args=())
def invariant_routing_backward(
    grad_w: torch.Tensor, logits: torch.Tensor, idx: torch.Tensor, norm_topk_prob: bool
) -> torch.Tensor:
    """Through softmax, the top-k gather and the renormalization, FP32, as ONE opaque op so
    eager, Inductor and export compute the same bits. CUDA: one Triton launch
    (`routing_backward_kernel`: the same formula, one row per program in a fixed order; it
    raises for what it does not take: dtypes other than float32 / bfloat16 / float16, more than
    its MAX_EXPERTS = 4096 experts; no fallback); CPU: the plain PyTorch formula below (the
    reference)."""
    if logits.is_cuda:
        from .routing_backward_kernel import routing_backward  # lazy: imports triton

        return routing_backward(grad_w, logits, idx, norm_topk_prob)
    p = torch.softmax(logits.to(torch.float32), dim=-1)
    g = grad_w.to(torch.float32)
    sel = p.gather(-1, idx)
    if norm_topk_prob:
        total = sel.sum(-1, keepdim=True)
        w = sel / total
        g = (g - (g * w).sum(-1, keepdim=True)) / total
    dp = torch.zeros_like(p).scatter_add(-1, idx, g)
    dz = p * (dp - (dp * p).sum(-1, keepdim=True))
    return dz.to(logits.dtype)


@invariant_routing_backward.register_fake
def _(grad_w, logits, idx, norm_topk_prob):
    return torch.empty_like(logits)


def _routing_backward(ctx, grad_w, grad_idx):
    logits, idx = ctx.saved_tensors
    return invariant_routing_backward(grad_w.contiguous(), logits, idx, ctx.norm), None, None


invariant_routing.register_autograd(_routing_backward, setup_context=_routing_setup)
