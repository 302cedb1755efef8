"""The MoE combine in the next residual add + RMSNorm's launch
(`fp4_compile::moe_combine_add_rms_norm`, its Triton kernel) on the GPU against the CUDA ops it
replaces, bitwise.

- == `moe_combine` (its CUDA kernel) then `invariant_add_rms_norm` (its CUDA kernel), y and h:
  Qwen3-30B-A3B's shapes (hidden 2048, top-8) at decode (T 1, 64) and prefill (T 512) sizes,
  a norm weight and none, the combine as either addend, an index with repeated and negative
  rows; also hidden 64 (several rows per program);
- the engine: tiny Qwen3-MoE in bf16, bf16 and strict recipes, with vs without the pass: same
  tokens and log-probs (raw bytes), and the learner's log-probs (its training forward keeps the
  two ops) bit for bit.
"""

import copy

import pytest
import torch

import fp4_compile.passes as passes
from fp4_compile import NVFP4Recipe
from fp4_compile.models import tiny_qwen3_moe
from fp4_compile.passes.fuse_combine_into_norms import fuse_combine_into_norms
from fp4_compile.testing import assert_bitwise_equal

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
ops = torch.ops.fp4_compile
BF16 = torch.bfloat16


def _case(t, h, k, *, permutation=True, seed=0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    s = t * k
    x = (torch.randn(s, h, generator=g, device=DEVICE) * 3).to(BF16)
    x[0, :2] = torch.tensor([0.0, -0.0], device=DEVICE)
    w = torch.rand(s, 1, generator=g, device=DEVICE).to(BF16)
    if permutation:
        idx = torch.randperm(s, generator=g, device=DEVICE)
    else:
        idx = torch.randint(0, max(s - 1, 1), (s,), generator=g, device=DEVICE)
        idx[0] = -1
    residual = (torch.randn(t, 1, h, generator=g, device=DEVICE) * 2).to(BF16)
    weight = (1.0 + 0.3 * torch.randn(h, generator=g, device=DEVICE)).to(BF16)
    return residual, x, w, idx, k, weight


@pytest.mark.parametrize(
    ("t", "h", "k"), [(1, 2048, 8), (64, 2048, 8), (512, 2048, 8), (33, 64, 2)]
)
@pytest.mark.parametrize("permutation", [True, False], ids=["perm", "repeats"])
@pytest.mark.parametrize("has_weight", [True, False], ids=["weight", "no-weight"])
@pytest.mark.parametrize("combine_first", [False, True], ids=["residual+c", "c+residual"])
def test_fused_equals_combine_then_add_norm(t, h, k, permutation, has_weight, combine_first):
    residual, x, w, idx, k, weight = _case(t, h, k, permutation=permutation)
    weight = weight if has_weight else None
    got = ops.moe_combine_add_rms_norm(residual, x, w, idx, k, weight, 1e-6)
    c = ops.moe_combine(x, w, idx, k).view(residual.shape)
    a, b = (c, residual) if combine_first else (residual, c)
    want = ops.invariant_add_rms_norm(a, b, weight, 1e-6)
    for name, p, q in zip(("y", "h"), got, want):
        assert_bitwise_equal(p, q, f"T {t}, H {h}: {name}")


@pytest.mark.parametrize("recipe", ["bf16", "strict"])
def test_engine_with_and_without_the_pass_and_the_learner(recipe, monkeypatch):
    from fp4_compile.rl import RolloutEngine, sequence_logprobs

    rec = getattr(NVFP4Recipe, recipe)()
    prompts, budgets = [[3, 5, 7], [11, 2], [4, 4, 4, 9, 1], [8]], [6, 3, 5, 4]
    torch.manual_seed(0)
    learner = tiny_qwen3_moe(layers=2, dtype=BF16).to(DEVICE).eval()
    full = passes.PIPELINE
    outs = []
    for pipeline in (full, tuple(p for p in full if p is not fuse_combine_into_norms)):
        monkeypatch.setattr(passes, "PIPELINE", pipeline)
        torch._dynamo.reset()
        engine = RolloutEngine(copy.deepcopy(learner), recipe=rec, max_batch=2, max_seq_len=24)
        outs.append(engine.generate(prompts, max_new_tokens=budgets, seed=3, temperature=0.8))
    assert outs[0].tokens == outs[1].tokens
    for i, (x, y) in enumerate(zip(outs[0].logprobs, outs[1].logprobs)):
        assert_bitwise_equal(x, y, f"{recipe}: request {i}, with vs without the pass")
    monkeypatch.setattr(passes, "PIPELINE", full)
    torch._dynamo.reset()
    compiled = torch.compile(learner, backend="minite", options={"recipe": rec})
    seqs = [p + t for p, t in zip(prompts, outs[0].tokens)]
    with torch.enable_grad():  # the training forward: the two ops, not the fused one
        want = sequence_logprobs(compiled, seqs, [len(p) for p in prompts], temperature=0.8)
    for i, (x, y) in enumerate(zip(outs[0].logprobs, want)):
        assert_bitwise_equal(
            x, y.detach().to(x.device), f"{recipe}: request {i}, rollout vs learner"
        )
