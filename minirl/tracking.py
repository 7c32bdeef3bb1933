"""Where metrics go: `metrics.jsonl` in the run directory (always), a readable console line per
step (always), and a tracking backend chosen by `logger.backend` (W&B offline by default)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from rich.console import Console

from minirl.config import Config
from minirl.registry import ConfigError, Registry

BACKENDS: Registry[type] = Registry("logger backend")


@BACKENDS.register("none")
class NullBackend:
    def __init__(self, cfg: Config, run_dir: Path) -> None:
        pass

    def log(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def close(self) -> None:
        pass


@BACKENDS.register("wandb")
class WandbBackend:
    """W&B in offline mode unless `logger.mode=online`; offline runs sync later with `wandb sync`."""

    def __init__(self, cfg: Config, run_dir: Path) -> None:
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
        )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


class Tracker:
    def __init__(self, cfg: Config, run_dir: Path, console: Console) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / "metrics.jsonl"
        self.console = console
        self.backend = BACKENDS.get(cfg.logger.backend)(cfg, run_dir)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        self.backend.log(step, metrics)

    def close(self) -> None:
        self.backend.close()
