"""`python -m minirl.report DIR`: a sweep's runs read together, one row per configuration.

python -m minirl.report multirun/NAME                          # every job of a multirun (nested sweeps too)
python -m minirl.report multirun/NAME --baseline loss=grpo     # each row against the loss=grpo row
python -m minirl.report outputs/DATE/TIME                      # a single run
python -m minirl.report multirun/NAME --replicate trainer.seed --replicate data.seed --metric eval/reward/mean
python -m minirl.report multirun/NAME --out reports/NAME       # where the files go (default: DIR)

Finds every run under DIR (minirl/reporting/runs.py) with its overrides and status (finished, failed with its
error, running, interrupted), folds the replicate axes (--replicate, default trainer.seed) into mean +- sd and
n, and prints the table: the overrides that vary, then the metric (--metric, default the held-out success rate)
at step 0, at the end and at its best, the gain, the steps, the wall time and the sampled tokens per second of
training step; with --baseline, the paired difference at the end and the pooled paired sign test on the held-out
tasks gained and lost (minirl/reporting/fold.py). Writes report.html (the table and the learning curves overlaid),
report.md, report.csv and report.json, and the metric's curves as learning_curves.svg. A directory without runs
or a baseline that matches no row prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omegaconf import OmegaConf
from rich.console import Console

from minirl.inspection.files import RunFileError
from minirl.reporting import html, tables
from minirl.reporting.fold import Table, fold
from minirl.reporting.runs import find_runs

OPTUNA_RESULTS = "optimization_results.yaml"  # what Hydra's Optuna sweeper writes in its sweep directory


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m minirl.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, metavar="DIR", help="a multirun's sweep directory, or a run directory")
    parser.add_argument("--metric", default="eval/success_rate", help="the metric the table follows")
    parser.add_argument(
        "--replicate", action="append", metavar="KEY", help="an override that replicates (repeatable; trainer.seed)"
    )
    parser.add_argument(
        "--baseline", action="append", metavar="KEY=VALUE", help="the row to compare with (repeatable: all must hold)"
    )
    parser.add_argument("--out", type=Path, help="the directory the report files go to (default DIR)")
    args = parser.parse_args(argv)
    if args.baseline and any("=" not in b for b in args.baseline):
        parser.error("--baseline takes KEY=VALUE, e.g. --baseline loss=grpo")
    return args


def optuna_results(root: Path) -> dict | None:
    """The best trial an Optuna sweep recorded in `root` or a sweep directory just below it, if any (not a walk of
    the whole tree: the runs' checkpoints and W&B files are below too)."""
    for path in [root / OPTUNA_RESULTS, *sorted(root.glob(f"*/{OPTUNA_RESULTS}"))]:
        if path.is_file():
            return OmegaConf.to_container(OmegaConf.load(path))
    return None


def write_files(table: Table, root: Path, out: Path, optuna: dict | None) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "report.html": html.render(table, root, optuna),
        "report.md": tables.markdown(table),
        "report.csv": tables.to_csv(table),
        "report.json": tables.dumps(table),
        "learning_curves.svg": html.curve_svg(table, table.metric) + "\n",
    }
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
    return [out / name for name in files]


def report(args: argparse.Namespace, console: Console) -> None:
    runs = find_runs(args.root)
    baseline = dict(b.split("=", 1) for b in args.baseline or [])
    try:
        table = fold(runs, args.metric, args.replicate or ["trainer.seed"], baseline)
    except ValueError as err:
        raise RunFileError(str(err)) from None
    console.print(tables.rich_table(table))
    for row in table.rows:
        for run in row.runs:
            if not run.done:
                error = f": {run.error}" if run.error else ""
                console.print(f"[bold red]{run.status}[/] {run.path} ({row.label}){error}", highlight=False)
    optuna = optuna_results(args.root)
    if optuna and "best_value" in optuna:
        params = " ".join(f"{k}={v}" for k, v in optuna["best_params"].items())
        console.print(f"Optuna's best trial: {optuna['best_value']} with {params}", highlight=False)
    try:
        written = write_files(table, args.root, args.out or args.root, optuna)
    except OSError as err:
        raise RunFileError(f"cannot write the report to {args.out or args.root} ({err.strerror})") from None
    console.print("wrote " + ", ".join(str(path) for path in written), highlight=False)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    if not console.is_terminal:  # a log or a pipe: the table's own width, not 80 columns
        console.width = 200
    try:
        report(args, console)
    except RunFileError as err:
        print(f"minirl.report: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
