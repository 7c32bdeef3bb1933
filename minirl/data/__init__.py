"""Task datasets: a registry of loaders returning a `Dataset` (train and held-out tasks, and the
malformed rows skipped under `data.on_error=skip`).

    @DATASETS.register("my_dataset")
    def my_dataset(cfg: DatasetConfig) -> Dataset: ...

then `data.name=my_dataset`. `WARM_START_CORPORA` names the conversations the SFT warm start (and the
embedded tiny model's tokenizer) learn from: `sft.corpus=synthetic_math`, or a file of a user's own
(`sft.corpus=jsonl sft.path=conversations.jsonl`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Protocol

from minirl.config import Config, OnError
from minirl.data import synthetic_math, synthetic_tools
from minirl.data.generation import RowGenerator
from minirl.data.jsonl import load_jsonl
from minirl.data.task import Task, task_from_row
from minirl.errors import ConfigError, DataError
from minirl.registry import Registry

log = logging.getLogger(__name__)

REASONS_LOGGED = 3  # skipped rows whose reason the log line quotes


class DatasetConfig(Protocol):
    """What loaders read from the config (`DataConfig`)."""

    path: str | None
    heldout_path: str | None
    train_size: int
    heldout_size: int
    seed: int
    phrasings: str
    train_phrasings: str | None
    on_error: OnError
    max_row_bytes: int


@dataclass
class Dataset:
    """What a loader returns; `skipped` holds one `path:lineno: reason` per malformed row left out."""

    train: list[Task]
    heldout: list[Task]
    skipped: list[str]

    def skip_report(self) -> str:
        """How many rows were skipped and the first few reasons, for the logs."""
        first = "; ".join(self.skipped[:REASONS_LOGGED])
        return f"skipped {len(self.skipped)} malformed rows (data.on_error=skip); first: {first}"


DatasetLoader = Callable[[DatasetConfig], Dataset]
DATASETS: Registry[DatasetLoader] = Registry("dataset")


def _synthetic(generator: RowGenerator) -> DatasetLoader:
    """The loader of a generated dataset: seeded train and held-out tasks that never share a prompt."""

    def load(cfg: DatasetConfig) -> Dataset:
        split = generator.train_heldout_split(
            cfg.train_size, cfg.heldout_size, cfg.seed, cfg.phrasings, cfg.train_phrasings
        )
        return Dataset(*split, skipped=[])

    return load


DATASETS.register("synthetic_tools")(_synthetic(synthetic_tools.GENERATOR))  # MiniMind's six mock tools
DATASETS.register("synthetic_math")(_synthetic(synthetic_math.GENERATOR))  # math for the code interpreter (ReTool)
DATASETS.register("synthetic_math_no_tool")(_synthetic(synthetic_math.NO_TOOL_GENERATOR))  # the same, no tool offered


@DATASETS.register("jsonl")
def jsonl_dataset(cfg: DatasetConfig) -> Dataset:
    """Tasks from `cfg.path`; held-out from `cfg.heldout_path`, else the file's last `heldout_size` tasks.
    Under `data.on_error=skip` malformed rows are left out, counted and logged; otherwise the first raises."""
    if cfg.path is None:
        raise ConfigError("data.path: the jsonl dataset needs a file (data.path=tasks.jsonl)")
    skipped: list[str] = []
    collect = skipped if cfg.on_error == OnError["skip"] else None
    tasks = load_jsonl(cfg.path, cfg.max_row_bytes, collect)
    if cfg.heldout_path is not None:
        dataset = Dataset(tasks, load_jsonl(cfg.heldout_path, cfg.max_row_bytes, collect), skipped)
    elif len(tasks) <= cfg.heldout_size:
        raise ConfigError(
            f"data.heldout_size: {cfg.path} has {len(tasks)} tasks, not more than heldout_size={cfg.heldout_size}; "
            "lower it or set data.heldout_path"
        )
    else:
        dataset = Dataset(tasks[: -cfg.heldout_size], tasks[-cfg.heldout_size :], skipped)
    if skipped:
        log.warning(dataset.skip_report())
    return dataset


@dataclass(frozen=True)
class WarmStartCorpus:
    """Conversations with full references that a warm start learns from (the embedded model's tokenizer too)."""

    # (config, n, seed, prompts to exclude) -> up to n tasks whose references are what SFT trains on
    conversations: Callable[[Config, int, int, Collection[str]], list[Task]]
    sources: tuple[tuple[str, str], ...]  # (package, file) whose source decides the rows: part of the model's cache key


def _generated(generator: RowGenerator) -> Callable[[Config, int, int, Collection[str]], list[Task]]:
    """The generator's warm-start rows as tasks."""

    def conversations(cfg: Config, n: int, seed: int, exclude: Collection[str]) -> list[Task]:
        rows = generator.sft_rows(n, seed, exclude, cfg.sft.extra_wording_share)
        return [task_from_row(row, f"{generator.name}:sft[{i}]") for i, row in enumerate(rows)]

    return conversations


def jsonl_conversations(cfg: Config, n: int, seed: int, exclude: Collection[str]) -> list[Task]:
    """The first `n` conversations of `sft.path` (rows in the agent format, each with assistant messages after its
    last user message) whose prompt is not excluded, in file order (`seed` is not used). A malformed row, or one
    with nothing to train on, raises DataError naming it."""
    if cfg.sft.path is None:
        raise ConfigError("sft.path: sft.corpus=jsonl needs a file of conversations (sft.path=conversations.jsonl)")
    tasks = load_jsonl(cfg.sft.path, cfg.data.max_row_bytes)
    for i, task in enumerate(tasks):
        if not any(m["role"] == "assistant" for m in task.reference):
            raise DataError(
                f"{cfg.sft.path}: row {i + 1} ({task.id}) has no assistant message after its last user message: "
                "nothing to train on"
            )
    return [t for t in tasks if t.messages[-1]["content"] not in exclude][:n]


WARM_START_CORPORA: Registry[WarmStartCorpus] = Registry("sft.corpus")
WARM_START_CORPORA.register("synthetic_tools")(
    WarmStartCorpus(
        _generated(synthetic_tools.GENERATOR),
        sources=(
            ("minirl.data", "generation.py"),
            ("minirl.data", "synthetic_tools.py"),
            ("minirl.tools", "minimind.py"),
        ),
    )
)
WARM_START_CORPORA.register("synthetic_math")(
    WarmStartCorpus(
        _generated(synthetic_math.GENERATOR),
        sources=(
            ("minirl.data", "generation.py"),
            ("minirl.data", "synthetic_math.py"),
            ("minirl.tools", "code_interpreter.py"),
        ),
    )
)
WARM_START_CORPORA.register("synthetic_math_no_tool")(
    WarmStartCorpus(
        _generated(synthetic_math.NO_TOOL_GENERATOR),
        sources=(("minirl.data", "generation.py"), ("minirl.data", "synthetic_math.py")),
    )
)
# a user's file: its bytes are part of the cache key (minirl.bootstrap), not any source
WARM_START_CORPORA.register("jsonl")(WarmStartCorpus(jsonl_conversations, sources=(("minirl.data", "jsonl.py"),)))

__all__ = [
    "DATASETS",
    "WARM_START_CORPORA",
    "DataError",
    "Dataset",
    "DatasetConfig",
    "DatasetLoader",
    "Task",
    "WarmStartCorpus",
    "load_jsonl",
]
