"""The rollout engine of a MoE model with its MoE block's decode-GEMM codes left to the experts'
GEMMs (`passes/defer_decode_codes.py`: the post-attention norm -> rms_norm_quantize_parts, the
experts' SwiGLU -> silu_mul_quantize_parts, the gate/up and down GEMMs ->
nvfp4_grouped_mm_parts quantizing the gathered rows in the decode GEMM's prologue) against the
same engine without the pass.

Tier: bitwise. As tests/rollout/test_defer_decode_codes_engine.py (the dense form): the norm
and GEMM ops, old and new, run their kernel paths in the Triton interpreter (made a decode
architecture for both engines) inside the engine's compiled prefill and decode graphs (tiny
Qwen3-MoE, strict, continuously batched; the router reads the normed values): the same tokens
and the same log-probs, raw bytes; the pass must have fired on the MoE block and the grouped
prologue must have run (else the test tests nothing). The SwiGLUs run their references on both
sides (the interpreter's exp is not torch's). Compiled kernels: tests/gpu.
"""

import copy
import os

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.models import tiny_qwen3_moe
from fp4_compile.rl import RolloutEngine
from fp4_compile.testing import assert_bitwise_equal

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1",
    reason="the interpreter's kernel path on CPU (a GPU runs tests/gpu)",
)
RECIPE = NVFP4Recipe.strict()
PROMPTS = [[3, 5, 7], [11, 2], [4, 4, 4, 9, 1]]
BUDGETS = [4, 2, 3]


def _generate(learner, monkeypatch, defer: bool):
    from fp4_compile.codegen import configs
    from fp4_compile.codegen.nvfp4 import (
        decode_gemm_kernel,
        gemm,
        grouped_parts,
        norm_parts,
        rms_norm_quantize,
    )
    from fp4_compile.rollout import store_binding

    grouped_prologue = []
    launch = decode_gemm_kernel.launch_decode_gemm

    def spy(*args, **kwargs):
        grouped_prologue.append(
            kwargs.get("a_parts") is not None and kwargs.get("offsets") is not None
        )
        return launch(*args, **kwargs)

    def forward(x, residual, weight, eps, recipe, transposed):  # the old norm op's kernels
        y2, a, gd, xt, gdt, h2 = rms_norm_quantize._cuda_operands(
            x, weight, eps, transposed, residual
        )
        return y2.reshape(x.shape), a, gd, xt, gdt, h2.reshape(x.shape)

    def linear_quantized(x_ongrid, x_gd, w, bias, out_dtype):  # the old GEMM op's kernels
        codes, scales = w.codes, w.block_scales.view(torch.uint8)
        return gemm.cuda_linear_quantized(
            x_ongrid, x_gd, codes, scales, w.global_decode, None, bias, out_dtype
        )

    def grouped_quantized(x_ongrid, x_gd, w, offsets, x_index=None):  # the old experts' kernels
        codes, scales = w.codes, w.block_scales.view(torch.uint8)
        return gemm.cuda_grouped_quantized(
            x_ongrid, x_gd, codes, scales, w.global_decode, None, offsets, torch.float32, x_index
        )

    fired = []
    defer_codes = store_binding.defer_decode_codes

    def maybe_defer(graph, report=None):
        fired.append(defer_codes(graph, report) if defer else 0)
        return fired[-1]

    with monkeypatch.context() as m:
        m.setattr(configs, "DECODE_DISPATCH", (*configs.DECODE_DISPATCH, "interpreter"))
        m.setattr(norm_parts, "_kernels", lambda t: True)
        m.setattr(grouped_parts, "_kernels", lambda t: True)
        m.setattr(rms_norm_quantize, "_forward", forward)
        m.setattr(gemm, "cpu_linear_quantized", linear_quantized)
        m.setattr(gemm, "cpu_grouped_quantized", grouped_quantized)
        m.setattr(decode_gemm_kernel, "launch_decode_gemm", spy)
        m.setattr(store_binding, "defer_decode_codes", maybe_defer)
        torch._dynamo.reset()
        engine = RolloutEngine(copy.deepcopy(learner), recipe=RECIPE, max_batch=2, max_seq_len=16)
        out = engine.generate(PROMPTS, max_new_tokens=BUDGETS, seed=3, temperature=0.8)
    return out, fired, any(grouped_prologue)


def test_moe_engine_with_deferred_codes_is_bitwise_the_engine_without(monkeypatch):
    torch.manual_seed(0)
    learner = tiny_qwen3_moe(layers=1).eval()
    deferred, fired, prologue = _generate(learner, monkeypatch, defer=True)
    plain, not_fired, no_prologue = _generate(learner, monkeypatch, defer=False)
    # each graph (one layer): the input norm (q/k/v), the post-attention norm (router + experts'
    # gate/up) and the experts' SwiGLU (down) rewritten
    assert fired and all(n == 3 for n in fired), fired
    assert prologue, "the experts' decode GEMM must quantize in its prologue"
    assert not any(not_fired) and not no_prologue
    assert deferred.tokens == plain.tokens
    for i, (a, b) in enumerate(zip(deferred.logprobs, plain.logprobs)):
        assert_bitwise_equal(a, b, f"request {i}")
