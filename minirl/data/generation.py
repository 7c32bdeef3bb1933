"""Seeded generation shared by the synthetic datasets: task families, core / extra phrasings, and
train / held-out splits that never share a prompt.

A dataset supplies its families (kind -> draw an episode from a `random.Random`) and how an
episode becomes a row; `RowGenerator` does the rest:

    GENERATOR = RowGenerator("my_dataset", families, to_row, sft_mix, rl_mix)
    train, heldout = GENERATOR.train_heldout_split(2000, 64, seed=0)

Warm-start (SFT) rows use core phrasings (and extra ones in a chosen share of rows,
`sft.extra_wording_share`, 0 by default) and may repeat a prompt; RL rows use a chosen phrasing set
(`data.phrasings`: all, or only the extra ones) and never repeat one. All randomness comes from
`random.Random(seed)`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from minirl.data.task import Task, task_from_row
from minirl.errors import DataError

_TRIES_PER_ROW = 20  # draws from the chosen family before it counts as full for this row
_PICKS_PER_ROW = 10  # family choices allowed per requested row before the space counts as too small
_MIN_PICKS = 100


@dataclass(frozen=True)
class Phrasings:
    """Ways to word one question: the warm start sees `core`; `extra` ones only in sft.extra_wording_share of its
    rows (by default none)."""

    core: tuple[str, ...]
    extra: tuple[str, ...]

    def pick(self, rng: random.Random, phrasing_set: str) -> str:
        return rng.choice(PHRASING_SETS[phrasing_set](self))


# which phrasings a split draws from; the warm start uses "core" (and "unseen" in sft.extra_wording_share of rows)
PHRASING_SETS: dict[str, Callable[[Phrasings], tuple[str, ...]]] = {
    "core": lambda p: p.core,  # the warm start's own wordings
    "all": lambda p: p.core + p.extra,  # seen and unseen wordings
    "unseen": lambda p: p.extra,  # only the extra wordings (by default never in the warm start): RL must generalise
}


class Episode(Protocol):
    user: str  # the question: the key that keeps splits apart


E = TypeVar("E", bound=Episode)


def prompt_text(task_or_row: Task | dict) -> str:
    """The last user message: the key that keeps splits apart."""
    messages = task_or_row.messages if isinstance(task_or_row, Task) else task_or_row["conversations"]
    return next(message["content"] for message in reversed(messages) if message["role"] == "user")


@dataclass(frozen=True)
class RowGenerator(Generic[E]):
    """Rows of one synthetic dataset, drawn family by family from a seed."""

    name: str  # the dataset's name, in error locations
    families: Mapping[str, Callable[[random.Random, str], E]]  # kind -> draw(rng, phrasing set)
    to_row: Callable[[random.Random, str, E], dict]  # (rng, kind, episode) -> row in the agent-RL format
    sft_mix: Mapping[str, float]  # share of each kind in warm-start rows
    rl_mix: Mapping[str, float]  # share of each kind in RL rows

    def _fresh_episode(self, rng: random.Random, kind: str, phrasings: str, taken: Collection[str]) -> E | None:
        """A draw from one family whose prompt is not taken; None when _TRIES_PER_ROW draws all were."""
        for _ in range(_TRIES_PER_ROW):
            episode = self.families[kind](rng, phrasings)
            if episode.user not in taken:
                return episode
        return None

    def generate(
        self,
        n: int,
        seed: int,
        exclude_prompts: Collection[str],
        mix: Mapping[str, float],
        phrasings: Callable[[], str],
        unique: bool,
    ) -> list[dict]:
        """n rows, each from a family drawn from `mix` and worded from the phrasing set `phrasings()` names, with a
        prompt not in `exclude_prompts` (nor, when `unique`, already used). Raises DataError when the prompt space
        runs out."""
        rng = random.Random(seed)
        taken = set(exclude_prompts)
        rows: list[dict] = []
        max_picks = max(_MIN_PICKS, _PICKS_PER_ROW * n)
        picks = 0
        while len(rows) < n:
            if picks == max_picks:
                raise DataError(
                    f"only {len(rows)} of {n} distinct synthetic prompts found in {max_picks} tries "
                    f"({len(exclude_prompts)} prompts excluded); ask for fewer rows"
                )
            picks += 1
            kind = rng.choices(list(mix), weights=list(mix.values()))[0]
            episode = self._fresh_episode(rng, kind, phrasings(), taken)
            if episode is None:
                continue
            if unique:
                taken.add(episode.user)
            rows.append(self.to_row(rng, kind, episode))
        return rows

    def sft_rows(
        self, n: int, seed: int, exclude_prompts: Collection[str], extra_wording_share: float = 0.0
    ) -> list[dict]:
        """Warm-start rows: kinds drawn from `sft_mix`, no prompt in `exclude_prompts`; each row is worded from the
        extra phrasings with probability `extra_wording_share` (drawn from a generator of its own, so the rows of
        share 0 are the same as before), else from the core ones."""
        wording = random.Random(f"wording:{seed}")
        return self.generate(
            n,
            seed,
            exclude_prompts,
            self.sft_mix,
            phrasings=lambda: "unseen" if wording.random() < extra_wording_share else "core",
            unique=False,
        )

    def rl_rows(
        self, n: int, seed: int, exclude_prompts: Collection[str] = frozenset(), phrasings: str = "all"
    ) -> list[dict]:
        """RL rows: `phrasings` (a PHRASING_SETS key), kinds drawn from `rl_mix`, distinct prompts
        none of which is excluded."""
        return self.generate(n, seed, exclude_prompts, self.rl_mix, lambda: phrasings, unique=True)

    def train_heldout_split(
        self, train_size: int, heldout_size: int, seed: int, phrasings: str = "all", train_phrasings: str | None = None
    ) -> tuple[list[Task], list[Task]]:
        """(train, held-out) RL tasks, worded from `phrasings` (train ones from `train_phrasings` when given);
        held-out uses seed + 1 and no train prompt equals a held-out one."""
        heldout = self.rl_rows(heldout_size, seed + 1, phrasings=phrasings)
        train = self.rl_rows(train_size, seed, {prompt_text(row) for row in heldout}, train_phrasings or phrasings)
        return self._tasks(train, "train"), self._tasks(heldout, "heldout")

    def _tasks(self, rows: list[dict], split: str) -> list[Task]:
        return [task_from_row(row, f"{self.name}:{split}[{i}]") for i, row in enumerate(rows)]
