"""What autograd adds to a lowered graph's backward: no stock reductions (their order would be
chosen separately by eager ATen and by Inductor, and compiled gradients would stop matching the
eager lowered graph bit for bit); grouped-query attention's repeat in particular is gone: the
attention op reads the KV heads in place and its backward sums each group's dK / dV in a
written-out order (tests/codegen/invariant/test_attention_gqa.py)."""

import collections

import pytest
import torch
from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func

from fp4_compile import NVFP4Recipe
from fp4_compile.models import tiny_llama, tiny_qwen3, tiny_qwen3_moe
from fp4_compile.passes import run_pipeline


def _joint_graphs(model, recipe):
    graphs = {}

    def backend(gm, example_inputs):
        run_pipeline(gm, recipe)

        def keep(name):
            def compiler(g, _):
                graphs[name] = g
                return make_boxed_func(g.forward)

            return compiler

        return aot_module_simplified(
            gm, example_inputs, fw_compiler=keep("fw"), bw_compiler=keep("bw")
        )

    torch._dynamo.reset()
    ids = torch.randint(0, model.config.vocab_size, (2, 16))
    logits = torch.compile(model, backend=backend)(input_ids=ids, use_cache=False).logits
    logits.float().sum().backward()
    torch._dynamo.reset()
    return graphs


@pytest.mark.parametrize(
    "build", [tiny_qwen3, tiny_qwen3_moe, tiny_llama], ids=["qwen3", "moe", "llama"]
)
@pytest.mark.parametrize(
    "recipe", [NVFP4Recipe.strict(), NVFP4Recipe.bf16()], ids=["strict", "bf16"]
)
def test_backward_graph_has_no_stock_sum(build, recipe):
    graphs = _joint_graphs(build(), recipe)
    ops = collections.Counter(
        str(n.target) for n in graphs["bw"].graph.nodes if n.op == "call_function"
    )
    assert not [t for t in ops if t.startswith("aten.sum")], ops
    assert ops["fp4_compile.invariant_attention_backward.default"] >= 1  # GQA: sums dK, dV
    assert not [t for t in ops if "repeat" in t], ops
