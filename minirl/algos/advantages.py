"""Advantage estimators: per-trajectory rewards [N] -> advantages [N].

Trajectories of one prompt are contiguous, so rewards.view(B, G) lays out one group per row.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from minirl.registry import Registry

AdvEstimator = Callable[[Tensor, int, float], Tensor]
ADV_ESTIMATORS: Registry[AdvEstimator] = Registry("advantage estimator")


def _groups(rewards: Tensor, group_size: int) -> Tensor:
    """rewards [N] -> [B, G]; N must be a multiple of G."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    return rewards.view(-1, group_size)


@ADV_ESTIMATORS.register("grpo")
def grpo_advantages(
    rewards: Tensor,  # [N] one scalar reward per trajectory, N = B * G, groups contiguous
    group_size: int,  # G
    eps: float,  # added to the group std
) -> Tensor:  # [N]
    """GRPO (arXiv 2402.03300): A_i = (r_i - mean_g r) / (std_g r + eps), population std.

    A group whose rewards are all equal (a size-1 group included) carries no signal about which
    sample is better; its advantages are exactly 0, also when eps == 0 (where 0 / 0 would be NaN).
    """
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    r = _groups(rewards, group_size)
    centred = r - r.mean(dim=1, keepdim=True)
    std = r.std(dim=1, unbiased=False, keepdim=True)
    # test equality on the raw rewards: a mean of equal floats can round away from them
    flat = r.amax(dim=1, keepdim=True) == r.amin(dim=1, keepdim=True)
    adv = torch.where(flat, torch.zeros_like(centred), centred / (std + eps))
    return adv.reshape(-1)
