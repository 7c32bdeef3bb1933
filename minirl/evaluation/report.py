"""The evaluation report: what a run measured, as a JSON file and as console tables.

Metrics (keys as in the trainer's `eval/` metrics, without the prefix; N = eval.samples):

    success_rate          avg@N: mean of the success criterion (reward.success) over every sample
    pass_at_n             share of tasks with at least one success among their N samples
    success_rate/<kind>   avg@N per task kind
    tools/call_ok_frac    calls that parsed and ran ok, among every call tried; a turn whose calls did not
                          parse counts as one failed call
    tools/..., rollout/turns, rollout/finish_<reason>, reward/...   as rollout_metrics (minirl/metrics.py)

plus, per tool, the tasks whose reference calls it, the success rate on them, the calls made to it and the
share of those that ran ok; and per task, the prompt and each sample's success, final answer and calls, so
two runs compare task by task.

    report = EvalReport.load("outputs/.../eval.json")
    report.metrics["pass_at_n"], report.tasks[0].samples[0].final_answer
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

# rollout_metrics keys that count tokens: the openai backend has none, so no report carries them
TOKEN_KEYS = ("rollout/response_tokens_mean", "rollout/response_tokens_max")
SECTIONS = ("success", "tools", "rollout", "reward")  # the order metrics are listed in, by section

Value = str | int | float | bool | None


class ReportError(ValueError):
    """A report file is missing or is not an evaluation report; the message names the file."""


@dataclass
class RunInfo:
    backend: str
    model: str
    dataset: str
    data_path: str | None  # the file the tasks came from, for file datasets
    samples: int  # N per task
    temperature: float
    seed: int
    tasks: int
    wall_s: float  # running the tasks (model loading excluded)


@dataclass
class ToolStats:
    reference_tasks: int  # tasks whose reference answer calls the tool
    success_rate: float | None  # avg@N over those tasks; None without any
    calls: int  # calls the policy made to it, over every sample
    ok_frac: float | None  # share of those calls that ran ok; None without any


@dataclass
class SampleResult:
    success: bool
    final_answer: str  # empty unless the sample ended with an answer
    finish_reason: str
    reward: float
    turns: int
    tool_calls: list[dict]  # {"name", "arguments", "status"} in call order
    error: str = ""  # why the policy could not be reached (finish_reason "error")


@dataclass
class TaskResult:
    id: str
    kind: str
    prompt: str  # the last user message
    gt: list[str]
    samples: list[SampleResult]


@dataclass
class EvalReport:
    run: RunInfo
    metrics: dict[str, float]
    per_tool: dict[str, ToolStats]
    tasks: list[TaskResult]

    def save(self, path: str | os.PathLike) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(asdict(self), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | os.PathLike) -> EvalReport:
        """The report saved at `path`; ReportError when the file is missing or not a report."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            return cls(
                run=RunInfo(**data["run"]),
                metrics={key: float(value) for key, value in data["metrics"].items()},
                per_tool={name: ToolStats(**stats) for name, stats in data["per_tool"].items()},
                tasks=[
                    TaskResult(**{**task, "samples": [SampleResult(**sample) for sample in task["samples"]]})
                    for task in data["tasks"]
                ],
            )
        except OSError as err:
            raise ReportError(f"{path}: cannot read it ({err.strerror})") from None
        except json.JSONDecodeError as err:
            raise ReportError(f"{path}: not valid JSON ({err.msg}, line {err.lineno})") from None
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise ReportError(f"{path}: not an evaluation report ({type(err).__name__}: {err})") from None

    def values(self) -> dict[str, Value]:
        """Every run field (`run/<field>`), metric, and per-tool figure (`tool/<name>/<field>`), flat."""
        per_tool = {
            f"tool/{name}/{key}": value for name, stats in self.per_tool.items() for key, value in asdict(stats).items()
        }
        return {**{f"run/{key}": value for key, value in asdict(self.run).items()}, **self.metrics, **per_tool}


def section(key: str) -> str:
    """The SECTIONS entry a metric is listed under."""
    return "success" if key.startswith(("success_rate", "pass_at_n")) else key.split("/", 1)[0]


def format_value(value: Value) -> str:
    """How the tables show a value: floats to three decimals, None as '-'."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def print_report(report: EvalReport, console: Console) -> None:
    """The run line, the metrics table and the per-tool table."""
    run = report.run
    console.print(
        f"[bold cyan]eval[/] {run.backend} {run.model} on {run.dataset}: {run.tasks} tasks x {run.samples} samples, "
        f"temperature {run.temperature:g}, seed {run.seed}, {run.wall_s:.1f}s"
    )
    metrics = Table("metric", "value", title=f"success_rate = avg@{run.samples}, pass_at_n = pass@{run.samples}")
    listed = None
    for key, value in report.metrics.items():
        if listed not in (None, section(key)):
            metrics.add_section()
        metrics.add_row(key, format_value(value))
        listed = section(key)
    console.print(metrics)
    if report.per_tool:
        tools = Table("tool", *(field.name for field in dataclasses.fields(ToolStats)), title="per tool")
        for name, stats in report.per_tool.items():
            tools.add_row(name, *(format_value(value) for value in asdict(stats).values()))
        console.print(tools)
