"""Where metrics go: `metrics.jsonl` in the run directory (always), a readable console line per
step (always), and a tracking backend chosen by `logger.backend` (W&B offline by default)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from rich.console import Console

from minirl.config import Config
from minirl.errors import ConfigError
from minirl.inspection.files import HELDOUT_FILE, METRICS_FILE, RUN_FILES, keep_through_step
from minirl.registry import Registry

BACKENDS: Registry[type] = Registry("logger backend")


@BACKENDS.register("none")
class NullBackend:
    def __init__(self, cfg: Config, run_dir: Path, run_id: str | None = None) -> None:
        pass

    run_id = None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def log_table(self, step: int, key: str, columns: list[str], rows: list[list]) -> None:
        pass

    def close(self, failed: bool = False) -> None:
        pass


@BACKENDS.register("wandb")
class WandbBackend:
    """W&B in offline mode unless `logger.mode=online`; offline runs sync later with `wandb sync`. The run's
    config is the whole typed config plus `overrides`, the command line's as {key: value}; the runs of one sweep
    share a group (logger.group) and are named by what the sweep varies (logger.run_name, minirl/sweep.py)."""

    def __init__(self, cfg: Config, run_dir: Path, run_id: str | None = None) -> None:
        try:
            import wandb
        except ImportError as err:
            raise ConfigError("logger=wandb needs wandb: pip install wandb (or use logger=none)") from err
        overrides = dict(override.split("=", 1) for override in cfg.overrides if "=" in override)
        self.run = wandb.init(
            project=cfg.logger.project,
            name=cfg.logger.run_name,
            group=cfg.logger.group,
            mode=cfg.logger.mode.value,
            dir=str(run_dir),
            config={**dataclasses.asdict(cfg), "overrides": overrides},
            settings=wandb.Settings(quiet=True),  # the console already shows each step
            id=run_id,
            resume="allow" if run_id else None,  # a resumed training run continues its W&B run
            reinit="finish_previous",  # a sweep's jobs in one process: each its own run, whatever the last left
        )
        self.run_id = self.run.id

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def log_table(self, step: int, key: str, columns: list[str], rows: list[list]) -> None:
        import wandb

        self.run.log({key: wandb.Table(columns=columns, data=rows)}, step=step)

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


class Tracker:
    """`resume_step` (a resumed run): rows of the run files (metrics.jsonl, trajectories.jsonl, heldout.jsonl)
    past that step were written after the checkpoint and are dropped, since the run logs those steps again;
    None (a run from step 0) drops every row an earlier attempt left in the directory. `run_id` continues the
    backend's run."""

    def __init__(
        self, cfg: Config, run_dir: Path, console: Console, resume_step: int | None = None, run_id: str | None = None
    ) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path, self.heldout_path = run_dir / METRICS_FILE, run_dir / HELDOUT_FILE
        for name in RUN_FILES:
            keep_through_step(run_dir / name, -1 if resume_step is None else resume_step)
        self.console = console
        self.backend = BACKENDS.get(cfg.logger.backend)(cfg, run_dir, run_id)

    @property
    def run_id(self) -> str | None:
        """The backend's run id (W&B), saved with checkpoints so a resumed run continues it."""
        return self.backend.run_id

    def log(self, step: int, metrics: dict[str, float]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        self.backend.log(step, metrics)

    def log_table(self, step: int, key: str, columns: list[str], rows: list[list]) -> None:
        self.backend.log_table(step, key, columns, rows)

    def log_heldout(self, step: int, task_ids: list[str], solved: list[bool]) -> None:
        """One held-out evaluation task by task (heldout.jsonl), so that two runs' evaluations pair up."""
        row = {"step": step, "tasks": task_ids, "solved": [int(s) for s in solved]}
        with self.heldout_path.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def close(self, failed: bool = False) -> None:
        self.backend.close(failed)

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, kind, error, trace) -> None:
        self.close(failed=kind is not None)


class MutedTracker(Tracker):
    """A Tracker that writes nothing: the ranks other than 0 of a multi-process run (rank 0 alone logs)."""

    def __init__(self) -> None:
        self.backend = NullBackend(None, Path("."))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def log_heldout(self, step: int, task_ids: list[str], solved: list[bool]) -> None:
        pass
