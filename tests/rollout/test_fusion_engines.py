"""The rollout engine's inference-graph fusions against the same engine without them, one case
per (model, master dtype, recipe) they fire in; each case builds ONE engine with the full
PIPELINE (the fusions on) and ONE with that case's fusions all off, and shares one learner:

- the MoE top-k combine folded into the residual add + RMSNorm after it
  (`passes/fuse_combine_into_norms.py`: bf16 graphs; one per layer under the bf16 recipe, one
  under strict, the last layer's into the final norm, the others quantize);
- routing + expert_order as one `routing_order` (`passes/fold_routing_order.py`; the FP32
  model's `.to(float32)` clone of the routing weights too);
- the rotary fused into the q / k norm pair (`passes/fuse_rotary_into_norm_pairs.py`: bf16
  graphs; CPU, the op's reference against Inductor's rotary kernels);
- the bf16 MoE experts' token gather read by the grouped GEMM's operand load
  (`passes/fold_expert_gathers.py`, `_fold_bf16`);
- the bf16 recipe's q/k/v and gate/up as ONE `invariant_linear` each over the group's BF16
  buffer, the members' parameters views of it (`WeightStore.make_linear_groups`,
  `rollout/bf16_groups.py`, `passes/fuse_group_linears.py`; FP32 masters, whose weights the
  graph casts, and BF16 masters, read as they are).

Tier: bitwise. Continuously batched (more requests than max_batch): the same tokens and
log-probs (raw bytes) with the fusions as without; with the bf16 recipe also after
`update_weights` with changed learner weights (copied into the parameters, so into the group
buffers). The log-probs equal the learner's sequence log-probs, in a training (grad-enabled)
forward whose graphs keep the unfused ops (none of these fusions fires there) and in a no-grad
forward. Counts: each fusion fires the stated number of times in every engine graph (prefill
and decode), none with it off. Each fusion alone: tests/passes/ and tests/codegen/.
"""

import copy
import importlib

import pytest
import torch

from fp4_compile import NVFP4Recipe, passes
from fp4_compile.models import tiny_qwen3, tiny_qwen3_moe
from fp4_compile.passes.fold_routing_order import fold_routing_order
from fp4_compile.passes.fuse_combine_into_norms import fuse_combine_into_norms
from fp4_compile.passes.fuse_rotary_into_norm_pairs import fuse_rotary_into_norm_pairs
from fp4_compile.rl import RolloutEngine, sequence_logprobs
from fp4_compile.testing import assert_bitwise_equal

LAYERS = 2
PROMPTS = [[3, 5, 7], [11, 2], [4, 4, 4, 9, 1], [8], [1, 2, 3, 4]]
BUDGETS = [6, 2, 5, 4, 3]
TEMPERATURE = 0.8
# the pass's module (the package names the pass function alike)
gathers = importlib.import_module("fp4_compile.passes.fold_expert_gathers")
# fusion -> (its pass in PIPELINE, the report's count)
PASSES = {
    "combine": (fuse_combine_into_norms, "combine_fused_into_norm"),
    "routing": (fold_routing_order, "routing_order_folded"),
    "rotary": (fuse_rotary_into_norm_pairs, "rotary_fused_into_norms"),
    "gather": (gathers.fold_expert_gathers, "expert_gather_folded"),
}
# case: (model, master dtype, recipe, {fusion: count per engine graph}, learner forwards)
# "groups": fused linear groups per layer in each graph (q/k/v and gate/up; MoE: q/k/v only)
CASES = {
    "moe-fp32-strict": ("moe", torch.float32, "strict", {"routing": LAYERS}, ("grad",)),
    "moe-bf16-strict": (
        "moe",
        torch.bfloat16,
        "strict",
        {"combine": 1, "routing": LAYERS, "rotary": LAYERS},
        ("grad",),
    ),
    "moe-bf16-bf16": (
        "moe",
        torch.bfloat16,
        "bf16",
        {"combine": LAYERS, "routing": LAYERS, "rotary": LAYERS, "gather": LAYERS, "groups": 1},
        ("grad", "no_grad"),
    ),
    "dense-bf16-bf16": (
        "dense",
        torch.bfloat16,
        "bf16",
        {"rotary": LAYERS, "groups": 2},
        ("no_grad", "no_grad"),
    ),
    "dense-fp32-bf16": (
        "dense",
        torch.float32,
        "bf16",
        {"rotary": 0, "groups": 2},
        ("no_grad", "no_grad"),
    ),
}


def _recording(pipeline, off, counts):
    """`pipeline` without the passes of `off`, the others recording their count per graph."""

    def graph(gm, recipe, report):
        counts.setdefault("graphs", []).append(1)

    steps = [graph]
    for p in pipeline:
        fusion = next((f for f, (q, _) in PASSES.items() if q is p), None)
        if fusion in off:
            continue
        if fusion is not None:

            def step(gm, recipe, report, p=p, fusion=fusion):
                p(gm, recipe, report)
                counts.setdefault(fusion, []).append(report.counts.get(PASSES[fusion][1], 0))

            steps.append(step)
        else:
            steps.append(p)
    return tuple(steps)


def _generate(engine, monkeypatch, off, counts):
    """Generate with the fusions of `off` left out of every graph the engine compiles."""
    pipeline = passes.PIPELINE
    with monkeypatch.context() as m:
        m.setattr(passes, "PIPELINE", _recording(pipeline, off, counts))
        return engine.generate(PROMPTS, max_new_tokens=BUDGETS, seed=3, temperature=TEMPERATURE)


def _assert_same(a, b, what):
    assert a.tokens == b.tokens, what
    for i, (x, y) in enumerate(zip(a.logprobs, b.logprobs)):
        assert len(x) == BUDGETS[i], what
        assert_bitwise_equal(x, y, f"{what}: request {i}")


def _assert_learner_equal(model, recipe, out, forward, monkeypatch, what):
    counts: dict[str, list[int]] = {}
    with monkeypatch.context() as m:
        m.setattr(passes, "PIPELINE", _recording(passes.PIPELINE, (), counts))
        learner = torch.compile(model, backend="minite", options={"recipe": recipe})
        seqs = [p + t for p, t in zip(PROMPTS, out.tokens)]
        with torch.set_grad_enabled(forward == "grad"):  # grad: the training forward
            ref = sequence_logprobs(
                learner, seqs, [len(p) for p in PROMPTS], temperature=TEMPERATURE
            )
    if forward == "grad":  # its graphs ran the passes, which kept the unfused ops
        for fusion in ("combine", "routing", "rotary"):
            assert counts.get(fusion) and set(counts[fusion]) == {0}, (what, fusion, counts)
    for i, (a, b) in enumerate(zip(out.logprobs, ref)):
        assert_bitwise_equal(a, b.detach().cpu(), f"{what}: request {i}, rollout vs learner")


def _step(model):
    """An in-place AdamW step changing every matrix."""
    params = [p for p in model.parameters() if p.dim() >= 2]
    for p in params:
        p.grad = torch.randn_like(p)
    torch.optim.AdamW(params, lr=0.05).step()
    for p in params:
        p.grad = None


@pytest.mark.parametrize("case", list(CASES))
def test_fused_engine_is_bitwise_the_unfused_one_and_the_learner(case, monkeypatch):
    kind, dtype, recipe, want, forwards = CASES[case]
    rec = getattr(NVFP4Recipe, recipe)()
    torch.manual_seed(0)
    make = tiny_qwen3_moe if kind == "moe" else tiny_qwen3
    learner = make(layers=LAYERS, dtype=dtype).eval()
    off = tuple(f for f in want if f != "groups")
    torch._dynamo.reset()
    fused = RolloutEngine(copy.deepcopy(learner), recipe=rec, max_batch=2, max_seq_len=24)
    plain = RolloutEngine(copy.deepcopy(learner), recipe=rec, max_batch=2, max_seq_len=24)
    if "groups" in want:
        plain.weight_store.fuse_groups = False
        store = fused.weight_store
        assert store.fuse_groups, "the engine's store fuses by default"
        assert len(store.linear_groups) == (5 if kind == "dense" else 3) * LAYERS, store
        for name, g in store.linear_groups.items():  # held once: the parameter is the buffer's
            p = store.params[name]
            assert p.untyped_storage().data_ptr() == g.buffer.untyped_storage().data_ptr(), name
            assert torch.equal(p, g.buffer[g.start : g.start + g.rows]), name
    counts: dict[str, list[int]] = {}
    plain_counts: dict[str, list[int]] = {}
    before = _generate(fused, monkeypatch, (), counts)
    _assert_same(before, _generate(plain, monkeypatch, off, plain_counts), f"{case}: on vs off")
    for fusion, n in want.items():
        if fusion == "groups":
            graphs, rest = divmod(fused.weight_store.groups_fused, n * LAYERS)
            assert graphs >= 2 and rest == 0, (case, fused.weight_store.groups_fused)
            assert plain.weight_store.groups_fused == 0, case
        else:  # prefill and decode graphs
            assert len(counts[fusion]) >= 2 and set(counts[fusion]) == {n}, (case, fusion, counts)
    assert len(plain_counts["graphs"]) >= 2, "the engine without compiles its own graphs"
    _assert_learner_equal(learner, rec, before, forwards[0], monkeypatch, f"{case}: before")
    if len(forwards) == 1:
        return

    _step(learner)
    fused.update_weights(learner)
    plain.update_weights(learner)
    after = _generate(fused, monkeypatch, (), counts)
    assert after.tokens != before.tokens, "the update must change the rollout (else no test)"
    _assert_same(after, _generate(plain, monkeypatch, off, plain_counts), f"{case}: after update")
    _assert_learner_equal(learner, rec, after, forwards[1], monkeypatch, f"{case}: after update")
    torch._dynamo.reset()
