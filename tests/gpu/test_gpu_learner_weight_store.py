"""The learner's weights quantized once per version on the GPU (`fp4_compile.compile(...,
quantize_weights="on_change")`, the store of `fp4_compile/rollout/weight_store.py`): bitwise the
per-call quantize, forward and every gradient, over AdamW steps, on Qwen3-30B-A3B-shaped layers
at 4096 tokens (every weight on the on-grid GEMM path: the store holds the on-grid copies, the
forward and dgrad read them), with and without CUDA graphs."""

import copy

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.models import qwen3_30b_a3b_layers
from fp4_compile.rollout.weight_store import WeightStore
from fp4_compile.sr_stream import set_sr_state, sr_state

pytestmark = pytest.mark.gpu

STEPS = 2


def _train(model, on_change: bool, cuda_graphs: bool, ids, sr):
    set_sr_state(sr)
    torch._dynamo.reset()
    options = {"recipe": NVFP4Recipe.strict(), "cuda_graphs": cuda_graphs}
    store = None
    if on_change:
        store = WeightStore.for_learner(model)
        options["weight_store"] = store
    compiled = torch.compile(model, backend="minite", options=options)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    logits, grads = [], []
    for _ in range(STEPS):
        torch.compiler.cudagraph_mark_step_begin()
        out = compiled(input_ids=ids, use_cache=False).logits
        out.float().logsumexp(-1).mean().backward()
        logits.append(out.detach().clone())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad(set_to_none=True)
    return logits, grads, store


@pytest.mark.parametrize("cuda_graphs", [False, True], ids=["launches", "cuda_graphs"])
def test_on_change_equals_every_call_on_the_gpu(cuda_graphs):
    base = qwen3_30b_a3b_layers(layers=1, device="cuda")
    ids = torch.randint(0, 8192, (8, 512), device="cuda", generator=None)
    sr = sr_state()
    want_logits, want_grads, _ = _train(copy.deepcopy(base), False, cuda_graphs, ids, sr)
    got_logits, got_grads, store = _train(copy.deepcopy(base), True, cuda_graphs, ids, sr)
    assert store.sites_bound > 0
    assert store.refreshes == STEPS - 1
    assert store.entry_writes == STEPS * len(store.entries), "one write per weight per step"
    # every weight on the on-grid GEMM path: the store holds the copies the graphs read
    assert all(e.ongrid is not None for e in store.entries.values())
    for step in range(STEPS):
        assert torch.equal(want_logits[step], got_logits[step]), f"step {step}: logits differ"
        bad = [
            n for n in want_grads[step] if not torch.equal(want_grads[step][n], got_grads[step][n])
        ]
        assert not bad, f"step {step}: gradients differ for {bad}"
