"""Continuous batching on the GPU (issue 54): the engine's CUDA-graph decode program with per-row
state, refilled mid-flight.

Bitwise: more requests than max_batch (ragged prompts, their own max_new_tokens, an EOS id that
ends several of them at varied steps) through one `generate` call with `cuda_graphs=True` (each
admission an in-place copy into the captured program's buffers, its prefill a batch-1 step into
a slot view of the bucket's cache) give every request the tokens and log-probs it has alone and
the same call's without graphs; one capture per bucket serves every refill. The CPU twin:
tests/rollout/test_continuous_batching.py.
"""

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.models import tiny_qwen3, tiny_qwen3_moe
from fp4_compile.rl import RolloutEngine
from fp4_compile.testing import assert_bitwise_equal

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
MODELS = {
    "tiny_qwen3": lambda: tiny_qwen3(layers=2).to(DEVICE).bfloat16(),
    "tiny_qwen3_moe": lambda: tiny_qwen3_moe(layers=2).to(DEVICE).bfloat16(),
}
NUM = 13


def _requests():
    g = torch.Generator().manual_seed(5)
    lengths = torch.randint(1, 24, (NUM,), generator=g).tolist()
    prompts = [torch.randint(0, 128, (n,), generator=g).tolist() for n in lengths]
    budgets = torch.randint(1, 40, (NUM,), generator=g).tolist()
    return prompts, budgets, [300 + 11 * i for i in range(NUM)]


@pytest.mark.parametrize("recipe_name", ["strict", "bf16"])
@pytest.mark.parametrize("model_name", list(MODELS))
def test_graph_continuous_batching_equals_each_alone_and_plain(model_name, recipe_name):
    torch._dynamo.reset()
    recipe = getattr(NVFP4Recipe, recipe_name)()
    engine = RolloutEngine(
        MODELS[model_name]().eval(), recipe=recipe, max_batch=4, max_seq_len=64, cuda_graphs=True
    )
    prompts, budgets, seeds = _requests()
    kw = dict(max_new_tokens=budgets, seed=seeds, temperature=0.8)
    free = engine.generate(prompts, **kw)
    counts = torch.zeros(128, dtype=torch.long)
    for row in free.tokens:
        counts[sorted(set(row))] += 1
    eos = int(torch.argmax(counts))  # the token the most requests draw: ends several of them
    out = engine.generate(prompts, eos_token_id=eos, **kw)
    assert "eos" in out.finish_reasons
    built = engine.programs_built
    for i in range(NUM):
        alone = engine.generate(
            [prompts[i]],
            max_new_tokens=budgets[i],
            seed=[seeds[i]],
            temperature=0.8,
            eos_token_id=eos,
        )
        assert out.tokens[i] == alone.tokens[0], i
        assert out.finish_reasons[i] == alone.finish_reasons[0], i
        assert_bitwise_equal(out.logprobs[i], alone.logprobs[0], f"request {i} vs alone")
    assert engine.programs_built == built + 1, "alone: the bucket-1 program, captured once"
    engine.cuda_graphs = False
    plain = engine.generate(prompts, eos_token_id=eos, **kw)
    assert plain.tokens == out.tokens
    for i in range(NUM):
        assert_bitwise_equal(out.logprobs[i], plain.logprobs[i], f"request {i}: graph vs plain")
