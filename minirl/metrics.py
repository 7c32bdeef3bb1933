"""Per-step statistics of a batch of trajectories, under stable namespaced keys."""

from __future__ import annotations

from collections import Counter
from statistics import fmean, pstdev

import torch

from minirl.rewards import is_success
from minirl.rollout.trajectory import FinishReason, Trajectory


def rollout_metrics(trajs: list[Trajectory], prefix: str = "") -> dict[str, float]:
    """Rewards, every reward term, lengths, turns, tool use and why trajectories ended."""
    rewards = [t.reward for t in trajs]
    sampled = [sum(t.action_mask) for t in trajs]
    calls = [r for t in trajs for turn in t.turns for r in turn.tool_results]
    out = {
        "reward/mean": fmean(rewards),
        "reward/std": pstdev(rewards),
        "rollout/response_tokens_mean": fmean(sampled),
        "rollout/response_tokens_max": float(max(sampled)),
        "rollout/turns": fmean(len(t.turns) for t in trajs),
        "rollout/success_rate": fmean(float(is_success(t)) for t in trajs),
        "tools/calls_per_traj": fmean(t.num_tool_calls for t in trajs),
        "tools/valid_frac": fmean(r.valid_call for r in calls) if calls else 0.0,
        "tools/ok_frac": fmean(r.status == "ok" for r in calls) if calls else 0.0,
    }
    for name in trajs[0].reward_terms:
        out[f"reward/{name}"] = fmean(t.reward_terms[name] for t in trajs)
    ended = Counter(t.finish_reason for t in trajs)
    for reason in FinishReason:
        out[f"rollout/finish_{reason.value}"] = ended[reason] / len(trajs)
    return {prefix + k: v for k, v in out.items()}


def success_by_kind(trajs: list[Trajectory], prefix: str) -> dict[str, float]:
    """Success rate per task kind (e.g. single / double / no_tool), to see where a gain comes from."""
    kinds = sorted({t.task.kind for t in trajs if t.task.kind})
    return {
        f"{prefix}success_rate/{kind}": fmean(float(is_success(t)) for t in trajs if t.task.kind == kind)
        for kind in kinds
    }


def advantage_metrics(advantages: torch.Tensor) -> dict[str, float]:
    """advantages: [N] one scalar per trajectory."""
    return {
        "adv/mean": advantages.mean().item(),
        "adv/std": advantages.std(unbiased=False).item(),
        "adv/min": advantages.min().item(),
        "adv/max": advantages.max().item(),
    }
