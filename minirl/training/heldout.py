"""A held-out evaluation's metrics against the one at step 0: which tasks it gained and lost since then, and the
sign test's p-value of that split (the chance of one as uneven if every changed task were a coin flip); and where
they go: the tracker, the console and the run's result."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from minirl.inspection import trajectory_panel, trajectory_record
from minirl.metrics import heldout_metrics
from minirl.rollout.trajectory import Trajectory
from minirl.stats import paired_split, sign_test_p
from minirl.tracking import Tracker
from minirl.training import console as lines


@dataclass
class TrainResult:
    eval_history: list[tuple[int, float]] = field(default_factory=list)  # (step, held-out success rate)
    solved_at_start: list[bool] = field(default_factory=list)  # per held-out task, at the step-0 evaluation
    run_dir: Path = Path(".")
    wall_s: float = 0.0


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


def log_heldout(
    step: int,
    trajs: list[Trajectory],  # one per held-out task, in task order, scored
    solved: Callable[[Trajectory], bool],
    result: TrainResult,  # its eval_history grows; at step 0 its solved_at_start is set
    tracker: Tracker,
    console: Console,
    tokenizer,
    eval_every: int,
) -> None:
    """The evaluation at `step` against step 0's (heldout_comparison): logged, printed with one of its
    trajectories (a different task each time), and recorded in `result`."""
    metrics, now, change = heldout_comparison(trajs, solved, result.solved_at_start if step else [])
    if step == 0:
        result.solved_at_start = now
    tracker.log(step, metrics)
    tracker.log_heldout(step, [traj.task.id for traj in trajs], now)  # pairs runs task by task (the report)
    result.eval_history.append((step, metrics["eval/success_rate"]))
    console.print(lines.eval_line(step, metrics, len(trajs), change))
    sample = trajs[step // max(1, eval_every) % len(trajs)]
    console.print(trajectory_panel(trajectory_record(sample, step, 0.0, tokenizer, solved)))
