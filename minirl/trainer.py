"""The RL training loop. Each step reads top to bottom:

    rollout -> reward (-> dynamic sampling) -> advantage -> loss + optimizer steps -> weight sync -> log

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
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from statistics import fmean

import numpy as np
import torch
from rich.console import Console

from minirl.algos.advantages import ADV_ESTIMATORS
from minirl.algos.dapo import overlong_penalty, tied_groups, tokens_to_limit, truncated
from minirl.algos.kl import KL_ESTIMATORS, sequence_kl
from minirl.algos.losses import LOSSES, micro_batch_share
from minirl.algos.rollout_correction import rollout_correction
from minirl.config import Config, LRSchedule, OldLogprobs, Overlong
from minirl.data import DATASETS, WARM_START_CORPORA
from minirl.data.task import Task
from minirl.metrics import advantage_metrics, group_metrics, rollout_metrics, success_by_kind
from minirl.models.loading import load_model, load_tokenizer, resolve_device, resolve_model_path
from minirl.protocol.formats import CALL_FORMATS
from minirl.rewards import SUCCESS_CRITERIA, check_weights, score_all
from minirl.rollout.agent_loop import AgentLimits, run_agent
from minirl.rollout.engine import ENGINES, SamplingParams
from minirl.rollout.trajectory import Trajectory
from minirl.tools import TOOLS, ToolExecutor, build_tools, import_tool_modules
from minirl.tracking import BACKENDS, Tracker


def check_names(cfg: Config) -> None:
    """Resolve every registry name in the config; runs before any model loads."""
    import_tool_modules(cfg.tools.imports)  # their @tool functions register before the names resolve
    for name in cfg.tools.names:
        TOOLS.get(name)
    check_weights(cfg.reward.weights)
    SUCCESS_CRITERIA.get(cfg.reward.success)
    LOSSES.get(cfg.loss.name)
    KL_ESTIMATORS.get(cfg.loss.kl_estimator)
    KL_ESTIMATORS.get(cfg.algo.kl_estimator)
    ADV_ESTIMATORS.get(cfg.algo.adv_estimator)
    ENGINES.get(cfg.rollout.engine)
    DATASETS.get(cfg.data.name)
    WARM_START_CORPORA.get(cfg.sft.corpus)
    BACKENDS.get(cfg.logger.backend)
    CALL_FORMATS.get(cfg.protocol.format)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@dataclass
class PolicyBatch:
    """Trajectories as tensors in target space: column t scores input_ids[:, start + t + 1]. Every log-prob
    is of the distribution the sampler drew from: logits / temperature, then top-k and top-p, renormalised."""

    input_ids: torch.Tensor  # [N, L] prompt + response, right-padded
    attention_mask: torch.Tensor  # [N, L]
    start: int  # first position whose next token can be an action (shortest prompt - 1)
    # [N, L - 1 - start] log pi_old of the target tokens: the sampler's (collate), or the trainer's own
    # recomputation under algo.old_logprobs=recompute (Trainer.prepare_batch)
    old_logp: torch.Tensor
    mask: torch.Tensor  # [N, L - 1 - start] 1.0 where the target token was sampled by the policy
    advantages: torch.Tensor  # [N]
    ref_logp: torch.Tensor | None = None  # [N, L - 1 - start] frozen reference's log-probs; None without one
    is_weights: torch.Tensor | None = None  # [N, L - 1 - start] rollout IS weights (algo.rollout_is=token); None = 1

    def _map(self, fn) -> PolicyBatch:
        tensors = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "start"}
        return replace(self, **{name: fn(t) for name, t in tensors.items() if t is not None})

    def rows(self, index: slice | torch.Tensor) -> PolicyBatch:
        return self._map(lambda t: t[index])

    def to(self, device: torch.device) -> PolicyBatch:
        return self._map(lambda t: t.to(device))


def collate(trajs: list[Trajectory], advantages: torch.Tensor, pad_id: int) -> PolicyBatch:
    width = max(len(t.prompt_ids) + len(t.response_ids) for t in trajs)
    start = min(len(t.prompt_ids) for t in trajs) - 1
    n = len(trajs)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    old_logp = torch.zeros((n, width - 1 - start))
    mask = torch.zeros((n, width - 1 - start))
    for row, t in enumerate(trajs):
        ids = t.prompt_ids + t.response_ids
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention[row, : len(ids)] = 1
        first = len(t.prompt_ids) - 1 - start  # column predicting the first response token
        old_logp[row, first : first + len(t.response_ids)] = torch.tensor(t.sampler_logprobs)
        mask[row, first : first + len(t.response_ids)] = torch.tensor(t.action_mask, dtype=torch.float)
    return PolicyBatch(input_ids, attention, start, old_logp, mask, advantages)


def _outside_top_k_top_p(
    logits: torch.Tensor,  # [..., V] already divided by the temperature
    top_p: float,
    top_k: int,  # 0 = off
) -> torch.Tensor:  # [..., V] bool, True for tokens the sampler could not draw
    """HF generate's TopKLogitsWarper then TopPLogitsWarper (vLLM filters the same way): top-k keeps the k
    largest logits (ties included); top-p then drops the smallest tokens whose cumulative probability,
    renormalised over what top-k kept, stays <= 1 - top_p, always keeping the largest."""
    removed = torch.zeros_like(logits, dtype=torch.bool)
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[..., -1:]  # [..., 1]
        removed = logits < kth
    if top_p < 1:
        ascending, order = torch.sort(logits.masked_fill(removed, -math.inf), dim=-1)
        drop = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p  # [..., V] in ascending order
        drop[..., -1] = False
        removed = removed | drop.scatter(-1, order, drop)
    return removed


def sampling_logprobs(
    model, batch: PolicyBatch, temperature: float, top_p: float = 1.0, top_k: int = 0
) -> torch.Tensor:
    """[N, L - 1 - start, V] log-probs of the distribution each target token was sampled from: the policy's
    logits divided by the temperature, filtered by top-k then top-p, renormalised; what the HF and vLLM engines
    report as sampler log-probs. The target token always stays in: it was sampled, so it lies in the sampler's
    kept set, and a rounding difference at the set's edge must not give it log-prob -inf."""
    keep = batch.input_ids.shape[1] - batch.start  # logits only where an action can be predicted
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=keep).logits
    logits = logits[:, :-1].float() / temperature  # [N, L - 1 - start, V]
    if top_k > 0 or top_p < 1:
        removed = _outside_top_k_top_p(logits, top_p, top_k)
        removed.scatter_(-1, batch.input_ids[:, batch.start + 1 :].unsqueeze(-1), False)
        logits = logits.masked_fill(removed, -math.inf)
    return torch.log_softmax(logits, dim=-1)


def target_logprobs(dist: torch.Tensor, batch: PolicyBatch) -> torch.Tensor:
    """[N, L - 1 - start] the entries of dist [N, L - 1 - start, V] at the target tokens."""
    return dist.gather(-1, batch.input_ids[:, batch.start + 1 :].unsqueeze(-1)).squeeze(-1)


def token_logprobs(model, batch: PolicyBatch, temperature: float, top_p: float = 1.0, top_k: int = 0) -> torch.Tensor:
    """[N, L - 1 - start] log-probs of the target tokens under the sampling distribution (sampling_logprobs)."""
    return target_logprobs(sampling_logprobs(model, batch, temperature, top_p, top_k), batch)


def mini_batch_plan(n: int, epochs: int, mini_batches: int, generator: torch.Generator) -> list[list[torch.Tensor]]:
    """Row indices of each mini-batch of each epoch: per epoch a fresh permutation of the n rows cut into
    min(mini_batches, n) near-equal parts. A single mini-batch keeps the rollout order: its gradient is a
    sum over all rows, so shuffling would change nothing but the rounding."""
    count = min(mini_batches, n)
    plan = []
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator) if count > 1 else torch.arange(n)
        plan.append(list(torch.tensor_split(order, count)))
    return plan


@dataclass
class TrainResult:
    eval_history: list[tuple[int, float]] = field(default_factory=list)  # (step, held-out success rate)
    run_dir: Path = Path(".")
    wall_s: float = 0.0


class Trainer:
    def __init__(self, cfg: Config, console: Console | None = None) -> None:
        check_names(cfg)
        seed_everything(cfg.trainer.seed)
        self.cfg, self.console = cfg, console or Console()
        self.run_dir = Path(cfg.output_dir)
        self.device = resolve_device(cfg.trainer.device)
        self.train_tasks, self.heldout = DATASETS.get(cfg.data.name)(cfg.data)
        path = resolve_model_path(cfg, self.console)
        self.tokenizer = load_tokenizer(path, cfg)
        self.policy = load_model(path, cfg, self.device)
        # no KL to the reference in the loss (beta = 0) nor in the reward: no reference model in memory
        needs_reference = cfg.loss.beta > 0 or cfg.algo.kl_in_reward
        self.reference = load_model(path, cfg, self.device, trainable=False) if needs_reference else None
        self.engine = ENGINES.get(cfg.rollout.engine)(
            self.policy, self.tokenizer, self.device,
            model_path=path, gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
        )  # fmt: skip
        tools = build_tools(cfg.tools.names, cfg.tools)
        self.executor = ToolExecutor(tools, cfg.tools.timeout_s, cfg.tools.max_output_chars)
        self.loss_fn = LOSSES.get(cfg.loss.name)
        self.adv_fn = ADV_ESTIMATORS.get(cfg.algo.adv_estimator)
        self.solved = SUCCESS_CRITERIA.get(cfg.reward.success)  # what the success-rate metrics count
        self.optimizer = torch.optim.AdamW(
            self.policy.parameters(), lr=cfg.trainer.lr, weight_decay=cfg.trainer.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        r = cfg.rollout
        self.limits = AgentLimits(r.max_turns, r.max_new_tokens, r.max_total_tokens, r.max_tool_calls)
        self.task_rng = random.Random(cfg.trainer.seed)
        self.task_queue: list[Task] = []
        self.shuffle_rng = torch.Generator().manual_seed(cfg.trainer.seed)  # mini-batch order; not the global RNG
        self.distribution = (r.temperature, r.top_p, r.top_k)  # what the sampler draws from; log-probs use it too

    def _lr_factor(self, step: int) -> float:
        t = self.cfg.trainer
        if step < t.warmup_steps:
            return (step + 1) / t.warmup_steps
        if t.lr_schedule is LRSchedule.cosine:
            optimizer_steps = t.steps * t.ppo_epochs * t.mini_batches
            progress = (step - t.warmup_steps) / max(1, optimizer_steps - t.warmup_steps)
            return 0.5 * (1 + math.cos(math.pi * progress))
        return 1.0

    def next_tasks(self) -> list[Task]:
        """The next prompts_per_step tasks of a reshuffled pass over the training set."""
        while len(self.task_queue) < self.cfg.trainer.prompts_per_step:
            epoch = list(self.train_tasks)
            self.task_rng.shuffle(epoch)
            self.task_queue += epoch
        batch = self.task_queue[: self.cfg.trainer.prompts_per_step]
        del self.task_queue[: len(batch)]
        return batch

    def rollout(self, tasks: list[Task], group_size: int, temperature: float) -> list[Trajectory]:
        r = self.cfg.rollout
        sampling = SamplingParams(r.max_new_tokens, temperature, r.top_p, r.top_k)
        self.policy.eval()  # no dropout while sampling
        return run_agent(
            self.engine, self.tokenizer, self.executor, tasks, group_size, self.limits, sampling, self.cfg.protocol
        )

    def evaluate(self) -> dict[str, float]:
        trajs = self.rollout(self.heldout, 1, self.cfg.trainer.eval_temperature)
        score_all(trajs, self.cfg.reward)
        metrics = {
            **rollout_metrics(trajs, self.solved, prefix="eval/"),
            **success_by_kind(trajs, self.solved, prefix="eval/"),
        }
        metrics["eval/success_rate"] = metrics.pop("eval/rollout/success_rate")
        return metrics

    @torch.no_grad()
    def reference_logprobs(self, batch: PolicyBatch) -> torch.Tensor | None:
        """[N, L - 1 - start] the frozen reference's log-probs of the batch's targets, in micro-batches; once per
        step, before advantages, since a KL in the reward needs them. None without a reference model."""
        if self.reference is None:
            return None
        size, n = self.cfg.trainer.micro_batch_size, batch.input_ids.shape[0]
        micros = (batch.rows(slice(first, first + size)).to(self.device) for first in range(0, n, size))
        return torch.cat([token_logprobs(self.reference, m, *self.distribution).cpu() for m in micros])

    def shaped_rewards(self, trajs: list[Trajectory], batch: PolicyBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """[N] the rewards the advantages see: with algo.kl_in_reward, r - kl_coef * the trajectory's KL to the
        reference (summed over its sampled tokens, under the policy that sampled them); and its metrics."""
        rewards = torch.tensor([t.reward for t in trajs])
        algo = self.cfg.algo
        if not algo.kl_in_reward:
            return rewards, {}
        kl = sequence_kl(batch.old_logp, batch.ref_logp, batch.mask, algo.kl_estimator)  # [N]
        return rewards - algo.kl_coef * kl, {"kl/in_reward": kl.mean().item()}

    def sample_groups(self) -> tuple[list[Trajectory], list[Trajectory]]:
        """Rollout and reward for prompts_per_step prompts: (every trajectory sampled this step, the ones to
        learn from), groups contiguous in both.

        Under algo.overlong=penalty the rewards include DAPO's soft overlong punishment (punish_overlong).
        Dynamic sampling (DAPO, algo.dynamic_sampling) drops the groups whose rewards all tie and, for up to
        algo.max_resample_rounds more rounds, rolls out further prompts until prompts_per_step groups are kept,
        then drops the surplus. Unlike DAPO, which samples until the batch is full, the batch may end short or
        empty (the step then makes no update); group_metrics counts both.
        """
        cfg, algo = self.cfg, self.cfg.algo
        size, wanted = cfg.rollout.group_size, cfg.trainer.prompts_per_step * cfg.rollout.group_size
        sampled: list[Trajectory] = []
        kept: list[Trajectory] = []
        for _ in range(1 + algo.max_resample_rounds):
            trajs = self.rollout(self.next_tasks(), size, cfg.rollout.temperature)  # rollout
            score_all(trajs, cfg.reward)  # reward
            if algo.overlong is Overlong.penalty:
                self.punish_overlong(trajs)
            sampled += trajs
            if not algo.dynamic_sampling:
                return sampled, trajs
            tied = tied_groups(torch.tensor([t.reward for t in trajs]), size)  # [prompts_per_step]
            kept += [t for t in trajs if not tied[t.group_index]]
            if len(kept) >= wanted:
                break
        return sampled, kept[:wanted]

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
        (minirl/algos/rollout_correction.py); the gap is logged either way."""
        algo = self.cfg.algo
        if algo.overlong is Overlong.mask:
            cut = torch.tensor([truncated(t) for t in trajs])  # [N]
            batch = replace(batch, mask=batch.mask * ~cut.unsqueeze(1))
        if algo.old_logprobs is OldLogprobs.sampler:
            return batch, {}
        old_logp = self.recompute_old_logprobs(batch, first_epoch)
        fix = rollout_correction(old_logp, batch.old_logp, batch.mask, algo.rollout_is.value, algo.rollout_is_threshold)
        batch = replace(batch, old_logp=old_logp, mask=fix.mask, is_weights=fix.weights)
        return batch, {key: value.item() for key, value in fix.metrics.items()}

    @torch.no_grad()
    def recompute_old_logprobs(self, batch: PolicyBatch, first_epoch: list[torch.Tensor]) -> torch.Tensor:
        """[N, L - 1 - start] log pi_old by the trainer with the current weights, over exactly the micro-batches
        the first epoch runs, so that the first mini-batch's ratios are exactly 1 (same inputs, same kernels)."""
        self.policy.eval()
        old_logp = torch.zeros_like(batch.old_logp)
        for rows in first_epoch:
            for micro_rows in rows.split(self.cfg.trainer.micro_batch_size):
                micro = batch.rows(micro_rows).to(self.device)
                old_logp[micro_rows] = token_logprobs(self.policy, micro, *self.distribution).cpu()
        return old_logp

    def update_policy(self, batch: PolicyBatch, plan: list[list[torch.Tensor]]) -> dict[str, float]:
        """One optimizer step per mini-batch of the plan (epochs x mini-batches of row indices, mini_batch_plan).
        The metrics are means over these optimizer steps; lr is the last one's."""
        self.policy.train()
        steps = [self.optimizer_step(batch, rows) for epoch in plan for rows in epoch]
        return {**{key: fmean(s[key] for s in steps) for key in steps[0]}, "lr": self.scheduler.get_last_lr()[0]}

    def optimizer_step(self, batch: PolicyBatch, rows: torch.Tensor) -> dict[str, float]:
        """One optimizer step on the mini-batch batch[rows], in micro-batches whose gradients add up to the
        mini-batch's; also the policy's mean entropy over its action tokens, from the logits the loss used."""
        mask = batch.mask[rows]  # [n, T]
        sums: dict[str, torch.Tensor] = {}
        entropy_sum = torch.zeros(())
        for micro_rows in rows.split(self.cfg.trainer.micro_batch_size):
            micro = batch.rows(micro_rows).to(self.device)
            dist = sampling_logprobs(self.policy, micro, *self.distribution)  # [b, T, V]
            logp = target_logprobs(dist, micro)  # [b, T]
            out = self.loss_fn(
                logp, micro.old_logp, micro.ref_logp, micro.advantages, micro.mask, self.cfg.loss,
                is_weights=micro.is_weights,
            )  # fmt: skip
            share = micro_batch_share(micro.mask, mask, self.cfg.loss.agg)
            (out.loss * share).backward()
            for key, value in out.metrics.items():
                sums[key] = sums.get(key, 0.0) + value.detach().cpu() * share
            action = dist.detach()[micro.mask > 0]  # [tokens, V]; entr(0) = 0 for tokens top-k/top-p removed
            entropy_sum += torch.special.entr(action.exp()).sum().cpu()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.cfg.trainer.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {
            **{k: float(v) for k, v in sums.items()},
            "entropy": float(entropy_sum / mask.sum().clamp(min=1)),
            "grad_norm": grad_norm.item(),
        }

    def fit(self) -> TrainResult:
        cfg, console = self.cfg, self.console
        tracker = Tracker(cfg, self.run_dir, console)
        result = TrainResult(run_dir=self.run_dir)
        started = time.perf_counter()
        self._log_eval(0, tracker, result)
        for step in range(1, cfg.trainer.steps + 1):
            t0 = time.perf_counter()
            sampled, trajs = self.sample_groups()  # rollout and reward; dynamic sampling drops all-tie groups
            t1 = time.perf_counter()
            update = self.learn(trajs) if trajs else {}  # advantage, loss, optimizer steps; none if every group tied
            t2 = time.perf_counter()
            metrics = {
                **rollout_metrics(sampled, self.solved), **group_metrics(sampled, trajs, cfg.rollout.group_size),
                **update, "time/rollout_s": t1 - t0, "time/update_s": t2 - t1, "time/step_s": t2 - t0,
            }  # fmt: skip
            tracker.log(step, metrics)  # log
            console.print(
                f"step {step:>4}/{cfg.trainer.steps}  reward {metrics['reward/mean']:+.2f} "
                f"± {metrics['reward/std']:.2f}  success {metrics['rollout/success_rate']:.0%}  "
                f"kl {metrics.get('loss/kl', 0.0):.4f}  valid calls {metrics['tools/valid_frac']:.0%}  "
                f"turns {metrics['rollout/turns']:.2f}  {metrics['time/step_s']:.1f}s"
            )
            if step % cfg.trainer.eval_every == 0 or step == cfg.trainer.steps:
                self._log_eval(step, tracker, result)
        if cfg.trainer.save_final:
            final = self.run_dir / "checkpoint"
            self.policy.save_pretrained(final)
            self.tokenizer.save_pretrained(final)
            console.print(f"saved the final policy to {final}")
        tracker.close()
        result.wall_s = time.perf_counter() - started
        return result

    def _log_eval(self, step: int, tracker: Tracker, result: TrainResult) -> None:
        metrics = self.evaluate()
        tracker.log(step, metrics)
        result.eval_history.append((step, metrics["eval/success_rate"]))
        kinds = "  ".join(
            f"{k.rsplit('/', 1)[-1]} {v:.0%}" for k, v in metrics.items() if k.startswith("eval/success_rate/")
        )
        self.console.print(
            f"[bold cyan]eval[/] step {step:>4}: held-out success {metrics['eval/success_rate']:.1%} "
            f"({len(self.heldout)} tasks; {kinds}), reward {metrics['eval/reward/mean']:+.2f}"
        )


def train(cfg: Config, console: Console | None = None) -> TrainResult:
    """Run RL training as configured; the plain-Python entry point tests call."""
    return Trainer(cfg, console).fit()
