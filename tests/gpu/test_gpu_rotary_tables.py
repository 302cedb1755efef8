"""The rotary tables on the GPU: `fp4_compile::rotary_tables` (one compiled Triton launch:
FP32 angles of positions, libdevice's cosf / sinf) against what it replaced (the angles, then
ATen's CUDA cos / sin through `fp4_compile::cos` / `sin`).

Bitwise:
- the tables == ATen's CUDA cos / sin of the graph's angles, EVERY position 0..131,071 at
  Qwen3's inverse frequencies (theta 1e6, head dim 128; FP32 and a BF16 buffer, a model cast
  whole) and Llama's (theta 5e5 and 1e4): the whole domain a rollout reaches up to 128k tokens
  (libdevice's `__nv_cosf` / `__nv_sinf` are the CUDA math library's cosf / sinf, which ATen's
  kernels call; this test is what makes that a fact here);
- the CUDA engine generates the same tokens and log-prob bytes with the pass as without it
  (strict, bf16), and equals the learner's log-probs from a graph compiled with grad mode on
  (which keeps ATen's cos / sin: the learner's training forward).
"""

import copy

import pytest
import torch

import fp4_compile.passes as passes
from fp4_compile import NVFP4Recipe
from fp4_compile.models import tiny_qwen3
from fp4_compile.passes.fuse_rotary_tables import fuse_rotary_tables
from fp4_compile.rl import RolloutEngine, sequence_logprobs
from fp4_compile.testing import assert_bitwise_equal

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
POSITIONS = 131072


def _inv_freq(theta, dim=128, dtype=torch.float32):
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    return inv.to(dtype).to(DEVICE)


@pytest.mark.parametrize(
    "theta, dtype",
    [(1e6, torch.float32), (1e6, torch.bfloat16), (5e5, torch.float32), (1e4, torch.float32)],
)
def test_tables_equal_atens_cuda_cos_sin_at_every_position(theta, dtype):
    inv_freq = _inv_freq(theta, dtype=dtype)
    positions = torch.arange(POSITIONS, device=DEVICE)[None]
    cos, sin = torch.ops.fp4_compile.rotary_tables(positions, inv_freq)
    angles = positions[..., None].float() * inv_freq.float()
    emb = torch.cat((angles, angles), dim=-1)
    assert_bitwise_equal(cos, torch.ops.fp4_compile.cos(emb), f"theta {theta} {dtype}: cos")
    assert_bitwise_equal(sin, torch.ops.fp4_compile.sin(emb), f"theta {theta} {dtype}: sin")


@pytest.mark.parametrize("recipe", ["strict", "bf16"])
def test_engine_with_and_without_the_pass_and_the_training_graph(recipe, monkeypatch):
    rec = getattr(NVFP4Recipe, recipe)()
    prompts, budgets = [[3, 5, 7], [11, 2], [4, 4, 4, 9, 1], [8]], [6, 3, 5, 4]
    torch.manual_seed(0)
    learner = tiny_qwen3(layers=2, dtype=torch.bfloat16).to(DEVICE).eval()
    full = passes.PIPELINE
    outs = []
    for pipeline in (full, tuple(p for p in full if p is not fuse_rotary_tables)):
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
    with torch.enable_grad():  # the training forward's graph: ATen's cos / sin
        want = sequence_logprobs(compiled, seqs, [len(p) for p in prompts], temperature=0.8)
    for i, (x, y) in enumerate(zip(outs[0].logprobs, want)):
        assert_bitwise_equal(x, y.detach().cpu(), f"{recipe}: request {i}, rollout vs learner")
