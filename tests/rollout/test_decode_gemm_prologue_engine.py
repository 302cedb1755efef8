"""The rollout engine with nvfp4_linear's kernel path taking the decode GEMM's quantizing prologue
(`codegen/nvfp4/gemm_cuda.few_row_parts`: the chunk maxima, then the decode GEMM quantizing its
operand, no row_codes launch) against the same engine without it (quantize_triton's split form,
then the decode GEMM).

Tier: bitwise. On CPU the ops dispatch to the reference, which this change leaves alone, so here
nvfp4_linear runs its kernel path in the Triton interpreter (the interpreter made a decode
architecture for both engines) inside the engine's compiled prefill and decode graphs (tiny
Qwen3, strict, continuously batched): the same tokens and the same log-probs, raw bytes, and
the prologue path must have run (else the test tests nothing). Learner == rollout with the
kernels compiled is tests/gpu/test_gpu_alignment.py's (the interpreter's FP32 dot is not the
reference's order).
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


def _generate(learner, monkeypatch, prologue: bool):
    from fp4_compile.codegen import configs
    from fp4_compile.codegen.nvfp4 import gemm, gemm_cuda

    taken = []
    few_row_parts = gemm_cuda.few_row_parts

    def parts(*args):
        out = few_row_parts(*args) if prologue else None
        taken.append(out is not None)
        return out

    def kernel_linear(x2, w, bias, recipe, x_amax):  # nvfp4_linear's CPU branch -> its kernels
        codes, scales = w.codes, w.block_scales.view(torch.uint8)
        return gemm_cuda.cuda_linear(
            x2.contiguous(), codes, scales, w.global_decode, None, bias, recipe, x_amax
        )

    with monkeypatch.context() as m:
        m.setattr(configs, "DECODE_DISPATCH", (*configs.DECODE_DISPATCH, "interpreter"))
        m.setattr(gemm_cuda, "few_row_parts", parts)
        m.setattr(gemm, "cpu_linear", kernel_linear)
        torch._dynamo.reset()
        engine = RolloutEngine(copy.deepcopy(learner), recipe=RECIPE, max_batch=2, max_seq_len=16)
        out = engine.generate(PROMPTS, max_new_tokens=BUDGETS, seed=3, temperature=0.8)
    return out, taken


def test_engine_with_prologue_is_bitwise_the_engine_without(monkeypatch):
    torch.manual_seed(0)
    learner = tiny_qwen3(layers=1).eval()
    fused, taken = _generate(learner, monkeypatch, prologue=True)
    plain, not_taken = _generate(learner, monkeypatch, prologue=False)
    assert any(taken), "the engine's o projection must take the prologue"
    assert not any(not_taken) and len(not_taken) == len(taken)
    assert fused.tokens == plain.tokens
    for i, (a, b) in enumerate(zip(fused.logprobs, plain.logprobs)):
        assert_bitwise_equal(a, b, f"request {i}")
