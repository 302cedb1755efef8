"""Sums over more than `ordered_sum`'s 64 elements (passes/lower_small_reductions.py): the MoE
router's load-balancing loss sums the router probabilities over every token, at any token count.

Contracts: (bitwise) a long or full sum is lowered to a fixed tree of `ordered_sum`s (chunks of
64 from the start, each in order, then the chunk sums the same way) and the Inductor-compiled
graph equals that written-out order, forward and gradient; (error budget) a Qwen3-MoE in train
mode with `output_router_logits=True` lowers completely at the token counts TRL uses (8x16,
8x64, and an uneven 8x13 with an attention mask), and its load-balancing loss and the router's
gradient equal transformers' eager ones within the float32 rounding of a sum of that many
non-negative terms."""

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.backend import lowering_only_backend
from fp4_compile.models import tiny_qwen3_moe
from fp4_compile.testing import assert_bitwise_equal


def _written_out(x: torch.Tensor, dim: int) -> torch.Tensor:
    """The tree's order in plain torch: chunks of 64 along `dim`, each summed left to right,
    then the chunk sums reduced the same way."""
    parts = list(x.unbind(dim))
    while len(parts) > 1:
        sums = []
        for i in range(0, len(parts), 64):
            acc = parts[i].clone()
            for p in parts[i + 1 : i + 64]:
                acc = acc + p
            sums.append(acc)
        parts = sums
    return parts[0]


@pytest.mark.parametrize("rows", [65, 200, 4096 + 70])
def test_long_sum_is_the_written_out_tree(rows):
    torch.manual_seed(0)
    x = torch.randn(rows, 3, requires_grad=True)
    weights = torch.randn(3)

    def f(x):
        return x.sum(0) * weights, (x * 2).sum()

    expected = (
        _written_out(x.detach(), 0) * weights,
        _written_out((x.detach() * 2).reshape(-1), 0),
    )
    reports = []
    for backend in (lowering_only_backend(NVFP4Recipe.strict(), reports), "minite"):
        torch._dynamo.reset()
        x.grad = None
        col, total = torch.compile(f, backend=backend, fullgraph=True)(x)
        assert_bitwise_equal(col, expected[0], f"sum over {rows} rows ({backend})")
        assert_bitwise_equal(total, expected[1], f"full sum of {rows * 3} ({backend})")
        (col.sum() + total).backward()
        assert_bitwise_equal(x.grad, (weights + 2).expand(rows, 3), "grad")
    assert reports[0].counts.get("ordered_sum_tree") == 2, reports[0].counts
    torch._dynamo.reset()


@pytest.mark.parametrize("batch, seq, masked", [(8, 16, False), (8, 64, False), (8, 13, True)])
def test_load_balancing_loss_lowers_at_trl_sizes(batch, seq, masked):
    model = tiny_qwen3_moe(layers=1, vocab=64, seed=1).train()
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (batch, seq))
    kw = {"use_cache": False, "output_router_logits": True}
    if masked:
        mask = torch.ones(batch, seq, dtype=torch.long)
        mask[::2, -3:] = 0  # right padding on every other row
        kw["attention_mask"] = mask
    eager = model(input_ids=ids, **kw)  # also installs transformers' output-capturing hooks
    eager.aux_loss.backward()
    router = model.model.layers[0].mlp.gate.weight
    eager_grad = router.grad.clone()
    router.grad = None
    reports = []
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=lowering_only_backend(NVFP4Recipe.strict(), reports))
    out = compiled(input_ids=ids, **kw)  # a LoweringError if a stock reduction were left
    out.aux_loss.backward()
    torch._dynamo.reset()
    assert sum(r.counts.get("ordered_sum_tree", 0) for r in reports) >= 1
    # the same loss of the lowered model's own router logits, summed by transformers eagerly:
    # sums of batch*seq non-negative probabilities per expert (then products and an E-term
    # sum); float32 summation in another order is within (n - 1) * 2^-24 relative per sum
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    cfg = model.config
    logits = tuple(t.detach() for t in out.router_logits)
    reference = load_balancing_loss_func(
        logits, cfg.num_experts, cfg.num_experts_per_tok, kw.get("attention_mask")
    )
    n = batch * seq
    budget = 3 * (n - 1) * 2.0**-24 * abs(reference.item())
    assert abs(out.aux_loss.item() - reference.item()) <= budget, (out.aux_loss, reference)
    # the router's logits differ from eager transformers' (NVFP4 layers before it), so its
    # gradient is compared loosely: it flows, and it points the same way
    assert router.grad is not None and torch.isfinite(router.grad).all()
    cos = torch.nn.functional.cosine_similarity(router.grad.flatten(), eager_grad.flatten(), 0)
    assert cos > 0.9, cos
