"""Two evaluation reports side by side: `python -m minirl.eval --compare A.json B.json [--markdown]`.

One row per run field, metric and per-tool figure of either file, with B - A for numbers; then, over the
tasks both reports ran, how many tasks each solves more often than the other and the exact sign test's
p-value of that split: on 64 tasks a difference of several points can be chance, and the paired count says
how likely. `--markdown` prints the same rows as a Markdown table (for the README). A missing or malformed
file exits 2 with one line.
"""

from __future__ import annotations

import argparse
import sys
from statistics import fmean

from rich.console import Console
from rich.table import Table

from minirl.evaluation.report import EvalReport, ReportError, Value, format_value
from minirl.stats import paired_split, sign_test_p

Row = tuple[str, str, str, str]  # key, A, B, B - A


def _delta(a: Value, b: Value) -> str:
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
    if not numbers:
        return ""
    difference = b - a
    return f"{difference:+d}" if isinstance(difference, int) else f"{difference:+.3f}"


def comparison_rows(a: EvalReport, b: EvalReport) -> list[Row]:
    """Every key of A, then the keys only B has; '-' where a file lacks the key."""
    values_a, values_b = a.values(), b.values()
    rows = []
    for key in [*values_a, *(key for key in values_b if key not in values_a)]:
        value_a, value_b = values_a.get(key), values_b.get(key)
        rows.append((key, format_value(value_a), format_value(value_b), _delta(value_a, value_b)))
    return rows


def _success_rates(report: EvalReport) -> dict[tuple[str, str], float]:
    """(task id, prompt) -> the share of the task's samples that succeeded."""
    return {(task.id, task.prompt): fmean(s.success for s in task.samples) for task in report.tasks if task.samples}


def paired_rows(a: EvalReport, b: EvalReport) -> list[Row]:
    """Over the tasks both reports ran (the same id and prompt): the task count, how many tasks each report
    solves in a larger share of its samples than the other, and the sign test's p-value of that split.
    No rows when the reports share no task."""
    rates_a, rates_b = _success_rates(a), _success_rates(b)
    shared = [key for key in rates_a if key in rates_b]
    if not shared:
        return []
    b_better, a_better = paired_split([rates_a[key] for key in shared], [rates_b[key] for key in shared])
    return [
        ("paired/tasks", str(len(shared)), str(len(shared)), ""),
        ("paired/tasks_solved_more_often", str(a_better), str(b_better), f"{b_better - a_better:+d}"),
        ("paired/sign_test_p", "", "", f"{sign_test_p(a_better, b_better):.3f}"),
    ]


def rich_table(rows: list[Row], name_a: str, name_b: str) -> Table:
    table = Table("key", name_a, name_b, "B - A", title="A vs B")
    for row in rows:
        table.add_row(*row)
    return table


def markdown_table(rows: list[Row], name_a: str, name_b: str) -> str:
    lines = [f"| key | {name_a} | {name_b} | B - A |", "| --- | ---: | ---: | ---: |"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """The `--compare` command line; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m minirl.eval", description="Compare two evaluation reports.")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"), required=True, help="two eval JSON files")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table instead")
    args = parser.parse_args(argv)
    path_a, path_b = args.compare
    try:
        report_a, report_b = EvalReport.load(path_a), EvalReport.load(path_b)
    except ReportError as err:
        print(f"compare error: {err}", file=sys.stderr)
        return 2
    rows = comparison_rows(report_a, report_b) + paired_rows(report_a, report_b)
    if args.markdown:
        print(markdown_table(rows, path_a, path_b))
    else:
        Console().print(rich_table(rows, path_a, path_b))
    return 0
