"""Which tasks a step rolls out, and which of the sampled groups it learns from.

`TaskQueue` walks reshuffled passes over the training set (its state resumes exactly). `collect_groups`
runs rollout rounds: without dynamic sampling one round of trainer.prompts_per_step prompts, all learned
from. With dynamic sampling (DAPO, algo.dynamic_sampling), rounds of algo.prompts_per_round prompts drop
the groups whose rewards all tie, until prompts_per_step groups are kept or algo.max_resample_rounds extra
rounds have run; the surplus is dropped. One large round costs less than several small ones (one decoding
loop). Unlike DAPO, which samples until the batch is full, the batch may end short or empty (the step then
makes no update); metrics.group_metrics counts both.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import torch

from minirl.algos.dapo import tied_groups
from minirl.config import AlgoConfig
from minirl.data.task import Task
from minirl.distributed.world import World
from minirl.rollout.trajectory import Trajectory


class TaskQueue:
    """The next tasks of reshuffled passes over `tasks`, drawn with its own RNG (seeded by `seed`)."""

    def __init__(self, tasks: Sequence[Task], seed: int) -> None:
        self.tasks = list(tasks)
        self.rng = random.Random(seed)
        self.queue: list[Task] = []

    def next(self, count: int) -> list[Task]:
        """The next `count` tasks; a new shuffled pass starts whenever the queue runs short."""
        while len(self.queue) < count:
            epoch = list(self.tasks)
            self.rng.shuffle(epoch)
            self.queue += epoch
        batch = self.queue[:count]
        del self.queue[:count]
        return batch

    def state_dict(self) -> dict[str, Any]:
        position = {id(task): i for i, task in enumerate(self.tasks)}
        return {"task_rng": self.rng.getstate(), "task_queue": [position[id(task)] for task in self.queue]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.setstate(state["task_rng"])
        self.queue = [self.tasks[i] for i in state["task_queue"]]


def collect_groups(
    rollout: Callable[[], list[Trajectory]],
    guide: Callable[[list[Trajectory]], list[Trajectory]],
    group_size: int,
    prompts_per_step: int,
    algo: AlgoConfig,
) -> tuple[list[Trajectory], list[Trajectory]]:
    """(every trajectory sampled this step, the ones to learn from), groups contiguous in both. Each round is
    `rollout()` (a round of groups with their rewards; under several ranks every rank's, `gathered`) and
    under algo.guide `guide` (a group that all failed learns from its task's reference answer; `sampled`
    keeps what the policy sampled)."""
    wanted = prompts_per_step * group_size
    sampled: list[Trajectory] = []
    kept: list[Trajectory] = []
    for _ in range(1 + algo.max_resample_rounds):
        trajs = rollout()
        sampled += trajs
        if algo.guide:
            trajs = guide(trajs)
        if not algo.dynamic_sampling:
            return sampled, trajs
        tied = tied_groups(torch.tensor([t.reward for t in trajs]), group_size)  # [groups]
        kept += [t for t in trajs if not tied[t.group_index]]
        if len(kept) >= wanted:
            break
    return sampled, kept[:wanted]


def gathered(world: World, trajs: list[Trajectory]) -> list[Trajectory]:
    """Every rank's round of groups (`trajs`, this rank's share of the round's tasks, World.share) as one round
    on every rank, in rank order (the tasks' order), each group_index its position in that round."""
    ranks = world.gather(trajs)
    offsets = [0]
    for part in ranks[:-1]:
        offsets.append(offsets[-1] + len({t.group_index for t in part}))
    for offset, part in zip(offsets, ranks):
        for traj in part:
            traj.group_index += offset
    return [traj for part in ranks for traj in part]
