r"""When a trajectory counts as solved: the criterion behind `rollout/success_rate`, `eval/success_rate`
and the per-kind rates, chosen by `reward.success`.

    solved = SUCCESS_CRITERIA.get("boxed_answer")
    solved(traj)  # True if the last \boxed{} of the final answer equals the task's first gt value
"""

from __future__ import annotations

from collections.abc import Callable

from minirl.registry import Registry
from minirl.rewards.matching import gt_hits
from minirl.rewards.math_answer import equivalent, last_boxed
from minirl.rollout.trajectory import FinishReason, Trajectory

SuccessCriterion = Callable[[Trajectory], bool]
SUCCESS_CRITERIA: Registry[SuccessCriterion] = Registry("success criterion")


@SUCCESS_CRITERIA.register("gt_in_answer")
def gt_in_answer(traj: Trajectory) -> bool:
    """Ended with an answer and every gt value is in it as a whole token; with no gt, ending with an answer suffices."""
    if traj.finish_reason is not FinishReason.ANSWER:
        return False
    return all(gt_hits(traj.final_text, traj.task.gt))


@SUCCESS_CRITERIA.register("boxed_answer")
def boxed_answer(traj: Trajectory) -> bool:
    r"""Ended with an answer whose last `\boxed{}` is equivalent to the first gt value (ReTool's accuracy).

    Without gt nothing can be checked, so nothing succeeds.
    """
    if traj.finish_reason is not FinishReason.ANSWER or not traj.task.gt:
        return False
    answer = last_boxed(traj.final_text)
    return answer is not None and equivalent(answer, traj.task.gt[0])
