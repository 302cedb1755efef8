"""lower_attention on grouped-query attention: transformers' repeat_kv (expand + reshape, a copy
of K and V per query head) is dropped and the attention op reads the KV heads in place. In the
exported rollout step (one graph for prefill and decode) the op's keys and values are the static
cache itself: between the cache input and the op there are views only, no op that copies it.
Contract: exact (graph structure); the bits are tests/codegen/invariant/test_attention_gqa.py's."""

import pytest
import torch

import fp4_compile
from fp4_compile import NVFP4Recipe
from fp4_compile.models import tiny_qwen3

aten = torch.ops.aten
VIEWS = {
    aten.squeeze.dim,
    aten.unsqueeze.default,
    aten.view.default,
    aten.slice.Tensor,
    aten.alias.default,
}
CACHE_WRITES = {aten.scatter_.src, aten.index_put_.default, aten.copy_.default}


def _source(node):
    """Walk back from an op argument through views and the cache's in-place writes to the
    first other node: (that node, the targets walked)."""
    walked = []
    while node.op == "call_function" and node.target in VIEWS | CACHE_WRITES:
        walked.append(node.target)
        node = node.args[0]
    return node, walked


@pytest.fixture(scope="module")
def rollout_graph():
    model = tiny_qwen3(layers=2).to(torch.bfloat16).eval()
    artifact = fp4_compile.export_rollout(
        model, recipe=NVFP4Recipe.strict(), max_batch=4, max_seq_len=48
    )
    return artifact.program.graph_module.graph, artifact.census


def test_decode_graph_reads_the_cache_in_place(rollout_graph):
    graph, census = rollout_graph
    assert not [name for name in census if "repeat" in name], census
    targets = {str(n.target) for n in graph.nodes if n.op == "call_function"}
    assert not [t for t in targets if "repeat" in t], targets
    caches = [n.name for n in graph.nodes if n.op == "placeholder" and "caches" in n.name]
    attention = [
        n for n in graph.nodes if n.target is torch.ops.fp4_compile.invariant_attention.default
    ]
    assert len(attention) == 2 and len(caches) == 4
    read = []
    for node in attention:
        for kv in node.args[1:3]:
            src, walked = _source(kv)
            assert src.op == "placeholder", (src, walked)  # views and the cache write only
            assert tuple(src.meta["val"].shape[1:]) == (2, 48, 32)  # [B, Hkv, S_max, D]
            read.append(src.name)
    assert sorted(read) == sorted(caches)  # every layer's k and v cache, each once


def test_mask_prepared_once_per_graph(rollout_graph):
    """The rollout step's mask (exported: symbolic batch and length) comes from ONE
    `invariant_position_mask` node, whose outputs every layer's attention reads: the mask (its
    argument for the CPU path), the lengths and the three trailing kernel arguments; no
    `invariant_attention_mask_args` node and no `full` of lengths is left."""
    graph, census = rollout_graph
    ops = torch.ops.fp4_compile
    (made,) = [n for n in graph.nodes if n.target is ops.invariant_position_mask.default]
    outputs = {n.args[1]: n for n in made.users}
    attention = [n for n in graph.nodes if n.target is ops.invariant_attention.default]
    assert len(attention) == 2 and census.count("fp4_compile::invariant_position_mask") == 1
    assert census.count("fp4_compile::invariant_attention_mask_args") == 0
    assert not [n for n in graph.nodes if n.target is aten.full.default]
    for node in attention:
        assert node.args[5] is outputs[0]
        assert list(node.args[3:5]) == [outputs[4], outputs[5]]
        assert list(node.args[8:11]) == [outputs[1], outputs[2], outputs[3]]


def test_learner_graph_drops_the_repeat():
    """The learner's Dynamo graph (torch-level spelling of the repeat): the same drop."""
    model = tiny_qwen3(layers=1)
    ids = torch.randint(0, model.config.vocab_size, (2, 8))
    (report,) = fp4_compile.explain(model, ids, use_cache=False, print_report=False)
    assert report.counts["repeat_kv_dropped"] == 2 and report.counts["attention"] == 1
    assert not [name for name in report.census if "repeat" in name], report.census
