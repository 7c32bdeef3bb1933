"""Task datasets: a registry of loaders returning (train, held-out) task lists.

    @DATASETS.register("my_dataset")
    def my_dataset(cfg: DatasetConfig) -> tuple[list[Task], list[Task]]: ...

then `data.name=my_dataset`. `WARM_START_CORPORA` names the conversations the embedded tiny
model's tokenizer and SFT warm start learn from (`sft.corpus=synthetic_math`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Protocol

from minirl.data import synthetic_math, synthetic_tools
from minirl.data.jsonl import load_jsonl
from minirl.data.task import DataError, Task
from minirl.registry import ConfigError, Registry


class DatasetConfig(Protocol):
    """What loaders read from the config (`DataConfig`)."""

    path: str | None
    heldout_path: str | None
    train_size: int
    heldout_size: int
    seed: int
    phrasings: str


DatasetLoader = Callable[[DatasetConfig], tuple[list[Task], list[Task]]]
DATASETS: Registry[DatasetLoader] = Registry("dataset")


@DATASETS.register("synthetic_tools")
def synthetic_tools_dataset(cfg: DatasetConfig) -> tuple[list[Task], list[Task]]:
    """Generated tool tasks; train and held-out never share a prompt."""
    return synthetic_tools.GENERATOR.train_heldout_split(cfg.train_size, cfg.heldout_size, cfg.seed, cfg.phrasings)


@DATASETS.register("synthetic_math")
def synthetic_math_dataset(cfg: DatasetConfig) -> tuple[list[Task], list[Task]]:
    """Generated math tasks for the code interpreter; train and held-out never share a prompt."""
    return synthetic_math.GENERATOR.train_heldout_split(cfg.train_size, cfg.heldout_size, cfg.seed, cfg.phrasings)


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


@dataclass(frozen=True)
class WarmStartCorpus:
    """Conversations with full references that the embedded model's tokenizer and warm start learn from."""

    sft_rows: Callable[[int, int, Collection[str]], list[dict]]  # (n, seed, exclude_prompts) -> rows
    sources: tuple[tuple[str, str], ...]  # (package, file) whose source decides the rows: part of the model's cache key


WARM_START_CORPORA: Registry[WarmStartCorpus] = Registry("sft.corpus")
WARM_START_CORPORA.register("synthetic_tools")(
    WarmStartCorpus(
        synthetic_tools.GENERATOR.sft_rows,
        sources=(
            ("minirl.data", "generation.py"),
            ("minirl.data", "synthetic_tools.py"),
            ("minirl.tools", "minimind.py"),
        ),
    )
)
WARM_START_CORPORA.register("synthetic_math")(
    WarmStartCorpus(
        synthetic_math.GENERATOR.sft_rows,
        sources=(
            ("minirl.data", "generation.py"),
            ("minirl.data", "synthetic_math.py"),
            ("minirl.tools", "code_interpreter.py"),
        ),
    )
)

__all__ = [
    "DATASETS",
    "WARM_START_CORPORA",
    "DataError",
    "DatasetConfig",
    "DatasetLoader",
    "Task",
    "WarmStartCorpus",
    "load_jsonl",
]
