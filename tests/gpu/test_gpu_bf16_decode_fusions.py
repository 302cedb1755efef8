"""The bf16 recipe's decode fusions on the GPU (compiled Triton kernels, CUDA graphs), two
Qwen3-30B-A3B-shaped layers (MoE, and the dense MLP of the same width), vocab 8192:
q/k/v and gate/up as one `invariant_linear` each over the group's BF16 buffer
(`passes/fuse_group_linears.py`), the experts' gather read by the grouped GEMM
(`passes/fold_expert_gathers.py`) and its unit scales made once.

Bitwise: an engine with the fusions generates the same tokens and log-probs (raw bytes) as one
without them (fuse_groups off, the BF16 gather fold off), and its log-probs == the learner's
sequence log-probs; both again after `update_weights` with changed weights.
"""

import copy
import importlib
from unittest import mock

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.models import qwen3_30b_a3b_layers
from fp4_compile.rl import RolloutEngine, sequence_logprobs
from fp4_compile.testing import count_bytes_differ

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
RECIPE = NVFP4Recipe.bf16()
BATCH, NEW_TOKENS, MAX_SEQ_LEN = 8, 24, 96
folds = importlib.import_module("fp4_compile.passes.fold_expert_gathers")


def _prompts(vocab):
    g = torch.Generator().manual_seed(5)
    return [
        torch.randint(0, vocab, (int(n),), generator=g).tolist()
        for n in torch.randint(4, 40, (BATCH,), generator=g)
    ]


def _differ(a, b) -> dict:
    counts = [count_bytes_differ(x.cpu(), y.cpu()) for x, y in zip(a, b)]
    return {i: n for i, n in enumerate(counts) if n}


def _generate(engine, prompts):
    return engine.generate(prompts, max_new_tokens=NEW_TOKENS, temperature=1.0, seed=0)


def _check(model, fused, plain, prompts, what):
    out = _generate(fused, prompts)
    with mock.patch.object(folds, "_fold_bf16", lambda graph, node, report: None):
        ref = _generate(plain, prompts)
    assert out.tokens == ref.tokens, what
    assert not _differ(out.logprobs, ref.logprobs), f"{what}: fused vs unfused engine"
    learner = torch.compile(model, backend="minite", options={"recipe": RECIPE})
    with torch.no_grad():
        train = sequence_logprobs(
            learner,
            [p + t for p, t in zip(prompts, out.tokens)],
            [len(p) for p in prompts],
            temperature=1.0,
        )
    assert not _differ(train, out.logprobs), f"{what}: engine vs learner"
    return out


@pytest.mark.parametrize("dense", [False, True], ids=["moe", "dense"])
def test_bf16_fusions_bitwise(dense):
    torch._dynamo.reset()
    model = qwen3_30b_a3b_layers(layers=2, device=DEVICE, dense=dense).eval()
    fused = RolloutEngine(
        copy.deepcopy(model),
        recipe=RECIPE,
        max_batch=BATCH,
        max_seq_len=MAX_SEQ_LEN,
        cuda_graphs=True,
    )
    plain = RolloutEngine(
        copy.deepcopy(model),
        recipe=RECIPE,
        max_batch=BATCH,
        max_seq_len=MAX_SEQ_LEN,
        cuda_graphs=True,
    )
    plain.weight_store.fuse_groups = False
    prompts = _prompts(model.config.vocab_size)
    before = _check(model, fused, plain, prompts, "before the update")
    assert fused.weight_store.groups_fused > 0 and plain.weight_store.groups_fused == 0
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(1.5)
    fused.update_weights(model)
    plain.update_weights(model)
    after = _check(model, fused, plain, prompts, "after update_weights")
    assert after.tokens != before.tokens, "the update must change the rollout (else no test)"
