"""CUDA graphs on the GPU: the rollout engine's graph decode and the learner's graph step.

Bitwise: `RolloutEngine(..., cuda_graphs=True)` gives the same tokens and log-probs as the same
engine decoding without graphs (tiny Qwen3, tiny Qwen3-MoE, two Qwen3-30B-A3B-shaped layers;
strict and bf16; batch 64, 32 new tokens). The learner compiled with `cuda_graphs: True` draws
fresh stochastic-rounding noise at every replay (two replays: same logits, different gradients),
and a replay's logits and gradients == the same step compiled without graphs from the same
stochastic-rounding state; restoring that state and replaying again repeats the gradients.
Wall times: `python -m benchmarks.rollout`, `python -m benchmarks.learner`.
"""

import copy

import gpu_internals as gi
import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.models import qwen3_30b_a3b_layers, tiny_qwen3, tiny_qwen3_moe
from fp4_compile.rl import RolloutEngine
from fp4_compile.testing import assert_bitwise_equal, count_bytes_differ

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
BATCH, NEW_TOKENS = 64, 32
# name -> (build, prompt length)
ENGINE_MODELS = {
    "tiny_qwen3": (lambda: tiny_qwen3(layers=2).to(DEVICE).bfloat16(), 24),
    "tiny_qwen3_moe": (lambda: tiny_qwen3_moe(layers=2).to(DEVICE).bfloat16(), 24),
    "30b_shaped_x2": (lambda: qwen3_30b_a3b_layers(layers=2, device=DEVICE), 64),
}
# name -> (build, ids shape, vocab of the ids)
LEARNER_MODELS = {
    "tiny_qwen3_moe": (lambda: tiny_qwen3_moe(layers=2).to(DEVICE).bfloat16(), (2, 64), 128),
    "30b_shaped_x2": (lambda: qwen3_30b_a3b_layers(layers=2, device=DEVICE), (4, 256), 8192),
}


@pytest.mark.parametrize("recipe_name", ["strict", "bf16"])
@pytest.mark.parametrize("model_name", list(ENGINE_MODELS))
def test_engine_graph_decode_equals_plain(model_name, recipe_name):
    """Bitwise: the engine's CUDA-graph decode == its plain decode, tokens and log-probs (same
    prompts of ragged lengths, same sampling seed)."""
    torch._dynamo.reset()
    build, prompt = ENGINE_MODELS[model_name]
    recipe = getattr(NVFP4Recipe, recipe_name)()
    engine = RolloutEngine(
        build().eval(), recipe=recipe, max_batch=BATCH, max_seq_len=prompt + 64, cuda_graphs=True
    )
    v = engine.vocab_size - 1
    prompts = [[1 + (i * 5 + j) % v for j in range(prompt - i % 7)] for i in range(BATCH)]
    graph = engine.generate(prompts, max_new_tokens=NEW_TOKENS, seed=11)
    engine.cuda_graphs = False
    plain = engine.generate(prompts, max_new_tokens=NEW_TOKENS, seed=11)
    wrong = [i for i, (a, b) in enumerate(zip(graph.tokens, plain.tokens)) if a != b]
    assert not wrong, f"{len(wrong)} of {BATCH} sequences sampled other tokens: {wrong[:16]}"
    differ = sum(count_bytes_differ(a, b) for a, b in zip(graph.logprobs, plain.logprobs))
    total = sum(int(t.numel()) for t in plain.logprobs)
    assert differ == 0, f"{differ} of {total} log-probs differ bitwise (graph vs plain decode)"


def _step(compiled, model, ids):
    """One forward+backward; logits and gradients cloned (a replay reuses the graph's memory)."""
    for p in model.parameters():
        p.grad = None
    logits = compiled(input_ids=ids, use_cache=False).logits
    logits.float().logsumexp(-1).mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach().clone(), grads


def _assert_grads_equal(a: dict, b: dict, what: str):
    assert a.keys() == b.keys(), f"{what}: gradient sets differ: {sorted(a.keys() ^ b.keys())}"
    differ = {n: c for n in a if (c := count_bytes_differ(a[n], b[n]))}
    assert not differ, f"{what}: {len(differ)} of {len(a)} gradients differ: {differ}"


@pytest.mark.parametrize("model_name", list(LEARNER_MODELS))
def test_learner_graph_step_equals_plain_step(model_name, monkeypatch):
    """Strict recipe, fixed weights, five graph steps (warm-up, record, replays). Bitwise: two
    replays give the same logits and different gradients (fresh SR noise); the last replay ==
    the step compiled without graphs (backward on the device seed path a capture takes) from
    the same SR state, logits and every gradient; replaying from that state again repeats the
    gradients."""
    build, shape, vocab = LEARNER_MODELS[model_name]
    recipe = NVFP4Recipe.strict()
    torch._dynamo.reset()
    gi.set_sr_state(None)
    model = build()
    plain_model = copy.deepcopy(model)
    ids = torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    graphs = torch.compile(model, backend="minite", options={"recipe": recipe, "cuda_graphs": True})
    runs, states = [], []
    for _ in range(5):
        states.append(gi.sr_state())
        runs.append(_step(graphs, model, ids))
    assert_bitwise_equal(runs[3][0], runs[4][0], "logits of two replays")
    fresh = sum(bool(count_bytes_differ(runs[3][1][n], runs[4][1][n])) for n in runs[4][1])
    assert fresh > 0, "two replays gave bitwise the same gradients: the SR noise was not redrawn"

    plain = torch.compile(plain_model, backend="minite", options={"recipe": recipe})
    monkeypatch.setattr(gi.nvfp4_linear_op, "capturing", lambda device: device.type == "cuda")
    gi.set_sr_state(states[4])
    logits, grads = _step(plain, plain_model, ids)
    monkeypatch.undo()
    assert_bitwise_equal(logits, runs[4][0], "logits, plain step vs replay")
    _assert_grads_equal(grads, runs[4][1], "plain step vs replay")

    gi.set_sr_state(states[4])
    _assert_grads_equal(_step(graphs, model, ids)[1], runs[4][1], "replay from a restored state")
