"""An evaluation report built from scored trajectories: the metrics, per tool and per task (the format and
its console tables are minirl/evaluation/report.py, which `python -m minirl.eval --compare` reads without
loading torch)."""

from __future__ import annotations

from statistics import fmean

from minirl.data.generation import prompt_text
from minirl.data.task import Task
from minirl.evaluation.report import (
    SECTIONS,
    TOKEN_KEYS,
    EvalReport,
    RunInfo,
    SampleResult,
    TaskResult,
    ToolStats,
    section,
)
from minirl.metrics import heldout_metrics
from minirl.protocol.parsing import TurnKind
from minirl.rewards import SuccessCriterion
from minirl.rollout.trajectory import Trajectory


def build_report(trajs: list[Trajectory], tasks: list[Task], solved: SuccessCriterion, run: RunInfo) -> EvalReport:
    """The report of scored trajectories (`run.samples` per task, contiguous, in task order)."""
    groups = [trajs[i : i + run.samples] for i in range(0, len(trajs), run.samples)]
    return EvalReport(
        run=run,
        metrics=evaluation_metrics(trajs, groups, solved),
        per_tool=tool_stats(trajs, solved),
        tasks=[_task_result(task, group, solved) for task, group in zip(tasks, groups, strict=True)],
    )


def evaluation_metrics(
    trajs: list[Trajectory], groups: list[list[Trajectory]], solved: SuccessCriterion
) -> dict[str, float]:
    """The held-out metrics of the trainer plus pass@N and call validity, listed section by section."""
    heldout = heldout_metrics(trajs, solved, prefix="")
    for key in TOKEN_KEYS:
        del heldout[key]
    metrics = {
        "success_rate": heldout.pop("success_rate"),
        "pass_at_n": fmean(any(solved(t) for t in group) for group in groups),
        "tools/call_ok_frac": call_ok_frac(trajs),
        **heldout,
    }
    return dict(sorted(metrics.items(), key=lambda item: SECTIONS.index(section(item[0]))))  # stable


def call_ok_frac(trajs: list[Trajectory]) -> float:
    """Calls that parsed and ran ok among every call tried; a turn that did not parse counts as one failed call
    (its markup says a call was meant, not how many). 0 when no call was tried."""
    results = [r for t in trajs for turn in t.turns for r in turn.tool_results]
    unparsed = sum(turn.parsed.kind is TurnKind.INVALID for t in trajs for turn in t.turns)
    tried = len(results) + unparsed
    return sum(r.status == "ok" for r in results) / tried if tried else 0.0


def tool_stats(trajs: list[Trajectory], solved: SuccessCriterion) -> dict[str, ToolStats]:
    """Per tool that a reference calls or the policy called: the tasks that need it and how calls to it went."""
    results = [r for t in trajs for turn in t.turns for r in turn.tool_results]
    names = {name for t in trajs for name in t.task.reference_tools} | {r.name for r in results}
    stats = {}
    for name in sorted(names):
        needing = [t for t in trajs if name in t.task.reference_tools]
        calls = [r for r in results if r.name == name]
        stats[name] = ToolStats(
            reference_tasks=len({t.group_index for t in needing}),
            success_rate=fmean(solved(t) for t in needing) if needing else None,
            calls=len(calls),
            ok_frac=fmean(r.status == "ok" for r in calls) if calls else None,
        )
    return stats


def _task_result(task: Task, group: list[Trajectory], solved: SuccessCriterion) -> TaskResult:
    samples = [
        SampleResult(
            success=solved(traj),
            final_answer=traj.final_text,
            finish_reason=traj.finish_reason.value,
            reward=traj.reward,
            turns=len(traj.turns),
            tool_calls=[
                {"name": call.name, "arguments": call.arguments, "status": result.status}
                for turn in traj.turns
                for call, result in zip(turn.parsed.tool_calls, turn.tool_results)
            ],
            error=traj.error,
        )
        for traj in group
    ]
    return TaskResult(task.id, task.kind, prompt_text(task), task.gt, samples)
