"""The folded table in four forms: rich (the console), Markdown, CSV and JSON (raw numbers, for scripts).

Figures of a rate metric (held-out success) are in points, mean +- sd over the replicates; `n` is how many runs
finished out of the configuration's runs.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator

from rich.table import Table as RichTable

from minirl.reporting.fold import FIGURES, ConfigRow, Stat, Table

# figure -> column title; the first four are the metric's
TITLES = {
    "start": "step 0",
    "end": "end",
    "best": "best",
    "gain": "gain",
    "steps": "steps",
    "wall_s": "wall",
    "tokens_per_s": "tokens/s",
}
STATUS_ORDER = ("finished", "failed", "running", "interrupted", "unknown")


def is_rate(metric: str) -> bool:
    """A metric in [0, 1] shown in points: success rates and fractions."""
    return "success" in metric or metric.endswith("_frac")


def _number(value: float, figure: str, rate: bool, signed: bool = False) -> str:
    if figure in ("start", "end", "best", "gain", "diff"):
        scaled = value * 100 if rate else value
        return f"{scaled:+.1f}" if signed else (f"{scaled:.1f}" if rate else f"{scaled:.3f}")
    if figure == "wall_s":
        minutes, seconds = divmod(round(value), 60)
        return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"
    return f"{value:,.0f}"


def stat_text(stat: Stat | None, figure: str, rate: bool) -> str:
    """`46.9 ± 3.1` (points), `+15.6 ± 2.2` for a gain, a lone value without the ±; '-' for none."""
    if stat is None:
        return "-"
    signed = figure in ("gain", "diff")
    text = _number(stat.mean, figure, rate, signed)
    if stat.sd is not None and figure not in ("steps",):
        text += f" ± {_number(stat.sd, figure, rate)}"
    return text


def p_text(p: float | None) -> str:
    """A p-value to 3 decimals, or `<0.001`."""
    if p is None:
        return "-"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def status_text(row: ConfigRow) -> str:
    """`3/3`, or `2/3 (1 failed)`: finished runs of all the configuration's runs, and what the others are."""
    counts = row.status
    done = counts.get("finished", 0) + counts.get("unknown", 0)
    others = [f"{counts[s]} {s}" for s in STATUS_ORDER[1:4] if counts.get(s)]
    return f"{done}/{len(row.runs)}" + (f" ({', '.join(others)})" if others else "")


def columns(table: Table) -> list[str]:
    """The column titles of the text forms."""
    names = [*table.varying, "n"] + [TITLES[f] for f in FIGURES]
    if table.baseline is not None:
        names += ["Δ end", "tasks +/-", "p"]
    return names


def _short(value: str) -> str:
    """A long float (an Optuna trial's lr) to 4 significant digits; anything else as it is."""
    try:
        number = float(value)
    except ValueError:
        return value
    return f"{number:.4g}" if len(value) > 8 and "." in value else value


def text_rows(table: Table) -> Iterator[list[str]]:
    """Each configuration's cells as text, in the order of `columns`."""
    rate = is_rate(table.metric)
    for row in table.rows:
        figures = [stat_text(row.stats[f], f, rate) for f in FIGURES]
        cells = [*map(_short, row.config.values()), status_text(row), *figures]
        if table.baseline is not None:
            if row is table.baseline:
                cells += ["baseline", "", ""]
            else:
                c = row.vs_baseline
                diff = stat_text(c.diff, "diff", rate) + (f" (n {c.diff.n})" if c.diff else "")
                tasks = f"{c.tasks_gained}/{c.tasks_lost}" if c.tasks_gained is not None else "-"
                cells += [diff, tasks, p_text(c.p)]
        yield cells


def title(table: Table) -> str:
    unit = " (points)" if is_rate(table.metric) else ""
    folded = ", ".join(table.replicate) or "nothing"
    against = f"; Δ end against {table.baseline.label}, paired" if table.baseline is not None else ""
    return f"{table.metric}{unit}: mean ± sd over {folded}{against}"


def rich_table(table: Table) -> RichTable:
    out = RichTable(*columns(table), title=title(table))
    for cells in text_rows(table):
        out.add_row(*cells)
    return out


def markdown(table: Table) -> str:
    names = columns(table)
    lines = ["| " + " | ".join(names) + " |", "|" + " --- |" * len(names)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |" for cells in text_rows(table)]
    baseline = ""
    if table.baseline is not None:
        baseline = (
            f" Baseline: {table.baseline.label}; tasks +/-: held-out tasks gained/lost against it at the end, pooled "
            "over the paired runs, with the exact sign test's p."
        )
    return f"{title(table)}.{baseline}\n\n" + "\n".join(lines) + "\n"


def _stat_json(stat: Stat | None) -> dict | None:
    return None if stat is None else {"mean": stat.mean, "sd": stat.sd, "n": stat.n}


def to_json(table: Table) -> dict:
    """The table with raw numbers (rates as fractions), each row's runs and their status and error."""
    rows = []
    for row in table.rows:
        entry = {
            "config": row.config,
            "status": dict(row.status),
            "runs": [
                {"path": str(r.path), "status": r.status, "overrides": r.overrides, "error": r.error} for r in row.runs
            ],
            "stats": {f: _stat_json(row.stats[f]) for f in FIGURES},
            "baseline": row is table.baseline,
        }
        if row.vs_baseline is not None:
            c = row.vs_baseline
            entry["vs_baseline"] = {
                "diff_end": _stat_json(c.diff),
                "tasks_gained": c.tasks_gained,
                "tasks_lost": c.tasks_lost,
                "task_pairs": c.task_pairs,
                "sign_test_p": c.p,
            }
        rows.append(entry)
    return {"metric": table.metric, "replicate": table.replicate, "varying": table.varying, "rows": rows}


def to_csv(table: Table) -> str:
    """One line per configuration: its config, the run counts, mean/sd/n of every figure, the comparison."""
    out = io.StringIO()
    writer = csv.writer(out)
    header = [*table.varying, "runs", "finished", "failed"]
    header += [f"{f}_{part}" for f in FIGURES for part in ("mean", "sd", "n")]
    header += ["diff_end_mean", "diff_end_sd", "diff_end_n", "tasks_gained", "tasks_lost", "sign_test_p"]
    writer.writerow(header)
    for row in table.rows:
        line = [*row.config.values(), len(row.runs), row.status.get("finished", 0), row.status.get("failed", 0)]
        for f in FIGURES:
            stat = row.stats[f]
            line += ["", "", 0] if stat is None else [stat.mean, "" if stat.sd is None else stat.sd, stat.n]
        c = row.vs_baseline
        if c is None:
            line += [""] * 6
        else:
            diff = ["", "", 0] if c.diff is None else [c.diff.mean, "" if c.diff.sd is None else c.diff.sd, c.diff.n]
            line += [*diff, *("" if v is None else v for v in (c.tasks_gained, c.tasks_lost, c.p))]
        writer.writerow(line)
    return out.getvalue()


def dumps(table: Table) -> str:
    return json.dumps(to_json(table), indent=2, ensure_ascii=False) + "\n"
