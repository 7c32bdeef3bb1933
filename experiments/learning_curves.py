"""Learning curves: held-out success at each evaluation, mean and spread over seeds, one PNG per figure.

    python -m minirl.train -m experiment=retool trainer.seed=0,1,2 logger=none hydra.sweep.dir=multirun/retool
    python -m minirl.train -m experiment=retool_no_tool trainer.seed=0,1,2 logger=none \\
        hydra.sweep.dir=multirun/retool_no_tool
    python -m minirl.train -m experiment=retool_paper trainer.seed=0,1,2 logger=none \\
        hydra.sweep.dir=multirun/retool_paper
    python -m minirl.train -m trainer.seed=0,1,2 logger=none hydra.sweep.dir=multirun/default
    python experiments/learning_curves.py \\
        --figure retool "code tool=multirun/retool" "no tool=multirun/retool_no_tool" \\
            "ReTool's algorithm=multirun/retool_paper" \\
        --figure default "MiniMind tools=multirun/default"

Each `--figure NAME LABEL=DIR ...` draws experiments/learning_curves_NAME.png (--out-dir): for each series, the
finished runs under DIR (minirl/reporting/runs.py), each run's held-out success per evaluation as a thin line,
their mean as a thick one and the band between the lowest and the highest run. Prints, per series, the success
at each evaluated step (mean, min, max), the gain of the last evaluation over step 0 per run, and the pooled
paired sign test of that split (the held-out tasks solved at the end and not at step 0, and the reverse, over all
runs), as the trainer runs it against step 0.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from minirl.reporting.runs import Run, find_runs  # noqa: E402
from minirl.stats import paired_split, sign_test_p  # noqa: E402

HERE = Path(__file__).resolve().parent


@dataclass
class Series:
    """One recipe's runs: the held-out success (%) of each run at each evaluated step."""

    label: str
    runs: list[Run]

    @property
    def steps(self) -> list[int]:
        """The steps every run evaluated at."""
        common = set.intersection(*(set(curve) for curve in self.curves))
        return sorted(common)

    @property
    def curves(self) -> list[dict[int, float]]:
        return [{row["step"]: 100 * statistics.fmean(row["solved"]) for row in run.heldout} for run in self.runs]

    def split(self) -> tuple[int, int]:
        """Held-out tasks solved at the last common step and not at step 0, and the reverse, pooled over runs."""
        first, last = self.steps[0], self.steps[-1]
        gained = lost = 0
        for run in self.runs:
            by_step = {row["step"]: row for row in run.heldout}
            before, after = by_step[first], by_step[last]
            if before["tasks"] != after["tasks"]:
                raise SystemExit(f"{run.path}: the evaluations at steps {first} and {last} are of other tasks")
            g, lo = paired_split(before["solved"], after["solved"])
            gained, lost = gained + g, lost + lo
        return gained, lost


def load_series(spec: str) -> Series:
    """LABEL=DIR: the finished runs under DIR that evaluated the held-out set."""
    label, sep, directory = spec.partition("=")
    if not sep:
        raise SystemExit(f"{spec!r}: a series is LABEL=DIR")
    runs = [run for run in find_runs(Path(directory)) if run.done and run.heldout]
    if not runs:
        raise SystemExit(f"{directory}: no finished run with held-out evaluations")
    return Series(label, sorted(runs, key=lambda run: str(run.path)))


def report(console: Console, name: str, series: list[Series]) -> None:
    """Per series: success at each step (mean, min, max), each run's gain, the pooled sign test."""
    for s in series:
        table = Table(title=f"{name}: {s.label} ({len(s.runs)} runs)")
        table.add_column("step", justify="right")
        for column in ("mean %", "min %", "max %"):
            table.add_column(column, justify="right")
        curves = s.curves
        for step in s.steps:
            values = [curve[step] for curve in curves]
            table.add_row(str(step), *(f"{v:.1f}" for v in (statistics.fmean(values), min(values), max(values))))
        console.print(table)
        first, last = s.steps[0], s.steps[-1]
        gains = [curve[last] - curve[first] for curve in curves]
        gained, lost = s.split()
        console.print(
            f"gain step {first} -> {last}: " + " / ".join(f"{g:+.1f}" for g in gains)
            + f" (mean {statistics.fmean(gains):+.1f}); tasks gained {gained}, lost {lost}, "
            f"sign test p {sign_test_p(gained, lost):.2g}"
        )  # fmt: skip


def plot(name: str, series: list[Series], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for s, color in zip(series, plt.rcParams["axes.prop_cycle"].by_key()["color"]):
        steps, curves = s.steps, s.curves
        for curve in curves:
            ax.plot(steps, [curve[t] for t in steps], color=color, alpha=0.3, linewidth=0.8)
        values = [[curve[t] for curve in curves] for t in steps]
        ax.fill_between(steps, [min(v) for v in values], [max(v) for v in values], color=color, alpha=0.15)
        mean = [statistics.fmean(v) for v in values]
        ax.plot(steps, mean, color=color, linewidth=2.2, marker="o", label=f"{s.label} (mean of {len(curves)})")
    ax.set_xlabel("training step")
    ax.set_ylabel("held-out success (%)")
    ax.set_title(f"{name}: held-out success, runs and their mean")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--figure", nargs="+", action="append", required=True, metavar="NAME LABEL=DIR",
        help="a figure's name, then its series",
    )  # fmt: skip
    parser.add_argument("--out-dir", type=Path, default=HERE, help="where learning_curves_NAME.png go")
    args = parser.parse_args()
    console = Console()
    for name, *specs in args.figure:
        if not specs:
            parser.error(f"--figure {name}: give at least one LABEL=DIR")
        series = [load_series(spec) for spec in specs]
        report(console, name, series)
        path = args.out_dir / f"learning_curves_{name}.png"
        plot(name, series, path)
        console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
