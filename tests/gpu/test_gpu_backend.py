"""The `minite` backend on the GPU: models compiled with backend="minite" (fullgraph, Inductor)
against the same lowered graph run eagerly (the passes without Inductor).

Bitwise, per model and recipe (strict, te, bf16): the forward logits and every parameter
gradient == the eager lowered graph's; the compiled backward run twice gives the same gradients;
where the recipe is batch invariant, a row alone == that row in the batch. Models: tiny Qwen3,
Qwen3-MoE and Llama (FP32), and two Qwen3-30B-A3B-shaped decoder layers at 256 tokens (4096
tokens: marked slow). Also the stochastic-rounding stream drawn on the GPU == on the CPU.
"""

import copy

import gpu_internals as gi
import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.models import qwen3_30b_a3b_layers, tiny_llama, tiny_qwen3, tiny_qwen3_moe
from fp4_compile.testing import assert_bitwise_equal, count_bytes_differ

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
RECIPES = {"strict": NVFP4Recipe.strict, "te": NVFP4Recipe.te, "bf16": NVFP4Recipe.bf16}
# name -> (build, (batch, tokens per sequence), vocab of the ids)
MODELS = {
    "tiny_qwen3": (lambda: tiny_qwen3(dtype=torch.bfloat16), (3, 24), 128),
    "tiny_qwen3_moe": (lambda: tiny_qwen3_moe(dtype=torch.bfloat16), (3, 24), 128),
    "tiny_llama_fp32": (lambda: tiny_llama(), (3, 24), 128),
    "30b_shaped_x2_256tok": (lambda: qwen3_30b_a3b_layers(layers=2), (2, 128), 8192),
    "30b_shaped_x2_4096tok": (lambda: qwen3_30b_a3b_layers(layers=2), (32, 128), 8192),
}
SLOW = {"30b_shaped_x2_4096tok"}


def test_sr_stream_cuda_equals_cpu():
    """Bitwise: the stochastic-rounding uniforms drawn on the GPU == on the CPU, [4096, 2048]
    at a 63-bit seed."""
    seed = 2**62 + 12345
    gpu = gi.sr_uniforms((4096, 2048), seed, DEVICE)
    assert_bitwise_equal(gpu.cpu(), gi.sr_uniforms((4096, 2048), seed, "cpu"), "SR uniforms")


def _fwd_bwd(model, backend, ids, **kw):
    torch._dynamo.reset()
    model.zero_grad(set_to_none=True)
    gi.set_sr_state(None)  # both runs draw the same stochastic-rounding streams
    compiled = torch.compile(model, backend=backend, fullgraph=True, **kw)
    logits = compiled(input_ids=ids, use_cache=False).logits
    logits.float().logsumexp(-1).mean().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return compiled, logits.detach(), grads


def _differing(a: dict, b: dict) -> dict:
    """name -> differing elements, for the gradients that differ."""
    counts = {n: count_bytes_differ(a[n], b[n]) for n in a}
    return {n: c for n, c in counts.items() if c}


def _cases():
    for model in MODELS:
        for recipe in RECIPES:
            marks = [pytest.mark.slow] if model in SLOW else []
            yield pytest.param(model, recipe, id=f"{model}-{recipe}", marks=marks)


@pytest.mark.parametrize("model_name, recipe_name", list(_cases()))
def test_compiled_equals_lowered_eager(model_name, recipe_name):
    """Bitwise: compiled (Inductor) forward and every parameter gradient == the eager lowered
    graph's; the compiled backward is deterministic run to run; batch-invariant recipes: a row
    alone == the row in the batch."""
    build, shape, vocab = MODELS[model_name]
    recipe = RECIPES[recipe_name]()
    ids = torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    model = build().to(DEVICE)
    twin = copy.deepcopy(model)
    compiled, logits, grads = _fwd_bwd(model, "minite", ids, options={"recipe": recipe})

    model.zero_grad(set_to_none=True)
    gi.set_sr_state(None)
    compiled(input_ids=ids, use_cache=False).logits.float().logsumexp(-1).mean().backward()
    rerun = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert rerun.keys() == grads.keys()
    differ = _differing(rerun, grads)
    assert not differ, f"compiled backward run twice: {len(differ)} gradients differ: {differ}"

    _, logits_ref, grads_ref = _fwd_bwd(twin, gi.lowering_only_backend(recipe), ids)
    assert_bitwise_equal(logits, logits_ref, "forward logits vs eager lowered graph")
    assert grads.keys() == grads_ref.keys(), (
        f"gradient sets differ: {grads.keys() ^ grads_ref.keys()}"
    )
    differ = _differing(grads, grads_ref)
    assert not differ, (
        f"{len(differ)} of {len(grads)} gradients differ from the eager lowered graph "
        f"(name: differing elements): {differ}"
    )
    assert all(bool(g.float().isfinite().all()) for g in grads.values()), "non-finite gradients"
    if recipe.batch_invariant:
        with torch.no_grad():
            alone = compiled(input_ids=ids[1:2], use_cache=False).logits
        assert_bitwise_equal(alone[0], logits[1], "row 1 alone vs in the batch")
