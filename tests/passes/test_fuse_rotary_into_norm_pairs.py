"""fuse_rotary_into_norm_pairs (bitwise): tiny Qwen3 and Qwen3-MoE in bf16, lowered in an
inference graph (no gradient tracked) with each layer's q / k norm pair and the rotary after it
fused into one invariant_rms_norm_pair_rotary, equal the same models lowered without the pass in
the logits, bit for bit (the lowered graphs run eagerly through the ops' CPU references). Every
layer fuses (one op per layer, no norm pair left, the tables' casts gone). Refusals, each with its
reason in report.notes and the graph left as it was: a graph that tracks a gradient (the
learner's), FP32 heads, normed heads read besides the rotary, k rotated with other tables."""

import operator

import pytest
import torch
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

import fp4_compile.passes as passes
from fp4_compile import NVFP4Recipe
from fp4_compile.backend import lowering_only_backend
from fp4_compile.models import tiny_qwen3, tiny_qwen3_moe
from fp4_compile.passes.fuse_rotary_into_norm_pairs import fuse_rotary_into_norm_pairs
from fp4_compile.passes.report import LoweringReport
from fp4_compile.testing import assert_bitwise_equal

PAIR = torch.ops.fp4_compile.invariant_rms_norm_pair.default
FUSED = "fp4_compile::invariant_rms_norm_pair_rotary"
MODELS = {"qwen3": tiny_qwen3, "qwen3_moe": tiny_qwen3_moe}
LAYERS = 2


def _run(model, ids, recipe, *, grad: bool):
    sink: list = []
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=lowering_only_backend(recipe, sink), fullgraph=True)
    with torch.set_grad_enabled(grad):
        logits = compiled(ids, use_cache=False).logits
    (report,) = sink
    return logits.detach(), report


def _count(report, op):
    return sum(name.split(".")[0] == op for name in report.census)


@pytest.mark.parametrize(
    ("arch", "recipe"), [("qwen3", "strict"), ("qwen3_moe", "strict"), ("qwen3", "bf16")]
)
def test_fused_rotary_is_bitwise_the_unfused_graph(arch, recipe, monkeypatch):
    rec = getattr(NVFP4Recipe, recipe)()
    model = MODELS[arch](layers=LAYERS, dtype=torch.bfloat16).eval()
    ids = torch.randint(
        0, model.config.vocab_size, (3, 11), generator=torch.Generator().manual_seed(5)
    )
    y, report = _run(model, ids, rec, grad=False)
    assert report.counts["rotary_fused_into_norms"] == LAYERS, report.notes
    assert _count(report, FUSED) == LAYERS
    assert _count(report, "fp4_compile::invariant_rms_norm_pair") == 0
    full = passes.PIPELINE
    monkeypatch.setattr(
        passes, "PIPELINE", tuple(p for p in full if p is not fuse_rotary_into_norm_pairs)
    )
    y_ref, report_ref = _run(model, ids, rec, grad=False)
    assert _count(report_ref, "fp4_compile::invariant_rms_norm_pair") == LAYERS
    assert_bitwise_equal(y, y_ref, f"logits ({arch}, {recipe})")


def test_learner_graph_and_fp32_heads_are_refused():
    """A graph that tracks the norms' gradients (the learner's training forward) and an FP32
    model keep the norm pair and the rotary's ops, with the reason noted."""
    rec = NVFP4Recipe.strict()
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(1))
    for dtype, grad, why in ((torch.bfloat16, True, "gradient"), (torch.float32, False, "float32")):
        model = tiny_qwen3(layers=LAYERS, dtype=dtype)
        _, report = _run(model, ids, rec, grad=grad)
        assert "rotary_fused_into_norms" not in report.counts
        assert _count(report, "fp4_compile::invariant_rms_norm_pair") == LAYERS
        notes = [n for n in report.notes if "rotary not fused" in n]
        assert len(notes) == LAYERS and all(why in n for n in notes), report.notes


D = 8


def _rotate_half(x):
    return torch.cat((-x[..., D // 2 :], x[..., : D // 2]), dim=-1)


def _rope(q, k, cos, sin, cos_k, sin_k):
    qe = (q * cos.unsqueeze(1)) + (_rotate_half(q) * sin.unsqueeze(1))
    ke = (k * cos_k.unsqueeze(1)) + (_rotate_half(k) * sin_k.unsqueeze(1))
    return qe, ke


def _fits(a, wa, b, wb, c32, s32):
    pair = PAIR(a, wa, b, wb, 1e-6)
    ya, yb = pair[0], pair[1]
    cos, sin = (c32 * 1.0).to(torch.bfloat16), (s32 * 1.0).to(torch.bfloat16)
    return _rope(ya.transpose(1, 2), yb.transpose(1, 2), cos, sin, cos, sin)


def _q_read_twice(a, wa, b, wb, c32, s32):
    pair = PAIR(a, wa, b, wb, 1e-6)
    ya, yb = pair[0], pair[1]
    q = ya.transpose(1, 2)
    cos, sin = c32.to(torch.bfloat16), s32.to(torch.bfloat16)
    qe, ke = _rope(q, yb.transpose(1, 2), cos, sin, cos, sin)
    return qe, ke, q * 2


def _other_tables(a, wa, b, wb, c32, s32):
    pair = PAIR(a, wa, b, wb, 1e-6)
    cos, sin = c32.to(torch.bfloat16), s32.to(torch.bfloat16)
    return _rope(pair[0].transpose(1, 2), pair[1].transpose(1, 2), cos, sin, sin, cos)


@pytest.mark.parametrize(
    ("fn", "why"),
    [
        (_fits, None),
        (_q_read_twice, "readers"),
        (_other_tables, "different cos / sin"),
    ],
)
def test_pass_on_a_graph_fires_or_refuses(fn, why):
    """Fires on the pattern (the graph's outputs keep their bits, the tables' scale-and-cast
    read by the op and gone); refuses, graph untouched and the reason noted, where the normed q
    has another reader or k's tables differ from q's."""
    g = torch.Generator().manual_seed(0)
    a = (torch.randn(2, 3, 4, D, generator=g) * 3).bfloat16()
    b = (torch.randn(2, 3, 2, D, generator=g) * 3).bfloat16()
    wa, wb = (1 + 0.2 * torch.randn(2, D, generator=g)).bfloat16()
    ang = torch.randn(2, 3, D, generator=g) * 9
    args = (a, wa, b, wb, ang.cos(), ang.sin())
    gm = torch.fx.symbolic_trace(fn)
    FakeTensorProp(gm).propagate(*args)
    want = fn(*args)
    with torch.no_grad():
        report = LoweringReport(recipe_fingerprint="test")
        fuse_rotary_into_norm_pairs(gm, NVFP4Recipe.strict(), report)
    gm.graph.lint()
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    fused = torch.ops.fp4_compile.invariant_rms_norm_pair_rotary.default
    if why is None:
        assert report.counts == {"rotary_fused_into_norms": 1} and not report.notes, report.notes
        assert fused in targets and PAIR not in targets
        assert not [n for n in gm.graph.nodes if n.op in ("call_method",) and n.target == "to"]
        assert operator.getitem in targets  # the op's two outputs
    else:
        assert "rotary_fused_into_norms" not in report.counts
        assert fused not in targets and PAIR in targets
        assert len(report.notes) == 1 and why in report.notes[0], report.notes
    got = gm(*args)
    for x, y in zip(got, want):
        assert_bitwise_equal(x, y, fn.__name__)
