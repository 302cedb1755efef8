"""OpRecorder sees fp4_compile ops in eager and compiled runs; compare_runs pairs them and
finds an op whose inputs agree but whose outputs do not."""

import copy

import torch

import fp4_compile.codegen  # noqa: F401  (registers the ops)
from fp4_compile import NVFP4Recipe
from fp4_compile.backend import lowering_only_backend
from fp4_compile.models import tiny_qwen3
from fp4_compile.sr_stream import set_sr_state
from tools.op_recorder import OpRecorder, compare_runs, first_culprit


def _run(model, backend, ids, **kw):
    torch._dynamo.reset()
    set_sr_state(None)
    compiled = torch.compile(model, backend=backend, fullgraph=True, **kw)
    loss = compiled(input_ids=ids, use_cache=False).logits.float().logsumexp(-1).mean()
    with OpRecorder() as rec:  # Dynamo does not trace under a dispatch mode: the backward only
        loss.backward()
    return rec.calls


def test_eager_lowered_and_compiled_runs_agree_op_by_op():
    torch.manual_seed(0)
    model = tiny_qwen3(layers=1, dtype=torch.bfloat16)
    twin = copy.deepcopy(model)
    ids = torch.randint(0, 100, (2, 16))
    recipe = NVFP4Recipe.strict()
    a = _run(twin, lowering_only_backend(recipe), ids)
    b = _run(model, "minite", ids, options={"recipe": recipe})
    ops = {c.op for c in a}
    assert "fp4_compile.nvfp4_linear_backward.default" in ops
    assert "fp4_compile.embedding_backward.default" in ops
    rows = compare_runs(a, b)
    assert all(r["paired"] for r in rows), [r["key"] for r in rows if not r["paired"]][:3]
    assert all(r["inputs_equal"] and r["outputs_equal"] for r in rows)
    assert first_culprit(rows) is None


def test_first_culprit_names_the_op_that_changed_its_output():
    x = torch.randn(4, 8)
    w = torch.randn(8)
    with OpRecorder() as a:
        torch.ops.fp4_compile.invariant_rms_norm(x, w, 1e-6)
    with OpRecorder() as b:
        torch.ops.fp4_compile.invariant_rms_norm(x, w, 1e-6)
    b.calls[0].outputs = ["changed"]
    culprit = first_culprit(compare_runs(a.calls, b.calls))
    assert culprit is not None and "invariant_rms_norm" in culprit["op"]
