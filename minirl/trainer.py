"""The RL training loop: setup, `fit`, `train_step` and state/resume. Each step reads top to bottom:

    rollout -> reward (-> guidance, dynamic sampling) -> advantage -> loss + optimizer steps -> weight sync
    (-> sync check) -> metrics (-> trajectories.jsonl every trainer.trajectories_every steps -> held-out eval
    -> checkpoint)

The parts of a step are functions with explicit inputs in minirl/training/: the rollout engine, the tools and
the training tasks (sampling.py), which groups a step learns from (groups.py), reward shaping (shaping.py), the
tensor layout (batch.py), pi_old, the rollout correction and the optimizer steps (update.py), the check that the
sampler moved with the trainer every rollout.sync_check_every steps (sync_check.py), and one step off
(trainer.async_rollout, pipeline.py): the next step's rollout runs on a worker thread during this step's update.
A step whose loss or gradient is not finite skips its update (trainer.max_bad_steps in a row stop the run);
`trainer.resume=auto` continues from the run directory's newest checkpoint (minirl/training/checkpoint.py) with
the same optimizer, schedule, RNG and data position, as if never stopped. Under `torchrun` every rank runs this
loop on the step's whole batch (minirl/distributed/); rank 0 alone logs, evaluates and writes checkpoints.

Example (what `python -m minirl.train` runs after composing the config):

    from minirl.config import Config
    from minirl.trainer import train
    result = train(Config())          # the embedded tiny model, synthetic tool tasks
    print(result.eval_history)        # [(step, held-out success rate), ...]
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from minirl.algos.advantages import ADV_ESTIMATORS
from minirl.bootstrap import model_path
from minirl.config import Config, DType, Resume
from minirl.data import DATASETS
from minirl.distributed.strategies import STRATEGIES
from minirl.distributed.world import World
from minirl.inference.sampling import SamplingParams
from minirl.inspection import (
    TRAJECTORIES_FILE,
    trajectory_table,
    write_trajectories,
)
from minirl.metrics import group_metrics, rollout_metrics
from minirl.models.loading import load_policy, load_reference, load_tokenizer
from minirl.protocol.chat import template_fit, thinking_views
from minirl.rewards import SUCCESS_CRITERIA, score_all
from minirl.rollout.engine import build_engine
from minirl.rollout.trajectory import Trajectory
from minirl.runtime import bf16_emulated, rank_seed, resolve_device, seed_everything
from minirl.tools.base import check_offered_tools
from minirl.tracking import MutedTracker, Tracker
from minirl.training import console as lines
from minirl.training import reward_model, sync_check
from minirl.training.batch import PolicyBatch, mini_batch_plan
from minirl.training.checkpoint import (
    latest_checkpoint,
    load_trainer_state,
    rank_rng_state,
    restore_policy,
    restore_rng_state,
    rng_state,
    save_checkpoint,
    save_policy,
)
from minirl.training.faults import BadStepCounter, update_memory_hint
from minirl.training.groups import TaskQueue
from minirl.training.heldout import TrainResult, log_heldout
from minirl.training.pipeline import Rollout, RolloutAhead, fresh
from minirl.training.sampling import Sampler
from minirl.training.update import PolicyOptimizer, advantage_batch, prepare_batch
from minirl.validate import validate


class Trainer:
    def __init__(self, cfg: Config, path: str, console: Console | None = None, world: World | None = None) -> None:
        """Everything a run holds, for the model at `path` (minirl.bootstrap.model_path resolves it), in `world`
        (default: the one torchrun started, World.from_env)."""
        validate(cfg)
        seed_everything(cfg.trainer.seed, cfg.trainer.deterministic, cfg.trainer.threads)
        self.world = world or World.from_env(resolve_device(cfg.trainer.device, cfg.trainer.deterministic))
        self.cfg, self.device = cfg, self.world.device
        self.console = (console or Console()) if self.world.is_main else Console(quiet=True)  # rank 0 alone prints
        if (cfg.model.dtype is DType.bfloat16 or cfg.trainer.bf16_autocast) and bf16_emulated(self.device):
            self.console.print(lines.emulated_bf16_warning(torch.backends.cpu.get_cpu_capability()))
        self.run_dir = Path(self.world.broadcast(cfg.output_dir))  # rank 0's, should the ranks' clocks differ
        dataset = DATASETS.get(cfg.data.name)(cfg.data)
        self.heldout, self.skipped_rows = dataset.heldout, dataset.skipped
        check_offered_tools(
            (schema for task in [*dataset.train, *self.heldout] for schema in task.tools), cfg.tools.names
        )
        self.tokenizer = load_tokenizer(path, cfg)
        if cfg.rollout.thinking_ratio is not None:  # a template without a thinking switch fails here, not at step 1
            thinking_views(self.tokenizer)
        # with LoRA adapters when model.lora.r > 0, spread over the ranks by trainer.strategy; self.policy is the
        # plain module every forward without gradients reads (Parallel.full)
        self.parallel = STRATEGIES.get(cfg.trainer.strategy)(load_policy(path, cfg, self.device), self.world)
        self.policy = self.parallel.full
        # no KL to the reference in the loss (beta = 0) nor in the reward: no reference model in memory
        needs_reference = cfg.loss.beta > 0 or cfg.algo.kl_in_reward
        self.reference = load_reference(path, cfg, self.policy, self.device) if needs_reference else None
        scorer = reward_model.build_reward_model(cfg.reward.model, self.device, cfg.trainer.deterministic)
        engine = build_engine(cfg.rollout, self.policy, self.tokenizer, self.device, path)
        # rollouts, rewards and the training tasks; the sampler owns the engine the weight sync writes into
        tasks = TaskQueue(dataset.train, cfg.trainer.seed)
        # one step off gathers its rounds on the worker thread, in a process group of its own (World.own_group)
        rollout_world = self.world.own_group() if cfg.trainer.async_rollout else self.world
        self.sampler = Sampler(cfg, engine, self.tokenizer, tasks, scorer, rollout_world)
        self.adv_fn = ADV_ESTIMATORS.get(cfg.algo.adv_estimator)
        self.solved = SUCCESS_CRITERIA.get(cfg.reward.success)  # what the success-rate metrics count
        sampling = SamplingParams.from_config(cfg.rollout, cfg.rollout.temperature)  # log-probs use it too
        self.learner = PolicyOptimizer.adamw(self.parallel, cfg.loss, cfg.trainer, self.device, sampling)
        self.shuffle_rng = torch.Generator().manual_seed(cfg.trainer.seed)  # mini-batch order; not the global RNG
        self.step = 0  # the last completed step
        # one step off: the engine samples from its own copy of the weights, on a worker thread (training/pipeline.py)
        self.ahead = RolloutAhead(self.sampler.cancel) if cfg.trainer.async_rollout else None
        if self.ahead is not None:
            self.sampler.engine.detach()
        self.pending: Rollout | None = None  # the next step's rollout, sampled during this step's update
        self.bad_steps = BadStepCounter(cfg.trainer.max_bad_steps)
        if self.world.rank:  # rank 0 draws on from the seed as one process does, the others from streams of their own
            seed_everything(rank_seed(cfg.trainer.seed, self.world.rank), cfg.trainer.deterministic)

    def fit(self) -> TrainResult:
        result = TrainResult(run_dir=self.run_dir)
        started = time.perf_counter()
        state = self.resume() if self.cfg.trainer.resume is Resume.auto else None
        try:
            self.run(state, result)
        finally:
            if self.ahead is not None:
                self.ahead.close()
        result.wall_s = time.perf_counter() - started
        return result

    def run(self, state: dict[str, Any] | None, result: TrainResult) -> None:
        """The steps after the last completed one (self.step), into `result`; `state`: the resumed checkpoint's."""
        cfg, console, main = self.cfg, self.console, self.world.is_main
        with self.tracker(state) as tracker:  # closed, a failed run marked failed, however the run ends
            fit = template_fit(self.tokenizer)
            console.print(lines.construction_line(fit.construction.value, fit.tool_rounds), highlight=False)
            if state is None:
                self.log_eval(0, tracker, result)
                if self.skipped_rows:
                    tracker.log(0, {"data/skipped_rows": float(len(self.skipped_rows))})
                    console.print(lines.skipped_rows_warning(self.skipped_rows), highlight=False)
            else:
                result.eval_history = state["eval_history"]
                result.solved_at_start = state.get("solved_at_start", [])  # absent from older checkpoints
            for step in range(self.step + 1, cfg.trainer.steps + 1):
                self.step = step
                metrics, trajs = self.train_step()
                tracker.log(step, metrics)
                console.print(lines.step_line(step, cfg.trainer.steps, metrics))
                self.bad_steps.count(step, int(metrics.get("faults/skipped_updates", 0)), console)
                if cfg.trainer.trajectories_every and step % cfg.trainer.trajectories_every == 0 and trajs and main:
                    records = write_trajectories(
                        self.run_dir / TRAJECTORIES_FILE, step, trajs, [t.advantage for t in trajs], self.tokenizer,
                        solved=self.solved,
                    )  # fmt: skip
                    tracker.log_table(step, "rollout/trajectories", *trajectory_table(records))
                if step % cfg.trainer.eval_every == 0 or step == cfg.trainer.steps:
                    self.log_eval(step, tracker, result)
                if cfg.trainer.save_every and (step % cfg.trainer.save_every == 0 or step == cfg.trainer.steps):
                    state = {**self.state_dict(), "run_id": tracker.run_id, "eval_history": result.eval_history}
                    state["solved_at_start"] = result.solved_at_start
                    if main:
                        save_checkpoint(self.run_dir, step, self.policy, self.tokenizer, state, cfg.trainer.keep_last)
            if cfg.trainer.save_final and main:
                final = self.run_dir / "checkpoint"
                save_policy(self.policy, self.tokenizer, final, merged=True)  # loads anywhere, LoRA or not
                console.print(f"saved the final policy to {final}")

    def tracker(self, state: dict[str, Any] | None) -> Tracker:
        """Where this rank's metrics go: on rank 0 the run's files and backend, continuing a resumed run's
        (`state`: its checkpoint's), on the others nowhere."""
        if not self.world.is_main:
            return MutedTracker()
        resume_step, run_id = (self.step, state["run_id"]) if state else (None, None)
        return Tracker(self.cfg, self.run_dir, self.console, resume_step=resume_step, run_id=run_id)

    def train_step(self) -> tuple[dict[str, float], list[Trajectory]]:
        """One step, one line per stage. Returns its metrics and the trajectories learned from; a step whose
        groups all tied makes no update. Under trainer.async_rollout the next step's rollout runs while this
        one updates (minirl/training/pipeline.py). Running out of memory raises TrainingError with the sizes
        that caused it."""
        cfg, t0 = self.cfg, time.perf_counter()
        # rollout -> reward (-> guidance, dynamic sampling), in rounds; one step off: sampled during the last update
        rollout, self.pending = self.pending or self.sampler.step_rollout(self.step - 1), None
        trajs, staleness = fresh(rollout.trajs, self.step - 1, cfg.algo.max_staleness)
        t1 = time.perf_counter()
        update: dict[str, float] = {}
        every = cfg.rollout.sync_check_every
        checked = trajs and every and self.step % every == 0
        probe = sync_check.probe(self.policy, trajs, self.device) if checked else None
        ahead = self.ahead is not None and self.step < cfg.trainer.steps
        if ahead:  # the next step's rollout, from the weights before this update
            self.ahead.start(partial(self.sampler.step_rollout, self.step - 1))
        elif trajs:
            self.sampler.engine.free_memory()  # vLLM on CUDA sleeps until the sync
        if trajs:
            longest = max(len(t.prompt_ids) + len(t.response_ids) for t in trajs)
            with update_memory_hint("the policy update", min(cfg.trainer.micro_batch_size, len(trajs)), longest):
                batch, shaping = self.advantages(trajs)  # advantage, of the rewards minus any KL in the reward
                update = {**shaping, **self.update(batch, trajs)}  # loss + optimizer steps
        waited = 0.0
        if ahead:
            self.pending, waited = self.ahead.wait()
        if trajs:
            self.sampler.engine.sync_weights(self.policy)  # weight sync: the next rollout samples from the new weights
            if probe is not None:  # the sync check: did the engine move with the trainer?
                update.update(self.checked_sync(probe))
        t2 = time.perf_counter()
        sampled = rollout.sampled
        metrics = {
            **rollout_metrics(sampled, self.solved), **group_metrics(sampled, trajs, cfg.rollout.group_size), **update,
            "time/rollout_s": rollout.seconds, "time/update_s": t2 - t1 - waited, "time/step_s": t2 - t0,
            **rollout.reward_model,
        }  # fmt: skip
        if self.ahead is not None:  # how long the trainer waited for rollouts: all of step 1's, then what outlasted
            metrics |= {**staleness, "time/rollout_wait_s": t1 - t0 + waited}  # the update
        return metrics, trajs

    def checked_sync(self, probe: sync_check.SyncProbe) -> dict[str, float]:
        """The sync check's metrics for the probe taken before this step's update; warns when the engine did not
        move to the new weights (minirl/training/sync_check.py)."""
        gaps = sync_check.sync_gaps(probe, self.sampler.engine, self.policy, self.device)
        if gaps.stale:
            self.console.print(lines.stale_sync_warning(self.step, self.cfg.rollout.engine, gaps.new, gaps.prev))
        return gaps.metrics()

    def advantages(self, trajs: list[Trajectory]) -> tuple[PolicyBatch, dict[str, float]]:
        """The trajectories as a batch with the reference's log-probs and advantages (training/update.py)."""
        pad, algo = self.tokenizer.pad_token_id, self.cfg.algo
        return advantage_batch(trajs, pad, self.learner, self.reference, self.adv_fn, algo, self.cfg.rollout.group_size)

    def update(self, batch: PolicyBatch, trajs: list[Trajectory]) -> dict[str, float]:
        """ppo_epochs x mini_batches optimizer steps after the loss mask, pi_old and the rollout correction."""
        t = self.cfg.trainer
        plan = mini_batch_plan(len(trajs), t.ppo_epochs, t.mini_batches, self.shuffle_rng)
        batch, correction = prepare_batch(batch, trajs, plan[0], self.learner, self.cfg.algo)
        poisoned = self.step in t.nan_loss_steps  # fault drill: this step's loss is NaN
        return {**correction, **self.learner.update(batch, plan, poisoned)}

    def log_eval(self, step: int, tracker: Tracker, result: TrainResult) -> None:
        """Held-out metrics at trainer.eval_temperature; after step 0 also the tasks gained and lost since then
        (minirl/training/heldout.py). The reward model (reward.model) scores no held-out task: `rm` is 0 there.
        Rank 0 alone."""
        if not self.world.is_main:
            return
        trajs = self.sampler.rollout(self.heldout, 1, self.cfg.trainer.eval_temperature)
        score_all(trajs, self.cfg.reward)  # the reward terms alone: no penalty shapes what held-out tasks score
        log_heldout(
            step, trajs, self.solved, result, tracker, self.console, self.tokenizer, self.cfg.trainer.eval_every
        )

    def state_dict(self) -> dict[str, Any]:
        """What an exact resume needs besides the weights: step, optimizer, schedule, RNG states, data position,
        and one step off the rollout sampled for the next step."""
        return {
            "step": self.step,
            "bad_steps": self.bad_steps.in_a_row,
            "optimizer": self.parallel.optimizer_state(self.learner.optimizer),
            "scheduler": self.learner.scheduler.state_dict(),
            "rng": self.world.gather(rng_state()),  # every rank's streams, in rank order
            **self.sampler.tasks.state_dict(),
            "shuffle_rng": self.shuffle_rng.get_state(),
            "pending_rollout": self.pending,  # one step off: sampled by this step's predecessor, not trained yet
        }

    def resume(self) -> dict[str, Any] | None:
        """Load the run directory's newest checkpoint (weights and state_dict); None when there is none."""
        checkpoint = latest_checkpoint(self.run_dir)
        if checkpoint is None:
            self.console.print(f"trainer.resume=auto: no checkpoint in {self.run_dir}; starting from step 0")
            return None
        state = load_trainer_state(checkpoint)
        restore_policy(self.policy, checkpoint, self.cfg, self.device)
        self.parallel.loaded()
        self.sampler.engine.sync_weights(self.policy)
        self.parallel.load_optimizer_state(self.learner.optimizer, state["optimizer"])
        self.learner.scheduler.load_state_dict(state["scheduler"])
        self.sampler.tasks.load_state_dict(state)
        self.shuffle_rng.set_state(state["shuffle_rng"])
        restore_rng_state(rank_rng_state(state["rng"], self.world.rank, self.world.size))
        self.step, self.bad_steps.in_a_row = state["step"], state["bad_steps"]
        self.pending = state.get("pending_rollout")  # absent from older checkpoints
        self.console.print(f"resuming from {checkpoint} (step {self.step})")
        return state


def train(cfg: Config, console: Console | None = None) -> TrainResult:
    """Run RL training as configured; the plain-Python entry point tests call. Names are checked before the
    embedded tiny model is built (when `model.name_or_path=tiny` and no cached build exists)."""
    console = console or Console()
    validate(cfg)
    world = World.from_env(resolve_device(cfg.trainer.device, cfg.trainer.deterministic))
    try:  # rank 0 builds the tiny model (once) while the others wait
        path = world.broadcast(model_path(cfg, console) if world.is_main else None)
        result = Trainer(cfg, path, console, world).fit()
    except BaseException as err:
        world.close(failed=err)  # this rank's exit makes torchrun stop the others
        raise
    world.close()
    return result
