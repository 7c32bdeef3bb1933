"""One job of a command, alone or in a Hydra multirun (`python -m minirl.train -m ...`): its record in the run
directory (job.json, minirl/inspection/job.py), what a rerun of the sweep does with it, and the objective it
returns to the sweeper.

- Every job writes job.json: running at its start; then finished, with its objective, or failed, with its error.
- In a multirun a failing job is recorded, said on the console and raised again, so that Hydra marks it failed:
  the launchers run the other jobs of the batch, and the sweep ends non-zero after them (Hydra's basic sweeper
  raises the first failure once its batch is done; the Optuna sweeper marks the trial failed and goes on while
  no more than hydra.sweeper.max_failure_rate of a batch fails). `python -m minirl.report` lists the failures.
- Rerunning a sweep into the same hydra.sweep.dir (name it: the default holds the time) skips the jobs that
  finished, returning the objective they recorded, and runs the interrupted or failed ones again with
  trainer.resume=auto: from their newest checkpoint if trainer.save_every wrote one, else from step 0. A job
  directory that holds a job with other overrides is refused: a sweep reruns into its directory only as the
  same sweep (Hydra numbers the jobs in the order of the sweep's values).
- In a multirun, W&B groups the jobs by their sweep directory (logger.group) and names each by its swept
  overrides (logger.run_name), unless those are set; and a launcher that runs jobs side by side gives each its
  share of the cores as torch threads (trainer.threads), unless that is set: joblib's n_jobs at a time (-1: one
  per core), or submitit's cpus_per_task.

The objective is the mean of the last sweep.objective_window values of sweep.objective in metrics.jsonl (the
final held-out success rate by default); None when the job logged none.
"""

from __future__ import annotations

import math
import os
import socket
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hydra.types import RunMode
from omegaconf import DictConfig
from rich.console import Console
from rich.markup import escape

from minirl.config import Config, Resume, SweepConfig
from minirl.errors import ConfigError
from minirl.inspection.files import METRICS_FILE, RunFileError, read_metrics
from minirl.inspection.job import JOB_FILE, JobStatus, job_status, read_job, write_job


class JobConflict(ConfigError):
    """The job directory holds another job, or this job running now: its record is left as it is."""


def swept_keys(argv: Sequence[str]) -> list[str]:
    """The keys a command line sweeps (`loss=grpo,cispo`, `trainer.lr=range(...)`, `x=choice(...)`)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        overrides = OverridesParser.create().parse_overrides([a for a in argv if "=" in a and not a.startswith("-")])
    except HydraException:  # Hydra reports the syntax error itself
        return []
    return [o.key_or_group for o in overrides if o.is_sweep_override() and not o.key_or_group.startswith("hydra.")]


def override_key(override: str) -> str:
    """`+trainer.x=1` -> `trainer.x`; `loss=cispo` -> `loss`."""
    return override.split("=", 1)[0].lstrip("+~")


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def thread_share(launcher: DictConfig) -> int:
    """Torch threads for each job of a launcher that runs several at once (0: the launcher runs one at a time)."""
    target = str(launcher.get("_target_", ""))
    if "joblib" in target:
        n_jobs = int(launcher.get("n_jobs") or -1)
        at_once = n_jobs if n_jobs > 0 else max(1, cores() + 1 + n_jobs)  # joblib: -1 all cores, -2 all but one
        return max(1, cores() // at_once)
    if "submitit" in target:
        return int(launcher.get("cpus_per_task") or 0)
    return 0


def objective(run_dir: Path, sweep: SweepConfig) -> float | None:
    """The job's objective from its metrics.jsonl: the mean of the last objective_window finite values of the key."""
    try:
        rows = read_metrics(run_dir / METRICS_FILE)
    except RunFileError:
        return None
    values = [row[sweep.objective] for row in rows if isinstance(row.get(sweep.objective), (int, float))]
    values = [float(v) for v in values if math.isfinite(v)][-sweep.objective_window :]
    return sum(values) / len(values) if values else None


@dataclass
class Job:
    """One Hydra job: where it runs, its overrides, and whether it is one of a multirun's."""

    run_dir: Path
    command: str
    overrides: list[str]
    swept: list[str]
    multirun: bool
    num: int
    sweep_dir: str
    threads: int  # the launcher's share of the cores for this job (0: not set by the launcher)
    previous: dict | None = None  # the record an earlier attempt left in run_dir
    record: dict = field(default_factory=dict)
    # whether this process keeps the record: under torchrun rank 0 alone (RANK, set by torchrun for each process)
    writes: bool = field(default_factory=lambda: os.environ.get("RANK", "0") == "0")

    @classmethod
    def from_hydra(cls, hydra_cfg: DictConfig, command: str, argv_swept: Sequence[str]) -> Job:
        multirun = hydra_cfg.mode == RunMode.MULTIRUN
        params = (hydra_cfg.sweeper.get("params") or {}) if multirun else {}  # a preset's or Optuna's search space
        run_dir = Path(hydra_cfg.runtime.output_dir)
        return cls(
            run_dir=run_dir,
            command=command,
            overrides=list(hydra_cfg.overrides.task),
            swept=list(dict.fromkeys([*argv_swept, *params])),
            multirun=multirun,
            num=int(hydra_cfg.job.get("num") or 0),
            sweep_dir=str(hydra_cfg.sweep.dir) if multirun else "",
            threads=thread_share(hydra_cfg.launcher) if multirun else 0,
            previous=read_job(run_dir),
        )

    @property
    def name(self) -> str:
        """What the sweep varies in this job (`loss=cispo trainer.seed=1`), or its number."""
        swept = [o for o in self.overrides if override_key(o) in self.swept]
        return " ".join(swept) or f"job {self.num}"

    def owns_previous(self) -> bool:
        """Whether the record in run_dir is this job's (the same overrides), or there is none."""
        return self.previous is None or self.previous.get("overrides") == self.overrides

    def prepare(self, cfg: Config, console: Console) -> bool:
        """Decide what this attempt does, before anything loads; True when the job finished before and is skipped.
        Sets the sweep's defaults on `cfg`: resume, threads, the W&B group and name, the overrides."""
        cfg.overrides = self.overrides
        if not self.multirun:
            return False
        if not self.owns_previous():
            held = " ".join(self.previous.get("overrides", []))
            raise JobConflict(
                f"{self.run_dir} holds the job `{held}`, not `{' '.join(self.overrides)}`: a sweep reruns into its "
                "hydra.sweep.dir only as the same sweep; give this one a new hydra.sweep.dir"
            )
        if self.previous is not None:
            status = job_status(self.previous)
            if status is JobStatus.running:
                raise JobConflict(f"{self.run_dir}: this job is running now (pid {self.previous.get('pid')})")
            if status is JobStatus.finished and cfg.sweep.skip_finished:
                done = f"{escape(self.label)} finished before ({self.run_dir / JOB_FILE})"
                console.print(f"{done}; skipped, its objective {self.previous.get('objective')}", highlight=False)
                return True
            cfg.trainer.resume = Resume.auto  # interrupted or failed: from its newest checkpoint, if any
            last = "failed" if status is JobStatus.failed else "was interrupted"
            console.print(f"{escape(self.label)}: its last attempt {last}; running it again with trainer.resume=auto")
        if not cfg.trainer.threads:
            cfg.trainer.threads = self.threads
        cfg.logger.group = cfg.logger.group or self.sweep_dir
        cfg.logger.run_name = cfg.logger.run_name or self.name
        return False

    @property
    def label(self) -> str:
        return f"job {self.num} ({self.name})" if self.multirun else "the run"

    @property
    def skipped_objective(self) -> float | None:
        return (self.previous or {}).get("objective")

    def start(self) -> None:
        before = (self.previous or {}) if self.owns_previous() else {}  # this job's earlier attempts
        now = time.time()
        self.record = {
            "status": JobStatus.running.value,
            "command": self.command,
            "overrides": self.overrides,
            "swept": self.swept,
            "job_num": self.num if self.multirun else None,
            "sweep_dir": self.sweep_dir or None,
            "attempts": before.get("attempts", 0) + 1,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "threads": None,
            "cpu_capability": None,
            "first_started": before.get("first_started", before.get("started", now)),  # the report's order
            "started": now,
            "ended": None,
            "wall_s": None,
            "objective": None,
            "error": None,
        }
        if self.writes:
            write_job(self.run_dir, self.record)

    def end(self, status: JobStatus, **fields) -> None:
        ended = time.time()
        torch = sys.modules.get("torch")  # what it ran with, if it loaded torch (never loaded here)
        if torch is not None:  # a run's float rounding, so its values bit for bit, follow both
            self.record.update(threads=torch.get_num_threads(), cpu_capability=torch.backends.cpu.get_cpu_capability())
        self.record.update(status=status.value, ended=ended, wall_s=ended - self.record["started"])
        self.record.update(fields)
        if self.writes:
            write_job(self.run_dir, self.record)

    def finish(self, sweep: SweepConfig) -> float | None:
        value = objective(self.run_dir, sweep)
        self.end(JobStatus.finished, objective=value)
        return value

    def fail(self, err: BaseException, console: Console) -> None:
        """Record the failure (one that came before the start too, a config error, unless the directory belongs to
        another job or to this one running now) and, in a multirun, say it on the console."""
        if isinstance(err, JobConflict):
            console.print(
                f"[bold red]{escape(self.label)} not run[/]: {escape(str(err))}", highlight=False, soft_wrap=True
            )
            return
        if not self.record:
            self.start()
        interrupted = isinstance(err, KeyboardInterrupt)
        error = f"{type(err).__name__}: {err}".strip().splitlines()[0]
        status = JobStatus.interrupted if interrupted else JobStatus.failed
        self.end(status, error=error, traceback="".join(traceback.format_exception(type(err), err, err.__traceback__)))
        if self.multirun and not interrupted:
            console.print(
                f"[bold red]{escape(self.label)} failed[/]: {escape(error)} ({self.run_dir}); the sweep runs its "
                "other jobs and ends with this error",
                highlight=False,
                soft_wrap=True,
            )
