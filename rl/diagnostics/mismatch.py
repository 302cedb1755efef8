"""Learner/rollout mismatch metrics, under the names users already read (verl, NeMo RL).

Inputs: learner log-probs `logp_train` and rollout log-probs `logp_rollout` of the SAME sampled
tokens, [B, T] FP32, and a 0/1 `mask` [B, T] of real (generated) tokens. Every metric is computed
on the device; `mismatch_metrics` syncs once (one `.tolist()`) at the end.

Definitions (ratio r = pi_train / pi_rollout = exp(logp_train - logp_rollout), means over
masked tokens unless stated):
- training/rollout_probs_diff_{max,mean,std}: |exp(logp_train) - exp(logp_rollout)| (verl)
- training/rollout_actor_probs_pearson_corr: Pearson correlation of the two probabilities
- rollout_corr/kl: mean(logp_rollout - logp_train), the k1 estimate of KL(rollout || train)
- rollout_corr/k3_kl: mean(r - 1 - log r), the k3 estimate of the same KL (never negative)
- rollout_corr/chi2_token: mean(r^2) - 1;  rollout_corr/chi2_seq: mean over sequences of
  prod_t r_t^2, minus 1
- rollout_corr/ppl_ratio: exp(mean(-logp_train)) / exp(mean(-logp_rollout)) (per token, pooled);
  rollout_corr/log_ppl_abs_diff: |mean(-logp_train) - mean(-logp_rollout)|
- rollout_corr/rollout_is_mean: mean(r); rollout_corr/rollout_is_eff_sample_size:
  (sum r)^2 / (n * sum r^2), in (0, 1]
- token_mult_prob_error: mean(exp(|logp_train - logp_rollout|)) (NeMo RL; flag above 1.05)
- gen_kl_error: the k3 estimate of KL(generation || training), as rollout_corr/k3_kl; NeMo RL
  reads values below 1e-3 as acceptable
- mismatch/max_abs_dlogp and mismatch/frac_bitwise_equal (minite's own: the contract is 0 and 1)

Warning levels (verl): |kl| > 0.1, chi2_token > 1, ESS < 0.3; NeMo: token_mult_prob_error > 1.05.
"""

from __future__ import annotations

import torch

METRIC_NAMES = (
    "training/rollout_probs_diff_max",
    "training/rollout_probs_diff_mean",
    "training/rollout_probs_diff_std",
    "training/rollout_actor_probs_pearson_corr",
    "rollout_corr/kl",
    "rollout_corr/k3_kl",
    "rollout_corr/chi2_token",
    "rollout_corr/chi2_seq",
    "rollout_corr/ppl_ratio",
    "rollout_corr/log_ppl_abs_diff",
    "rollout_corr/rollout_is_mean",
    "rollout_corr/rollout_is_eff_sample_size",
    "token_mult_prob_error",
    "gen_kl_error",
    "mismatch/max_abs_dlogp",
    "mismatch/frac_bitwise_equal",
)


def _check(logp_train, logp_rollout, mask):
    if logp_train.shape != logp_rollout.shape or logp_train.shape != mask.shape:
        raise ValueError(
            f"logp_train {tuple(logp_train.shape)}, logp_rollout {tuple(logp_rollout.shape)} and mask "
            f"{tuple(mask.shape)} must have the same [B, T] shape"
        )
    if logp_train.dim() != 2:
        raise ValueError(f"expected [B, T] tensors, got {logp_train.dim()} dimensions")


def mismatch_tensors(
    logp_train: torch.Tensor, logp_rollout: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """All metrics as 0-d device tensors (no host sync)."""
    _check(logp_train, logp_rollout, mask)
    m = mask.to(torch.float64)
    n = m.sum().clamp(min=1.0)
    lt, lr = logp_train.double(), logp_rollout.double()
    lt, lr = torch.where(m > 0, lt, 0.0), torch.where(m > 0, lr, 0.0)

    def mean(x):
        return (x * m).sum() / n

    pt, pr = lt.exp(), lr.exp()
    diff = (pt - pr).abs()
    diff_mean = mean(diff)
    diff_std = (mean((diff - diff_mean) ** 2)).sqrt()
    cov = mean((pt - mean(pt)) * (pr - mean(pr)))
    var_t, var_r = mean((pt - mean(pt)) ** 2), mean((pr - mean(pr)) ** 2)
    corr = torch.where(
        (var_t > 0) & (var_r > 0), cov / (var_t * var_r).sqrt(), torch.ones_like(cov)
    )
    log_r = lt - lr
    r = log_r.exp()
    k3 = mean(r - 1 - log_r)
    seq_has = (m.sum(dim=1) > 0).to(torch.float64)
    chi2_seq = (
        (torch.exp(2 * (log_r * m).sum(dim=1)) * seq_has).sum() / seq_has.sum().clamp(min=1)
    ) - 1
    nll_t, nll_r = mean(-lt), mean(-lr)
    r_masked = r * m
    ess = r_masked.sum() ** 2 / (n * (r_masked**2).sum()).clamp(min=1e-300)
    equal = (logp_train.view(torch.int32) == logp_rollout.view(torch.int32)).to(torch.float64)
    return {
        "training/rollout_probs_diff_max": (diff * m).max(),
        "training/rollout_probs_diff_mean": diff_mean,
        "training/rollout_probs_diff_std": diff_std,
        "training/rollout_actor_probs_pearson_corr": corr,
        "rollout_corr/kl": mean(lr - lt),
        "rollout_corr/k3_kl": k3,
        "rollout_corr/chi2_token": mean(r**2) - 1,
        "rollout_corr/chi2_seq": chi2_seq,
        "rollout_corr/ppl_ratio": torch.exp(nll_t - nll_r),
        "rollout_corr/log_ppl_abs_diff": (nll_t - nll_r).abs(),
        "rollout_corr/rollout_is_mean": mean(r),
        "rollout_corr/rollout_is_eff_sample_size": ess,
        "token_mult_prob_error": mean(torch.exp((lt - lr).abs())),
        "gen_kl_error": k3,
        "mismatch/max_abs_dlogp": ((lt - lr).abs() * m).max(),
        "mismatch/frac_bitwise_equal": mean(equal),
    }


def mismatch_metrics(
    logp_train: torch.Tensor, logp_rollout: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """All metrics as Python floats, with ONE host sync."""
    tensors = mismatch_tensors(logp_train, logp_rollout, mask)
    values = torch.stack([tensors[k].reshape(()) for k in METRIC_NAMES]).tolist()
    return dict(zip(METRIC_NAMES, values))


def pack_ragged(per_sequence: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """List of [T_i] tensors -> ([B, T_max] zero-padded, [B, T_max] mask)."""
    t_max = max((int(x.numel()) for x in per_sequence), default=0)
    out = torch.zeros((len(per_sequence), t_max), dtype=torch.float32)
    mask = torch.zeros((len(per_sequence), t_max), dtype=torch.float32)
    for i, x in enumerate(per_sequence):
        out[i, : x.numel()] = x.float().cpu()
        mask[i, : x.numel()] = 1
    return out, mask


WARNINGS = {
    "rollout_corr/kl": lambda v: abs(v) > 0.1,
    "rollout_corr/chi2_token": lambda v: v > 1.0,
    "rollout_corr/rollout_is_eff_sample_size": lambda v: v < 0.3,
    "token_mult_prob_error": lambda v: v > 1.05,
}


def warnings_for(metrics: dict[str, float]) -> list[str]:
    return [name for name, bad in WARNINGS.items() if name in metrics and bad(metrics[name])]
