"""lower_attention on the rollout step over a paged KV cache (`fp4_compile/rollout/
paged_kv_cache.py`): each layer's cache read, `fp4_compile::gather_kv_pages(pool, block_table)`
(the contiguous layout transformers' attention sees), is folded into the attention op, which
takes the page pools and the block table themselves: no gather is left in the graph, so no
contiguous copy of the cache is ever made. Then the lowered step's logits and its in-place
cache writes are the static-cache step's, bitwise, for the same keys laid out in shuffled pages.
Contract: exact (graph structure) and bitwise (the step's outputs, CPU path).
"""

import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.backend import lowering_only_backend
from fp4_compile.models import tiny_qwen3
from fp4_compile.rollout.step import RolloutStep
from fp4_compile.testing import assert_bitwise_equal

OPS = torch.ops.fp4_compile
B, S_MAX, PAGE = 2, 48, 16


def _compiled(model, graphs, reports):
    lower = lowering_only_backend(NVFP4Recipe.strict(), reports)

    def backend(gm, example_inputs, **unused):
        graphs.append(gm)
        return lower(gm, example_inputs)

    torch._dynamo.reset()
    return torch.compile(RolloutStep(model), backend=backend, fullgraph=True, dynamic=False)


def test_paged_step_folds_the_gather_and_matches_the_static_step():
    torch.manual_seed(0)
    model = tiny_qwen3(layers=2).to(torch.bfloat16).eval()
    cfg = model.config
    hkv, d = cfg.num_key_value_heads, cfg.head_dim
    # a decode step after a prompt of 20 and of 33 tokens: cached keys, then one new token
    lengths = torch.tensor([20, 33])
    ids = torch.randint(0, cfg.vocab_size, (B, 1))
    positions = (lengths - 1)[:, None]
    g = torch.Generator().manual_seed(1)
    static = [torch.randn(B, hkv, S_MAX, d, generator=g).bfloat16() for _ in range(4)]
    width = S_MAX // PAGE
    num_pages = B * width + 2
    table = torch.randperm(num_pages - 1, generator=g)[: B * width].reshape(B, width) + 1
    pools = [torch.randn(num_pages, hkv, PAGE, d, generator=g).bfloat16() for _ in range(4)]
    for pool, cache in zip(pools, static):
        for b in range(B):
            for p in range(width):
                pool[table[b, p]] = cache[b, :, p * PAGE : (p + 1) * PAGE]

    graphs, reports = [], []
    step = _compiled(model, graphs, reports)
    got = step(ids, positions, lengths, *pools, block_table=table)
    (gm,) = graphs
    (report,) = reports
    assert report.counts["paged_attention"] == 2, report.counts
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert OPS.gather_kv_pages.default not in targets
    attention = [n for n in gm.graph.nodes if n.target is OPS.invariant_attention.default]
    assert len(attention) == 2
    for node in attention:
        k, v, block_table = node.args[1], node.args[2], node.args[11]
        for kv in (k, v):  # the pools (written in place by the step), not a gathered copy
            val = kv.meta.get("val", kv.meta.get("example_value"))
            assert tuple(val.shape) == (num_pages, hkv, PAGE, d), kv
        assert block_table.op == "placeholder"

    want = _compiled(model, [], [])(ids, positions, lengths, *static)
    assert_bitwise_equal(got, want, "logits, paged vs static")
    for pool, cache in zip(pools, static):  # the new token's keys and values, written in place
        layout = OPS.gather_kv_pages(pool, table)
        for b in range(B):
            assert_bitwise_equal(layout[b], cache[b], f"cache row {b}")
