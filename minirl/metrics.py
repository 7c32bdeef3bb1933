"""Per-step statistics of a batch of trajectories, under stable namespaced keys (the paired sign test of held-out
tasks gained and lost is in minirl/stats.py)."""

from __future__ import annotations

import typing
from collections import Counter
from statistics import fmean, pstdev

import torch

from minirl.algos.dapo import tied_groups, truncated
from minirl.rewards import SuccessCriterion
from minirl.rollout.trajectory import Trajectory, TrajectoryEnd
from minirl.tools.base import ToolStatus


def rollout_metrics(trajs: list[Trajectory], solved: SuccessCriterion, prefix: str = "") -> dict[str, float]:
    """Rewards, every reward term, lengths (sampled tokens; the share cut by a length limit), turns, success
    (`solved`: reward.success), tool use (calls per trajectory, share of trajectories that called, validity,
    latency, share and count of each call status, calls dropped unread) and why trajectories ended. Everything is
    over this batch only, never cumulative."""
    rewards = [t.reward for t in trajs]
    sampled = [sum(t.action_mask) for t in trajs]
    calls = [r for t in trajs for turn in t.turns for r in turn.tool_results]
    out = {
        "reward/mean": fmean(rewards),
        "reward/std": pstdev(rewards),
        "rollout/trajectories": float(len(trajs)),
        "rollout/sampled_tokens": float(sum(sampled)),  # this batch's, over all its trajectories
        "rollout/response_tokens_mean": fmean(sampled),
        "rollout/response_tokens_max": float(max(sampled)),
        "rollout/response_clipped_frac": fmean(truncated(t) for t in trajs),  # turn_tokens or token_budget
        "rollout/turns": fmean(len(t.turns) for t in trajs),
        "rollout/success_rate": fmean(float(solved(t)) for t in trajs),
        "tools/calls_per_traj": fmean(t.num_tool_calls for t in trajs),
        "tools/used_frac": fmean(t.num_tool_calls > 0 for t in trajs),
        "tools/valid_frac": fmean(r.valid_call for r in calls) if calls else 0.0,
        "tools/latency_mean_s": fmean(r.latency_s for r in calls) if calls else 0.0,
        "tools/latency_max_s": max((r.latency_s for r in calls), default=0.0),
        # calls protocol.call_policy=lenient left out because they could not be read (0 under the other policies)
        "tools/dropped_count": float(sum(len(turn.parsed.dropped) for t in trajs for turn in t.turns)),
    }
    statuses = Counter(r.status for r in calls)
    for status in typing.get_args(ToolStatus):  # shares of this step's calls: ok, error, timeout, ...
        out[f"tools/{status}_frac"] = statuses[status] / len(calls) if calls else 0.0
        out[f"tools/{status}_count"] = float(statuses[status])
    for name in trajs[0].reward_terms:
        out[f"reward/{name}"] = fmean(t.reward_terms[name] for t in trajs)
    ended = Counter(t.finish_reason for t in trajs)
    for reason in TrajectoryEnd:
        out[f"rollout/finish_{reason.value}"] = ended[reason] / len(trajs)
    out.update(thinking_metrics(trajs, solved))
    return {prefix + k: v for k, v in out.items()}


def thinking_metrics(trajs: list[Trajectory], solved: SuccessCriterion) -> dict[str, float]:
    """Under rollout.thinking_ratio: the share of trajectories rendered with thinking on, and the success rate of
    those with it on and of those with it off (0 when there are none); nothing when no trajectory was drawn."""
    drawn = [t for t in trajs if t.thinking is not None]
    if not drawn:
        return {}
    out = {"rollout/thinking_frac": fmean(float(t.thinking) for t in drawn)}
    for on, key in ((True, "rollout/success_rate_thinking"), (False, "rollout/success_rate_no_thinking")):
        side = [float(solved(t)) for t in drawn if t.thinking is on]
        out[key] = fmean(side) if side else 0.0
    return out


def success_by_kind(trajs: list[Trajectory], solved: SuccessCriterion, prefix: str) -> dict[str, float]:
    """Success rate per task kind (e.g. single / double / no_tool), to see where a gain comes from."""
    kinds = sorted({t.task.kind for t in trajs if t.task.kind})
    return {
        f"{prefix}success_rate/{kind}": fmean(float(solved(t)) for t in trajs if t.task.kind == kind) for kind in kinds
    }


def heldout_metrics(trajs: list[Trajectory], solved: SuccessCriterion, prefix: str) -> dict[str, float]:
    """rollout_metrics and success_by_kind of a held-out evaluation, its mean success as `{prefix}success_rate`."""
    metrics = {**rollout_metrics(trajs, solved, prefix), **success_by_kind(trajs, solved, prefix)}
    metrics[f"{prefix}success_rate"] = metrics.pop(f"{prefix}rollout/success_rate")
    return metrics


def group_metrics(sampled: list[Trajectory], kept: list[Trajectory], group_size: int) -> dict[str, float]:
    """Groups of this step: the share whose rewards all tie (no GRPO signal) among all sampled, how many were
    sampled and kept for the update (they differ under algo.dynamic_sampling), and how many of the kept ones
    hold their task's replayed reference (algo.guide: one per guided group). Groups are contiguous."""
    tied = tied_groups(torch.tensor([t.reward for t in sampled]), group_size)  # [groups sampled]
    return {
        "reward/zero_std_frac": int(tied.sum()) / len(tied),
        "algo/groups_sampled": float(len(tied)),
        "algo/groups_kept": float(len(kept) // group_size),
        "algo/groups_guided": float(sum(t.off_policy for t in kept)),
    }


def advantage_metrics(advantages: torch.Tensor) -> dict[str, float]:
    """advantages: [N] one scalar per trajectory."""
    return {
        "adv/mean": advantages.mean().item(),
        "adv/std": advantages.std(unbiased=False).item(),
        "adv/min": advantages.min().item(),
        "adv/max": advantages.max().item(),
    }
