"""Runs folded into one row per configuration: the overrides that vary between runs name a configuration, and the
replicate axes (trainer.seed unless told otherwise) fold into mean, sd and n of each figure.

    runs = find_runs(Path("multirun/losses"))
    table = fold(runs, metric="eval/success_rate", replicate=["trainer.seed"], baseline={"loss": "grpo"})
    for row in table.rows: print(row.config, row.stats["end"].mean, row.vs_baseline)

A run's figures (summarise): the metric at step 0, at its last evaluation (`end`) and its best, the gain (end -
step 0), the last training step, the wall time job.json recorded, and the tokens its policy sampled per second of
training step (the sum of rollout/sampled_tokens over the sum of time/step_s). Only finished runs count; the
others are counted by status.

Against a baseline row: the paired difference of `end` over the replicates both rows finished (the same seed, say),
as mean, sd and n, and, where the two runs of a pair evaluated the same held-out tasks (heldout.jsonl), the tasks
the row solved at the end and the baseline did not (gained) and the reverse (lost), pooled over the pairs, with the
exact sign test of that split (minirl/stats.py): the test the trainer runs against step 0, here against the
baseline.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from minirl.reporting.runs import Run
from minirl.stats import mean_sd, sign_test_p

FIGURES = ("start", "end", "best", "gain", "steps", "wall_s", "tokens_per_s")
ABSENT = "-"  # a configuration that leaves a varying key at its default


@dataclass
class Stat:
    mean: float
    sd: float | None  # None for one value
    n: int

    @classmethod
    def of(cls, values: list[float]) -> Stat | None:
        if not values:
            return None
        mean, sd = mean_sd(values)
        return cls(mean, sd, len(values))


@dataclass
class Comparison:
    """A row against the baseline row, over the replicates both finished."""

    diff: Stat | None  # paired differences of `end`, row minus baseline
    tasks_gained: int | None = None  # pooled over the pairs whose held-out tasks match; None: no pair matches
    tasks_lost: int | None = None
    task_pairs: int = 0  # pairs whose held-out tasks matched
    p: float | None = None


@dataclass
class ConfigRow:
    config: dict[str, str]  # varying key -> value (ABSENT where a run does not set it)
    runs: list[Run]
    stats: dict[str, Stat | None] = field(default_factory=dict)  # FIGURES -> over the finished runs
    by_replicate: dict[tuple, dict] = field(default_factory=dict)  # replicate values -> that run's summary
    vs_baseline: Comparison | None = None

    @property
    def status(self) -> Counter:
        return Counter(run.status for run in self.runs)

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.config.items() if v != ABSENT) or "all runs"


@dataclass
class Table:
    metric: str
    replicate: list[str]
    varying: list[str]  # the keys that name a configuration
    rows: list[ConfigRow]
    baseline: ConfigRow | None = None


def metric_points(rows: list[dict], key: str) -> list[tuple[int, float]]:
    return [
        (row["step"], float(row[key]))
        for row in rows
        if isinstance(row.get(key), (int, float)) and math.isfinite(row[key])
    ]


def summarise(run: Run, metric: str) -> dict:
    """One run's figures (None where it did not log what a figure needs), and its last held-out outcomes."""
    points = metric_points(run.rows, metric)
    first = next((v for s, v in points if s == 0), None)
    end = points[-1][1] if points else None
    steps = [row["step"] for row in run.rows if "time/step_s" in row]
    step_s = sum(v for _, v in metric_points(run.rows, "time/step_s"))
    tokens = sum(v for _, v in metric_points(run.rows, "rollout/sampled_tokens"))
    last_heldout = run.heldout[-1] if run.heldout else None
    return {
        "start": first,
        "end": end,
        "best": max(v for _, v in points) if points else None,
        "gain": end - first if end is not None and first is not None else None,
        "steps": float(max(steps)) if steps else None,
        "wall_s": run.record.get("wall_s"),
        "tokens_per_s": tokens / step_s if step_s > 0 else None,
        "heldout": dict(zip(last_heldout["tasks"], last_heldout["solved"])) if last_heldout else None,
    }


def same_value(override: str, wanted: str) -> bool:
    """Whether an override's value is the one asked for; true and false in any case (a sweep of `true,false`
    records `True` and `False`)."""
    booleans = ("true", "false")
    return override == wanted or (override.lower() in booleans and override.lower() == wanted.lower())


def varying_keys(runs: list[Run], replicate: list[str]) -> list[str]:
    """Keys whose value differs between runs, or that some runs do not set, in first-seen order."""
    keys = list(dict.fromkeys(key for run in runs for key in run.overrides))
    varying = []
    for key in keys:
        values = {run.overrides.get(key, ABSENT) for run in runs}
        if len(values) > 1 and key not in replicate:
            varying.append(key)
    return varying


def compare(row: ConfigRow, baseline: ConfigRow) -> Comparison:
    """`row` against `baseline` over the replicates both finished (see the module docstring)."""
    shared = [key for key in row.by_replicate if key in baseline.by_replicate]
    diffs = [
        row.by_replicate[key]["end"] - baseline.by_replicate[key]["end"]
        for key in shared
        if row.by_replicate[key]["end"] is not None and baseline.by_replicate[key]["end"] is not None
    ]
    comparison = Comparison(Stat.of(diffs))
    gained = lost = 0
    for key in shared:
        mine, theirs = row.by_replicate[key]["heldout"], baseline.by_replicate[key]["heldout"]
        if mine is None or theirs is None or mine.keys() != theirs.keys():
            continue  # other held-out tasks: nothing to pair
        comparison.task_pairs += 1
        gained += sum(mine[task] > theirs[task] for task in mine)
        lost += sum(mine[task] < theirs[task] for task in mine)
    if comparison.task_pairs:
        comparison.tasks_gained, comparison.tasks_lost = gained, lost
        comparison.p = sign_test_p(gained, lost)
    return comparison


def fold(runs: list[Run], metric: str, replicate: list[str], baseline: dict[str, str] | None = None) -> Table:
    """Runs -> one row per configuration (in first-seen order), each figure folded over its finished runs; with
    `baseline` (key -> value, e.g. {"loss": "grpo"}), every row compared with the one row it matches. ValueError
    when the baseline matches no row, or several."""
    varying = varying_keys(runs, replicate)
    rows: dict[tuple, ConfigRow] = {}
    for run in runs:
        config = {key: run.overrides.get(key, ABSENT) for key in varying}
        rows.setdefault(tuple(config.items()), ConfigRow(config, [])).runs.append(run)
    for row in rows.values():
        for run in row.runs:
            if run.done:
                values = tuple(run.overrides.get(key, ABSENT) for key in replicate)
                if values in row.by_replicate:  # the same configuration and replicate twice: both count, unpaired
                    values = (*values, str(run.path))
                row.by_replicate[values] = summarise(run, metric)
        summaries = list(row.by_replicate.values())
        row.stats = {name: Stat.of([s[name] for s in summaries if s[name] is not None]) for name in FIGURES}
    table = Table(metric, replicate, varying, list(rows.values()))
    if baseline:
        matches = [
            row
            for row in table.rows
            if all(same_value(run.overrides.get(k, ABSENT), v) for k, v in baseline.items() for run in row.runs)
        ]
        if len(matches) != 1:
            wanted = " ".join(f"{k}={v}" for k, v in baseline.items())
            known = "; ".join(row.label for row in table.rows)
            raise ValueError(f"--baseline {wanted} matches {len(matches)} configurations, not one; they are: {known}")
        table.baseline = matches[0]
        for row in table.rows:
            if row is not table.baseline:
                row.vs_baseline = compare(row, table.baseline)
    return table
