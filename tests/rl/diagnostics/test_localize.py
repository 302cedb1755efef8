"""Localization of learner/rollout gaps: identical views report nothing, a perturbed layer is
found at the right layer and position."""

import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.models import tiny_qwen3
from fp4_compile.rl.diagnostics.localize import (
    compare_states,
    learner_hidden_states,
    localize_divergence,
    rollout_hidden_states,
)
from fp4_compile.rollout.step import RolloutStep


def _sequences():
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 128, (n,), generator=g).tolist() for n in (5, 9, 3)]
    return [p + torch.randint(0, 128, (4,), generator=g).tolist() for p in prompts], [5, 9, 3]


def test_strict_learner_and_rollout_agree_bitwise_batched():
    model = tiny_qwen3(dtype=torch.bfloat16).eval()
    seqs, plens = _sequences()
    loc = localize_divergence(model, seqs, plens, recipe=NVFP4Recipe.strict())
    assert loc.first_divergent is None, loc.table()
    assert all(g.first_position is None for g in loc.layers)


def test_perturbed_layer_is_located():
    model = tiny_qwen3(layers=2).eval()
    seqs, plens = _sequences()
    ref = learner_hidden_states(model, seqs, device="cpu")
    step = RolloutStep(model, return_hidden=True)
    got = rollout_hidden_states(step, model, seqs, plens, device="cpu")
    # eager float32 prefill vs full forward may differ by rounding; perturb a copy instead
    bumped = [[t.clone() for t in s] for s in ref]
    bumped[1][2][6] += 1.0  # sequence 1, after layer 1, position 6
    loc = compare_states(ref, bumped)
    assert loc.first_divergent == "layer 1"
    assert loc.layers[2].first_position == len(seqs[0]) + 6
    assert loc.layers[2].num_differing == model.config.hidden_size
    assert len(got) == 3 and got[0][0].shape == ref[0][0].shape
