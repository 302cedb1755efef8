"""fuse_rotary_tables (bitwise): tiny Qwen3, Qwen3-MoE (bf16) and Llama (FP32, as built), lowered in an
inference graph (grad mode off) with the rotary embedding's angles, cos and sin as one
`fp4_compile::rotary_tables`, equal the same models lowered without the pass in the logits, bit
for bit (the lowered graphs run eagerly through the ops' CPU references). One op per graph, no
`fp4_compile::cos` / `sin` left. A graph compiled with grad mode on (the learner's training
forward) keeps its cos / sin ops."""

import pytest
import torch

import fp4_compile.passes as passes
from fp4_compile import NVFP4Recipe
from fp4_compile.backend import lowering_only_backend
from fp4_compile.models import tiny_llama, tiny_qwen3, tiny_qwen3_moe
from fp4_compile.passes.fuse_rotary_tables import fuse_rotary_tables
from fp4_compile.testing import assert_bitwise_equal

MODELS = {
    "qwen3": (tiny_qwen3, torch.bfloat16),
    "qwen3_moe": (tiny_qwen3_moe, torch.bfloat16),
    "llama": (tiny_llama, None),
}


def _run(model, ids, *, grad: bool):
    sink: list = []
    torch._dynamo.reset()
    backend = lowering_only_backend(NVFP4Recipe.strict(), sink)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    with torch.set_grad_enabled(grad):
        logits = compiled(ids, use_cache=False).logits
    (report,) = sink
    return logits.detach(), report


def _count(report, op):
    return sum(name.split(".")[0] == op for name in report.census)


@pytest.mark.parametrize("arch", MODELS)
def test_fused_tables_are_bitwise_the_unfused_graph(arch, monkeypatch):
    make, dtype = MODELS[arch]
    model = (make(layers=2, dtype=dtype) if dtype else make(layers=2)).eval()
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, model.config.vocab_size, (3, 11), generator=g)
    y, report = _run(model, ids, grad=False)
    assert report.counts["rotary_tables"] == 1, report.notes
    assert _count(report, "fp4_compile::rotary_tables") == 1
    assert _count(report, "fp4_compile::cos") == _count(report, "fp4_compile::sin") == 0
    full = passes.PIPELINE
    monkeypatch.setattr(passes, "PIPELINE", tuple(p for p in full if p is not fuse_rotary_tables))
    y_ref, report_ref = _run(model, ids, grad=False)
    assert _count(report_ref, "fp4_compile::cos") == _count(report_ref, "fp4_compile::sin") == 1
    assert_bitwise_equal(y, y_ref, f"logits ({arch})")


def test_training_graph_keeps_its_ops():
    model = tiny_qwen3(layers=1, dtype=torch.bfloat16)
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(1))
    _, report = _run(model, ids, grad=True)
    assert "rotary_tables" not in report.counts
    assert _count(report, "fp4_compile::cos") == _count(report, "fp4_compile::sin") == 1


class _Tables(torch.nn.Module):
    """A rotary table of positions whose inverse frequencies pass through `inv_cast` first."""

    def __init__(self, inv_cast):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (1e4 ** (torch.arange(0, 8, 2) / 8.0)) * 7.3)
        self.inv_cast = inv_cast

    def forward(self, positions):
        angles = positions[..., None].float() * self.inv_cast(self.inv_freq).float()
        emb = torch.cat((angles, angles), dim=-1)
        return emb.cos(), emb.sin()


@pytest.mark.parametrize(
    "inv_cast, fused",
    [(lambda t: t, True), (lambda t: t.bfloat16(), True), (lambda t: t.to(torch.int64), False)],
    ids=["fp32", "through-bf16", "through-int64"],
)
def test_only_exact_cast_chains_are_fused(inv_cast, fused):
    """Contract: the op computes float(position) * inv_freq and nothing else, so an inverse
    frequency that passes through an integer (a truncation the op would skip) is left as it is;
    the fused tables equal the unfused ones bitwise."""
    module, positions = _Tables(inv_cast), torch.arange(40).reshape(2, 20)
    sink: list = []
    torch._dynamo.reset()
    compiled = torch.compile(
        module, backend=lowering_only_backend(NVFP4Recipe.strict(), sink), fullgraph=True
    )
    with torch.no_grad():
        got = compiled(positions)
    torch._dynamo.reset()
    (report,) = sink
    assert _count(report, "fp4_compile::rotary_tables") == int(fused), report.notes
    for a, b in zip(got, module(positions)):
        assert_bitwise_equal(a, b, "tables")
