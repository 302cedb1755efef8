"""GRPO math: group-normalized advantages, the clipped policy-ratio loss, KL to a reference
policy, and rollout corrections for recipes whose rollout is not bitwise the learner.

Shape legend: N sequences (= P prompts x G samples, grouped contiguously: sequence i belongs to
prompt i // G), T target positions; every per-token tensor is [N, T] with a 0/1 `mask` of the
generated tokens. Three log-probs of the same sampled tokens appear:
  logp          the learner now (carries the gradient),
  old_logp      the learner before this batch's first update (detached; pi_old),
  rollout_logp  the rollout engine that sampled them (pi_behavior).
Under the strict recipe old_logp == rollout_logp bitwise and the corrections are the identity.

Formulas (each per token t of sequence i, A_i the sequence's advantage):
  ratio       = exp(logp - old_logp)
  surrogate   = min(ratio * A_i, clip(ratio, 1 - clip_low, 1 + clip_high) * A_i)
  kl (k3)     = exp(ref_logp - logp) - (ref_logp - logp) - 1        (KL(pi || ref), >= 0)
  token loss  = -is_weight * surrogate + kl_coef * kl
Aggregation: "token" = sum(token loss * mask) / sum(mask) (every token weighs the same, DAPO);
"sequence" = mean over sequences of each sequence's token mean (the original GRPO).

Rollout correction (weights are detached; they reweight, never carry gradient):
  token TIS:   is_weight = min(exp(old_logp - rollout_logp), tis_cap)
  token MIS:   a token whose ratio exp(old_logp - rollout_logp) leaves [low, high] is masked out
  seq MIS:     a sequence whose ratio prod_t exp(old_logp - rollout_logp) leaves [low, high] is
               rejected (all its tokens masked out); the product is formed in log space.
"""

from __future__ import annotations

import math

import torch

AGGREGATIONS = ("token", "sequence")
ADVANTAGE_SCALES = ("std", "none")


def group_advantages(
    rewards_N: torch.Tensor, *, group_size: int, scale: str = "std", eps: float = 1e-6
) -> torch.Tensor:
    """(r - mean of its group) / (std of its group + eps), groups of `group_size` consecutive
    sequences. std is the population std (divide by G), so a group of identical rewards gives
    advantage 0 exactly. scale="none" skips the division (Dr. GRPO)."""
    if rewards_N.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards_N.shape)}")
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if rewards_N.numel() % group_size:
        raise ValueError(
            f"{rewards_N.numel()} rewards do not split into groups of group_size={group_size}"
        )
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"scale must be one of {ADVANTAGE_SCALES}, got {scale!r}")
    r_PG = rewards_N.reshape(-1, group_size)
    centered = r_PG - r_PG.mean(dim=1, keepdim=True)
    if scale == "std":
        std = centered.pow(2).mean(dim=1, keepdim=True).sqrt()
        # a group of equal rewards carries no signal: advantage 0 (also when eps is 0)
        centered = torch.where(std > 0, centered / (std + eps), torch.zeros_like(centered))
    return centered.reshape(-1)


def _check_bounds(name: str, bounds) -> tuple[float, float] | None:
    if bounds is None:
        return None
    low, high = bounds
    if not 0.0 <= low < 1.0 < high:
        raise ValueError(f"{name} must be (low, high) with 0 <= low < 1 < high, got {bounds!r}")
    return float(low), float(high)


def rollout_correction(
    old_logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    tis_cap: float | None = None,
    mis_token_bounds: tuple[float, float] | None = None,
    mis_seq_bounds: tuple[float, float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """-> (is_weight [N, T], corrected mask [N, T], stats as 0-d device tensors). All off:
    weights 1 and the mask unchanged."""
    if old_logp.shape != rollout_logp.shape or old_logp.shape != mask.shape:
        raise ValueError(
            f"old_logp {tuple(old_logp.shape)}, rollout_logp {tuple(rollout_logp.shape)} and "
            f"mask {tuple(mask.shape)} must have one [N, T] shape"
        )
    if tis_cap is not None and not tis_cap >= 1.0:
        raise ValueError(f"tis_cap must be >= 1 (or None), got {tis_cap!r}")
    token_bounds = _check_bounds("mis_token_bounds", mis_token_bounds)
    seq_bounds = _check_bounds("mis_seq_bounds", mis_seq_bounds)
    m = mask.to(old_logp.dtype)
    log_ratio = torch.where(m > 0, (old_logp - rollout_logp).detach(), 0.0)
    ratio = log_ratio.exp()
    weight = torch.ones_like(ratio)
    if tis_cap is not None:
        weight = ratio.clamp(max=tis_cap)
    keep = m
    if token_bounds is not None:
        low, high = token_bounds
        keep = keep * ((ratio >= low) & (ratio <= high)).to(m.dtype)
    if seq_bounds is not None:
        low, high = seq_bounds
        seq_log_ratio = log_ratio.sum(dim=1, keepdim=True)
        log_low = math.log(low) if low > 0 else -math.inf
        inside = (seq_log_ratio >= log_low) & (seq_log_ratio <= math.log(high))
        keep = keep * inside.to(m.dtype)
    n = m.sum().clamp(min=1.0)
    seqs = (m.sum(dim=1) > 0).to(m.dtype)
    kept_seqs = (keep.sum(dim=1) > 0).to(m.dtype)
    tis_clipped = (
        (ratio > tis_cap) if tis_cap is not None else torch.zeros_like(ratio, dtype=torch.bool)
    )
    stats = {
        "correction/is_weight_mean": (weight * m).sum() / n,
        "correction/tis_clipped_frac": (tis_clipped.to(m.dtype) * m).sum() / n,
        "correction/masked_token_frac": 1.0 - keep.sum() / n,
        "correction/rejected_seq_frac": 1.0 - kept_seqs.sum() / seqs.sum().clamp(min=1.0),
    }
    return weight, keep, stats


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages_N: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    aggregation: str = "token",
    is_weight: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    global_tokens: torch.Tensor | None = None,
    global_seqs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The clipped GRPO objective as a loss to minimize -> (loss, stats as 0-d device tensors).
    `global_tokens` / `global_seqs` (the mask's token count and the number of sequences with a
    target, summed over data-parallel ranks) replace the local denominators: each rank then
    returns its additive share of the global loss and stats (sum them over ranks)."""
    if logp.shape != old_logp.shape or logp.shape != mask.shape:
        raise ValueError(
            f"logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)} and mask "
            f"{tuple(mask.shape)} must have one [N, T] shape"
        )
    if advantages_N.shape != logp.shape[:1]:
        raise ValueError(
            f"advantages must be [N]={tuple(logp.shape[:1])}, got {tuple(advantages_N.shape)}"
        )
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    if not (0.0 <= clip_low < 1.0 and clip_high >= 0.0):
        raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {clip_low}, {clip_high}")
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
    if kl_coef > 0 and ref_logp is None:
        raise ValueError("kl_coef > 0 needs ref_logp (the reference policy's log-probs)")
    m = mask.to(logp.dtype)
    adv = advantages_N.to(logp.dtype)[:, None]
    log_ratio = torch.where(m > 0, logp - old_logp.detach(), 0.0)
    ratio = log_ratio.exp()
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    surrogate = torch.minimum(ratio * adv, clipped * adv)
    token_loss = -surrogate
    if is_weight is not None:
        token_loss = token_loss * is_weight.detach()
    kl = torch.zeros_like(logp)
    if ref_logp is not None:
        d = torch.where(m > 0, ref_logp.detach() - logp, 0.0)
        kl = d.exp() - d - 1.0
        if kl_coef > 0:
            token_loss = token_loss + kl_coef * kl
    n = m.sum().clamp(min=1.0) if global_tokens is None else global_tokens.to(m.dtype)
    if aggregation == "token":
        loss = (token_loss * m).sum() / n
    else:
        per_seq_n = m.sum(dim=1)
        has = (per_seq_n > 0).to(m.dtype)
        per_seq = (token_loss * m).sum(dim=1) / per_seq_n.clamp(min=1.0)
        seqs = has.sum().clamp(min=1.0) if global_seqs is None else global_seqs.to(m.dtype)
        loss = (per_seq * has).sum() / seqs
    was_clipped = clipped * adv < ratio * adv  # the clipped branch was the minimum
    stats = {
        "loss/policy": loss.detach(),
        "loss/ratio_mean": (ratio.detach() * m).sum() / n,
        "loss/clip_frac": (was_clipped.to(m.dtype) * m).sum() / n,
        "loss/kl_ref": (kl.detach() * m).sum() / n,
    }
    return loss, stats
