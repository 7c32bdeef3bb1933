"""`python -m minirl.inspect RUN_DIR`: the trajectories a run recorded, with their loss mask.

python -m minirl.inspect RUN_DIR                        # the latest recorded step, a few trajectories
python -m minirl.inspect RUN_DIR --step 20 --step 40 --limit 8
python -m minirl.inspect RUN_DIR --html                 # writes RUN_DIR/report.html and prints its path
python -m minirl.inspect RUN_DIR --html /tmp/run.html

The trainer writes RUN_DIR/trajectories.jsonl every trainer.trajectories_every steps and metrics.jsonl
every step. Errors (no such run, no recorded trajectories, an unrecorded step) print one line and exit 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from minirl.inspection.files import TRAJECTORIES_FILE, RunFileError, read_trajectories, select_records
from minirl.inspection.report import REPORT_FILE, REPORT_LIMIT, write_report
from minirl.inspection.terminal import trajectory_panel

TERMINAL_LIMIT = 4


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m minirl.inspect", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a training run's output directory")
    parser.add_argument(
        "--step", type=int, action="append", help="a recorded step to show (repeatable; default: the latest)"
    )
    parser.add_argument(
        "--limit",
        type=int,
        help=f"trajectories per step (default {TERMINAL_LIMIT} in the terminal, {REPORT_LIMIT} in the report)",
    )
    parser.add_argument(
        "--html", nargs="?", const="", metavar="OUT", help=f"write the HTML report (default RUN_DIR/{REPORT_FILE})"
    )
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit must be >= 1, got {args.limit}")
    return args


def show(run_dir: Path, steps: list[int] | None, limit: int, console: Console) -> None:
    path = run_dir / TRAJECTORIES_FILE
    if not path.is_file():
        raise RunFileError(f"{run_dir} has no {TRAJECTORIES_FILE} (written every trainer.trajectories_every steps)")
    for record in select_records(list(read_trajectories(path)), steps, limit):
        console.print(trajectory_panel(record))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    try:
        if not args.run_dir.is_dir():
            raise RunFileError(f"no run directory at {args.run_dir}")
        if args.html is None:
            show(args.run_dir, args.step, args.limit or TERMINAL_LIMIT, console)
        else:
            print(write_report(args.run_dir, args.html or None, args.step, args.limit or REPORT_LIMIT))
    except RunFileError as err:
        print(f"minirl.inspect: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
