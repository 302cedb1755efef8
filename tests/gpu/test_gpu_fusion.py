"""Quantization shared and fused into its producers, on the GPU (compiled Triton kernels), at the
learner's shapes (Qwen3-30B-A3B: hidden 2048, q 4096 / k, v 512 out-features, 4096 tokens).

Bitwise, each against the unfused path:
- quantize_activation + nvfp4_linear_quantized == nvfp4_linear for q/k/v on one X: outputs, dX
  (the three dgrads summed as autograd sums them), dW with stochastic-rounding gradients;
- the rms_norm_quantize kernel == the rms_norm kernel, then quantize_triton (per row) and the
  per-tensor X^T quantize: y, on-grid operands, global decodes; rows of a 16-row call == the
  same rows of the 4096-row call (batch invariance);
- its residual form (add_rms_norm_quantize) == the add, then the kernel, h included;
- the silu_mul_quantize kernel == silu_mul_triton, then quantize_triton (per row);
- nvfp4_grouped_mm_quantized == nvfp4_grouped_mm (128 experts, gathered tokens): y, dX, dW;
- the expert weights' one-read quantize in 1, 4, 8 expert groups == the two-step form;
- the whole pipeline with the share / fuse passes == without them (logits and every gradient,
  Inductor-compiled `minite`), on two Qwen3-30B-A3B-shaped layers, MoE and dense.
"""

import copy

import gpu_internals as gi
import pytest
import torch

import fp4_compile.passes as passes
from fp4_compile import NVFP4Recipe
from fp4_compile.models import qwen3_30b_a3b_layers
from fp4_compile.testing import assert_bitwise_equal, count_bytes_differ

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
TOKENS, HIDDEN = 4096, 2048
ops = torch.ops.fp4_compile


def _randn(*shape, seed, scale=1.0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    return torch.randn(*shape, generator=g, device=DEVICE) * scale


def _weight(n, k, seed):
    w = _randn(n, k, seed=seed, scale=0.02).to(torch.bfloat16).requires_grad_()
    codes, scales, gd = ops.quantize(w.detach(), "16x16", "per_tensor", None, "rne", 0)
    return w, (codes, scales.view(torch.uint8), gd)


@pytest.mark.parametrize("recipe_name", ["strict", "te"])
def test_shared_quantize_qkv_equals_nvfp4_linear(recipe_name):
    recipe = getattr(NVFP4Recipe, recipe_name)()
    x = _randn(8, TOKENS // 8, HIDDEN, seed=1).to(torch.bfloat16).requires_grad_()
    weights = [_weight(n, HIDDEN, seed=10 + i) for i, n in enumerate((4096, 512, 512))]

    def run(shared):
        gi.set_sr_state(None)
        x.grad = None
        for w, _ in weights:
            w.grad = None
        operands = ops.quantize_activation(x.detach(), recipe.numerics_key, None, True)
        outs = []
        for site, (w, wq) in enumerate(weights):
            args = (x, w, *wq, None, None, recipe.numerics_key, None, site)
            outs.append(
                ops.nvfp4_linear_quantized(*args, *operands) if shared else ops.nvfp4_linear(*args)
            )
        loss = sum(o.float().pow(2).mean() for o in outs)
        loss.backward()
        return [o.detach() for o in outs], x.grad.clone(), [w.grad.clone() for w, _ in weights]

    outs, dx, dws = run(shared=True)
    outs_ref, dx_ref, dws_ref = run(shared=False)
    for i in range(3):
        assert_bitwise_equal(outs[i], outs_ref[i], f"y[{i}] ({recipe_name})")
        assert_bitwise_equal(dws[i], dws_ref[i], f"dW[{i}] ({recipe_name})")
    assert_bitwise_equal(dx, dx_ref, f"dX ({recipe_name})")


@pytest.mark.parametrize("hidden", [HIDDEN, 128])
def test_rms_norm_quantize_kernel_equals_unfused_kernels(hidden):
    x = (_randn(TOKENS, hidden, seed=2) * _randn(TOKENS, 1, seed=3).exp()).to(torch.bfloat16)
    w = (1.0 + 0.1 * _randn(hidden, seed=4)).to(torch.bfloat16)
    y, ongrid, gd, row_amax = gi.rms_norm_quantize_kernel(x, w, 1e-6)
    y_ref = gi.rms_norm_kernel(x, w, None, 1e-6)[0]
    assert_bitwise_equal(y, y_ref, "y")
    a, gd_a = gi.quantize_triton(y_ref, block="1x16", global_scale="per_row", out="ongrid")
    assert_bitwise_equal(ongrid, a, "on-grid operand")
    assert_bitwise_equal(gd, gd_a, "per-row global decode")
    fused = ops.rms_norm_quantize(x, w, 1e-6, NVFP4Recipe.strict().numerics_key, True)
    xt, gd_t = gi.quantize_transposed_ongrid(y_ref, global_scale="per_tensor")
    assert_bitwise_equal(fused[3], xt, "X^T on-grid operand")
    assert_bitwise_equal(fused[4], gd_t, "X^T global decode")
    for m in (1, 16, 777):
        part = gi.rms_norm_quantize_kernel(x[:m], w, 1e-6)
        for got, full, what in zip(part, (y, ongrid, gd, row_amax), ("y", "on-grid", "gd", "amax")):
            assert_bitwise_equal(got, full[:m], f"{what}: {m} rows alone vs in {TOKENS}")


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("rows", [1, 16, TOKENS])
def test_add_rms_norm_quantize_kernel_equals_add_then_kernel(rows, split):
    """The residual form (a decoder layer's add fused into the norm after it) == eager
    `x + residual` (BF16, one rounding) then the rms_norm_quantize kernel: y, on-grid operand,
    global decode, row maxima and h, in both launch forms (decode's batch 1 takes the split)."""
    x = (_randn(rows, HIDDEN, seed=9) * _randn(rows, 1, seed=10).exp()).to(torch.bfloat16)
    r = (_randn(rows, HIDDEN, seed=11) * _randn(rows, 1, seed=12).exp()).to(torch.bfloat16)
    w = (1.0 + 0.1 * _randn(HIDDEN, seed=13)).to(torch.bfloat16)
    got = gi.add_rms_norm_quantize_kernel(x, r, w, 1e-6, split=split)
    h = x + r
    want = gi.rms_norm_quantize_kernel(h, w, 1e-6, split=split)
    for a, b, what in zip(got, (*want, h), ("y", "on-grid", "gd", "row maxima", "h")):
        assert_bitwise_equal(a, b, f"{what} ({rows} rows, split {split})")


@pytest.mark.parametrize("masked", [False, True])
def test_silu_mul_quantize_kernel_equals_unfused_kernels(masked):
    """The experts' SwiGLU at the learner's shape (4096 tokens x top-8, moe_intermediate 768):
    y == silu_mul_triton on the halves, the operand == quantize_triton(y, per row)."""
    x = _randn(TOKENS * 8, 2 * 768, seed=5, scale=2.0).to(torch.bfloat16)
    mask = (torch.arange(TOKENS * 8, device=DEVICE) % 7 == 3) if masked else None
    y, ongrid, gd, _ = gi.silu_mul_quantize_kernel(x[:, :768], x[:, 768:], mask)
    y_ref = gi.silu_mul_kernel(x[:, :768], x[:, 768:], mask)
    assert_bitwise_equal(y, y_ref, "y")
    a, gd_a = gi.quantize_triton(y_ref, block="1x16", global_scale="per_row", out="ongrid")
    assert_bitwise_equal(ongrid, a, "on-grid operand")
    assert_bitwise_equal(gd, gd_a, "per-row global decode")


def test_grouped_mm_quantized_equals_nvfp4_grouped_mm():
    """The experts' gate_up at the learner's shape (128 experts, top-8 of 4096 tokens, the
    token gather folded into x_index): forward, dX and dW with stochastic-rounding gradients."""
    recipe = NVFP4Recipe.strict()
    e, n, k = 128, 1536, HIDDEN
    x = _randn(TOKENS, k, seed=6).to(torch.bfloat16).requires_grad_()
    w = _randn(e, n, k, seed=7, scale=0.02).to(torch.bfloat16).requires_grad_()
    codes, scales, gd = ops.quantize(w.detach(), "16x16", "per_expert", None, "rne", 0)
    g = torch.Generator(device=DEVICE).manual_seed(8)
    perm = torch.randperm(TOKENS * 8, generator=g, device=DEVICE)
    x_index = perm // 8
    counts = torch.bincount(
        torch.randint(0, e, (TOKENS * 8,), generator=g, device=DEVICE), minlength=e
    )
    offsets = counts.cumsum(0).to(torch.int32)
    args = (
        x,
        w,
        codes,
        scales.view(torch.uint8),
        gd,
        offsets,
        None,
        recipe.numerics_key,
        None,
        3,
        x_index,
        None,
    )
    dy = _randn(TOKENS * 8, n, seed=9).to(torch.bfloat16)

    def run(op, *extra):
        gi.set_sr_state(None)
        y = op(*args, *extra)
        return (y, *torch.autograd.grad(y, (x, w), dy))

    a, gd_a = gi.quantize_triton(x.detach(), block="1x16", global_scale="per_row", out="ongrid")
    got = run(ops.nvfp4_grouped_mm_quantized, a, gd_a)
    want = run(ops.nvfp4_grouped_mm)
    for u, v, what in zip(got, want, ("y", "dX", "dW")):
        assert_bitwise_equal(u, v, what)


@pytest.mark.parametrize("groups", [1, 4, 8])
def test_expert_groups_one_read_quantize_equals_two_step(groups):
    """The expert weights' one-read quantize in expert groups (each group waits on its own
    programs: the waits run here, not in the interpreter) == the two-step form, gate_up
    [128, 1536, 2048]: on-grid values and per-expert global decodes."""
    w = _randn(128, 1536, HIDDEN, seed=10, scale=0.02).to(torch.bfloat16)
    got = gi.quantize_weight_tiles(w, "per_expert", out="ongrid", expert_groups=groups)
    want = gi.quantize_triton(
        w, block="16x16", global_scale="per_expert", out="ongrid", one_read_weights=False
    )
    assert_bitwise_equal(got[0], want[0], f"on-grid ({groups} groups)")
    assert_bitwise_equal(got[1], want[1], f"global decode ({groups} groups)")


def _fwd_bwd(model, ids, recipe):
    torch._dynamo.reset()
    model.zero_grad(set_to_none=True)
    gi.set_sr_state(None)
    compiled = torch.compile(model, backend="minite", fullgraph=True, options={"recipe": recipe})
    logits = compiled(input_ids=ids, use_cache=False).logits
    logits.float().logsumexp(-1).mean().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), grads


@pytest.mark.parametrize("dense", [False, True], ids=["moe", "dense"])
def test_pipeline_with_fusions_equals_without(dense, monkeypatch):
    recipe = NVFP4Recipe.strict()
    model = qwen3_30b_a3b_layers(layers=2, dense=dense).to(DEVICE)
    twin = copy.deepcopy(model)
    ids = torch.randint(0, 8192, (8, 512), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    logits, grads = _fwd_bwd(model, ids, recipe)
    dropped = set(gi.fusion_passes().values())
    monkeypatch.setattr(passes, "PIPELINE", tuple(p for p in passes.PIPELINE if p not in dropped))
    logits_ref, grads_ref = _fwd_bwd(twin, ids, recipe)
    assert_bitwise_equal(logits, logits_ref, "logits with vs without the fusions")
    assert grads.keys() == grads_ref.keys()
    differ = {n: count_bytes_differ(grads[n], grads_ref[n]) for n in grads}
    differ = {n: c for n, c in differ.items() if c}
    assert not differ, f"{len(differ)} of {len(grads)} gradients differ: {differ}"
