"""Reward shaping, all in one place: what turns a trajectory's reward terms into the reward its advantage
sees. In order: the reward model's score (reward.model: the term `rm`, minirl/training/reward_model.py), the
weighted terms (minirl/rewards, clipped by reward.clip), DAPO's soft overlong penalty (algo.overlong=penalty),
off-policy guidance (algo.guide: a group whose rewards all tie below its task's reference answer learns from
that answer, scored the same way), and the KL to the reference model subtracted from the reward
(algo.kl_in_reward).
"""

from __future__ import annotations

from collections.abc import Callable

import jinja2
import torch

from minirl.algos.dapo import overlong_penalty, tied_groups, tokens_to_limit
from minirl.algos.kl import sequence_kl
from minirl.config import AlgoConfig, Config, Overlong, RolloutConfig
from minirl.protocol.chat import TemplateError
from minirl.rewards import score_all
from minirl.rollout.agent_loop import AgentLimits, replay_reference
from minirl.rollout.trajectory import Trajectory, TrajectoryEnd
from minirl.tools import ToolExecutor
from minirl.training.batch import PolicyBatch
from minirl.training.reward_model import NO_REWARD_MODEL, RewardModel


def score(trajs: list[Trajectory], cfg: Config, reward_model: RewardModel = NO_REWARD_MODEL) -> None:
    """Set each trajectory's reward and reward terms: the reward model's score (none without `reward_model`),
    the weighted terms, then the overlong penalty."""
    reward_model.score(trajs)
    score_all(trajs, cfg.reward)
    if cfg.algo.overlong is Overlong.penalty:
        punish_overlong(trajs, cfg.rollout, cfg.algo)


def punish_overlong(trajs: list[Trajectory], rollout: RolloutConfig, algo: AlgoConfig) -> None:
    """Add DAPO's soft overlong punishment (minirl/algos/dapo.py) to each reward, after reward.clip; it is
    also recorded as the reward term `overlong_penalty`, so reward/overlong_penalty logs its mean."""
    room = torch.tensor([tokens_to_limit(t, rollout.max_new_tokens, rollout.max_total_tokens) for t in trajs])  # [N]
    penalties = overlong_penalty(room, algo.overlong_buffer, algo.overlong_penalty).tolist()
    for traj, penalty in zip(trajs, penalties):
        traj.reward += penalty
        traj.reward_terms["overlong_penalty"] = penalty


def guided(
    trajs: list[Trajectory],
    group_size: int,
    reference: Callable[[Trajectory], Trajectory | None],
    solved_share: float = 0.0,
) -> list[Trajectory]:
    """trajs with the last member of each group whose rewards all tie replaced by `reference(last member)`, the
    task's reference answer replayed and scored (`replayed`), where that earns more than the group:
    off-policy guidance (docs/algorithms.md). The group then has something to teach, however rarely the
    policy solves the task. With `solved_share` > 0 (algo.guide_solved_share) a group whose rewards differ is
    guided too where at most that share of it earns what the reference does, its last member earns less and
    another member does too (a group the reference would make tie teaches nothing)."""
    out = list(trajs)
    if group_size < 2:  # a group of one has no sample to compare the reference with
        return out
    rewards = torch.tensor([t.reward for t in trajs])  # [N]
    tied = tied_groups(rewards, group_size)  # [groups]
    by_group = rewards.view(-1, group_size)  # [groups, group_size]
    candidates = range(len(tied)) if solved_share > 0 else tied.nonzero().flatten().tolist()
    for group in candidates:
        last = trajs[group * group_size + group_size - 1]
        guide = reference(last)
        if guide is None or guide.reward <= last.reward:
            continue
        below = by_group[group] < guide.reward  # [group_size]; all of a tied group below the reference
        # guided, the group must still differ: another member below the reference stays
        if below.sum() >= 2 and 1 - below.float().mean() <= solved_share:
            out[group * group_size + group_size - 1] = guide
    return out


def replayed(
    traj: Trajectory,
    tokenizer,
    executor: ToolExecutor,
    limits: AgentLimits,
    cfg: Config,
    reward_model: RewardModel = NO_REWARD_MODEL,
) -> Trajectory | None:
    """The reference answer of traj's task replayed in its group slot and scored (`score`, by `reward_model` as
    the samples it competes with are), or None where it cannot guide: the task has none, the chat template
    cannot split it into turns or refuses it, or the replay did not go as the reference did (it ran into a
    limit, or a tool rejected or skipped one of its calls, so its answer would not follow from what the tools
    returned)."""
    if not traj.task.reference:
        return None
    try:
        guide = replay_reference(
            traj.task, traj.group_index, tokenizer, executor, limits, cfg.protocol, thinking=traj.thinking
        )
    except (TemplateError, jinja2.TemplateError):  # the template refuses it (Llama 3's: two calls in a turn)
        return None
    results = [result for turn in guide.turns for result in turn.tool_results]
    if guide.finish_reason is not TrajectoryEnd.ANSWER or any(r.status != "ok" for r in results):
        return None
    score([guide], cfg, reward_model)
    return guide


def kl_shaped(trajs: list[Trajectory], batch: PolicyBatch, algo: AlgoConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """[N] the rewards the advantages see: with algo.kl_in_reward, r - kl_coef * the trajectory's KL to the
    reference (summed over its sampled tokens, under the policy that sampled them; none for a replayed
    reference answer, which no policy sampled); and its metrics."""
    rewards = torch.tensor([t.reward for t in trajs])
    if not algo.kl_in_reward:
        return rewards, {}
    kl = sequence_kl(batch.old_logp, batch.ref_logp, batch.mask, algo.kl_estimator)  # [N]
    kl = kl * ~torch.tensor([t.off_policy for t in trajs])
    return rewards - algo.kl_coef * kl, {"kl/in_reward": kl.mean().item()}
