"""The run report: one static, self-contained HTML file (no scripts, no external assets) with the reward
and success curves of `metrics.jsonl` as inline SVG, a summary table, and the recorded trajectories of the
chosen steps with their loss mask. Every string from the run, model text above all, is HTML-escaped.

    path = write_report("outputs/2025-06-01/12-00-00")   # <run dir>/report.html, latest recorded step
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from pathlib import Path
from statistics import fmean

from minirl.inspection.files import (
    METRICS_FILE,
    TRAJECTORIES_FILE,
    RunFileError,
    read_metrics,
    read_trajectories,
    select_records,
)
from minirl.inspection.plots import Series, line_plot
from minirl.inspection.record import (
    LOSS_LABEL,
    MASKED_LABEL,
    call_signature,
    message_label,
    outcome_fields,
    record_title,
)

REPORT_FILE = "report.html"
REPORT_LIMIT = 8  # trajectories shown per step

CSS = """
body { font-family: sans-serif; font-size: 13px; color: #222; margin: 24px; }
h1 { font-size: 22px; margin-bottom: 2px; }
h2 { font-size: 17px; border-bottom: 1px solid #ddd; padding-bottom: 3px; margin-top: 26px; }
h3 { font-size: 14px; margin: 4px 0 8px; }
.muted { color: #777; }
table.summary { border-collapse: collapse; }
table.summary th, table.summary td { border: 1px solid #ddd; padding: 3px 10px; text-align: left; }
.plot { display: inline-block; vertical-align: top; margin: 0 18px 12px 0; }
.traj { border: 1px solid #ccc; padding: 8px 14px; margin: 16px 0; }
.msg { border-left: 4px solid #bbb; padding: 2px 8px; margin: 6px 0; }
.msg.user { border-color: #2f9e44; }
.msg.assistant { border-color: #1c7ed6; }
.msg.tool { border-color: #ae3ec9; }
.msg.system { color: #666; }
.msg.failed { border-color: #e03131; }
.label { font-weight: bold; font-size: 12px; }
.failed .label, .invalid { color: #c92a2a; }
.call { color: #b35c00; }
pre { font-family: monospace; font-size: 12px; white-space: pre-wrap; overflow-wrap: break-word; margin: 2px 0; }
.outcome { margin: 10px 0; }
.outcome div { margin: 1px 0; }
.loss { background: #b2f2bb; color: #000; }
.masked { color: #999; }
.legend span { padding: 1px 4px; margin-right: 12px; }
"""


def _curve(rows: Sequence[dict], key: str) -> list[tuple[float, float]]:
    return [
        (row["step"], row[key]) for row in rows if isinstance(row.get(key), (int, float)) and math.isfinite(row[key])
    ]


def curves_html(rows: Sequence[dict]) -> str:
    """The reward plot (train and eval reward/mean) and the success plot (rollout and eval success rate)."""
    reward = line_plot(
        [
            Series("train reward/mean", _curve(rows, "reward/mean")),
            Series("eval reward/mean", _curve(rows, "eval/reward/mean")),
        ],
        "Reward",
        "step",
        "reward",
    )
    success = line_plot(
        [
            Series("rollout/success_rate", _curve(rows, "rollout/success_rate")),
            Series("eval/success_rate", _curve(rows, "eval/success_rate")),
        ],
        "Success rate",
        "step",
        "success",
        y_range=(0.0, 1.0),
        percent=True,
    )
    return "".join(f'<div class="plot">{svg}</div>' for svg in (reward, success))


def _from_to(first: float, first_where: str, last: float, last_where: str, percent: bool) -> str:
    if percent:
        return f"{first:.1%} {first_where} -> {last:.1%} {last_where} ({(last - first) * 100:+.1f} points)"
    return f"{first:+.3f} {first_where} -> {last:+.3f} {last_where}"


def _change(rows: Sequence[dict], key: str, percent: bool) -> str:
    """`30.0% at step 0 -> 39.1% at step 60 (+9.1 points)`, over the rows that have `key`."""
    points = _curve(rows, key)
    if not points:
        return ""
    (first_step, first), (last_step, last) = points[0], points[-1]
    return _from_to(first, f"at step {first_step}", last, f"at step {last_step}", percent)


def _trend(rows: Sequence[dict], key: str, percent: bool) -> str:
    """For a metric logged every step, and so noisy from step to step: its mean over the first fifth of the
    logged steps -> its mean over the last fifth (at least one step each), e.g.
    `25.3% over steps 1-10 -> 29.8% over steps 41-50 (+4.5 points)`."""
    points = _curve(rows, key)
    if not points:
        return ""
    width = max(1, len(points) // 5)
    head, tail = points[:width], points[-width:]

    def span(part: list[tuple[float, float]]) -> str:
        return f"over steps {part[0][0]}-{part[-1][0]}" if len(part) > 1 else f"at step {part[0][0]}"

    return _from_to(fmean(v for _, v in head), span(head), fmean(v for _, v in tail), span(tail), percent)


def _paired(rows: Sequence[dict]) -> str:
    """The last evaluation's tasks gained and lost since step 0 and the sign test's p-value; '' if not logged."""
    last = next((row for row in reversed(rows) if "eval/tasks_gained" in row), None)
    if last is None:
        return ""
    return (
        f"{last['eval/tasks_gained']:.0f} gained, {last['eval/tasks_lost']:.0f} lost at step {last['step']} "
        f"(sign test p {last['eval/sign_test_p']:.3f})"
    )


def summary_rows(rows: Sequence[dict], records: Sequence[dict]) -> list[tuple[str, str]]:
    """(what, value) lines of the summary table; metrics a run did not log are left out."""
    train_steps = [row["step"] for row in rows if "reward/mean" in row]
    best_step, best = max(_curve(rows, "eval/success_rate"), key=lambda point: point[1], default=(None, None))
    kinds = sorted({key for row in rows for key in row if key.startswith("eval/success_rate/")})
    step_times = _curve(rows, "time/step_s")
    recorded = sorted({r["step"] for r in records})
    lines = [
        ("training steps logged", f"{len(train_steps)} (last step {train_steps[-1]})" if train_steps else ""),
        ("eval success", _change(rows, "eval/success_rate", percent=True)),
        ("best eval success", f"{best:.1%} at step {best_step}" if best is not None else ""),
        ("eval tasks since step 0", _paired(rows)),
        *[(f"eval success, {key.rsplit('/', 1)[-1]}", _change(rows, key, percent=True)) for key in kinds],
        ("train reward/mean", _trend(rows, "reward/mean", percent=False)),
        ("rollout/success_rate", _trend(rows, "rollout/success_rate", percent=True)),
        ("training time", f"{sum(t for _, t in step_times) / 60:.1f} min" if step_times else ""),
        ("trajectories recorded", f"{len(records)} at steps {', '.join(map(str, recorded))}" if records else "none"),
    ]
    return [(what, value) for what, value in lines if value]


def _message_html(message: dict) -> str:
    failed = " failed" if message.get("status", "ok") != "ok" else ""
    parts = [
        f'<div class="msg {escape(message["role"])}{failed}">',
        f'<div class="label">{escape(message_label(message))}</div>',
        f"<pre>{escape(message['content'])}</pre>",
        *[f'<pre class="call">-&gt; {escape(call_signature(call))}</pre>' for call in message.get("tool_calls", [])],
    ]
    if message.get("invalid_reason"):
        parts.append(f'<pre class="invalid">invalid: {escape(message["invalid_reason"])}</pre>')
    return "".join([*parts, "</div>"])


def trajectory_html(record: dict) -> str:
    """One trajectory: title, conversation, outcome, and the response tokens by loss mask."""
    outcome = "".join(f"<div><b>{label}</b> {escape(value)}</div>" for label, value in outcome_fields(record))
    tokens = "".join(
        f'<span class="{"loss" if mask else "masked"}">{escape(text)}</span>' for text, mask in record["response"]
    )
    return (
        f'<section class="traj"><h3>{escape(record_title(record))}</h3>'
        + "".join(_message_html(m) for m in record["messages"])
        + f'<div class="outcome">{outcome}</div>'
        + f'<div class="legend"><span class="loss">{LOSS_LABEL}</span><span class="masked">{MASKED_LABEL}</span></div>'
        + f'<pre class="tokens">{tokens}</pre></section>'
    )


def render_report(title: str, rows: Sequence[dict], records: Sequence[dict], shown: Sequence[dict]) -> str:
    """The HTML page: summary and curves from metrics rows, then the `shown` records (of all `records`) by step."""
    summary = "".join(
        f"<tr><th>{escape(what)}</th><td>{escape(value)}</td></tr>" for what, value in summary_rows(rows, records)
    )
    sections = []
    for step in dict.fromkeys(r["step"] for r in shown):
        at_step = [r for r in shown if r["step"] == step]
        total = sum(1 for r in records if r["step"] == step)
        sections.append(f'<h2>Trajectories at step {step}</h2><p class="muted">{len(at_step)} of {total} recorded</p>')
        sections += [trajectory_html(r) for r in at_step]
    head = f'<head><meta charset="utf-8"><title>{escape(title)}</title><style>{CSS}</style></head>'
    body = [
        f'<h1>minirl run report</h1><p class="muted">{escape(title)}</p>',
        f'<h2>Summary</h2><table class="summary">{summary}</table>',
        f"<h2>Curves</h2>{curves_html(rows)}",
        *sections,
    ]
    return f'<!DOCTYPE html>\n<html lang="en">{head}<body>{"".join(body)}</body></html>\n'


def write_report(
    run_dir: str | Path, out: str | Path | None = None, steps: Sequence[int] | None = None, limit: int = REPORT_LIMIT
) -> Path:
    """Write the report of a run directory to `out` (default <run dir>/report.html) and return its path.
    `steps` (default: the latest recorded) and `limit` (per step) choose the trajectories shown; a run
    without trajectories.jsonl gets curves and summary only. RunFileError without metrics.jsonl."""
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir / METRICS_FILE)
    trajectories = run_dir / TRAJECTORIES_FILE
    records = list(read_trajectories(trajectories)) if trajectories.exists() else []
    shown = select_records(records, steps, limit) if records or steps else []
    path = Path(out) if out is not None else run_dir / REPORT_FILE
    html = render_report(str(run_dir), rows, records, shown)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(html, encoding="utf-8")
    except OSError as err:
        raise RunFileError(f"cannot write the report to {path} ({err.strerror})") from None
    return path
