"""The sampling side of a run: the rollout engine, the tool executor, the agent's limits and the training tasks.

`Sampler` owns the engine (the trainer syncs weights into `sampler.engine`, and a test may swap it) and runs a
step's rollout: rounds of `group_size` trajectories per prompt, each round scored (shaping.score), guided and
filtered into the groups to learn from (groups.collect_groups), timed and stamped with the policy version that
sampled it (pipeline.timed). Under torchrun every rank rolls out its share of a round's groups and gathers the
whole round. Held-out evaluation samples through `rollout` too, with the same engine and limits.
"""

from __future__ import annotations

import threading

from minirl.config import Config
from minirl.data.task import Task
from minirl.distributed.world import World
from minirl.inference.sampling import SamplingParams
from minirl.rollout.agent_loop import AgentLimits, run_agent
from minirl.rollout.engine import Engine
from minirl.rollout.thinking import draw_thinking
from minirl.rollout.trajectory import Trajectory
from minirl.tools import ToolExecutor
from minirl.training.faults import rollout_memory_hint
from minirl.training.groups import TaskQueue, collect_groups, gathered
from minirl.training.pipeline import Rollout, timed
from minirl.training.reward_model import RewardModel
from minirl.training.shaping import guided, replayed, score


class Sampler:
    """Rollouts of `tasks` (the training set, in reshuffled passes) and of any other tasks, by `engine`."""

    def __init__(
        self, cfg: Config, engine: Engine, tokenizer, tasks: TaskQueue, reward_model: RewardModel, world: World
    ) -> None:
        self.cfg, self.engine, self.tokenizer, self.tasks = cfg, engine, tokenizer, tasks
        self.reward_model, self.world = reward_model, world
        self.executor = ToolExecutor.from_config(cfg.tools)
        self.limits = AgentLimits.from_config(cfg.rollout)
        self.cancel = threading.Event()  # set: a rollout in progress stops at its next turn (RolloutCancelled)

    @property
    def prompts_per_round(self) -> int:
        """Prompts one rollout round samples: algo.prompts_per_round, or trainer.prompts_per_step when that is 0."""
        return self.cfg.algo.prompts_per_round or self.cfg.trainer.prompts_per_step

    def step_rollout(self, version: int) -> Rollout:
        """A step's rollout (`groups`) by the weights of policy version `version`, timed; running out of memory
        raises TrainingError with the sizes that caused it."""
        rows = self.prompts_per_round * self.cfg.rollout.group_size
        with rollout_memory_hint("rollout", rows, self.cfg.rollout.max_total_tokens):
            rollout = timed(self.groups, version)
        rollout.reward_model = self.reward_model.metrics()
        return rollout

    def groups(self) -> tuple[list[Trajectory], list[Trajectory]]:
        """(every trajectory sampled this step, the ones to learn from): rounds of rollout and reward
        (minirl/training/groups.py)."""
        size = self.cfg.rollout.group_size
        return collect_groups(
            rollout=lambda: gathered(self.world, self.scored_round()),
            guide=lambda trajs: guided(trajs, size, self.reference_answer, self.cfg.algo.guide_solved_share),
            group_size=size,
            prompts_per_step=self.cfg.trainer.prompts_per_step,
            algo=self.cfg.algo,
        )

    def scored_round(self) -> list[Trajectory]:
        """This rank's share (World.share, whole groups) of the next round's tasks, rolled out and scored."""
        tasks = self.world.share(self.tasks.next(self.prompts_per_round))  # every rank draws the same tasks
        trajs = self.rollout(tasks, self.cfg.rollout.group_size, self.cfg.rollout.temperature, train=True)
        score(trajs, self.cfg, self.reward_model)
        return trajs

    def rollout(self, tasks: list[Task], group_size: int, temperature: float, train: bool = False) -> list[Trajectory]:
        """`group_size` trajectories per task; a training one draws which render with thinking on (thinking_ratio)."""
        r = self.cfg.rollout
        thinking = draw_thinking(r.thinking_ratio, r.thinking_unit, len(tasks), group_size) if train else None
        sampling, protocol = SamplingParams.from_config(r, temperature), self.cfg.protocol
        return run_agent(
            self.engine, self.tokenizer, self.executor, tasks, group_size, self.limits, sampling, protocol, thinking,
            barrier=r.barrier, cancel=self.cancel,
        )  # fmt: skip

    def reference_answer(self, traj: Trajectory) -> Trajectory | None:
        """The reference answer of traj's task, replayed in its group slot and scored (training/shaping.py)."""
        return replayed(traj, self.tokenizer, self.executor, self.limits, self.cfg, self.reward_model)
