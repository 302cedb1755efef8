"""The folds of the MoE experts' data movement into one op each: the token gather into the NVFP4
grouped GEMM (`passes/fold_expert_gathers.py`), the top-k combine (`passes/fold_moe_combine.py`)
and the sentinel row masks of the GEMMs' outputs into their readers (`passes/fold_row_masks.py`).
Each fires on transformers' experts as they are (with and without the expert-parallel sentinel
mask, which transformers 5.17 applies on every call: a whole-row `masked_fill_` of the gathered
copy and of each grouped GEMM's output), and the compiled model's logits and every gradient
equal, bit for bit, the same model compiled without that fold."""

import pytest
import torch

import fp4_compile
import fp4_compile.codegen  # noqa: F401  (registers the ops)
from fp4_compile import passes
from fp4_compile.models import tiny_qwen3_moe
from fp4_compile.passes.attach_combine_inverse import attach_combine_inverse
from fp4_compile.passes.fold_expert_gathers import fold_expert_gathers
from fp4_compile.passes.fold_expert_order import fold_expert_order
from fp4_compile.passes.fold_moe_combine import fold_moe_combine
from fp4_compile.passes.fold_row_masks import fold_row_masks
from fp4_compile.passes.fold_swiglu_halves import fold_swiglu_halves
from fp4_compile.sr_stream import set_sr_state
from fp4_compile.testing import assert_bitwise_equal


def _model(sentinel_mask: bool):
    model = tiny_qwen3_moe(layers=2, dtype=torch.bfloat16)
    for m in model.modules():
        if hasattr(m, "_is_expert_parallel"):
            m._is_expert_parallel = sentinel_mask  # the masked path of transformers' experts
    return model


def _run(model, ids):
    torch._dynamo.reset()
    model.zero_grad(set_to_none=True)
    set_sr_state(None)
    out = torch.compile(model, backend="minite", fullgraph=True)(ids, use_cache=False).logits
    out.float().pow(2).mean().backward()
    return out.detach(), {
        n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
    }


@pytest.mark.parametrize(
    "fold",
    [
        fold_expert_gathers,
        fold_moe_combine,
        fold_row_masks,
        fold_swiglu_halves,
        attach_combine_inverse,
    ],
    ids=lambda f: f.__name__,
)
@pytest.mark.parametrize("sentinel_mask", [False, True], ids=["plain", "sentinel-mask"])
def test_fold_fires_and_changes_no_bit(sentinel_mask, fold, monkeypatch):
    model = _model(sentinel_mask)
    ids = torch.randint(
        0, model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(1)
    )
    (report,) = fp4_compile.explain(model, ids, use_cache=False, print_report=False)
    assert report.counts["expert_gather_folded"] == 2  # one per layer: gate_up's input
    assert report.counts["moe_combine_folded"] == 2  # one per layer
    # the sentinel post-masks of both expert GEMMs' outputs: into silu_mul and moe_combine
    assert report.counts.get("row_mask_folded", 0) == (4 if sentinel_mask else 0)
    assert report.counts["swiglu_halves_folded"] == 2  # one per layer, masked or not
    assert report.counts["combine_inverse_attached"] == 2  # the combine's index: inv[perm]
    assert report.counts["expert_gather_perm_attached"] == 2  # gate_up's index: perm // k
    y, g = _run(model, ids)
    monkeypatch.setattr(passes, "PIPELINE", tuple(p for p in passes.PIPELINE if p is not fold))
    y_ref, g_ref = _run(model, ids)
    assert_bitwise_equal(y, y_ref, "logits")
    assert g.keys() == g_ref.keys() and len(g) > 10
    for name in g:
        assert_bitwise_equal(g[name], g_ref[name], name)
    set_sr_state(None)


def test_expert_order_fold_fires_and_changes_no_bit(monkeypatch):
    """`fold_expert_order`: transformers' sort, histogram, cumsum, inverse, token index and
    weight gather become one `expert_order` per layer, and the logits and every gradient (the
    routing weights' included) equal the model compiled without it, bitwise. With the sentinel
    mask the sorted ids have more readers (the clamp, the mask): left as it is."""
    model = _model(False)
    ids = torch.randint(
        0, model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(1)
    )
    (report,) = fp4_compile.explain(model, ids, use_cache=False, print_report=False)
    assert report.counts["expert_order_folded"] == 2  # one per layer
    census = " ".join(report.census)
    assert "sort" not in census.replace("expert_order", "") and "histc" not in census
    y, g = _run(model, ids)
    without = tuple(p for p in passes.PIPELINE if p is not fold_expert_order)
    monkeypatch.setattr(passes, "PIPELINE", without)
    y_ref, g_ref = _run(model, ids)
    assert_bitwise_equal(y, y_ref, "logits")
    assert g.keys() == g_ref.keys() and len(g) > 10
    for name in g:
        assert_bitwise_equal(g[name], g_ref[name], name)
    set_sr_state(None)
    monkeypatch.undo()
    (masked,) = fp4_compile.explain(_model(True), ids, use_cache=False, print_report=False)
    assert "expert_order_folded" not in masked.counts


def test_masked_rows_are_zero_rows_of_the_op():
    """x_index -1 = a zero row, forward and backward, on the CPU (reference) path: the same
    values and gradients as masking a gathered copy (the unfolded graph)."""
    from fp4_compile import NVFP4Recipe
    from fp4_compile import reference as ref

    rec = NVFP4Recipe.strict().numerics_key
    g = torch.Generator().manual_seed(0)
    w = torch.randn(3, 32, 48, generator=g)
    wq = ref.quantize_experts(w)
    h = torch.randn(5, 48, generator=g, dtype=torch.float32).to(torch.bfloat16)
    idx = torch.tensor([0, 3, 1, 4, 2, 0, 3, 1])
    mask = torch.tensor([0, 0, 1, 0, 0, 1, 0, 0], dtype=torch.bool)
    offsets = torch.tensor([3, 3, 8], dtype=torch.int32)
    args = (
        w,
        wq.codes,
        wq.block_scales.view(torch.uint8),
        wq.global_decode,
        offsets,
        None,
        rec,
        None,
        0,
    )
    h1 = h.clone().requires_grad_()
    y = torch.ops.fp4_compile.nvfp4_grouped_mm(h1, *args, torch.where(mask, -1, idx))
    h2 = h.clone().requires_grad_()
    x2 = torch.ops.fp4_compile.gather_rows(h2, idx).masked_fill(mask[:, None], 0.0)
    y_ref = torch.ops.fp4_compile.nvfp4_grouped_mm(x2, *args)
    assert_bitwise_equal(y, y_ref, "forward")
    dy = torch.randn(y.shape, generator=g).to(y.dtype)
    set_sr_state(None)
    y.backward(dy)
    set_sr_state(None)
    y_ref.backward(dy)
    assert_bitwise_equal(h1.grad, h2.grad, "dh")
    set_sr_state(None)


def test_fold_keeps_a_negative_gather_index_wrapping():
    """x[idx] wraps a negative index (-1 is the last row), the folded op's -1 is a zero row: the
    pass wraps the index first, so the folded graph == the unfolded one on a graph whose gather
    index has negative entries (a make_fx graph: the pass on aten-level graphs)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fp4_compile import NVFP4Recipe
    from fp4_compile import reference as ref
    from fp4_compile.passes.report import LoweringReport

    rec = NVFP4Recipe.strict().numerics_key
    g = torch.Generator().manual_seed(0)
    w = torch.randn(2, 32, 48, generator=g)
    wq = ref.quantize_experts(w)
    scales = wq.block_scales.view(torch.uint8)
    h = torch.randn(5, 48, generator=g).to(torch.bfloat16)
    idx = torch.tensor([0, -1, 3, -5, 2, 4])
    offsets = torch.tensor([2, 6], dtype=torch.int32)
    ops = torch.ops.fp4_compile

    def f(h, idx, w, codes, scales, gd, offsets):
        x = ops.gather_rows(h, idx)
        return ops.nvfp4_grouped_mm(x, w, codes, scales, gd, offsets, None, rec)

    args = (h, idx, w, wq.codes, scales, wq.global_decode, offsets)
    gm = make_fx(f, tracing_mode="fake")(*args)
    want = gm(*args)
    report = LoweringReport(recipe_fingerprint="test")
    fold_expert_gathers(gm, NVFP4Recipe.strict(), report)
    assert report.counts["expert_gather_folded"] == 1
    assert not any(n.target is ops.gather_rows.default for n in gm.graph.nodes)
    assert_bitwise_equal(gm(*args), want, "folded, negative indices")


def _gather_gemm_graph(f, *tensors):
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(f, tracing_mode="fake")(*tensors)


@pytest.mark.parametrize("case", ["fill_after_gemm", "dead_functional_fill", "source_written"])
def test_fold_refuses_what_would_change_the_result(case):
    """The gather fold only takes a row fill that is in place on the gathered copy AND before
    the GEMM reads it, and never moves the read of h past a write to h: a fill after the GEMM,
    a dead functional fill, an in-place write of h between the gather and the GEMM are left
    alone (the graph's result unchanged)."""
    from fp4_compile import NVFP4Recipe
    from fp4_compile import reference as ref
    from fp4_compile.passes.report import LoweringReport

    rec = NVFP4Recipe.strict().numerics_key
    g = torch.Generator().manual_seed(0)
    w = torch.randn(2, 32, 48, generator=g)
    wq = ref.quantize_experts(w)
    ops = torch.ops.fp4_compile
    h = torch.randn(5, 48, generator=g).to(torch.bfloat16)
    idx = torch.tensor([0, 1, 3, 2, 2, 4])
    mask = torch.tensor([1, 0, 0, 1, 0, 0], dtype=torch.bool)[:, None]
    offsets = torch.tensor([2, 6], dtype=torch.int32)

    def f(h, idx, mask, w, codes, scales, gd, offsets):
        x = ops.gather_rows(h, idx)
        if case == "source_written":
            h.mul_(2.0)
        if case == "dead_functional_fill":
            _ = x.masked_fill(mask, 0.0)
        y = ops.nvfp4_grouped_mm(x, w, codes, scales, gd, offsets, None, rec)
        if case == "fill_after_gemm":
            x.masked_fill_(mask, 0.0)
        return y

    args = (h, idx, mask, w, wq.codes, wq.block_scales.view(torch.uint8), wq.global_decode, offsets)
    gm = _gather_gemm_graph(f, *args)
    want = gm(h.clone(), *args[1:])
    report = LoweringReport(recipe_fingerprint="test")
    fold_expert_gathers(gm, NVFP4Recipe.strict(), report)
    assert "expert_gather_folded" not in report.counts
    assert_bitwise_equal(gm(h.clone(), *args[1:]), want, case)


def test_combine_fold_refuses_a_write_between():
    """An in-place write of the experts' output between row_scale and the sum: no fold."""
    from fp4_compile.passes.report import LoweringReport

    ops = torch.ops.fp4_compile
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 16, generator=g)
    w = torch.rand(6, 1, generator=g)
    idx = torch.randperm(6, generator=g)

    def f(x, w, idx):
        s = ops.row_scale(x, w)
        x.mul_(2.0)
        y = ops.gather_rows(s, idx).view(3, 2, 16)
        return ops.ordered_sum(y, 1, False)

    gm = _gather_gemm_graph(f, x, w, idx)
    report = LoweringReport(recipe_fingerprint="test")
    fold_moe_combine(gm, None, report)
    assert "moe_combine_folded" not in report.counts


@pytest.mark.parametrize(
    "case", ["fold", "other_reader", "source_written", "in_place_fill", "one_half_elsewhere"]
)
def test_row_mask_fold_on_aten_graphs(case):
    """On make_fx (ATen) graphs: the sentinel post-masks read only by silu_mul (through
    chunk(2, -1)) and moe_combine fold (the graph's values unchanged, no masked_fill left);
    another reader of the masked copy, a write to x between the fill and the op, an in-place
    fill, or a silu_mul whose other operand is not the masked copy's half: left alone."""
    from fp4_compile.passes.report import LoweringReport

    ops = torch.ops.fp4_compile
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 16, generator=g).to(torch.bfloat16)
    z = torch.randn(6, 16, generator=g).to(torch.bfloat16)
    mask = torch.tensor([1, 0, 0, 1, 0, 0], dtype=torch.bool)[:, None]
    w = torch.rand(6, 1, generator=g).to(torch.bfloat16)
    idx = torch.randperm(6, generator=g)

    def f(x, z, mask, w, idx):
        if case == "in_place_fill":
            y = x.clone()
            y.masked_fill_(mask, 0.0)
        else:
            y = x.masked_fill(mask, 0.0)
        if case == "source_written":
            x.mul_(2.0)
        a, b = y.chunk(2, dim=-1)
        if case == "one_half_elsewhere":
            b = z[:, 8:]
        h = ops.silu_mul(a, b)
        y2 = z.masked_fill(mask, 0.0)
        out = ops.moe_combine(y2, w, idx, 2)
        if case == "other_reader":
            out = out + y2[::2].sum()
        return h, out

    args = (x, z, mask, w, idx)
    gm = _gather_gemm_graph(f, *args)
    want = gm(x.clone(), *args[1:])
    report = LoweringReport(recipe_fingerprint="test")
    fold_row_masks(gm, None, report)
    got = gm(x.clone(), *args[1:])
    assert_bitwise_equal(got[0], want[0], f"{case}: silu_mul")
    assert_bitwise_equal(got[1], want[1], f"{case}: moe_combine")
    folded = report.counts.get("row_mask_folded", 0)
    expected = {
        "fold": 2,
        "other_reader": 1,
        "source_written": 1,
        "in_place_fill": 1,
        "one_half_elsewhere": 1,
    }[case]
    assert folded == expected, (case, folded)
    fills = [n for n in gm.graph.nodes if "masked_fill" in str(n.target)]
    assert len(fills) == 2 - expected


def _dynamo_graph(f, *tensors):
    """The Dynamo (torch-level) graph of f: what the backend's passes see under torch.compile."""
    graphs = []

    def capture(gm, example_inputs, **unused):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(f, backend=capture, fullgraph=True)(*tensors)
    return graphs[0]


_INVERSE_CASES = {  # case: (arange of inv[perm] = ..., attached?)
    "fires": (lambda: torch.arange(0, 6), True),
    "end_keyword": (lambda: torch.arange(end=6), True),
    "start_end_keywords": (lambda: torch.arange(start=0, end=6), True),
    "start_minus_one": (lambda: torch.arange(-1, end=5), False),  # a rotated permutation
    "step_keyword": (lambda: torch.arange(0, 6, step=1), True),
    "reversed": (lambda: torch.arange(5, -1, -1), False),  # a permutation, not perm's inverse
    "perm_not_a_sort": (lambda: torch.arange(6), False),
    "inv_written_again": (lambda: torch.arange(6), False),
    "perm_written": (lambda: torch.arange(6), False),
    "sort_input_keyword": (lambda: torch.arange(6), True),
}


@pytest.mark.parametrize("tracer", ["aten", "dynamo"])
@pytest.mark.parametrize("case", list(_INVERSE_CASES))
def test_combine_inverse_only_where_the_graph_proves_it(case, tracer):
    """On an ATen graph (make_fx: `index_put_`, `sort.stable`) and on a Dynamo graph (setitem,
    keyword arguments): the combine gets `idx_inverse` only when its index is
    `inv[perm] = arange(S)` (start 0, step 1, positional or keyword) of a sort's indices with
    nothing else writing inv or perm before it; the graph's result is the same either way."""
    from fp4_compile.passes.report import LoweringReport

    ops = torch.ops.fp4_compile
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 16, generator=g)
    w = torch.rand(6, 1, generator=g)
    ids = torch.tensor([2, 0, 1, 2, 0, 1])
    given = torch.tensor([3, 1, 0, 5, 4, 2])
    values, fires = _INVERSE_CASES[case]

    def f(x, w, ids, given):
        ids = ids + 0 * given  # every input read (Dynamo drops unread ones from its graph)
        if case == "perm_not_a_sort":
            perm = given
        elif case == "sort_input_keyword":
            perm = torch.sort(input=ids, stable=True)[1]
        else:
            perm = torch.sort(ids, stable=True)[1]
        inv = torch.empty_like(perm)
        inv[perm] = values()
        if case == "inv_written_again":
            inv[0] = inv[1]
        if case == "perm_written":
            perm.mul_(1)
        return ops.moe_combine.default(x, w, inv, 2)  # the overload the fold creates

    gm = (_gather_gemm_graph if tracer == "aten" else _dynamo_graph)(f, x, w, ids, given)
    named = {"x": x, "w": w, "ids": ids, "given": given}
    inputs = [
        named[n.name.removeprefix("l_").removesuffix("_").removesuffix("_1")]
        for n in gm.graph.nodes
        if n.op == "placeholder"
    ]  # Dynamo: in order of first use
    want = gm(*inputs)
    report = LoweringReport(recipe_fingerprint="test")
    attach_combine_inverse(gm, None, report)
    gm.recompile()
    combine = next(n for n in gm.graph.nodes if n.target is ops.moe_combine.default)
    assert (combine.kwargs.get("idx_inverse") is not None) == fires
    assert report.counts.get("combine_inverse_attached", 0) == int(fires)
    got = gm(*inputs)  # the forward never reads idx_inverse: the same result
    got, want = (got[0], want[0]) if isinstance(want, (tuple, list)) else (got, want)
    assert_bitwise_equal(got, want, case)


@pytest.mark.parametrize(
    "case", ["fires", "index_written", "perm_written", "not_a_sort", "k_does_not_match"]
)
def test_expert_gather_perm_only_where_the_graph_proves_it(case):
    """fold_expert_gathers attaches x_perm only when the gather index is `perm // k` of a sort's
    indices, k * rows == S, and neither perm nor the index is written or viewed."""
    from fp4_compile import NVFP4Recipe
    from fp4_compile import reference as ref
    from fp4_compile.passes.report import LoweringReport

    rec = NVFP4Recipe.strict().numerics_key
    g = torch.Generator().manual_seed(0)
    w = torch.randn(2, 32, 48, generator=g)
    wq = ref.quantize_experts(w)
    ops = torch.ops.fp4_compile
    rows = 4 if case == "k_does_not_match" else 3
    h = torch.randn(rows, 48, generator=g).to(torch.bfloat16)
    ids = torch.tensor([1, 0, 0, 1, 1, 0])
    given = torch.tensor([1, 2, 5, 0, 3, 4])
    offsets = torch.tensor([3, 6], dtype=torch.int32)

    def f(h, ids, given, w, codes, scales, gd, offsets):
        perm = given if case == "not_a_sort" else torch.sort(ids, stable=True)[1]
        idx = perm // 2
        if case == "index_written":
            idx[0] = 1
        if case == "perm_written":
            perm.add_(0)
        x = ops.gather_rows(h, idx)
        return ops.nvfp4_grouped_mm(x, w, codes, scales, gd, offsets, None, rec)

    args = (
        h,
        ids,
        given,
        w,
        wq.codes,
        wq.block_scales.view(torch.uint8),
        wq.global_decode,
        offsets,
    )
    gm = _gather_gemm_graph(f, *args)
    report = LoweringReport(recipe_fingerprint="test")
    fold_expert_gathers(gm, NVFP4Recipe.strict(), report)
    assert report.counts.get("expert_gather_folded", 0) == 1
    assert report.counts.get("expert_gather_perm_attached", 0) == int(case == "fires")
