"""GRPO math against hand-computed cases and a float64 oracle written out loop by loop.

Contract: error budget. The functions run in FP32; the oracle is a per-token Python loop in
float64, so results agree to FP32 rounding (rtol 1e-6). Hand cases use values exact in FP32 and
are compared exactly where the arithmetic is exact.
"""

import math

import pytest
import torch

from fp4_compile.rl.train.grpo import group_advantages, policy_loss, rollout_correction


def test_group_advantages_hand_case():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.5, 0.5, 0.5, 0.5])
    adv = group_advantages(rewards, group_size=4, eps=0.0)
    # group 1: mean 0.5, population std 0.5 -> +-1; group 2: all equal -> exactly 0
    assert adv.tolist() == [1.0, -1.0, 1.0, -1.0, 0.0, 0.0, 0.0, 0.0]
    unscaled = group_advantages(rewards, group_size=4, scale="none")
    assert unscaled.tolist() == [0.5, -0.5, 0.5, -0.5, 0.0, 0.0, 0.0, 0.0]


def test_group_advantages_vs_float64():
    g = torch.Generator().manual_seed(0)
    rewards = torch.rand(24, generator=g)
    adv = group_advantages(rewards, group_size=6, eps=1e-6)
    for p in range(4):
        group = [float(x) for x in rewards[p * 6 : (p + 1) * 6]]
        mean = sum(group) / 6
        std = math.sqrt(sum((x - mean) ** 2 for x in group) / 6)
        for j, x in enumerate(group):
            assert adv[p * 6 + j].item() == pytest.approx((x - mean) / (std + 1e-6), rel=1e-5)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(group_size=3), "do not split"),
        (dict(group_size=0), "group_size"),
        (dict(group_size=2, scale="max"), "scale"),
    ],
)
def test_group_advantages_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        group_advantages(torch.zeros(4), **kwargs)


def _oracle_loss(
    logp, old, adv, mask, *, clip_low, clip_high, aggregation, weight=None, ref=None, kl_coef=0.0
):
    """Per-token float64 loop of the formulas in rl/train/grpo.py's docstring."""
    per_seq, total, count = [], 0.0, 0
    for i in range(logp.shape[0]):
        s, n = 0.0, 0
        for t in range(logp.shape[1]):
            if mask[i, t] == 0:
                continue
            ratio = math.exp(float(logp[i, t]) - float(old[i, t]))
            a = float(adv[i])
            surr = min(ratio * a, min(max(ratio, 1 - clip_low), 1 + clip_high) * a)
            tok = -surr * (float(weight[i, t]) if weight is not None else 1.0)
            if ref is not None and kl_coef > 0:
                d = float(ref[i, t]) - float(logp[i, t])
                tok += kl_coef * (math.exp(d) - d - 1)
            s, n = s + tok, n + 1
        total, count = total + s, count + n
        if n:
            per_seq.append(s / n)
    return total / count if aggregation == "token" else sum(per_seq) / len(per_seq)


def _batch(seed):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(5, 7, generator=g) * 3
    old = logp + 0.4 * (torch.rand(5, 7, generator=g) - 0.5)  # ratios in ~[0.82, 1.22]: some clip
    adv = torch.randn(5, generator=g)
    mask = (torch.rand(5, 7, generator=g) > 0.3).float()
    mask[2] = 0.0  # a sequence without tokens weighs nothing
    mask[0, 0] = 1.0
    return logp, old, adv, mask


@pytest.mark.parametrize("aggregation", ["token", "sequence"])
def test_policy_loss_vs_float64(aggregation):
    logp, old, adv, mask = _batch(1)
    ref = logp - 0.3
    weight = torch.rand(5, 7, generator=torch.Generator().manual_seed(2)) + 0.5
    loss, stats = policy_loss(
        logp,
        old,
        adv,
        mask,
        clip_low=0.1,
        clip_high=0.15,
        aggregation=aggregation,
        is_weight=weight,
        ref_logp=ref,
        kl_coef=0.05,
    )
    want = _oracle_loss(
        logp.double(),
        old.double(),
        adv.double(),
        mask,
        clip_low=0.1,
        clip_high=0.15,
        aggregation=aggregation,
        weight=weight.double(),
        ref=ref.double(),
        kl_coef=0.05,
    )
    assert loss.item() == pytest.approx(want, rel=1e-5)
    assert 0.0 < stats["loss/clip_frac"].item() < 1.0


def test_policy_loss_on_policy_gradient_is_advantage_weighted_score():
    """At ratio 1 (one update per batch) d loss / d logp_t = -A_i / num_tokens (token mean)."""
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.25]], requires_grad=True)
    adv = torch.tensor([2.0, -1.0])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, stats = policy_loss(logp, logp.detach(), adv, mask, aggregation="token")
    loss.backward()
    want = torch.tensor([[-2.0 / 3, -2.0 / 3], [1.0 / 3, 0.0]])
    torch.testing.assert_close(logp.grad, want, rtol=1e-6, atol=0)
    assert loss.item() == pytest.approx(-(2 + 2 - 1) / 3)
    assert stats["loss/clip_frac"].item() == 0.0 and stats["loss/ratio_mean"].item() == 1.0


def test_policy_loss_clip_hand_case():
    """ratio 2 with A > 0 is clipped at 1 + clip_high (no gradient); ratio 0.5 with A > 0 is not."""
    old = torch.zeros(1, 2)
    logp = torch.tensor([[math.log(2.0), math.log(0.5)]], requires_grad=True)
    loss, stats = policy_loss(
        logp, old, torch.tensor([1.0]), torch.ones(1, 2), clip_low=0.2, clip_high=0.2
    )
    assert loss.item() == pytest.approx(-(1.2 + 0.5) / 2)
    loss.backward()
    assert logp.grad[0, 0].item() == 0.0
    assert logp.grad[0, 1].item() == pytest.approx(-0.5 / 2)
    assert stats["loss/clip_frac"].item() == 0.5


def test_policy_loss_errors():
    z = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="aggregation"):
        policy_loss(z, z, torch.zeros(2), z, aggregation="batch")
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(z, z, torch.zeros(3), z)
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(z, z, torch.zeros(2), z, kl_coef=0.1)


def test_tis_hand_case():
    old = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    rollout = torch.log(torch.tensor([[0.1, 0.3, 0.4]]))  # ratios 5, 1, 0.5
    mask = torch.ones(1, 3)
    w, keep, stats = rollout_correction(old, rollout, mask, tis_cap=2.0)
    assert w.tolist()[0] == pytest.approx([2.0, 1.0, 0.5], rel=1e-6)
    assert keep.tolist() == [[1.0, 1.0, 1.0]]
    assert stats["correction/tis_clipped_frac"].item() == pytest.approx(1 / 3)


def test_token_mis_hand_case():
    old = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    rollout = torch.log(torch.tensor([[0.1, 0.3, 0.4]]))
    w, keep, stats = rollout_correction(old, rollout, torch.ones(1, 3), mis_token_bounds=(0.6, 2.0))
    assert w.tolist() == [[1.0, 1.0, 1.0]]
    assert keep.tolist() == [[0.0, 1.0, 0.0]]
    assert stats["correction/masked_token_frac"].item() == pytest.approx(2 / 3)


def test_seq_mis_hand_case():
    """Sequence 0: ratios 2 * 2 = 4 > high -> rejected; sequence 1: 2 * 0.5 = 1 -> kept; the
    padded token (mask 0) of sequence 1 does not count even though its ratio is huge."""
    old = torch.log(torch.tensor([[0.4, 0.4, 0.9], [0.4, 0.1, 0.9]]))
    rollout = torch.log(torch.tensor([[0.2, 0.2, 0.9], [0.2, 0.2, 0.001]]))
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    w, keep, stats = rollout_correction(old, rollout, mask, mis_seq_bounds=(0.5, 2.0))
    assert keep.tolist() == [[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]
    assert stats["correction/rejected_seq_frac"].item() == 0.5


def test_correction_identity_when_aligned():
    logp, _, _, mask = _batch(3)
    w, keep, stats = rollout_correction(
        logp, logp.clone(), mask, tis_cap=2.0, mis_seq_bounds=(0.5, 2.0)
    )
    assert torch.equal(w, torch.ones_like(w)) and torch.equal(keep, mask)
    assert stats["correction/rejected_seq_frac"].item() == 0.0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(tis_cap=0.5), "tis_cap"),
        (dict(mis_seq_bounds=(1.5, 2.0)), "mis_seq_bounds"),
        (dict(mis_token_bounds=(0.5, 0.9)), "mis_token_bounds"),
    ],
)
def test_correction_errors(kwargs, match):
    z = torch.zeros(1, 2)
    with pytest.raises(ValueError, match=match):
        rollout_correction(z, z, torch.ones(1, 2), **kwargs)


@pytest.mark.parametrize("aggregation", ["token", "sequence"])
def test_policy_loss_shards_with_global_denominators_sum_to_the_whole(aggregation):
    """Data-parallel split: each half's loss and stats with the GLOBAL token / sequence counts
    add up to the loss and stats of the whole batch."""
    g = torch.Generator().manual_seed(3)
    logp = -torch.rand(4, 6, generator=g, dtype=torch.float64)
    old = logp + 0.1 * torch.randn(4, 6, generator=g, dtype=torch.float64)
    adv = torch.tensor([1.0, -0.5, 0.25, -2.0], dtype=torch.float64)
    mask = torch.tensor(
        [[1] * 6, [1] * 2 + [0] * 4, [0] * 6, [1] * 4 + [0] * 2], dtype=torch.float64
    )
    whole, whole_stats = policy_loss(logp, old, adv, mask, aggregation=aggregation)
    tokens, seqs = mask.sum(), (mask.sum(1) > 0).to(mask.dtype).sum()
    parts = [
        policy_loss(
            logp[i],
            old[i],
            adv[i],
            mask[i],
            aggregation=aggregation,
            global_tokens=tokens,
            global_seqs=seqs,
        )
        for i in (slice(0, 2), slice(2, 4))
    ]
    assert float(parts[0][0] + parts[1][0]) == pytest.approx(float(whole), rel=1e-12)
    for k in whole_stats:
        if k != "loss/policy":
            total = parts[0][1][k] + parts[1][1][k]
            assert float(total) == pytest.approx(float(whole_stats[k]), rel=1e-12), k
