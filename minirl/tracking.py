"""Where metrics go: `metrics.jsonl` in the run directory (always), a readable console line per
step (always), and a tracking backend chosen by `logger.backend` (W&B offline by default)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from rich.console import Console

from minirl.config import Config
from minirl.errors import ConfigError
from minirl.inspection.files import METRICS_FILE, TRAJECTORIES_FILE, keep_through_step
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

    def close(self) -> None:
        pass


@BACKENDS.register("wandb")
class WandbBackend:
    """W&B in offline mode unless `logger.mode=online`; offline runs sync later with `wandb sync`."""

    def __init__(self, cfg: Config, run_dir: Path, run_id: str | None = None) -> None:
        try:
            import wandb
        except ImportError as err:
            raise ConfigError("logger=wandb needs wandb: pip install wandb (or use logger=none)") from err
        self.run = wandb.init(
            project=cfg.logger.project,
            name=cfg.logger.run_name,
            mode=cfg.logger.mode.value,
            dir=str(run_dir),
            config=dataclasses.asdict(cfg),
            settings=wandb.Settings(quiet=True),  # the console already shows each step
            id=run_id,
            resume="allow" if run_id else None,  # a resumed training run continues its W&B run
        )
        self.run_id = self.run.id

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def log_table(self, step: int, key: str, columns: list[str], rows: list[list]) -> None:
        import wandb

        self.run.log({key: wandb.Table(columns=columns, data=rows)}, step=step)

    def close(self) -> None:
        self.run.finish()


class Tracker:
    """`resume_step` (a resumed run): rows of metrics.jsonl and trajectories.jsonl past that step were
    written after the checkpoint and are dropped, since the run logs those steps again; `run_id` continues
    the backend's run."""

    def __init__(
        self, cfg: Config, run_dir: Path, console: Console, resume_step: int | None = None, run_id: str | None = None
    ) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / METRICS_FILE
        if resume_step is not None:
            for path in (self.path, run_dir / TRAJECTORIES_FILE):
                keep_through_step(path, resume_step)
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

    def close(self) -> None:
        self.backend.close()
