"""Advantage estimators: per-trajectory rewards [N] -> advantages [N].

Trajectories of one prompt are contiguous, so rewards.view(B, G) lays out one group per row. Every
estimator has the signature fn(rewards [N], group_size G, eps) -> [N]; eps guards a std division
and is unused by estimators that divide by none. A reward with the KL to the reference folded in
(algo.kl_in_reward) arrives here already shaped: the estimators see plain scalars.

A set of rewards that are all equal carries no signal about which sample is better: its
advantages are exactly 0 (not rounding noise, not NaN), whatever eps is.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from minirl.registry import Registry

AdvEstimator = Callable[[Tensor, int, float], Tensor]
ADV_ESTIMATORS: Registry[AdvEstimator] = Registry("advantage estimator")
# estimators whose baseline comes from the sample's own group: a group of one sample always gets advantage 0
GROUP_BASELINE = frozenset({"grpo", "dr_grpo", "rloo"})


def _groups(rewards: Tensor, group_size: int) -> Tensor:
    """rewards [N] -> [B, G]; N must be a multiple of G."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    return rewards.view(-1, group_size)


def _centred(r: Tensor) -> tuple[Tensor, Tensor]:
    """r [B, G] -> (r - row mean [B, G], flat [B, 1] bool: the row's rewards are all equal)."""
    # test equality on the raw rewards: a mean of equal floats can round away from them
    flat = r.amax(dim=1, keepdim=True) == r.amin(dim=1, keepdim=True)
    return r - r.mean(dim=1, keepdim=True), flat


def _scaled(r: Tensor, eps: float) -> Tensor:
    """r [B, G] -> (r - row mean) / (row population std + eps); flat rows -> 0."""
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    centred, flat = _centred(r)
    std = r.std(dim=1, unbiased=False, keepdim=True)
    return torch.where(flat, torch.zeros_like(centred), centred / (std + eps))


@ADV_ESTIMATORS.register("grpo")
def grpo_advantages(
    rewards: Tensor,  # [N] one scalar reward per trajectory, N = B * G, groups contiguous
    group_size: int,  # G
    eps: float,  # added to the group std
) -> Tensor:  # [N]
    """GRPO (arXiv 2402.03300): A_i = (r_i - mean_g r) / (std_g r + eps), population std over the group."""
    return _scaled(_groups(rewards, group_size), eps).reshape(-1)


@ADV_ESTIMATORS.register("dr_grpo")
def dr_grpo_advantages(rewards: Tensor, group_size: int, eps: float) -> Tensor:  # [N], G, unused -> [N]
    """Dr. GRPO (arXiv 2503.20783): A_i = r_i - mean_g r. No std division: dividing by the group std
    up-weights prompts that are nearly always or nearly never solved (a difficulty bias)."""
    centred, flat = _centred(_groups(rewards, group_size))
    return torch.where(flat, torch.zeros_like(centred), centred).reshape(-1)


@ADV_ESTIMATORS.register("rloo")
def rloo_advantages(rewards: Tensor, group_size: int, eps: float) -> Tensor:  # [N], G, unused -> [N]
    """RLOO (arXiv 2402.14740): A_i = r_i - mean_{j != i} r_j = G / (G - 1) * (r_i - mean_g r).

    The baseline leaves the sample itself out, so it is independent of it (an unbiased gradient).
    A group of one has no other sample to compare with: its advantage is 0.
    """
    if group_size == 1:
        return torch.zeros_like(_groups(rewards, group_size)).reshape(-1)
    centred, flat = _centred(_groups(rewards, group_size))
    return torch.where(flat, torch.zeros_like(centred), centred * group_size / (group_size - 1)).reshape(-1)


@ADV_ESTIMATORS.register("reinforce_plus_plus")
def reinforce_plus_plus_advantages(rewards: Tensor, group_size: int, eps: float) -> Tensor:  # [N], G, eps -> [N]
    """REINFORCE++ (arXiv 2501.03262): A_i = (r_i - mean_batch r) / (std_batch r + eps), population std
    over every trajectory of the batch; groups play no part (G only checks the layout).

    The paper normalises token-level returns whose KL penalty is a reward-to-go; here the KL (when
    algo.kl_in_reward) is one sum per trajectory and the normalisation is over trajectories, not
    tokens, matching the one-advantage-per-trajectory layout every loss expects.
    """
    _groups(rewards, group_size)
    return _scaled(rewards.view(1, -1), eps).reshape(-1)
