"""What autograd adds to a lowered graph's backward: no stock reductions (their order would be
chosen separately by eager ATen and by Inductor, and compiled gradients would stop matching the
eager lowered graph bit for bit); grouped-query attention's repeat in particular is
`fp4_compile::repeat_kv`, whose backward sums each group in a written-out order."""

import collections

import pytest
import torch
from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func

from fp4_compile import NVFP4Recipe
from fp4_compile.codegen.invariant.repeat_kv import repeat_kv, repeat_kv_backward
from fp4_compile.models import tiny_llama, tiny_qwen3, tiny_qwen3_moe
from fp4_compile.passes import run_pipeline
from fp4_compile.testing import assert_bitwise_equal


def _joint_graphs(model, recipe):
    graphs = {}

    def backend(gm, example_inputs):
        run_pipeline(gm, recipe)

        def keep(name):
            def compiler(g, _):
                graphs[name] = g
                return make_boxed_func(g.forward)

            return compiler

        return aot_module_simplified(gm, example_inputs, fw_compiler=keep("fw"),
                                     bw_compiler=keep("bw"))  # fmt: skip

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
    assert ops["fp4_compile.repeat_kv_backward.default"] >= 2  # keys and values: GQA models


def test_repeat_kv_forward_is_the_copy_and_backward_the_ordered_sum():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 1, 5, 8, generator=g).to(torch.bfloat16)
    y = repeat_kv(x, 4)
    assert_bitwise_equal(y, x.expand(2, 3, 4, 5, 8).reshape(2, 12, 5, 8), "forward")
    grad = (torch.randn(2, 12, 5, 8, generator=g) * 1e3).to(torch.bfloat16)
    got = repeat_kv_backward(grad, 4, torch.bfloat16)
    parts = grad.reshape(2, 3, 4, 5, 8).float()
    want = ((parts[:, :, 0] + parts[:, :, 1]) + parts[:, :, 2]) + parts[:, :, 3]
    assert_bitwise_equal(got, want.to(torch.bfloat16).unsqueeze(2), "backward")
    xr = x.clone().requires_grad_()
    repeat_kv(xr, 4).backward(grad)
    assert_bitwise_equal(xr.grad, got, "autograd")
    torch.library.opcheck(torch.ops.fp4_compile.repeat_kv.default, (x.float().requires_grad_(), 2))
    with pytest.raises(ValueError, match=r"\[B, H, 1, T, D\]"):
        repeat_kv(x.squeeze(2), 4)
    with pytest.raises(ValueError, match="n_rep"):
        repeat_kv(x, 0)
