"""A held-out evaluation's metrics against the one at step 0: which tasks it gained and lost since then, and the
sign test's p-value of that split (the chance of one as uneven if every changed task were a coin flip)."""

from __future__ import annotations

from collections.abc import Callable

from minirl.metrics import heldout_metrics
from minirl.rollout.trajectory import Trajectory
from minirl.stats import paired_split, sign_test_p


def heldout_comparison(
    trajs: list[Trajectory],  # one per held-out task, in task order, scored
    solved: Callable[[Trajectory], bool],  # the success criterion (reward.success)
    solved_at_start: list[bool],  # per task at step 0; empty at step 0 itself (or from an older checkpoint)
) -> tuple[dict[str, float], list[bool], str]:
    """(the eval/ metrics, with eval/tasks_gained, eval/tasks_lost and eval/sign_test_p against
    `solved_at_start` when there is one; each task solved or not; the console's words for that change)."""
    metrics = heldout_metrics(trajs, solved, prefix="eval/")
    now = [solved(traj) for traj in trajs]
    if not solved_at_start:
        return metrics, now, ""
    gained, lost = paired_split(solved_at_start, now)
    p = sign_test_p(gained, lost)
    metrics.update({"eval/tasks_gained": float(gained), "eval/tasks_lost": float(lost), "eval/sign_test_p": p})
    return metrics, now, f"; since step 0: {gained} tasks gained, {lost} lost, sign test p {p:.3f}"
