"""CUDA graphs on the GPU: the rollout engine's graph decode and the learner's graph step.

Bitwise: `RolloutEngine(..., cuda_graphs=True)` gives the same tokens and log-probs as the same
engine decoding without graphs (tiny Qwen3, tiny Qwen3-MoE, two Qwen3-30B-A3B-shaped layers;
strict and bf16; batch 64, 32 new tokens), with one capture per (batch bucket, sampling setting)
replayed across generate calls; greedy, top-k and top-p sampling inside the graph likewise; and
after `update_weights` the replayed graph decodes with the new weights (== a fresh plain engine
and the learner's log-probs). The learner compiled with `cuda_graphs: True` draws
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
from fp4_compile.rl import RolloutEngine, sequence_logprobs
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
    again = engine.generate(prompts, max_new_tokens=NEW_TOKENS, seed=11)
    assert engine.programs_built == 1, "one capture, replayed by the second call"
    engine.cuda_graphs = False
    plain = engine.generate(prompts, max_new_tokens=NEW_TOKENS, seed=11)
    _assert_same(graph, plain, "graph vs plain decode")
    _assert_same(again, plain, "second graph call vs plain decode")


def _assert_same(a, b, what):
    wrong = [i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y]
    assert not wrong, f"{what}: {len(wrong)} sequences sampled other tokens: {wrong[:16]}"
    differ = sum(count_bytes_differ(x, y) for x, y in zip(a.logprobs, b.logprobs))
    total = sum(int(t.numel()) for t in b.logprobs)
    assert differ == 0, f"{what}: {differ} of {total} log-probs differ bitwise"


@pytest.mark.parametrize(
    "sampling",
    [dict(temperature=0.0), dict(temperature=0.8, top_k=20), dict(temperature=1.0, top_p=0.9)],
    ids=["greedy", "top_k", "top_p"],
)
def test_sampling_inside_the_graph_equals_plain(sampling):
    torch._dynamo.reset()
    build, prompt = ENGINE_MODELS["tiny_qwen3_moe"]
    engine = RolloutEngine(
        build().eval(),
        recipe=NVFP4Recipe.strict(),
        max_batch=16,
        max_seq_len=prompt + 64,
        cuda_graphs=True,
    )
    prompts = [[1 + (i * 5 + j) % 127 for j in range(prompt - i % 7)] for i in range(11)]
    graph = engine.generate(prompts, max_new_tokens=NEW_TOKENS, seed=5, **sampling)
    engine.cuda_graphs = False
    plain = engine.generate(prompts, max_new_tokens=NEW_TOKENS, seed=5, **sampling)
    _assert_same(graph, plain, f"{sampling}: graph vs plain")


def test_replay_after_update_weights_uses_the_new_weights():
    """Strict, tiny Qwen3-MoE, an engine with its own copy of the weights, 6 requests in the
    batch bucket 8 (two padded rows): generate (capture), a fused in-place optimizer step on the
    learner, update_weights, generate again (a replay of the same capture) == a fresh engine
    without graphs on the learner, and == the learner's sequence log-probs, bitwise."""
    torch._dynamo.reset()
    recipe = NVFP4Recipe.strict()
    learner_model = tiny_qwen3_moe(layers=2).to(DEVICE).bfloat16()
    engine = RolloutEngine(
        copy.deepcopy(learner_model).eval(),
        recipe=recipe,
        max_batch=8,
        max_seq_len=64,
        cuda_graphs=True,
    )
    prompts = [[1 + (i * 3 + j) % 127 for j in range(5 + i)] for i in range(6)]  # 2 padded
    before = engine.generate(prompts, max_new_tokens=16, seed=2)
    params = [p for p in learner_model.parameters() if p.dim() >= 2]
    for p in params:
        p.grad = torch.randn_like(p)
    torch.optim.AdamW(params, lr=0.05, fused=True).step()
    engine.update_weights(learner_model)
    after = engine.generate(prompts, max_new_tokens=16, seed=2)
    assert engine.programs_built == 1, "the update must not need another capture"
    assert after.tokens != before.tokens, "the update must change the rollout (else no test)"
    fresh = RolloutEngine(learner_model.eval(), recipe=recipe, max_batch=8, max_seq_len=64)
    _assert_same(after, fresh.generate(prompts, max_new_tokens=16, seed=2), "replay vs fresh")
    learner = torch.compile(learner_model, backend="minite", options={"recipe": recipe})
    seqs = [p + t for p, t in zip(prompts, after.tokens)]
    with torch.no_grad():
        ref = sequence_logprobs(learner, seqs, [len(p) for p in prompts])
    for i, (a, b) in enumerate(zip(after.logprobs, ref)):
        assert_bitwise_equal(a, b.cpu(), f"request {i}: replay vs learner")


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
