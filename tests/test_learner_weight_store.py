"""The learner's weights quantized once per version (`fp4_compile.compile(...,
quantize_weights="on_change")`, `fp4_compile/rollout/weight_store.py`): the same bits as the
per-call quantize, forward and every gradient, across optimizer steps with gradient
accumulation; one quantize per optimizer step, not per micro-batch; in-place edits outside the
optimizer are seen; replaced parameters are refused."""

from __future__ import annotations

import copy

import pytest
import torch

import fp4_compile
from fp4_compile.models import tiny_qwen3, tiny_qwen3_moe
from fp4_compile.sr_stream import set_sr_state, sr_state

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

STEPS, MICRO = 3, 2


def _batches(vocab: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, vocab, (2, 32), generator=g) for _ in range(STEPS * MICRO)]


def _train(model, quantize_weights: str, batches, sr, *, fused: bool = False):
    """STEPS AdamW steps of MICRO micro-batches each: (per micro-batch logits, per step grads,
    the compiled model)."""
    set_sr_state(sr)
    torch._dynamo.reset()
    compiled = fp4_compile.compile(model, recipe="strict", quantize_weights=quantize_weights)
    # fused: torch's fused AdamW writes the parameters without bumping their version counters
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused)
    logits, grads = [], []
    for step in range(STEPS):
        for ids in batches[step * MICRO : (step + 1) * MICRO]:
            out = compiled(input_ids=ids, use_cache=False).logits
            out.float().logsumexp(-1).mean().backward()
            logits.append(out.detach().clone())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad(set_to_none=True)
    return logits, grads, compiled


def _store(compiled):
    return compiled.minite_weight_store


@pytest.mark.parametrize(
    "build, fused",
    [(tiny_qwen3, False), (tiny_qwen3, True), (tiny_qwen3_moe, False)],
    ids=["qwen3", "qwen3_fused_adamw", "qwen3_moe"],
)
def test_on_change_is_bitwise_the_per_call_quantize_with_one_quantize_per_step(build, fused):
    base = build(layers=1)
    batches = _batches(base.config.vocab_size)
    sr = sr_state()
    want_logits, want_grads, _ = _train(copy.deepcopy(base), "every_call", batches, sr, fused=fused)
    model = copy.deepcopy(base)
    got_logits, got_grads, compiled = _train(model, "on_change", batches, sr, fused=fused)
    for i, (w, g) in enumerate(zip(want_logits, got_logits)):
        assert torch.equal(w, g), f"micro-batch {i}: logits differ"
    for step, (w, g) in enumerate(zip(want_grads, got_grads)):
        bad = [n for n in w if not torch.equal(w[n], g[n])]
        assert not bad, f"step {step}: gradients differ for {bad}"
    store = _store(compiled)
    assert store.sites_bound > 0, "no weight quantize was bound to the store"
    # quantized at the first call, then once at the first call after each of the first
    # STEPS - 1 optimizer steps: never per micro-batch
    assert store.refreshes == STEPS - 1


def test_on_change_sees_in_place_edits_and_refuses_replaced_parameters():
    model = tiny_qwen3(layers=1)
    ids = torch.randint(
        0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(3)
    )
    torch._dynamo.reset()
    compiled = fp4_compile.compile(model, recipe="strict", quantize_weights="on_change")
    with torch.no_grad():
        before = compiled(input_ids=ids, use_cache=False).logits
        again = compiled(input_ids=ids, use_cache=False).logits
        assert _store(compiled).refreshes == 0 and torch.equal(before, again)
        proj = model.model.layers[0].mlp.down_proj.weight
        proj.mul_(4.0)  # an edit outside any optimizer
        edited = compiled(input_ids=ids, use_cache=False).logits
        assert _store(compiled).refreshes == 1
        torch._dynamo.reset()
        want = fp4_compile.compile(model, recipe="strict")(input_ids=ids, use_cache=False).logits
    assert not torch.equal(edited, before), "the edit did not reach the logits"
    assert torch.equal(edited, want), "the store served stale quantized bytes after an edit"
    model.model.layers[0].mlp.down_proj.weight = torch.nn.Parameter(proj.detach().clone())
    with pytest.raises(ValueError, match="down_proj.weight.*no longer the tensor"):
        _store(compiled).refresh_if_changed()


def test_quantize_weights_is_checked():
    with pytest.raises(ValueError, match="quantize_weights must be one of"):
        fp4_compile.compile(tiny_qwen3(layers=1), quantize_weights="per_step")
