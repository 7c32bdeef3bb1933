"""What one rollout produces: a multi-turn conversation as tokens, mask and sampler log-probs."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from minirl.protocol.parsing import ParsedTurn

if TYPE_CHECKING:
    from minirl.data.task import Task
    from minirl.tools.base import ToolResult


class TrajectoryEnd(str, Enum):
    """Why a trajectory ended (Trajectory.finish_reason); why one decoding row stopped is inference's StopReason."""

    ANSWER = "answer"  # the model answered without a tool call
    INVALID = "invalid"  # the turn could not be parsed (bad markup / JSON)
    MAX_TURNS = "max_turns"  # still calling tools after rollout.max_turns turns
    TURN_TOKENS = "turn_tokens"  # a turn hit rollout.max_new_tokens without ending
    TOKEN_BUDGET = "token_budget"  # the whole conversation hit rollout.max_total_tokens
    ERROR = "error"  # the policy could not be reached (an evaluation endpoint kept failing); see Trajectory.error


@dataclass
class Turn:
    """One assistant turn and what the tools answered to it."""

    text: str  # decoded sampled tokens (end-of-turn token removed)
    parsed: ParsedTurn
    tool_results: list[ToolResult] = field(default_factory=list)


@dataclass
class Trajectory:
    """One sampled conversation for one task.

    `response_ids`, `action_mask` and `sampler_logprobs` have the same length R: everything the
    conversation added after the first prompt. action_mask[i] == 1 exactly for tokens the policy
    sampled (in a replayed reference answer, `off_policy`, the reference's assistant tokens);
    framework-added closing tokens and tool observations have mask 0 and logprob 0.0.
    """

    task: Task
    group_index: int  # index of the task in the batch; trajectories of one group are contiguous
    prompt_ids: list[int]  # P0, the rendered first prompt
    response_ids: list[int] = field(default_factory=list)  # [R]
    action_mask: list[int] = field(default_factory=list)  # [R] 1 = sampled by the policy
    sampler_logprobs: list[float] = field(default_factory=list)  # [R] log p_sampler(token)
    turns: list[Turn] = field(default_factory=list)
    finish_reason: TrajectoryEnd | None = None
    reward: float = 0.0
    reward_terms: dict[str, float] = field(default_factory=dict)
    rm_score: float = 0.0  # the reward model's clipped score (minirl/training/reward_model.py); 0 = not scored
    advantage: float = 0.0  # set by the trainer for the trajectories it learns from
    error: str = ""  # why the policy could not be reached, under TrajectoryEnd.ERROR
    off_policy: bool = False  # the task's reference answer replayed (replay_reference), not sampled
    thinking: bool | None = None  # its render's thinking on/off (rollout.thinking_ratio); None: not drawn
    policy_version: int = 0  # optimizer updates behind the weights that sampled it (steps trained before its rollout)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def num_tool_calls(self) -> int:
        return sum(len(t.parsed.tool_calls) for t in self.turns)

    @property
    def final_text(self) -> str:
        """The last turn's answer text; empty unless the trajectory ended with an answer."""
        if self.finish_reason is not TrajectoryEnd.ANSWER or not self.turns:
            return ""
        return self.turns[-1].parsed.content
