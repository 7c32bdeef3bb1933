"""Task datasets: a registry of loaders returning (train, held-out) task lists.

    @DATASETS.register("my_dataset")
    def my_dataset(cfg: DatasetConfig) -> tuple[list[Task], list[Task]]: ...

then `data.name=my_dataset`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from minirl.data.jsonl import load_jsonl
from minirl.data.synthetic_tools import train_heldout_split
from minirl.data.task import DataError, Task
from minirl.registry import ConfigError, Registry


class DatasetConfig(Protocol):
    """What loaders read from the config (`DataConfig`)."""

    path: str | None
    heldout_path: str | None
    train_size: int
    heldout_size: int
    seed: int


DatasetLoader = Callable[[DatasetConfig], tuple[list[Task], list[Task]]]
DATASETS: Registry[DatasetLoader] = Registry("dataset")


@DATASETS.register("synthetic_tools")
def synthetic_tools_dataset(cfg: DatasetConfig) -> tuple[list[Task], list[Task]]:
    """Generated tool tasks; train and held-out never share a prompt."""
    return train_heldout_split(cfg.train_size, cfg.heldout_size, cfg.seed)


@DATASETS.register("jsonl")
def jsonl_dataset(cfg: DatasetConfig) -> tuple[list[Task], list[Task]]:
    """Tasks from `cfg.path`; held-out from `cfg.heldout_path`, else the file's last `heldout_size` tasks."""
    if cfg.path is None:
        raise ConfigError("data.path: the jsonl dataset needs a file (data.path=tasks.jsonl)")
    tasks = load_jsonl(cfg.path)
    if cfg.heldout_path is not None:
        return tasks, load_jsonl(cfg.heldout_path)
    if len(tasks) <= cfg.heldout_size:
        raise ConfigError(
            f"data.heldout_size: {cfg.path} has {len(tasks)} tasks, not more than heldout_size={cfg.heldout_size}; "
            "lower it or set data.heldout_path"
        )
    return tasks[: -cfg.heldout_size], tasks[-cfg.heldout_size :]


__all__ = ["DATASETS", "DataError", "DatasetConfig", "DatasetLoader", "Task", "load_jsonl"]
