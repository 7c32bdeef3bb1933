"""The runs under a directory: every job of a Hydra multirun (nested sweeps too), or a single run directory, each
with its overrides, its status and its files.

    runs = find_runs(Path("multirun/loss_study"))   # [Run(path, overrides, status, error, rows, heldout), ...]

A run directory is one that holds job.json (the entry point writes it, minirl/inspection/job.py), metrics.jsonl or
`.hydra/overrides.yaml`; the search does not go below one. Its overrides are those job.json records (what made the
files there; Hydra rewrites `.hydra/` at every attempt), else `.hydra/overrides.yaml`. A run from before job
records has status `unknown`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from minirl.inspection.files import HELDOUT_FILE, METRICS_FILE, RunFileError, read_jsonl, read_metrics
from minirl.inspection.job import JOB_FILE, job_status, read_job

OVERRIDES_FILE = Path(".hydra") / "overrides.yaml"
UNKNOWN = "unknown"  # no job record: a run from before they were written
# what a run directory holds besides its files: never a run of its own
_NOT_RUNS = {"checkpoint", "checkpoints", "wandb", ".hydra", ".submitit"}


@dataclass
class Run:
    path: Path
    overrides: dict[str, str]  # key -> value, in the order given (`loss=cispo` -> {"loss": "cispo"})
    status: str  # a JobStatus value, or UNKNOWN
    error: str | None = None  # a failed run's error line
    record: dict = field(default_factory=dict)  # job.json ({} without one)
    rows: list[dict] = field(default_factory=list)  # metrics.jsonl
    heldout: list[dict] = field(default_factory=list)  # heldout.jsonl: per-task held-out outcomes per evaluation

    @property
    def done(self) -> bool:
        """Whether its figures count: it finished (or has no record to say otherwise)."""
        return self.status in ("finished", UNKNOWN)


def _split(overrides: list[str]) -> dict[str, str]:
    pairs = (o.split("=", 1) for o in overrides if "=" in o)
    return {key.lstrip("+~"): value for key, value in pairs}


def load_run(path: Path) -> Run:
    """One run directory's record, overrides and files (missing files are empty)."""
    record = read_job(path) or {}
    if "overrides" in record:
        overrides = list(record["overrides"])
    elif (path / OVERRIDES_FILE).is_file():
        overrides = [str(o) for o in OmegaConf.to_container(OmegaConf.load(path / OVERRIDES_FILE))]
    else:
        overrides = []
    rows = read_metrics(path / METRICS_FILE) if (path / METRICS_FILE).is_file() else []
    heldout = list(read_jsonl(path / HELDOUT_FILE)) if (path / HELDOUT_FILE).is_file() else []
    status = job_status(record).value if record else UNKNOWN
    return Run(path, _split(overrides), status, record.get("error"), record, rows, heldout)


def _is_run(path: Path, names: set[str]) -> bool:
    return JOB_FILE in names or METRICS_FILE in names or (path / OVERRIDES_FILE).is_file()


def find_runs(root: Path) -> list[Run]:
    """The runs at or under `root` in the order they first started (runs without a record last, by job number).
    RunFileError when `root` is not a directory or holds none."""
    if not root.is_dir():
        raise RunFileError(f"no directory at {root}")
    found = []
    for directory, subdirs, files in os.walk(root):
        path = Path(directory)
        if _is_run(path, set(files)):
            found.append(path)
            subdirs.clear()
        else:
            subdirs[:] = [d for d in subdirs if d not in _NOT_RUNS]
    if not found:
        raise RunFileError(f"no runs under {root} (a run directory holds {JOB_FILE} or {METRICS_FILE})")
    runs = [load_run(path) for path in found]

    def order(run: Run) -> tuple:  # when it first started (sweeps in the order they ran), then its job number
        numbers = tuple(int(p) if p.isdigit() else 0 for p in run.path.relative_to(root).parts)
        return (run.record.get("first_started", run.record.get("started", math.inf)), numbers, str(run.path))

    return sorted(runs, key=order)
