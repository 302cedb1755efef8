"""The decode attention's per-head maxima for the output projection
(`fp4_compile::invariant_attention_parts`, its kernel's epilogue) and the projection reading
them (`fp4_compile::nvfp4_linear_with_parts`) on the GPU against the CUDA ops they replace,
bitwise.

- (out, lse) == `invariant_attention`'s, parts == each head's max |out| of that out, and
  `nvfp4_linear_with_parts(out as o_proj's rows, parts)` == `nvfp4_linear` (its own
  chunk_abs_max, then the decode GEMM's prologue): Qwen3-8B (32 / 8 heads) and Qwen3-30B-A3B
  (32 / 4) shapes, head dim 128, batch 1, 64 and 256 (past the decode GEMM: the parts unread),
  rows of different kv_len;
- the engine: tiny Qwen3 in bf16, strict, with vs without the pass: the same tokens and
  log-probs (raw bytes), the pass fired, and the learner's log-probs bit for bit.
"""

import copy

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile import reference as ref
from fp4_compile.models import tiny_qwen3
from fp4_compile.testing import assert_bitwise_equal

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
ops = torch.ops.fp4_compile
KEY = NVFP4Recipe.strict().numerics_key


@pytest.mark.parametrize("batch", [1, 64, 256])
@pytest.mark.parametrize(("hq", "hkv"), [(32, 8), (32, 4)], ids=["8b", "30b"])
def test_parts_and_the_projection_reading_them(hq, hkv, batch):
    g = torch.Generator(device=DEVICE).manual_seed(0)
    d, tk = 128, 512
    q = torch.randn(batch, hq, 1, d, generator=g, device=DEVICE).bfloat16()
    k = torch.randn(batch, hkv, tk, d, generator=g, device=DEVICE).bfloat16()
    v = (torch.randn(batch, hkv, tk, d, generator=g, device=DEVICE) * 3).bfloat16()
    kv_len = torch.randint(1, tk + 1, (batch,), generator=g, device=DEVICE, dtype=torch.int32)
    args = (q, k, v, kv_len - 1, kv_len, None, False, d**-0.5)
    out, lse, parts = ops.invariant_attention_parts(*args)
    want_out, want_lse = ops.invariant_attention(*args)
    assert_bitwise_equal(out, want_out, "out")
    assert_bitwise_equal(lse, want_lse, "lse")
    heads = want_out.transpose(1, 2).reshape(batch, hq, d).float()
    assert_bitwise_equal(parts, heads.abs().amax(dim=2), "parts")
    x = want_out.transpose(1, 2).reshape(batch, 1, hq * d)
    weight = torch.randn(2048, hq * d, generator=g, device=DEVICE)
    wq = ref.quantize(weight, block="16x16")
    w = (wq.codes, wq.block_scales.view(torch.uint8), wq.global_decode)
    got = ops.nvfp4_linear_with_parts(x, parts, *w, None, None, KEY)
    want = ops.nvfp4_linear(x, weight, *w, None, None, KEY, None, 0)
    assert_bitwise_equal(got, want, f"o_proj, batch {batch}")


def test_engine_with_and_without_the_pass_and_the_learner(monkeypatch):
    from fp4_compile.rl import RolloutEngine, sequence_logprobs
    from fp4_compile.rollout import store_binding

    rec = NVFP4Recipe.strict()
    prompts, budgets = [[3, 5, 7], [11, 2], [4, 4, 4, 9, 1], [8]], [6, 3, 5, 4]
    torch.manual_seed(0)
    learner = tiny_qwen3(layers=2, dtype=torch.bfloat16).to(DEVICE).eval()
    emit = store_binding.emit_attention_parts
    outs, fired = [], []
    for on in (True, False):
        monkeypatch.setattr(
            store_binding,
            "emit_attention_parts",
            lambda gr, r=None, on=on: fired.append(emit(gr, r) if on else 0) or fired[-1],
        )
        torch._dynamo.reset()
        engine = RolloutEngine(copy.deepcopy(learner), recipe=rec, max_batch=2, max_seq_len=24)
        outs.append(engine.generate(prompts, max_new_tokens=budgets, seed=3, temperature=0.8))
    assert any(fired), fired
    assert outs[0].tokens == outs[1].tokens
    for i, (x, y) in enumerate(zip(outs[0].logprobs, outs[1].logprobs)):
        assert_bitwise_equal(x, y, f"request {i}, with vs without the pass")
    torch._dynamo.reset()
    compiled = torch.compile(learner, backend="minite", options={"recipe": rec})
    seqs = [p + t for p, t in zip(prompts, outs[0].tokens)]
    with torch.enable_grad():  # the training forward: the plain ops
        want = sequence_logprobs(compiled, seqs, [len(p) for p in prompts], temperature=0.8)
    for i, (x, y) in enumerate(zip(outs[0].logprobs, want)):
        assert_bitwise_equal(x, y.detach().to(x.device), f"request {i}, rollout vs learner")
