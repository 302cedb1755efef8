"""The rollout engine with the decode GEMMs quantizing their operand in their prologue against the
same engine without it, both ways the prologue is reached:

- the norms' and dense SwiGLU's decode-GEMM codes left to the GEMM's prologue
  (`passes/defer_decode_codes.py`: rms_norm_quantize_parts / silu_mul_quantize_parts +
  nvfp4_linear_parts, no row_codes launch after the producers);
- nvfp4_linear's kernel path at few rows (`codegen/nvfp4/gemm_cuda.few_row_parts`: the chunk
  maxima, then the decode GEMM quantizing its operand; the o projection), instead of
  quantize_triton's split form then the decode GEMM.

Tier: bitwise. On CPU the ops dispatch to the references (which these changes leave alone), so
here the norm and GEMM ops, old and new, run their kernel paths in the Triton interpreter (made a
decode architecture for both engines) inside the engine's compiled prefill and decode graphs
(tiny Qwen3, strict, continuously batched): ONE engine with both on, ONE with both off; the same
tokens and the same log-probs, raw bytes; the pass must have fired, and both prologues must have
run (else the test tests nothing). Learner == rollout with the CPU references: the engine tests
(tests/rollout/test_engine*.py) run with the pass on; compiled kernels: tests/gpu
(tests/gpu/test_gpu_alignment.py: the interpreter's FP32 dot is not the reference's order).
"""

import copy
import os

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.models import tiny_qwen3
from fp4_compile.rl import RolloutEngine
from fp4_compile.testing import assert_bitwise_equal

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1",
    reason="the interpreter's kernel path on CPU (a GPU runs tests/gpu)",
)
RECIPE = NVFP4Recipe.strict()
PROMPTS = [[3, 5, 7], [11, 2], [4, 4, 4, 9, 1]]
BUDGETS = [4, 2, 3]


def _generate(learner, monkeypatch, on: bool):
    """(output, defer's rewrites per graph, few_row_parts taken per call, decode GEMM launches
    with a prologue)."""
    from fp4_compile.codegen import configs
    from fp4_compile.codegen.nvfp4 import (
        decode_gemm_kernel,
        gemm,
        gemm_cuda,
        norm_parts,
        rms_norm_quantize,
    )
    from fp4_compile.rollout import store_binding

    prologue = []
    launch = decode_gemm_kernel.launch_decode_gemm

    def spy(*args, **kwargs):
        prologue.append(kwargs.get("a_parts") is not None)
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

    def kernel_linear(x2, w, bias, recipe, x_amax):  # nvfp4_linear's CPU branch -> its kernels
        codes, scales = w.codes, w.block_scales.view(torch.uint8)
        return gemm_cuda.cuda_linear(
            x2.contiguous(), codes, scales, w.global_decode, None, bias, recipe, x_amax
        )

    taken = []
    few_row_parts = gemm_cuda.few_row_parts

    def parts(*args):
        out = few_row_parts(*args) if on else None
        taken.append(out is not None)
        return out

    fired = []
    defer_codes = store_binding.defer_decode_codes

    def maybe_defer(graph, report=None):
        fired.append(defer_codes(graph, report) if on else 0)
        return fired[-1]

    with monkeypatch.context() as m:
        m.setattr(configs, "DECODE_DISPATCH", (*configs.DECODE_DISPATCH, "interpreter"))
        m.setattr(norm_parts, "_kernels", lambda t: True)
        m.setattr(rms_norm_quantize, "_forward", forward)
        m.setattr(gemm, "cpu_linear_quantized", linear_quantized)
        m.setattr(gemm, "cpu_linear", kernel_linear)
        m.setattr(gemm_cuda, "few_row_parts", parts)
        m.setattr(decode_gemm_kernel, "launch_decode_gemm", spy)
        m.setattr(store_binding, "defer_decode_codes", maybe_defer)
        torch._dynamo.reset()
        engine = RolloutEngine(copy.deepcopy(learner), recipe=RECIPE, max_batch=2, max_seq_len=16)
        out = engine.generate(PROMPTS, max_new_tokens=BUDGETS, seed=3, temperature=0.8)
    return out, fired, taken, sum(prologue)


def test_engine_with_decode_prologues_is_bitwise_the_engine_without(monkeypatch):
    torch.manual_seed(0)
    learner = tiny_qwen3(layers=1).eval()
    fused, fired, taken, prologues = _generate(learner, monkeypatch, on=True)
    plain, not_fired, not_taken, no_prologues = _generate(learner, monkeypatch, on=False)
    # each graph (one layer): the two norms and the SwiGLU rewritten
    assert fired and all(n == 3 for n in fired), fired
    assert any(taken), "the engine's o projection must take the prologue"
    # the deferred codes' GEMMs launch with a prologue too, besides each few_row_parts one
    assert prologues > sum(taken), (prologues, sum(taken))
    assert not any(not_fired) and not any(not_taken) and no_prologues == 0
    assert len(not_taken) == len(taken)
    assert fused.tokens == plain.tokens
    for i, (a, b) in enumerate(zip(fused.logprobs, plain.logprobs)):
        assert_bitwise_equal(a, b, f"request {i}")
