"""DAPO's data-side techniques (arXiv 2503.14476): dynamic sampling and overlong reward shaping.

- Dynamic sampling (section 3.2): a group whose rewards all tie has GRPO advantages of exactly 0 and
  teaches nothing; it is dropped before the update (the trainer may roll out more prompts to refill).
- Overlong filtering (section 3.4): a trajectory cut by a length limit is excluded from the loss.
- Soft overlong punishment (section 3.4, eq. 13): with L_max the limit and L_cache a buffer,
  R_length(y) = 0 while |y| <= L_max - L_cache, ((L_max - L_cache) - |y|) / L_cache inside the
  buffer, -1 beyond L_max; scaled and added to the rule reward. A multi-turn trajectory has two
  limits (rollout.max_new_tokens per turn, rollout.max_total_tokens in all); the nearer one counts.
"""

from __future__ import annotations

from torch import Tensor

from minirl.rollout.trajectory import Trajectory, TrajectoryEnd

# finish reasons of a trajectory that a length limit cut off (the text did not end by itself)
TRUNCATED = frozenset({TrajectoryEnd.TURN_TOKENS, TrajectoryEnd.TOKEN_BUDGET})


def truncated(traj: Trajectory) -> bool:
    return traj.finish_reason in TRUNCATED


def tied_groups(
    rewards: Tensor,  # [N] one reward per trajectory, groups of `group_size` contiguous
    group_size: int,
) -> Tensor:  # [N / group_size] bool, True where every reward of the group is equal
    """Groups with zero reward spread, compared exactly on the raw rewards (as grpo_advantages does)."""
    if rewards.dim() != 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"rewards {tuple(rewards.shape)} do not split into groups of {group_size}")
    groups = rewards.view(-1, group_size)
    return groups.amax(dim=1) == groups.amin(dim=1)


def _turn_lengths(action_mask: list[int]) -> list[int]:
    """Sampled tokens per assistant turn: the runs of 1s (turns are separated by observation tokens)."""
    lengths, run = [], 0
    for sampled in [*action_mask, 0]:
        if sampled:
            run += 1
        elif run:
            lengths.append(run)
            run = 0
    return lengths


def tokens_to_limit(traj: Trajectory, max_new_tokens: int, max_total_tokens: int) -> int:
    """L_max - |y| for the nearer limit: room left in the longest turn (against rollout.max_new_tokens)
    or in the whole conversation, prompt included (against rollout.max_total_tokens); 0 = at a limit."""
    longest_turn = max(_turn_lengths(traj.action_mask), default=0)
    total = len(traj.prompt_ids) + len(traj.response_ids)
    return min(max_new_tokens - longest_turn, max_total_tokens - total)


def overlong_penalty(
    room: Tensor,  # [N] tokens_to_limit of each trajectory
    buffer: int,  # L_cache > 0
    scale: float,  # the penalty at (and past) the limit
) -> Tensor:  # [N] <= 0, added to the reward
    """scale * R_length: 0 while more than `buffer` tokens remain, then linear down to -scale at the limit."""
    if buffer <= 0:
        raise ValueError(f"buffer must be > 0, got {buffer}")
    return scale * ((room.float() - buffer) / buffer).clamp(min=-1.0, max=0.0)
