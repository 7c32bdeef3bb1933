"""The RL training loop. Each step reads top to bottom:

    rollout -> reward (-> dynamic sampling) -> advantage -> loss + optimizer steps -> weight sync -> log
    (-> trajectories.jsonl every trainer.trajectories_every steps -> held-out eval -> checkpoint)

A step whose loss or gradient is not finite skips its update (trainer.max_bad_steps in a row stop the
run); `trainer.resume=auto` continues from the run directory's newest checkpoint (minirl/training/checkpoint.py)
with the same optimizer, schedule, RNG and data position, so the run goes on as if never stopped.

Example (what `python -m minirl.train` runs after composing the config):

    from minirl.config import Config
    from minirl.trainer import train
    result = train(Config())          # the embedded tiny model, synthetic tool tasks
    print(result.eval_history)        # [(step, held-out success rate), ...]
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from statistics import fmean
from typing import Any

import torch
from rich.console import Console

from minirl.algos.advantages import ADV_ESTIMATORS
from minirl.algos.dapo import overlong_penalty, tied_groups, tokens_to_limit, truncated
from minirl.algos.kl import sequence_kl
from minirl.algos.losses import LOSSES, micro_batch_share
from minirl.algos.rollout_correction import rollout_correction
from minirl.bootstrap import model_path
from minirl.config import Config, LRSchedule, OldLogprobs, Overlong, Resume
from minirl.data import DATASETS
from minirl.data.task import Task
from minirl.errors import TrainingError
from minirl.evaluation.compare import paired_split, sign_test_p
from minirl.inspection import (
    TRAJECTORIES_FILE,
    trajectory_panel,
    trajectory_record,
    trajectory_table,
    write_trajectories,
)
from minirl.metrics import advantage_metrics, group_metrics, heldout_metrics, rollout_metrics
from minirl.models.loading import load_model, load_tokenizer
from minirl.protocol.chat import TemplateError
from minirl.rewards import SUCCESS_CRITERIA, score_all
from minirl.rollout.agent_loop import AgentLimits, replay_reference, run_agent
from minirl.rollout.engine import SamplingParams, build_engine
from minirl.rollout.trajectory import Trajectory, TrajectoryEnd
from minirl.runtime import resolve_device, seed_everything
from minirl.tools import ToolExecutor
from minirl.tools.base import check_offered_tools
from minirl.tracking import Tracker
from minirl.training.batch import (
    PolicyBatch,
    collate,
    micro_batches,
    mini_batch_plan,
    sampling_logprobs,
    target_logprobs,
    token_logprobs,
)
from minirl.training.checkpoint import (
    latest_checkpoint,
    load_trainer_state,
    restore_rng_state,
    rng_state,
    save_checkpoint,
)
from minirl.training.faults import reported_out_of_memory
from minirl.validate import validate


@dataclass
class TrainResult:
    eval_history: list[tuple[int, float]] = field(default_factory=list)  # (step, held-out success rate)
    solved_at_start: list[bool] = field(default_factory=list)  # per held-out task, at the step-0 evaluation
    run_dir: Path = Path(".")
    wall_s: float = 0.0


class Trainer:
    def __init__(self, cfg: Config, console: Console | None = None) -> None:
        validate(cfg)
        seed_everything(cfg.trainer.seed, cfg.trainer.deterministic)
        self.cfg, self.console = cfg, console or Console()
        self.run_dir = Path(cfg.output_dir)
        self.device = resolve_device(cfg.trainer.device, cfg.trainer.deterministic)
        dataset = DATASETS.get(cfg.data.name)(cfg.data)
        self.train_tasks, self.heldout, self.skipped_rows = dataset.train, dataset.heldout, dataset.skipped
        check_offered_tools(
            (schema for task in [*self.train_tasks, *self.heldout] for schema in task.tools), cfg.tools.names
        )
        path = model_path(cfg, self.console)
        self.tokenizer = load_tokenizer(path, cfg)
        self.policy = load_model(path, cfg, self.device)
        # no KL to the reference in the loss (beta = 0) nor in the reward: no reference model in memory
        needs_reference = cfg.loss.beta > 0 or cfg.algo.kl_in_reward
        self.reference = load_model(path, cfg, self.device, trainable=False) if needs_reference else None
        self.engine = build_engine(cfg.rollout, self.policy, self.tokenizer, self.device, path)
        self.executor = ToolExecutor.from_config(cfg.tools)
        self.loss_fn = LOSSES.get(cfg.loss.name)
        self.adv_fn = ADV_ESTIMATORS.get(cfg.algo.adv_estimator)
        self.solved = SUCCESS_CRITERIA.get(cfg.reward.success)  # what the success-rate metrics count
        self.optimizer = torch.optim.AdamW(
            self.policy.parameters(), lr=cfg.trainer.lr, weight_decay=cfg.trainer.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        r = cfg.rollout
        self.limits = AgentLimits.from_config(r)
        self.task_rng = random.Random(cfg.trainer.seed)
        self.task_queue: list[Task] = []
        self.shuffle_rng = torch.Generator().manual_seed(cfg.trainer.seed)  # mini-batch order; not the global RNG
        self.distribution = (r.temperature, r.top_p, r.top_k)  # what the sampler draws from; log-probs use it too
        self.step = 0  # the last completed step
        self.bad_steps = 0  # steps in a row whose updates were skipped for a non-finite loss or gradient

    def _lr_factor(self, step: int) -> float:
        t = self.cfg.trainer
        if step < t.warmup_steps:
            return (step + 1) / t.warmup_steps
        if t.lr_schedule is LRSchedule.cosine:
            optimizer_steps = t.steps * t.ppo_epochs * t.mini_batches
            progress = (step - t.warmup_steps) / max(1, optimizer_steps - t.warmup_steps)
            return 0.5 * (1 + math.cos(math.pi * progress))
        return 1.0

    @property
    def prompts_per_round(self) -> int:
        """Prompts one rollout round samples: algo.prompts_per_round, or trainer.prompts_per_step when that is 0."""
        return self.cfg.algo.prompts_per_round or self.cfg.trainer.prompts_per_step

    def next_tasks(self, count: int) -> list[Task]:
        """The next `count` tasks of a reshuffled pass over the training set."""
        while len(self.task_queue) < count:
            epoch = list(self.train_tasks)
            self.task_rng.shuffle(epoch)
            self.task_queue += epoch
        batch = self.task_queue[:count]
        del self.task_queue[:count]
        return batch

    def rollout(self, tasks: list[Task], group_size: int, temperature: float) -> list[Trajectory]:
        sampling = SamplingParams.from_config(self.cfg.rollout, temperature)
        self.policy.eval()  # no dropout while sampling
        return run_agent(
            self.engine, self.tokenizer, self.executor, tasks, group_size, self.limits, sampling, self.cfg.protocol
        )

    def evaluate(self) -> tuple[dict[str, float], list[Trajectory]]:
        """The held-out tasks at trainer.eval_temperature: metrics and the scored trajectories."""
        trajs = self.rollout(self.heldout, 1, self.cfg.trainer.eval_temperature)
        score_all(trajs, self.cfg.reward)
        return heldout_metrics(trajs, self.solved, prefix="eval/"), trajs

    @torch.no_grad()
    def reference_logprobs(self, batch: PolicyBatch) -> torch.Tensor | None:
        """[N, L - 1 - start] the frozen reference's log-probs of the batch's targets, in micro-batches; once per
        step, before advantages, since a KL in the reward needs them. None without a reference model."""
        if self.reference is None:
            return None
        return self.batch_logprobs(self.reference, batch, [torch.arange(batch.input_ids.shape[0])])

    @torch.no_grad()
    def batch_logprobs(self, model, batch: PolicyBatch, mini_batches: list[torch.Tensor]) -> torch.Tensor:
        """[N, L - 1 - start] `model`'s log-probs of the batch's targets, computed over the micro-batches
        (micro_batches) of each mini-batch of row indices; 0 in columns a row's micro-batch cut off."""
        logp = torch.zeros_like(batch.old_logp)
        for rows in mini_batches:
            for micro_rows, micro, first in micro_batches(batch, rows, self.cfg.trainer.micro_batch_size):
                micro_logp = token_logprobs(model, micro.to(self.device), *self.distribution).cpu()
                logp[micro_rows, first : first + micro_logp.shape[1]] = micro_logp
        return logp

    def shaped_rewards(self, trajs: list[Trajectory], batch: PolicyBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """[N] the rewards the advantages see: with algo.kl_in_reward, r - kl_coef * the trajectory's KL to the
        reference (summed over its sampled tokens, under the policy that sampled them; none for a replayed
        reference answer, which no policy sampled); and its metrics."""
        rewards = torch.tensor([t.reward for t in trajs])
        algo = self.cfg.algo
        if not algo.kl_in_reward:
            return rewards, {}
        kl = sequence_kl(batch.old_logp, batch.ref_logp, batch.mask, algo.kl_estimator)  # [N]
        kl = kl * ~torch.tensor([t.off_policy for t in trajs])
        return rewards - algo.kl_coef * kl, {"kl/in_reward": kl.mean().item()}

    def sample_groups(self) -> tuple[list[Trajectory], list[Trajectory]]:
        """Rollout and reward for a step: (every trajectory sampled this step, the ones to learn from), groups
        contiguous in both.

        Under algo.overlong=penalty the rewards include DAPO's soft overlong punishment (punish_overlong).
        Under algo.guide a group that all failed learns from its task's reference answer (guided); `sampled`
        keeps what the policy sampled. Without dynamic sampling a step rolls out prompts_per_step prompts and
        learns from all of them. Dynamic sampling (DAPO, algo.dynamic_sampling) rolls out rounds of
        algo.prompts_per_round prompts (default prompts_per_step), drops the groups whose rewards all tie, and
        stops once prompts_per_step groups are kept or after algo.max_resample_rounds extra rounds; the surplus
        is dropped. One large round costs less than several small ones (one decoding loop). Unlike DAPO, which
        samples until the batch is full, the batch may end short or empty (the step then makes no update);
        group_metrics counts both.
        """
        cfg, algo = self.cfg, self.cfg.algo
        size, wanted = cfg.rollout.group_size, cfg.trainer.prompts_per_step * cfg.rollout.group_size
        sampled: list[Trajectory] = []
        kept: list[Trajectory] = []
        for _ in range(1 + algo.max_resample_rounds):
            trajs = self.rollout(self.next_tasks(self.prompts_per_round), size, cfg.rollout.temperature)  # rollout
            score_all(trajs, cfg.reward)  # reward
            if algo.overlong is Overlong.penalty:
                self.punish_overlong(trajs)
            sampled += trajs
            if algo.guide:
                trajs = self.guided(trajs)
            if not algo.dynamic_sampling:
                return sampled, trajs
            tied = tied_groups(torch.tensor([t.reward for t in trajs]), size)  # [prompts_per_step]
            kept += [t for t in trajs if not tied[t.group_index]]
            if len(kept) >= wanted:
                break
        return sampled, kept[:wanted]

    def guided(self, trajs: list[Trajectory]) -> list[Trajectory]:
        """trajs with the last member of each group whose rewards all tie replaced by the task's reference answer
        (replay_reference, scored like a sample) where that earns more than the group: off-policy guidance
        (docs/algorithms.md). The group then has something to teach, however rarely the policy solves the task."""
        size = self.cfg.rollout.group_size
        out = list(trajs)
        if size < 2:  # a group of one has no sample to compare the reference with
            return out
        tied = tied_groups(torch.tensor([t.reward for t in trajs]), size)  # [groups]
        for group in tied.nonzero().flatten().tolist():
            last = trajs[group * size + size - 1]
            guide = self.replayed(last.task, last.group_index)
            if guide is not None and guide.reward > last.reward:
                out[group * size + size - 1] = guide
        return out

    def replayed(self, task: Task, group_index: int) -> Trajectory | None:
        """The task's reference answer replayed and scored, or None where it cannot guide: the task has none, the
        chat template cannot split it into turns, or the replay did not go as the reference did (it ran into a
        limit, or a tool rejected or skipped one of its calls, so its answer would not follow from what the
        tools returned)."""
        if not task.reference:
            return None
        try:
            guide = replay_reference(task, group_index, self.tokenizer, self.executor, self.limits, self.cfg.protocol)
        except TemplateError:
            return None
        results = [result for turn in guide.turns for result in turn.tool_results]
        if guide.finish_reason is not TrajectoryEnd.ANSWER or any(r.status != "ok" for r in results):
            return None
        score_all([guide], self.cfg.reward)
        if self.cfg.algo.overlong is Overlong.penalty:
            self.punish_overlong([guide])
        return guide

    def punish_overlong(self, trajs: list[Trajectory]) -> None:
        """Add DAPO's soft overlong punishment (minirl/algos/dapo.py) to each reward, after reward.clip; it is
        also recorded as the reward term `overlong_penalty`, so reward/overlong_penalty logs its mean."""
        r, algo = self.cfg.rollout, self.cfg.algo
        room = torch.tensor([tokens_to_limit(t, r.max_new_tokens, r.max_total_tokens) for t in trajs])  # [N]
        penalties = overlong_penalty(room, algo.overlong_buffer, algo.overlong_penalty).tolist()
        for traj, penalty in zip(trajs, penalties):
            traj.reward += penalty
            traj.reward_terms["overlong_penalty"] = penalty

    def learn(self, trajs: list[Trajectory]) -> dict[str, float]:
        """Advantages of the kept groups, then ppo_epochs x mini_batches optimizer steps, then weight sync."""
        cfg = self.cfg
        batch = collate(trajs, torch.zeros(len(trajs)), self.tokenizer.pad_token_id)  # advantages set below
        batch.ref_logp = self.reference_logprobs(batch)  # [N, T] or None
        rewards, kl_metrics = self.shaped_rewards(trajs, batch)  # minus the KL with algo.kl_in_reward
        batch.advantages = advantages = self.adv_fn(rewards, cfg.rollout.group_size, cfg.algo.adv_eps)  # advantage
        for traj, advantage in zip(trajs, advantages.tolist()):
            traj.advantage = advantage
        plan = mini_batch_plan(len(trajs), cfg.trainer.ppo_epochs, cfg.trainer.mini_batches, self.shuffle_rng)
        batch, correction = self.prepare_batch(batch, trajs, plan[0])  # overlong mask, log pi_old, rollout IS
        update = self.update_policy(batch, plan)  # loss and optimizer steps
        self.engine.sync_weights(self.policy)  # the next rollout samples from the new weights
        return {**advantage_metrics(advantages), **kl_metrics, **correction, **update}

    def prepare_batch(
        self, batch: PolicyBatch, trajs: list[Trajectory], first_epoch: list[torch.Tensor]
    ) -> tuple[PolicyBatch, dict[str, float]]:
        """The loss mask and log pi_old. algo.overlong=mask takes the trajectories a length limit cut off out of
        the loss (DAPO's overlong filtering). algo.old_logprobs=recompute replaces the sampler's log-probs by the
        trainer's, and algo.rollout_is turns the gap between the two into token weights or a trajectory mask
        (minirl/algos/rollout_correction.py); the gap is logged either way. A replayed reference answer
        (algo.guide) has no sampler: its pi_old is the policy's before the update, so its ratios start at 1 and
        it has no gap to correct."""
        algo = self.cfg.algo
        if algo.overlong is Overlong.mask:
            cut = torch.tensor([truncated(t) for t in trajs])  # [N]
            batch = replace(batch, mask=batch.mask * ~cut.unsqueeze(1))
        replayed = torch.tensor([t.off_policy for t in trajs]).unsqueeze(1)  # [N, 1]
        if algo.old_logprobs is OldLogprobs.sampler:
            if replayed.any():
                self.policy.eval()
                now = self.batch_logprobs(self.policy, batch, [replayed.flatten().nonzero().flatten()])
                batch = replace(batch, old_logp=torch.where(replayed, now, batch.old_logp))
            return batch, {}
        old_logp = self.recompute_old_logprobs(batch, first_epoch)
        sampler = torch.where(replayed, old_logp, batch.old_logp)
        fix = rollout_correction(old_logp, sampler, batch.mask, algo.rollout_is.value, algo.rollout_is_threshold)
        batch = replace(batch, old_logp=old_logp, mask=fix.mask, is_weights=fix.weights)
        return batch, {key: value.item() for key, value in fix.metrics.items()}

    def recompute_old_logprobs(self, batch: PolicyBatch, first_epoch: list[torch.Tensor]) -> torch.Tensor:
        """[N, L - 1 - start] log pi_old by the trainer with the current weights, over exactly the micro-batches
        the first epoch runs, so that the first mini-batch's ratios are exactly 1 (same inputs, same kernels)."""
        self.policy.eval()
        return self.batch_logprobs(self.policy, batch, first_epoch)

    def update_policy(self, batch: PolicyBatch, plan: list[list[torch.Tensor]]) -> dict[str, float]:
        """One optimizer step per mini-batch of the plan (epochs x mini-batches of row indices, mini_batch_plan).
        The metrics are means over these optimizer steps, but faults/skipped_updates counts them; lr is the last
        one's."""
        self.policy.train()
        steps = [self.optimizer_step(batch, rows) for epoch in plan for rows in epoch]
        metrics = {key: fmean(s[key] for s in steps) for key in steps[0]}
        metrics["faults/skipped_updates"] = sum(s["faults/skipped_updates"] for s in steps)
        return {**metrics, "lr": self.scheduler.get_last_lr()[0]}

    def optimizer_step(self, batch: PolicyBatch, rows: torch.Tensor) -> dict[str, float]:
        """One optimizer step on the mini-batch batch[rows], in micro-batches whose gradients add up to the
        mini-batch's; also the policy's mean entropy over its action tokens, from the logits the loss used.
        A non-finite loss or gradient norm skips the step (weights, optimizer state and schedule stay as they
        were) and sets faults/skipped_updates to 1."""
        mask = batch.mask[rows]  # [n, T]
        drill = self.step in self.cfg.trainer.nan_loss_steps  # fault drill: this step's loss is NaN
        sums: dict[str, torch.Tensor] = {}
        entropy_sum = torch.zeros(())
        for _, micro, _ in micro_batches(batch, rows, self.cfg.trainer.micro_batch_size):
            micro = micro.to(self.device)
            dist = sampling_logprobs(self.policy, micro, *self.distribution)  # [b, T, V]
            logp = target_logprobs(dist, micro)  # [b, T]
            out = self.loss_fn(
                logp, micro.old_logp, micro.ref_logp, micro.advantages, micro.mask, self.cfg.loss,
                is_weights=micro.is_weights,
            )  # fmt: skip
            share = micro_batch_share(micro.mask, mask, self.cfg.loss.agg)
            loss = out.loss * math.nan if drill else out.loss
            (loss * share).backward()
            for key, value in out.metrics.items():
                sums[key] = sums.get(key, 0.0) + value.detach().cpu() * share
            action = dist.detach()[micro.mask > 0]  # [tokens, V]; entr(0) = 0 for tokens top-k/top-p removed
            entropy_sum += torch.special.entr(action.exp()).sum().cpu()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.cfg.trainer.max_grad_norm)
        finite = bool(torch.isfinite(grad_norm)) and not drill
        if finite:
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {
            **{k: float(v) for k, v in sums.items()},
            "entropy": float(entropy_sum / mask.sum().clamp(min=1)),
            "grad_norm": grad_norm.item(),
            "faults/skipped_updates": float(not finite),
        }

    def fit(self) -> TrainResult:
        cfg, console = self.cfg, self.console
        result = TrainResult(run_dir=self.run_dir)
        started = time.perf_counter()
        state = self.resume() if cfg.trainer.resume is Resume.auto else None
        tracker = Tracker(
            cfg, self.run_dir, console, resume_step=self.step if state else None, run_id=state and state["run_id"]
        )
        if state is None:
            self._log_eval(0, tracker, result)
            self._log_skipped_rows(tracker)
        else:
            result.eval_history = state["eval_history"]
            result.solved_at_start = state.get("solved_at_start", [])  # absent from older checkpoints
        for step in range(self.step + 1, cfg.trainer.steps + 1):
            self.step = step
            metrics, trajs = self.train_step()
            tracker.log(step, metrics)  # log
            groups = f"groups {metrics['algo/groups_kept']:.0f}"
            if metrics["algo/groups_guided"]:
                groups += f" ({metrics['algo/groups_guided']:.0f} guided)"
            console.print(
                f"step {step:>4}/{cfg.trainer.steps}  reward {metrics['reward/mean']:+.2f} "
                f"± {metrics['reward/std']:.2f}  success {metrics['rollout/success_rate']:.0%}  "
                f"kl {metrics.get('loss/kl', 0.0):.4f}  valid calls {metrics['tools/valid_frac']:.0%}  "
                f"turns {metrics['rollout/turns']:.2f}  {groups}  {metrics['time/step_s']:.1f}s"
            )
            self.check_skipped_updates(metrics)
            if cfg.trainer.trajectories_every and step % cfg.trainer.trajectories_every == 0 and trajs:
                self.record_trajectories(step, trajs, tracker)
            if step % cfg.trainer.eval_every == 0 or step == cfg.trainer.steps:
                self._log_eval(step, tracker, result)
            if cfg.trainer.save_every and (step % cfg.trainer.save_every == 0 or step == cfg.trainer.steps):
                state = {
                    **self.state_dict(),
                    "run_id": tracker.run_id,
                    "eval_history": result.eval_history,
                    "solved_at_start": result.solved_at_start,
                }
                save_checkpoint(self.run_dir, step, self.policy, self.tokenizer, state, cfg.trainer.keep_last)
        if cfg.trainer.save_final:
            final = self.run_dir / "checkpoint"
            self.policy.save_pretrained(final)
            self.tokenizer.save_pretrained(final)
            console.print(f"saved the final policy to {final}")
        tracker.close()
        result.wall_s = time.perf_counter() - started
        return result

    def train_step(self) -> tuple[dict[str, float], list[Trajectory]]:
        """One step: rollout and reward (dynamic sampling drops all-tie groups), then advantage, loss and optimizer
        steps (none if every group tied). Returns its metrics and the trajectories learned from. Running out of
        memory raises TrainingError with the sizes that caused it."""
        cfg = self.cfg
        t0 = time.perf_counter()
        rows = self.prompts_per_round * cfg.rollout.group_size
        with reported_out_of_memory("rollout", rows, cfg.rollout.max_total_tokens, "lower rollout.group_size, "
                                    "trainer.prompts_per_step, algo.prompts_per_round "
                                    "or rollout.max_total_tokens"):  # fmt: skip
            sampled, trajs = self.sample_groups()
        t1 = time.perf_counter()
        longest = max((len(t.prompt_ids) + len(t.response_ids) for t in trajs), default=0)
        with reported_out_of_memory("the policy update", min(cfg.trainer.micro_batch_size, len(trajs)), longest,
                                    "lower trainer.micro_batch_size (gradients accumulate to the same update) "
                                    "or rollout.max_total_tokens"):  # fmt: skip
            update = self.learn(trajs) if trajs else {}
        t2 = time.perf_counter()
        metrics = {
            **rollout_metrics(sampled, self.solved), **group_metrics(sampled, trajs, cfg.rollout.group_size),
            **update, "time/rollout_s": t1 - t0, "time/update_s": t2 - t1, "time/step_s": t2 - t0,
        }  # fmt: skip
        return metrics, trajs

    def check_skipped_updates(self, metrics: dict[str, float]) -> None:
        """Count steps in a row that skipped an update for a non-finite loss or gradient; raise TrainingError at
        trainer.max_bad_steps."""
        skipped = int(metrics.get("faults/skipped_updates", 0))
        self.bad_steps = self.bad_steps + 1 if skipped else 0
        if not skipped:
            return
        limit = self.cfg.trainer.max_bad_steps
        self.console.print(
            f"[bold yellow]warning[/]: step {self.step}: non-finite loss or gradient, {skipped} update(s) skipped "
            f"({self.bad_steps} step(s) in a row; the run stops at {limit})"
        )
        if self.bad_steps >= limit:
            raise TrainingError(
                f"steps {self.step - limit + 1}-{self.step}: every one had a non-finite loss or gradient, their "
                "updates were skipped; lower trainer.lr or check the rewards, then continue from the newest "
                "checkpoint with trainer.resume=auto"
            )

    def record_trajectories(self, step: int, trajs: list[Trajectory], tracker: Tracker) -> None:
        """Append this step's learned-from trajectories to trajectories.jsonl and log them as a table."""
        advantages = [t.advantage for t in trajs]
        path = self.run_dir / TRAJECTORIES_FILE
        records = write_trajectories(path, step, trajs, advantages, self.tokenizer, solved=self.solved)
        tracker.log_table(step, "rollout/trajectories", *trajectory_table(records))

    def state_dict(self) -> dict[str, Any]:
        """What an exact resume needs besides the weights: step, optimizer, schedule, RNG states, data position."""
        position = {id(task): i for i, task in enumerate(self.train_tasks)}
        return {
            "step": self.step,
            "bad_steps": self.bad_steps,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng_state(),
            "task_rng": self.task_rng.getstate(),
            "task_queue": [position[id(task)] for task in self.task_queue],
            "shuffle_rng": self.shuffle_rng.get_state(),
        }

    def resume(self) -> dict[str, Any] | None:
        """Load the run directory's newest checkpoint (weights and state_dict); None when there is none."""
        checkpoint = latest_checkpoint(self.run_dir)
        if checkpoint is None:
            self.console.print(f"trainer.resume=auto: no checkpoint in {self.run_dir}; starting from step 0")
            return None
        state = load_trainer_state(checkpoint)
        self.policy.load_state_dict(load_model(str(checkpoint), self.cfg, self.device).state_dict())
        self.engine.sync_weights(self.policy)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.task_rng.setstate(state["task_rng"])
        self.task_queue = [self.train_tasks[i] for i in state["task_queue"]]
        self.shuffle_rng.set_state(state["shuffle_rng"])
        restore_rng_state(state["rng"])
        self.step, self.bad_steps = state["step"], state["bad_steps"]
        self.console.print(f"resuming from {checkpoint} (step {self.step})")
        return state

    def _log_skipped_rows(self, tracker: Tracker) -> None:
        if not self.skipped_rows:
            return
        tracker.log(0, {"data/skipped_rows": float(len(self.skipped_rows))})
        self.console.print(
            f"[bold yellow]warning[/]: skipped {len(self.skipped_rows)} malformed dataset rows (data.on_error=skip); "
            f"first: {self.skipped_rows[0]}",
            highlight=False,
        )

    def _log_eval(self, step: int, tracker: Tracker, result: TrainResult) -> None:
        """Held-out metrics; after step 0 also the tasks gained and lost since then and the sign test's p-value
        of that split (the chance of one as uneven if every changed task were a coin flip)."""
        metrics, trajs = self.evaluate()
        solved = [self.solved(traj) for traj in trajs]  # trajs in held-out task order
        change = ""
        if step == 0:
            result.solved_at_start = solved
        elif result.solved_at_start:
            gained, lost = paired_split(result.solved_at_start, solved)
            p = sign_test_p(gained, lost)
            metrics.update({"eval/tasks_gained": float(gained), "eval/tasks_lost": float(lost), "eval/sign_test_p": p})
            change = f"; since step 0: {gained} tasks gained, {lost} lost, sign test p {p:.3f}"
        tracker.log(step, metrics)
        result.eval_history.append((step, metrics["eval/success_rate"]))
        kinds = "  ".join(
            f"{k.rsplit('/', 1)[-1]} {v:.0%}" for k, v in metrics.items() if k.startswith("eval/success_rate/")
        )
        self.console.print(
            f"[bold cyan]eval[/] step {step:>4}: held-out success {metrics['eval/success_rate']:.1%} "
            f"({len(self.heldout)} tasks; {kinds}), reward {metrics['eval/reward/mean']:+.2f}{change}"
        )
        sample = trajs[step // max(1, self.cfg.trainer.eval_every) % len(trajs)]  # a different task each time
        self.console.print(trajectory_panel(trajectory_record(sample, step, 0.0, self.tokenizer, self.solved)))


def train(cfg: Config, console: Console | None = None) -> TrainResult:
    """Run RL training as configured; the plain-Python entry point tests call."""
    return Trainer(cfg, console).fit()
