"""Real shapes on the GPU (issue 52): full vocabulary (151,936), learner micro-batches past 2**31
logits elements, engine prefills of 131k tokens and 8k-token responses; strict recipe.

Contracts: no illegal memory access (int64 offsets, `codegen/runtime.py`); the learner's head runs
in row chunks (`rollout/learner_head.py`), so its peak memory stays far below [tokens x vocab]
FP32 logits; the engine computes the head on one row per request; learner == rollout log-probs
bitwise on a ragged subset (including 8k-token sequences). Peak memory and wall time of each case
go to $MINITE_GPU_REPORT (a JSON file) when set: `benchmarks/gpu_session.sh` part real_shapes.
Models: `fp4_compile.models.real_shape_model`, LAYERS decoder layers, BF16, random init.
"""

import json
import os
import time

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.models import real_shape_model, real_shape_note
from fp4_compile.rl import RolloutEngine, sequence_logprobs
from fp4_compile.testing import count_bytes_differ

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
LAYERS = 2
VOCAB = 151936
REPORT: dict = {}


def _record(case: str, **fields) -> None:
    fields["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    REPORT[case] = fields
    path = os.environ.get("MINITE_GPU_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(REPORT, f, indent=1)
    print(case, fields)


def _sequences(num, length, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (length,), generator=g).tolist() for _ in range(num)]


@pytest.fixture(scope="module")
def dense():
    torch._dynamo.reset()
    model = real_shape_model("qwen3-8b", layers=LAYERS, device=DEVICE)
    REPORT["models"] = {"dense": real_shape_note("qwen3-8b", layers=LAYERS)}
    yield model
    del model
    torch.cuda.empty_cache()


@pytest.mark.parametrize("shape", [(8, 2048), (4, 8192)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_learner_forward_backward_full_vocab(dense, shape):
    """8 x 2048 and 4 x 8192 tokens (16,384 / 32,768 rows x 151,936: 2.5e9 / 5e9 logits, past
    2**31): log-probs of every token and the backward run; the peak above the weights stays
    below what FP32 logits would add on top of the gradients (H100: 9.7 / 14.3 GiB against
    9.3 / 18.5 GiB of FP32 logits, benchmarks/results/2026-12-07_real_shapes_9f55dc9.json)."""
    num, length = shape
    learner = torch.compile(dense, backend="minite", options={"recipe": NVFP4Recipe.strict()})
    seqs = _sequences(num, length, VOCAB, seed=num)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    logp = sequence_logprobs(learner, seqs, [1] * num, temperature=1.0)
    torch.cat(logp).mean().backward()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    dense.zero_grad(set_to_none=True)
    logits_gib = num * length * VOCAB * 4 / 2**30
    assert all(torch.isfinite(x).all() for x in logp)
    above_weights = (torch.cuda.max_memory_allocated() - base) / 2**30
    _record(
        f"learner_{num}x{length}",
        seconds_with_compile=round(seconds, 1),
        fp32_logits_gib=round(logits_gib, 1),
        peak_above_weights_gib=round(above_weights, 2),
    )
    # above the weights: their gradients, the head's FP32 gradient accumulator, the activations
    # and one head chunk; the [tokens x vocab] FP32 logits would come on top of all of them
    grads_gib = sum(p.numel() * p.element_size() for p in dense.parameters()) / 2**30
    head_acc_gib = dense.lm_head.weight.numel() * 4 / 2**30
    assert above_weights < logits_gib + grads_gib + head_acc_gib
    if num * length >= 32768:  # from 32k tokens on, below the FP32 logits alone
        assert above_weights < logits_gib


def test_engine_prefill_64x2048_then_256_new_tokens(dense):
    """Batch 64 of ragged 1024-2048-token prompts (up to 131k prefill rows; the head runs on 64),
    256 new tokens; learner == rollout bitwise on 4 of them."""
    recipe = NVFP4Recipe.strict()
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1024, 2049, (64,), generator=g).tolist()
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]
    engine = RolloutEngine(
        dense, recipe=recipe, device=DEVICE, max_batch=64, max_seq_len=2048 + 256, cuda_graphs=True
    )
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    out = engine.generate(prompts, max_new_tokens=256, temperature=1.0, seed=0)
    torch.cuda.synchronize()
    _record("engine_64x2048_256new", seconds_with_compile=round(time.perf_counter() - t0, 1))
    assert all(len(t) == 256 for t in out.tokens)
    learner = torch.compile(dense, backend="minite", options={"recipe": recipe})
    pick = [0, 17, 40, 63]
    seqs = [prompts[i] + out.tokens[i] for i in pick]
    with torch.no_grad():
        ref = sequence_logprobs(learner, seqs, [len(prompts[i]) for i in pick])
    diffs = {i: count_bytes_differ(out.logprobs[i], r.cpu()) for i, r in zip(pick, ref)}
    assert not any(diffs.values()), f"bytes differing per request: {diffs}"
    del engine


def test_engine_8192_new_tokens(dense):
    """Batch 8, 8192 new tokens each (an 8k-slot cache); learner == rollout bitwise on 2 of the
    8k-token sequences (the learner at 8k-token sequences)."""
    recipe = NVFP4Recipe.strict()
    prompts = _sequences(8, 64, VOCAB, seed=3)
    engine = RolloutEngine(
        dense, recipe=recipe, device=DEVICE, max_batch=8, max_seq_len=64 + 8192, cuda_graphs=True
    )
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    out = engine.generate(prompts, max_new_tokens=8192, temperature=1.0, seed=7)
    torch.cuda.synchronize()
    _record("engine_8x8192new", seconds_with_compile=round(time.perf_counter() - t0, 1))
    assert all(len(t) == 8192 for t in out.tokens)
    learner = torch.compile(dense, backend="minite", options={"recipe": recipe})
    pick = [1, 6]
    with torch.no_grad():
        ref = sequence_logprobs(learner, [prompts[i] + out.tokens[i] for i in pick], [64, 64])
    diffs = {i: count_bytes_differ(out.logprobs[i], r.cpu()) for i, r in zip(pick, ref)}
    assert not any(diffs.values()), f"bytes differing per request: {diffs}"
    del engine


def test_moe_learner_8x2048_full_vocab():
    """The Qwen3-30B-A3B-shaped (MoE) learner at 8 x 2048 tokens, full vocabulary."""
    torch._dynamo.reset()
    model = real_shape_model("qwen3-30b-a3b", layers=LAYERS, device=DEVICE)
    REPORT.setdefault("models", {})["moe"] = real_shape_note("qwen3-30b-a3b", layers=LAYERS)
    learner = torch.compile(model, backend="minite", options={"recipe": NVFP4Recipe.strict()})
    seqs = _sequences(8, 2048, VOCAB, seed=11)
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    logp = sequence_logprobs(learner, seqs, [1] * 8)
    torch.cat(logp).mean().backward()
    torch.cuda.synchronize()
    _record("moe_learner_8x2048", seconds_with_compile=round(time.perf_counter() - t0, 1))
    assert all(torch.isfinite(x).all() for x in logp)
