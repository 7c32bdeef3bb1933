"""The sweep report as one static, self-contained HTML file (as `minirl.inspect --html` writes for one run): the
folded table, the runs that failed with their errors and those not finished, the best trial of an Optuna search,
and the learning curves of every configuration overlaid (the mean over its finished runs, shaded from the lowest
to the highest). Every string from the runs is HTML-escaped.
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from statistics import fmean

from minirl.inspection.plots import Series, line_plot
from minirl.inspection.report import CSS
from minirl.reporting.fold import ConfigRow, Table, metric_points
from minirl.reporting.tables import columns, is_rate, text_rows, title

CURVES = ("rollout/success_rate", "reward/mean")  # drawn beside the metric's, from the training steps
SWEEP_CSS = "td.num { text-align: right; } .error { color: #c92a2a; font-family: monospace; }"


def mean_curve(row: ConfigRow, key: str) -> Series:
    """`key` per step: the mean over the row's finished runs that logged it, and their range as the band."""
    by_step: dict[int, list[float]] = {}
    for run in row.runs:
        if run.done:
            for step, value in metric_points(run.rows, key):
                by_step.setdefault(step, []).append(value)
    steps = sorted(by_step)
    points = [(step, fmean(by_step[step])) for step in steps]
    band = [(step, min(by_step[step]), max(by_step[step])) for step in steps if len(by_step[step]) > 1]
    return Series(row.label, points, band)


def curve_svg(table: Table, key: str) -> str:
    rate = is_rate(key)
    return line_plot(
        [mean_curve(row, key) for row in table.rows],
        key,
        "step",
        key.rsplit("/", 1)[-1],
        y_range=(0.0, 1.0) if rate else None,
        percent=rate,
        width=760,
        height=340,
    )


def _failures_html(table: Table) -> str:
    runs = [run for row in table.rows for run in row.runs if not run.done]
    if not runs:
        return ""
    items = []
    for run in runs:
        overrides = " ".join(f"{k}={v}" for k, v in run.overrides.items())
        error = f' <span class="error">{escape(run.error)}</span>' if run.error else ""
        items.append(f"<li><b>{escape(run.status)}</b> {escape(str(run.path))}: {escape(overrides)}{error}</li>")
    return f"<h2>Runs not finished</h2><ul>{''.join(items)}</ul>"


def _optuna_html(best: dict | None) -> str:
    if not best:
        return ""
    params = ", ".join(f"{k}={v}" for k, v in best.get("best_params", {}).items())
    return f"<h2>Optuna search</h2><p>best value {escape(str(best.get('best_value')))} with {escape(params)}</p>"


def render(table: Table, root: Path, optuna: dict | None = None) -> str:
    """The HTML page of a folded table of the runs under `root`."""
    head_cells = "".join(f"<th>{escape(c)}</th>" for c in columns(table))
    body_rows = "".join(
        "<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in cells) + "</tr>" for cells in text_rows(table)
    )
    plots = [curve_svg(table, key) for key in dict.fromkeys((table.metric, *CURVES))]
    runs = sum(len(row.runs) for row in table.rows)
    body = [
        f'<h1>minirl sweep report</h1><p class="muted">{escape(str(root))}: {runs} runs, {len(table.rows)} '
        "configurations</p>",
        f'<h2>{escape(title(table))}</h2><table class="summary"><tr>{head_cells}</tr>{body_rows}</table>',
        _failures_html(table),
        _optuna_html(optuna),
        '<h2>Learning curves</h2><p class="muted">the mean over each configuration\'s finished runs; shaded from '
        "the lowest to the highest run</p>",
        *(f'<div class="plot">{svg}</div>' for svg in plots),
    ]
    head = f'<head><meta charset="utf-8"><title>{escape(str(root))}</title><style>{CSS}{SWEEP_CSS}</style></head>'
    return f'<!DOCTYPE html>\n<html lang="en">{head}<body>{"".join(body)}</body></html>\n'
