"""The learner's weights quantized once per version (`fp4_compile.compile(...,
quantize_weights="on_change")`, `fp4_compile/rollout/weight_store.py`): bitwise the per-call
quantize, forward and every gradient, across optimizer steps (fused and unfused AdamW) with
gradient accumulation; one write of each weight per optimizer step, none per micro-batch;
in-place edits outside the optimizer are seen (only the edited entry rewritten); replaced
parameters are refused. The on-grid form (what the learner reads on CUDA: the lowering gives a
weight an on-grid copy, `gemm.forward_uses_ongrid`) is lowered here as on CUDA: the store then
holds the copy, the bound graphs read it (no decode per call), and every GEMM call's copy is
checked against the decode of its packed bytes (the CPU GEMMs compute from the packed bytes)."""

from __future__ import annotations

import contextlib
import copy
import importlib
from unittest import mock

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

import fp4_compile
from fp4_compile.codegen.nvfp4 import gemm
from fp4_compile.codegen.nvfp4.gemm_call import GemmCall, is_gemm
from fp4_compile.models import tiny_qwen3, tiny_qwen3_moe
from fp4_compile.rollout.weight_store import WeightStore
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
    assert store.entry_writes == STEPS * len(store.entries), "one write per weight per step"


@contextlib.contextmanager
def _lowered_as_on_cuda():
    """Lower as on CUDA at >= ONGRID_FORWARD_MIN_ROWS rows (every weight gets its on-grid
    copy), keeping the packed bytes the CPU GEMMs compute from; check every GEMM call's copy
    against the decode of its packed bytes. Yields (bound graphs, checked GEMM calls)."""
    skip = importlib.import_module("fp4_compile.passes.skip_unread_packed_weights")
    real_check, real_bind = gemm.check_weight, WeightStore.bind_dynamo_graph
    bound, checked = [], []

    def check_weight(x, w_codes, w_scales, w_gd, *, experts, w_ongrid=None):
        real = not isinstance(w_codes, FakeTensor) and w_codes.device.type != "meta"
        if real and w_ongrid is not None:
            decoded = torch.ops.fp4_compile.ongrid_weight(w_codes, w_scales)
            assert torch.equal(decoded, w_ongrid), "a GEMM got an on-grid copy of other bytes"
            checked.append(tuple(w_ongrid.shape))
        return real_check(x, w_codes, w_scales, w_gd, experts=experts, w_ongrid=w_ongrid)

    def bind(store, gm, example_inputs, report=None):
        out = real_bind(store, gm, example_inputs, report)
        bound.append(out[0])
        return out

    with (
        mock.patch.object(gemm, "forward_uses_ongrid", lambda device_type, rows: True),
        mock.patch.object(skip, "packed_bytes_unread", lambda q, *a: False),
        mock.patch.object(gemm, "check_weight", check_weight),
        mock.patch.object(WeightStore, "bind_dynamo_graph", bind),
    ):
        yield bound, checked


@pytest.mark.parametrize(
    "build, fused", [(tiny_qwen3, False), (tiny_qwen3_moe, True)], ids=["qwen3", "qwen3_moe_fused"]
)
def test_on_change_reads_its_stored_ongrid_copies_bitwise(build, fused):
    base = build(layers=1)
    batches = _batches(base.config.vocab_size)
    sr = sr_state()
    with _lowered_as_on_cuda() as (bound, checked):
        want_logits, want_grads, _ = _train(
            copy.deepcopy(base), "every_call", batches, sr, fused=fused
        )
        every_call_checks = len(checked)
        got_logits, got_grads, compiled = _train(
            copy.deepcopy(base), "on_change", batches, sr, fused=fused
        )
    assert every_call_checks > 0, "the every-call lowering gave no GEMM an on-grid copy"
    assert len(checked) - every_call_checks == every_call_checks, "GEMMs without their copy"
    for i, (w, g) in enumerate(zip(want_logits, got_logits)):
        assert torch.equal(w, g), f"micro-batch {i}: logits differ"
    for step, (w, g) in enumerate(zip(want_grads, got_grads)):
        bad = [n for n in w if not torch.equal(w[n], g[n])]
        assert not bad, f"step {step}: gradients differ for {bad}"
    store = _store(compiled)
    assert store.entries and all(e.ongrid is not None for e in store.entries.values())
    assert store.entry_writes == STEPS * len(store.entries), "one write per weight per step"
    ops = torch.ops.fp4_compile
    assert bound, "no graph was bound to the store"
    for gm in bound:
        nodes = list(gm.graph.nodes)
        per_call = [
            n.name
            for n in nodes
            if n.target in (ops.ongrid_weight.default, ops.quantize_with_ongrid.default)
        ]
        assert not per_call, f"the bound graph still decodes / quantizes weights: {per_call}"
        gemms = [n for n in nodes if is_gemm(n, "nvfp4_linear", "nvfp4_grouped_mm")]
        copies = [GemmCall.of(n).w_ongrid for n in gemms]
        assert gemms and all(c is not None and c.op == "placeholder" for c in copies)
        stored = [n for n in nodes if n.op == "placeholder" and n.name.startswith("minite_store")]
        static = [n.meta.get("tensor_dict", {}).get("_dynamo_static_input_type") for n in stored]
        assert stored and all(static), "store inputs must be static (CUDA graphs: no copy)"


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
        writes = _store(compiled).entry_writes
        proj.mul_(4.0)  # an edit outside any optimizer
        edited = compiled(input_ids=ids, use_cache=False).logits
        assert _store(compiled).refreshes == 1
        assert _store(compiled).entry_writes == writes + 1, "only the edited entry is rewritten"
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
