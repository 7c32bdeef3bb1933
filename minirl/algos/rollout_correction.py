"""Sampler/trainer mismatch correction ("rollout importance sampling").

The sampler (HF generate, vLLM) and the trainer score the same tokens with the same weights but
different kernels (and, with vLLM, a different precision), so pi_sampler != pi_old before any
update and the policy gradient is slightly off-policy. Both log-probs here are of the distribution
actually sampled from (temperature, top-k, top-p applied). With the per-token gap

    gap_t = log pi_old(y_t) - log pi_sampler(y_t)     (pi_old: the trainer's recomputation)

on action tokens, two corrections (threshold C >= 1):

- token: truncated importance sampling (TIS; Yao et al. 2025, "Your Efficient RL Framework Secretly
  Brings You Off-Policy RL Training"): the weight w_t = min(exp(gap_t), C) multiplies the per-token
  policy-gradient loss as a constant. verl: `rollout_is: token`; TRL: `token_truncate`.
- sequence: sequence-level masked importance sampling (Seq-MIS; Liu, Li et al. 2025, "When Speed
  Kills Stability"): a trajectory whose ratio exp(sum_t gap_t) falls outside [1/C, C] leaves the loss
  altogether (and its denominator); the others are kept unweighted. verl: `rollout_rs: sequence` with
  the default lower bound 1/C; TRL's `sequence_mask` masks above C only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

_SAFE_LOG = 20.0  # ratios are formed from log-gaps clamped to [-20, 20] (as verl), so exp() stays finite


@dataclass
class Correction:
    mask: Tensor  # [B, T] the loss mask, trajectories rejected by `sequence` zeroed
    weights: Tensor | None  # [B, T] truncated IS weights under `token` (1 off the action tokens), else None
    # rollout_is/logp_gap_abs_mean: mean |gap_t| over action tokens; with a mode on also
    # rollout_is/weight_min|mean|max: the ratio at the mode's level (per action token, or per trajectory)
    # before truncation; rollout_is/masked_frac: share of trajectories (with an action token) masked out
    metrics: dict[str, Tensor]


def _masked_stats(values: Tensor, keep: Tensor, prefix: str) -> dict[str, Tensor]:
    """min / mean / max of values[keep]; 0 when nothing is kept. values, keep: same shape."""
    if not keep.any():
        zero = values.new_zeros(())
        return {f"{prefix}_min": zero, f"{prefix}_mean": zero, f"{prefix}_max": zero}
    kept = values[keep]
    return {f"{prefix}_min": kept.min(), f"{prefix}_mean": kept.mean(), f"{prefix}_max": kept.max()}


def rollout_correction(
    old_logp: Tensor,  # [B, T] log pi_old(y_t) recomputed by the trainer
    sampler_logp: Tensor,  # [B, T] log pi_sampler(y_t) as the rollout engine reported it
    mask: Tensor,  # [B, T] 1 = action token (sampled by the policy)
    mode: str,  # off | token | sequence
    threshold: float,  # C >= 1
) -> Correction:
    """Token weights or a trajectory mask from the per-token log-prob gap; `off` only measures it."""
    if mode not in ("off", "token", "sequence"):
        raise ValueError(f"unknown rollout_is mode '{mode}'; known: off, sequence, token")
    if threshold < 1:
        raise ValueError(f"threshold must be >= 1, got {threshold}")
    keep = mask > 0
    gap = torch.where(keep, old_logp - sampler_logp, torch.zeros_like(old_logp))  # [B, T]
    metrics = {"rollout_is/logp_gap_abs_mean": gap.abs().sum() / keep.sum().clamp(min=1)}
    if mode == "token":
        ratio = gap.clamp(-_SAFE_LOG, _SAFE_LOG).exp()  # [B, T], 1 off the action tokens
        metrics |= _masked_stats(ratio, keep, "rollout_is/weight")
        metrics["rollout_is/masked_frac"] = gap.new_zeros(())
        return Correction(mask, ratio.clamp(max=threshold), metrics)
    if mode == "sequence":
        log_ratio = gap.sum(dim=1)  # [B] log of the product of the per-token ratios
        scored = keep.any(dim=1)  # [B] trajectories with an action token
        inside = log_ratio.abs() <= math.log(threshold)  # ratio in [1/C, C]
        metrics |= _masked_stats(log_ratio.clamp(-_SAFE_LOG, _SAFE_LOG).exp(), scored, "rollout_is/weight")
        metrics["rollout_is/masked_frac"] = (scored & ~inside).sum() / scored.sum().clamp(min=1)
        return Correction(mask * inside.unsqueeze(1), None, metrics)
    return Correction(mask, None, metrics)
