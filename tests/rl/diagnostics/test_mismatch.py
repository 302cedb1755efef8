"""Mismatch metrics: exact values on hand-made inputs (float64 oracle), identical inputs give
the contract values (kl 0, ratio 1, all bitwise equal), one host sync."""

import math

import pytest
import torch

from fp4_compile.rl.diagnostics.mismatch import (
    METRIC_NAMES,
    mismatch_metrics,
    pack_ragged,
    warnings_for,
)


def test_identical_logprobs_give_contract_values():
    lp = -torch.rand(3, 5) * 3
    m = mismatch_metrics(lp, lp.clone(), torch.ones(3, 5))
    assert set(m) == set(METRIC_NAMES)
    assert m["rollout_corr/kl"] == 0.0 and m["rollout_corr/k3_kl"] == 0.0
    assert m["token_mult_prob_error"] == 1.0 and m["mismatch/max_abs_dlogp"] == 0.0
    assert m["mismatch/frac_bitwise_equal"] == 1.0
    assert m["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(1.0, abs=1e-15)
    assert m["training/rollout_actor_probs_pearson_corr"] == pytest.approx(1.0, abs=1e-12)
    assert warnings_for(m) == []


def test_values_match_a_float64_oracle():
    lt = torch.tensor([[-1.0, -2.0, -0.5]])
    lr = torch.tensor([[-1.1, -1.8, -0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # last token masked out
    m = mismatch_metrics(lt, lr, mask)
    d = [(-1.0) - (-1.1), (-2.0) - (-1.8)]
    d = [float(torch.tensor(a, dtype=torch.float32)) for a in d]
    a = [float(torch.tensor(x)) for x in (-1.0, -2.0)]
    b = [float(torch.tensor(x, dtype=torch.float32)) for x in (-1.1, -1.8)]
    kl = sum(bi - ai for ai, bi in zip(a, b)) / 2
    k3 = sum(math.exp(ai - bi) - 1 - (ai - bi) for ai, bi in zip(a, b)) / 2
    assert m["rollout_corr/kl"] == pytest.approx(kl, rel=1e-12)
    assert m["rollout_corr/k3_kl"] == pytest.approx(k3, rel=1e-12)
    assert m["token_mult_prob_error"] == pytest.approx(
        sum(math.exp(abs(x)) for x in d) / 2, rel=1e-6
    )
    assert m["mismatch/max_abs_dlogp"] == pytest.approx(max(abs(x) for x in d), rel=1e-6)
    assert m["mismatch/frac_bitwise_equal"] == 0.0
    chi2 = sum(math.exp(2 * (ai - bi)) for ai, bi in zip(a, b)) / 2 - 1
    assert m["rollout_corr/chi2_token"] == pytest.approx(chi2, rel=1e-12)


def test_warnings_fire():
    lt = torch.zeros(1, 4)
    lr = torch.full((1, 4), -1.0)
    assert "token_mult_prob_error" in warnings_for(mismatch_metrics(lt, lr, torch.ones(1, 4)))


def test_shape_errors_and_ragged_packing():
    with pytest.raises(ValueError, match="same \\[B, T\\] shape"):
        mismatch_metrics(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))
    packed, mask = pack_ragged([torch.tensor([-1.0, -2.0]), torch.tensor([-3.0])])
    assert packed.tolist() == [[-1.0, -2.0], [-3.0, 0.0]] and mask.tolist() == [[1, 1], [1, 0]]
