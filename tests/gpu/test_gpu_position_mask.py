"""The rollout step's position mask on the GPU: `fp4_compile::invariant_position_mask` (one
compiled Triton launch for the mask, its attention kernel arguments and the lengths) against what
it replaced.

Bitwise:
- the op's six outputs == its CPU path (`decode_reference.position_mask_args`: the torch ops
  the step ran, then the mask-args reference), decode (Tq = 1) at batch 1 and 64 and a prefill,
  at a Qwen3-8B-sized cache (4,096 slots) and a ragged one (4,000);
- the attention given the op's outputs == the attention given `invariant_attention_mask_args`
  of the same mask and the `full` lengths it replaced (out and lse);
- the CUDA engine generates the same tokens and log-prob bytes with the op as with the old mask
  ops, static and paged caches.
"""

import copy

import pytest
import torch

import fp4_compile.rollout.step as step_module
from fp4_compile import NVFP4Recipe
from fp4_compile.codegen.invariant import decode_reference
from fp4_compile.models import tiny_qwen3
from fp4_compile.rl import RolloutEngine
from fp4_compile.testing import assert_bitwise_equal

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
OP = torch.ops.fp4_compile.invariant_position_mask
PARTS = ("mask", "words", "intervals", "flag", "q_start", "kv_keys")


def _positions(batch: int, tq: int, slots: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, slots - tq, (batch, 1), generator=g)
    positions = start + torch.arange(tq)[None]
    kv_len = positions[:, -1] + 1 - torch.randint(0, 2, (batch,), generator=g) * (tq > 1)
    return positions, kv_len


@pytest.mark.parametrize(
    "batch, tq, slots", [(1, 1, 4096), (64, 1, 4096), (64, 1, 4000), (4, 37, 4000)]
)
def test_op_equals_its_cpu_path_bitwise(batch, tq, slots):
    positions, kv_len = _positions(batch, tq, slots, seed=batch + tq)
    want = OP(positions, kv_len, slots)
    got = OP(positions.to(DEVICE), kv_len.to(DEVICE), slots)
    for g, w, part in zip(got, want, PARTS):
        assert g.dtype == w.dtype and g.shape == w.shape, (part, g.shape, w.shape)
        assert_bitwise_equal(g.cpu(), w, f"B={batch} Tq={tq} S={slots}: {part}")


@pytest.mark.parametrize("batch", [1, 64])
def test_attention_reads_the_op_s_arguments_bitwise(batch):
    slots, hq, hkv, d = 512, 32, 8, 128
    positions, kv_len = (t.to(DEVICE) for t in _positions(batch, 1, slots, seed=7))
    g = torch.Generator(device=DEVICE).manual_seed(1)
    q = torch.randn(batch, hq, 1, d, generator=g, device=DEVICE).bfloat16()
    k, v = (
        torch.randn(batch, hkv, slots, d, generator=g, device=DEVICE).bfloat16() for _ in range(2)
    )
    mask, words, iv, flag, q_start, kv_keys = OP(positions, kv_len, slots)
    attention = torch.ops.fp4_compile.invariant_attention
    got = attention(q, k, v, q_start, kv_keys, mask, False, 0.088, words, iv, flag)
    old_mask = decode_reference.position_mask(positions, kv_len, slots)
    old_args = torch.ops.fp4_compile.invariant_attention_mask_args(old_mask, 1, slots)
    zeros = torch.zeros(batch, dtype=torch.int64, device=DEVICE)
    full = torch.full((batch,), slots, dtype=torch.int64, device=DEVICE)
    want = attention(q, k, v, zeros, full, old_mask, False, 0.088, *old_args)
    for a, b, part in zip(got, want, ("out", "lse")):
        assert_bitwise_equal(a, b, f"batch {batch}: {part}, op's arguments vs the old ones")


@pytest.mark.parametrize("kv_cache", ["static", "paged"])
def test_engine_with_the_op_is_bitwise_the_old_mask(kv_cache, monkeypatch):
    prompts, budgets = [[3, 5, 7], [11, 2], [4, 4, 4, 9, 1], [8]], [5, 2, 4, 3]
    torch.manual_seed(0)
    learner = tiny_qwen3(layers=2, dtype=torch.bfloat16).eval()
    extra = dict(kv_tokens=192, kv_page_size=64) if kv_cache == "paged" else {}

    def generate():
        torch._dynamo.reset()
        engine = RolloutEngine(
            copy.deepcopy(learner).to(DEVICE),
            recipe=NVFP4Recipe.strict(),
            max_batch=2,
            max_seq_len=64,
            kv_cache=kv_cache,
            **extra,
        )
        return engine.generate(prompts, max_new_tokens=budgets, seed=3, temperature=0.8)

    out = generate()
    monkeypatch.setattr(step_module, "attention_mask_4d", decode_reference.position_mask)
    ref = generate()
    assert out.tokens == ref.tokens, kv_cache
    for i, (a, b) in enumerate(zip(out.logprobs, ref.logprobs)):
        assert_bitwise_equal(a, b, f"{kv_cache}: request {i}, position mask op vs old mask")
