"""Learner == rollout on the GPU, strict recipe, two Qwen3-30B-A3B-shaped decoder layers (random
init, vocab 8192).

Bitwise: the log-prob the rollout engine recorded for every sampled token (prefill, then decode
through the static KV cache, batches 1 / 8 / 64; 256 marked slow; prompts of 4-63 tokens, 32 new
tokens) == the learner's log-prob of that token from one compiled forward over the whole
sequence. And, teacher-forced on fixed sequences (the pass/fail part of
`tools.localize_gpu`), every hidden state and the logits agree between the four views
learner batched / learner alone / rollout batched / rollout alone, for the MoE model and a dense
Qwen3 of the same width. te's gap is a measurement, not a contract, and is not tested here.
"""

import gpu_internals as gi
import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.models import qwen3_30b_a3b_layers
from fp4_compile.rl import RolloutEngine, sequence_logprobs
from fp4_compile.testing import count_bytes_differ

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
LAYERS, NEW_TOKENS, MAX_SEQ_LEN = 2, 32, 128


def _build(dense=False):
    return qwen3_30b_a3b_layers(layers=LAYERS, device=DEVICE, dense=dense).eval()


def _prompts(batch, vocab):
    g = torch.Generator().manual_seed(batch)
    return [
        torch.randint(0, vocab, (int(n),), generator=g).tolist()
        for n in torch.randint(4, 64, (batch,), generator=g)
    ]


@pytest.fixture(scope="module")
def strict_pair():
    """One model, its rollout engine and its compiled learner, strict recipe."""
    torch._dynamo.reset()
    recipe = NVFP4Recipe.strict()
    model = _build()
    engine = RolloutEngine(model, recipe=recipe, max_batch=256, max_seq_len=MAX_SEQ_LEN)
    learner = torch.compile(model, backend="minite", options={"recipe": recipe})
    yield model, engine, learner
    del model, engine, learner
    torch.cuda.empty_cache()


@pytest.mark.parametrize(
    "batch", [1, 8, 64, pytest.param(256, marks=pytest.mark.slow)], ids=lambda b: f"batch{b}"
)
def test_engine_logprobs_equal_learner(strict_pair, batch):
    """Bitwise: the engine's per-token log-probs (sampled, temperature 1) == the learner's
    sequence log-probs of the same tokens."""
    model, engine, learner = strict_pair
    prompts = _prompts(batch, model.config.vocab_size)
    out = engine.generate(prompts, max_new_tokens=NEW_TOKENS, temperature=1.0, seed=0)
    with torch.no_grad():
        train = sequence_logprobs(
            learner,
            [p + t for p, t in zip(prompts, out.tokens)],
            [len(p) for p in prompts],
            temperature=1.0,
        )
    assert len(train) == len(out.logprobs) == batch
    for i, (a, b) in enumerate(zip(train, out.logprobs)):
        assert a.shape == b.shape, f"sequence {i}: {a.shape[0]} vs {b.shape[0]} log-probs"
    counts = [count_bytes_differ(a.cpu(), b.cpu()) for a, b in zip(train, out.logprobs)]
    differ = {i: n for i, n in enumerate(counts) if n}
    total = sum(int(t.numel()) for t in out.logprobs)
    assert not differ, (
        f"{sum(differ.values())} of {total} sampled tokens' log-probs differ bitwise between the "
        f"engine and the learner; per sequence: {differ}"
    )


@pytest.mark.parametrize("dense", [False, True], ids=["moe", "dense"])
def test_teacher_forced_views_agree(dense):
    """Bitwise: on the same teacher-forced sequences (batch 8, prompts 4-63 tokens, 16 tokens
    after each), every layer's hidden states and the logits agree between learner batched,
    learner alone, rollout batched (prefill + decode through the KV cache) and rollout alone."""
    torch._dynamo.reset()
    recipe = NVFP4Recipe.strict()
    model = _build(dense)
    g = torch.Generator().manual_seed(8)
    plens = [int(n) for n in torch.randint(4, 64, (8,), generator=g)]
    vocab = model.config.vocab_size
    seqs = [torch.randint(0, vocab, (p + 16,), generator=g).tolist() for p in plens]
    opts = {"options": {"recipe": recipe}}
    learner = torch.compile(model, backend="minite", **opts)
    step = torch.compile(gi.RolloutStep(model, return_hidden=True), backend="minite", **opts)
    with torch.no_grad():
        views = {
            "learner batched": gi.learner_hidden_states(learner, seqs, device=DEVICE),
            "learner alone": [
                gi.learner_hidden_states(learner, [s], device=DEVICE)[0] for s in seqs
            ],
            "rollout batched": gi.rollout_hidden_states(step, model, seqs, plens, device=DEVICE),
            "rollout alone": [
                gi.rollout_hidden_states(step, model, [s], [p], device=DEVICE)[0]
                for s, p in zip(seqs, plens)
            ],
        }
    failures = []
    for left, right in (
        ("learner batched", "learner alone"),
        ("rollout batched", "rollout alone"),
        ("rollout alone", "learner alone"),
        ("rollout batched", "learner batched"),
    ):
        loc = gi.compare_states(views[left], views[right])
        if loc.first_divergent is not None:
            gap = next(x for x in loc.layers if x.name == loc.first_divergent)
            logits = loc.layers[-1]
            failures.append(
                f"{left} vs {right}: first divergent {gap.name} at position {gap.first_position} "
                f"({gap.num_differing} of {gap.num_elements} values); logits "
                f"{logits.num_differing} of {logits.num_elements} differ"
            )
    assert not failures, "; ".join(failures)
