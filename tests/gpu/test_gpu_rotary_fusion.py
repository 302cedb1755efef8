"""The q / k norm pair with the rotary in it (`fp4_compile::invariant_rms_norm_pair_rotary`, the
Triton kernel) on the GPU against the CUDA ops it replaces, bitwise.

- == `invariant_rms_norm_pair` (its CUDA kernel) then transformers' `apply_rotary_pos_emb` run
  eagerly on CUDA, with the rotary embedding's `(t * scaling).to(bf16)` tables: Qwen3-8B's heads
  (32 q / 8 kv of 128) read in place from a fused q/k/v output, at decode (B 1, 64; T 1) and
  prefill (B 2, T 512) shapes, tables per sequence and shared (batch 1), scaling 1 and not;
- == the same unfused ops compiled by the `minite` backend WITHOUT the fusion pass (Inductor's
  rotary kernels under minite's pins, `emulate_precision_casts`: the learner's side);
- the engine: tiny Qwen3 in bf16, strict and bf16 recipes, with vs without the pass: same
  tokens and log-probs (raw bytes), and the learner's log-probs bit for bit.
"""

import copy

import pytest
import torch
from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

import fp4_compile.passes as passes
from fp4_compile import NVFP4Recipe
from fp4_compile.models import tiny_qwen3
from fp4_compile.passes.fuse_rotary_into_norm_pairs import fuse_rotary_into_norm_pairs
from fp4_compile.testing import assert_bitwise_equal

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
ops = torch.ops.fp4_compile
BF16 = torch.bfloat16


def _inputs(b, t, *, hq=32, hk=8, d=128, one_batch=False, seed=0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    qkv = torch.randn(b, t, (hq + 2 * hk) * d, generator=g, device=DEVICE) * 3
    qkv = (qkv * torch.logspace(-2, 2, hq + 2 * hk, device=DEVICE).repeat_interleave(d)).to(BF16)
    q = qkv[..., : hq * d].view(b, t, hq, d)
    k = qkv[..., hq * d : (hq + hk) * d].view(b, t, hk, d)
    wq, wk = (1.0 + 0.3 * torch.randn(2, d, generator=g, device=DEVICE)).to(BF16)
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, d, 2, dtype=torch.float32, device=DEVICE) / d))
    pos = torch.randint(0, 32768, (1 if one_batch else b, t), generator=g, device=DEVICE)
    emb = torch.cat([pos.float()[..., None] * inv_freq] * 2, dim=-1)
    return q, wq, k, wk, ops.cos(emb), ops.sin(emb)


def _unfused(q, wq, k, wk, cos, sin, scaling: float):
    yq, yk = ops.invariant_rms_norm_pair(q, wq, k, wk, 1e-6)
    c, s = (cos * scaling).to(q.dtype), (sin * scaling).to(q.dtype)
    return apply_rotary_pos_emb(yq.transpose(1, 2), yk.transpose(1, 2), c, s)


SHAPES = [(1, 1, False), (64, 1, False), (2, 512, False), (4, 16, True)]


@pytest.mark.parametrize(("b", "t", "one_batch"), SHAPES)
@pytest.mark.parametrize("scaling", [1.0, 0.7])
def test_fused_equals_norm_pair_then_eager_rotary(b, t, one_batch, scaling):
    args = _inputs(b, t, one_batch=one_batch, seed=b * 1000 + t)
    got = ops.invariant_rms_norm_pair_rotary(*args, scaling)
    want = _unfused(*args, scaling)
    for x, y, what in zip(got, want, ("q_embed", "k_embed")):
        assert x.is_contiguous() and x.shape == y.shape
        assert_bitwise_equal(x, y, f"{what} (B {b}, T {t}, scaling {scaling})")


@pytest.mark.parametrize(("b", "t", "one_batch"), SHAPES)
def test_fused_equals_inductor_unfused(b, t, one_batch, monkeypatch):
    """The learner's side: the unfused ops through the minite backend with the pass dropped."""
    full = passes.PIPELINE
    monkeypatch.setattr(
        passes, "PIPELINE", tuple(p for p in full if p is not fuse_rotary_into_norm_pairs)
    )
    torch._dynamo.reset()
    compiled = torch.compile(
        _unfused, backend="minite", fullgraph=True, options={"recipe": NVFP4Recipe.strict()}
    )
    args = _inputs(b, t, one_batch=one_batch, seed=b + t)
    with torch.no_grad():
        want = compiled(*args, 1.0)
    got = ops.invariant_rms_norm_pair_rotary(*args, 1.0)
    for x, y, what in zip(got, want, ("q_embed", "k_embed")):
        assert_bitwise_equal(x, y, f"{what} vs Inductor's rotary (B {b}, T {t})")


@pytest.mark.parametrize("recipe", ["strict", "bf16"])
def test_engine_with_and_without_the_pass_and_the_learner(recipe, monkeypatch):
    from fp4_compile.rl import RolloutEngine, sequence_logprobs

    rec = getattr(NVFP4Recipe, recipe)()
    prompts, budgets = [[3, 5, 7], [11, 2], [4, 4, 4, 9, 1], [8]], [6, 3, 5, 4]
    torch.manual_seed(0)
    learner = tiny_qwen3(layers=2, dtype=BF16).to(DEVICE).eval()
    full = passes.PIPELINE
    outs = []
    for pipeline in (full, tuple(p for p in full if p is not fuse_rotary_into_norm_pairs)):
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
    with torch.no_grad():
        want = sequence_logprobs(compiled, seqs, [len(p) for p in prompts], temperature=0.8)
    for i, (x, y) in enumerate(zip(outs[0].logprobs, want)):
        assert_bitwise_equal(x, y.to(x.device), f"{recipe}: request {i}, rollout vs learner")
