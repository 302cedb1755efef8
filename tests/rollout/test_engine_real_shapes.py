"""The engine at real shapes, on the CPU (issue 52).

- The head only where it is read: every call of the output embedding (prefill and decode) sees
  one row per request of the bucket, never a prompt's every position.
- Long responses: a prompt of 3,000 tokens in an 8,256-slot cache, then decoding; the engine's
  log-probs equal the learner's (one forward over the whole sequence) bitwise. (An 8,000-token
  prompt peaks at ~22 GB on the CPU reference, past a CI machine; the GPU test runs 8 x 8,192 new
  tokens: tests/gpu/test_gpu_real_shapes.py.)
- A KV cache the device cannot hold is refused before any work, naming the shape and the bytes.
"""

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.models import tiny_qwen3
from fp4_compile.rl import RolloutEngine, sequence_logprobs
from fp4_compile.testing import assert_bitwise_equal


def test_head_runs_on_one_row_per_request():
    model = tiny_qwen3(vocab=128, layers=1).eval()
    engine = RolloutEngine(
        model, recipe=NVFP4Recipe.strict(), compile=False, max_batch=4, max_seq_len=64
    )
    rows = []
    hook = model.lm_head.register_forward_hook(lambda m, args, out: rows.append(args[0].shape))
    try:
        engine.generate([[1, 2, 3, 4, 5], list(range(3, 30)), [7]], max_new_tokens=4, seed=0)
    finally:
        hook.remove()
    # one prefill + 3 decode steps, each [bucket 4, 1 row, hidden]
    assert rows == [torch.Size([4, 1, 64])] * 4


def test_8k_slot_cache_long_context_engine_equals_learner():
    model = tiny_qwen3(vocab=256, layers=1).eval()
    recipe = NVFP4Recipe.strict()
    engine = RolloutEngine(model, recipe=recipe, max_batch=2, max_seq_len=8256)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (3000,), generator=g).tolist(), [5, 6, 7]]
    out = engine.generate(prompts, max_new_tokens=8, temperature=1.0, seed=3)
    learner = torch.compile(model, backend="minite", options={"recipe": recipe})
    with torch.no_grad():
        ref = sequence_logprobs(learner, [prompts[0] + out.tokens[0]], [3000])
    assert_bitwise_equal(out.logprobs[0], ref[0], "3k-token request in an 8k-slot cache")


def test_kv_cache_that_cannot_fit_is_refused_before_work(monkeypatch):
    model = tiny_qwen3(vocab=128, layers=2).eval()
    engine = RolloutEngine(
        model, recipe=NVFP4Recipe.strict(), compile=False, max_batch=8, max_seq_len=4096
    )
    # 2 (K, V) x 2 layers x batch 8 x 2 KV heads x 4096 slots x head_dim 32 x 4 bytes (FP32)
    assert engine.kv_cache_bytes(8) == 2 * 2 * 8 * 2 * 4096 * 32 * 4
    monkeypatch.setattr(engine, "device", torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2**20, 2**30))
    with pytest.raises(ValueError, match=r"batch 8 x max_seq_len 4096 .* needs 0\.03 GiB"):
        engine.generate([[1, 2]] * 8, max_new_tokens=2)
    assert not engine._caches  # nothing was allocated
