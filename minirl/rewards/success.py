r"""When a trajectory counts as solved: the criterion behind `rollout/success_rate`, `eval/success_rate`
and the per-kind rates, chosen by `reward.success`.

    solved = SUCCESS_CRITERIA.get("boxed_answer")
    solved(traj)  # True if the last \boxed{} of the final answer equals the task's first gt value
"""

from __future__ import annotations

from collections.abc import Callable

from minirl.registry import Registry
from minirl.rewards.matching import credited_hits, has_protocol_markup
from minirl.rewards.math_answer import equivalent, last_boxed
from minirl.rollout.trajectory import Trajectory, TrajectoryEnd

SuccessCriterion = Callable[[Trajectory], bool]
SUCCESS_CRITERIA: Registry[SuccessCriterion] = Registry("success criterion")


def answer_hits(traj: Trajectory) -> list[bool]:
    """For each gt value, whether the final answer earns it: a whole-token match in an answer that
    passes the guards against gaming the match (minirl/rewards/matching.py: `credited_hits`)."""
    question = "\n".join(message["content"] for message in traj.task.messages)
    return credited_hits(traj.final_text, traj.task.gt, question)


@SUCCESS_CRITERIA.register("gt_in_answer")
def gt_in_answer(traj: Trajectory) -> bool:
    """Ended with an answer that earns every gt value (`answer_hits`); with no gt, ending with an answer
    free of tool-protocol markup suffices."""
    if traj.finish_reason is not TrajectoryEnd.ANSWER:
        return False
    return all(answer_hits(traj)) and not has_protocol_markup(traj.final_text)


@SUCCESS_CRITERIA.register("boxed_answer")
def boxed_answer(traj: Trajectory) -> bool:
    r"""Ended with an answer whose last `\boxed{}` is equivalent to the first gt value (ReTool's accuracy).

    Without gt nothing can be checked, so nothing succeeds.
    """
    if traj.finish_reason is not TrajectoryEnd.ANSWER or not traj.task.gt:
        return False
    answer = last_boxed(traj.final_text)
    return answer is not None and equivalent(answer, traj.task.gt[0])
