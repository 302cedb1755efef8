"""The strict recipe's MoE combine in the next input norm's launch
(`fp4_compile::moe_combine_add_rms_norm_parts`, `combine_add_rms_norm_kernel`'s parts form) on
the GPU against the CUDA ops it replaces, bitwise.

- == `moe_combine` (its CUDA kernel) then `rms_norm_quantize_parts` (at a decode its
  `rms_norm_amax` launch; else the composition itself), y, the row maxima and h:
  Qwen3-30B-A3B's shapes (hidden 2048, top-8) at decode (T 1, 64) and prefill (T 512) sizes, a
  norm weight and none, the combine as either addend, repeated and negative indices; hidden 64
  (several rows per program); and the decode GEMM reading the fused op's outputs ==
  reading the two ops' (`nvfp4_linear_parts`, its prologue);
- the engine: tiny Qwen3-MoE in bf16, strict, with vs without the pass: same tokens and
  log-probs (raw bytes), the pass fired, and the learner's log-probs bit for bit.
"""

import copy

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile import reference as ref
from fp4_compile.models import tiny_qwen3_moe
from fp4_compile.testing import assert_bitwise_equal

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
ops = torch.ops.fp4_compile
BF16 = torch.bfloat16
KEY = NVFP4Recipe.strict().numerics_key


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
def test_fused_equals_combine_then_norm_parts(t, h, k, permutation, has_weight, combine_first):
    residual, x, w, idx, k, weight = _case(t, h, k, permutation=permutation)
    weight = weight if has_weight else None
    got = ops.moe_combine_add_rms_norm_parts(residual, x, w, idx, k, weight, 1e-6, KEY)
    c = ops.moe_combine(x, w, idx, k).view(residual.shape)
    a, b = (c, residual) if combine_first else (residual, c)
    want = ops.rms_norm_quantize_parts(a, b, weight, 1e-6, KEY)
    for i, name in ((0, "y"), (3, "row maxima"), (4, "h")):
        assert_bitwise_equal(got[i], want[i], f"T {t}, H {h}: {name}")
    wq = ref.quantize(torch.randn(256, h, device=DEVICE), block="16x16")
    weights = (wq.codes, wq.block_scales.view(torch.uint8), wq.global_decode, None, None)
    gemm = [ops.nvfp4_linear_parts(o[0], o[1], o[2], o[3], *weights) for o in (got, want)]
    assert_bitwise_equal(gemm[0], gemm[1], f"T {t}, H {h}: the GEMM reading them")


def test_engine_with_and_without_the_pass_and_the_learner(monkeypatch):
    from fp4_compile.rl import RolloutEngine, sequence_logprobs
    from fp4_compile.rollout import store_binding

    rec = NVFP4Recipe.strict()
    prompts, budgets = [[3, 5, 7], [11, 2], [4, 4, 4, 9, 1], [8]], [6, 3, 5, 4]
    torch.manual_seed(0)
    learner = tiny_qwen3_moe(layers=2, dtype=BF16).to(DEVICE).eval()
    fuse_parts = store_binding.fuse_combine_into_norm_parts
    outs, fired = [], []
    for fuse in (True, False):
        monkeypatch.setattr(
            store_binding,
            "fuse_combine_into_norm_parts",
            lambda g, r=None, f=fuse: fired.append(fuse_parts(g, r) if f else 0) or fired[-1],
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
    with torch.enable_grad():  # the training forward: the two ops, not the fused one
        want = sequence_logprobs(compiled, seqs, [len(p) for p in prompts], temperature=0.8)
    for i, (x, y) in enumerate(zip(outs[0].logprobs, want)):
        assert_bitwise_equal(x, y.detach().to(x.device), f"request {i}, rollout vs learner")
