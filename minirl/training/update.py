"""The policy update of a step: pi_old and the rollout correction, then one optimizer step per mini-batch.

`prepare_batch` sets the loss mask and log pi_old: algo.overlong=mask takes the trajectories a length limit
cut off out of the loss (DAPO's overlong filtering); algo.old_logprobs=recompute replaces the sampler's
log-probs by the trainer's, and algo.rollout_is turns the gap between the two into token weights or a
trajectory mask (minirl/algos/rollout_correction.py). `PolicyOptimizer.update` then runs the plan's
mini-batches, each in micro-batches whose gradients add up to the mini-batch's. A non-finite loss or
gradient norm skips that optimizer step (weights, optimizer state and schedule stay as they were).

Under several ranks (minirl/distributed/) each rank holds the whole batch and runs every W-th micro-batch of
each mini-batch, weighted by W x its share of the mini-batch's loss units (tokens, sequences, ...): the
strategy averages the ranks' gradients, so the result is the single process's gradient, in every loss.agg
mode; a token mean is not the mean of per-rank token means. Ranks with fewer micro-batches run a weight-0
one, so that every rank makes the same forwards and backwards (collectives under fsdp2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import fmean

import torch

from minirl.algos.dapo import truncated
from minirl.algos.losses import LOSSES, micro_batch_share, reference_nll
from minirl.algos.rollout_correction import rollout_correction
from minirl.config import AlgoConfig, LossConfig, LRSchedule, OldLogprobs, Overlong, TrainerConfig
from minirl.distributed.strategies import Parallel
from minirl.inference.sampling import SamplingParams
from minirl.metrics import advantage_metrics
from minirl.rollout.trajectory import Trajectory
from minirl.training.batch import PolicyBatch, action_logits, batch_logprobs, collate, micro_batches, targets
from minirl.training.shaping import kl_shaped


def lr_factor(step: int, t: TrainerConfig) -> float:
    """The multiplier of trainer.lr at optimizer step `step`: linear warm-up, then constant or cosine to 0."""
    if step < t.warmup_steps:
        return (step + 1) / t.warmup_steps
    if t.lr_schedule is LRSchedule.cosine:
        optimizer_steps = t.steps * t.ppo_epochs * t.mini_batches
        progress = (step - t.warmup_steps) / max(1, optimizer_steps - t.warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * progress))
    return 1.0


@dataclass
class PolicyOptimizer:
    """The policy (spread over the ranks by `parallel`), its optimizer and schedule, and how it scores a batch
    (`sampling`: what the sampler drew from; every log-prob is of that distribution)."""

    parallel: Parallel
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    loss_fn: object  # a LOSSES entry
    loss_cfg: LossConfig
    trainer_cfg: TrainerConfig
    device: torch.device
    sampling: SamplingParams

    @classmethod
    def adamw(cls, parallel, loss_cfg: LossConfig, trainer_cfg: TrainerConfig, device, sampling) -> PolicyOptimizer:
        """AdamW at trainer.lr and weight_decay under the lr_factor schedule, minimising loss.name."""
        loss_fn = LOSSES.get(loss_cfg.name)
        trained = [p for p in parallel.trained.parameters() if p.requires_grad]  # with LoRA, the adapters alone
        optimizer = torch.optim.AdamW(trained, lr=trainer_cfg.lr, weight_decay=trainer_cfg.weight_decay)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, trainer_cfg))
        return cls(parallel, optimizer, scheduler, loss_fn, loss_cfg, trainer_cfg, device, sampling)

    @property
    def policy(self) -> torch.nn.Module:
        """The policy as a plain module, for forwards without gradients (Parallel.full)."""
        return self.parallel.full

    def logprobs(self, model, batch: PolicyBatch, mini_batches: list[torch.Tensor]) -> torch.Tensor:
        """[N, L - 1 - start] `model`'s log-probs of the targets over these mini-batches' micro-batches, each rank
        computing its micro-batches (those it trains on) and the ranks' parts summed."""
        world = self.parallel.world
        size, shard = self.trainer_cfg.micro_batch_size, (world.rank, world.size)
        return world.sum_(batch_logprobs(model, batch, mini_batches, size, self.device, self.sampling, shard))

    def update(self, batch: PolicyBatch, plan: list[list[torch.Tensor]], poisoned: bool) -> dict[str, float]:
        """One optimizer step per mini-batch of the plan (epochs x mini-batches of row indices, mini_batch_plan).
        The metrics are means over these optimizer steps, but faults/skipped_updates counts them; lr is the last
        one's. `poisoned` (the fault drill, trainer.nan_loss_steps) makes every loss NaN."""
        self.parallel.trained.train()
        steps = [self.step(batch, rows, poisoned) for epoch in plan for rows in epoch]
        self.parallel.gathered()
        metrics = {key: fmean(s[key] for s in steps) for key in steps[0]}
        metrics["faults/skipped_updates"] = sum(s["faults/skipped_updates"] for s in steps)
        return {**metrics, "lr": self.scheduler.get_last_lr()[0]}

    def step(self, batch: PolicyBatch, rows: torch.Tensor, poisoned: bool) -> dict[str, float]:
        """One optimizer step on the mini-batch batch[rows] (`backward`). A non-finite loss or gradient norm
        skips the step and sets faults/skipped_updates to 1."""
        metrics = self.backward(batch, rows, poisoned)
        grad_norm = self.parallel.clip_grad_norm_(self.trainer_cfg.max_grad_norm)
        finite = bool(torch.isfinite(grad_norm)) and not poisoned
        if finite:
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {**metrics, "grad_norm": grad_norm.item(), "faults/skipped_updates": float(not finite)}

    def backward(self, batch: PolicyBatch, rows: torch.Tensor, poisoned: bool) -> dict[str, float]:
        """The gradient of the mini-batch batch[rows]'s loss, accumulated over its micro-batches (each weighted
        by its share, module docstring) and averaged over the ranks; the loss's metrics and the policy's mean
        entropy over the action tokens, from the logits the loss used, all of the whole mini-batch."""
        world, mask = self.parallel.world, batch.mask[rows]  # [n, T]
        micros = [micro for _, micro, _ in micro_batches(batch, rows, self.trainer_cfg.micro_batch_size)]
        count = -(-len(micros) // world.size)  # micro-batches per rank
        mine = [(micro, 1.0) for micro in micros[world.rank :: world.size]]
        mine += [(micros[0], 0.0)] * (count - len(mine))  # weight 0: the same forwards on every rank
        sums: dict[str, torch.Tensor] = {}
        entropy_sum = torch.zeros((), device=self.device)
        for i, (micro, weight) in enumerate(mine):
            share = weight * micro_batch_share(micro.mask, mask, self.loss_cfg.agg)  # on the host's masks: no sync
            micro = micro.to(self.device)
            with self.parallel.gradient_sync(i == count - 1):
                with torch.autocast(self.device.type, torch.bfloat16, enabled=self.trainer_cfg.bf16_autocast):
                    logits = action_logits(self.parallel.trained, micro, self.parallel.shares_prompts)
                tokens = targets(micro)  # [b, T]
                logp = self.sampling.token_logprobs(logits, tokens)  # [b, T]
                out = self.loss_fn(
                    logp, micro.old_logp, micro.ref_logp, micro.advantages, micro.mask, self.loss_cfg,
                    is_weights=micro.is_weights,
                )  # fmt: skip
                loss = out.loss
                if self.loss_cfg.reference_nll > 0:
                    nll = reference_nll(logp, micro.mask, micro.replayed, self.loss_cfg)
                    loss = loss + self.loss_cfg.reference_nll * nll
                    out.metrics["loss/reference_nll"] = nll.detach()
                loss = loss * math.nan if poisoned else loss
                (loss * share * world.size).backward()  # the ranks' gradients are averaged
            for key, value in out.metrics.items():  # on the device: one transfer for the mini-batch, below
                sums[key] = sums.get(key, 0.0) + value.detach() * share
            entropy_sum += weight * self.sampling.entropy(logits.detach(), tokens, (micro.mask > 0).float())
        keys = sorted(sums)
        values = [torch.as_tensor(sums[k], dtype=torch.float32, device=self.device) for k in keys]
        stacked = torch.stack([*values, entropy_sum])
        totals = world.sum_(stacked.cpu())
        metrics = {k: float(v) for k, v in zip(keys, totals[:-1])}
        return {**metrics, "entropy": float(totals[-1] / mask.sum().clamp(min=1))}


def advantage_batch(
    trajs: list[Trajectory],
    pad_id: int,
    learner: PolicyOptimizer,
    reference: torch.nn.Module | None,  # None: no KL to a reference anywhere (beta 0, no KL in the reward)
    adv_fn,  # an ADV_ESTIMATORS entry
    algo: AlgoConfig,
    group_size: int,
) -> tuple[PolicyBatch, dict[str, float]]:
    """The trajectories as a batch with the reference's log-probs and each row's advantage (of the rewards minus
    any KL in the reward; also set on the trajectory), and the metrics of the advantages and of that KL."""
    batch = collate(trajs, torch.zeros(len(trajs)), pad_id)  # advantages set below
    if reference is not None:  # once per step, before advantages: a KL in the reward needs them
        with torch.no_grad():
            batch.ref_logp = learner.logprobs(reference, batch, [torch.arange(len(trajs))])
    rewards, kl_metrics = kl_shaped(trajs, batch, algo)
    batch.advantages = adv_fn(rewards, group_size, algo.adv_eps)  # [N]
    for traj, advantage in zip(trajs, batch.advantages.tolist()):
        traj.advantage = advantage
    return batch, {**advantage_metrics(batch.advantages), **kl_metrics}


def prepare_batch(
    batch: PolicyBatch,
    trajs: list[Trajectory],
    first_epoch: list[torch.Tensor],
    learner: PolicyOptimizer,
    algo: AlgoConfig,
) -> tuple[PolicyBatch, dict[str, float]]:
    """The loss mask and log pi_old (module docstring); the gap between the sampler's and the trainer's
    log-probs is logged under recompute. A replayed reference answer (algo.guide) has no sampler: its pi_old
    is the policy's before the update, so its ratios start at 1 and it has no gap to correct. Under
    recompute, pi_old is computed over exactly the micro-batches the first epoch runs, so that the first
    mini-batch's ratios are exactly 1 (same inputs, same kernels)."""
    if algo.overlong is Overlong.mask:
        cut = torch.tensor([truncated(t) for t in trajs])  # [N]
        batch = replace(batch, mask=batch.mask * ~cut.unsqueeze(1))
    replayed = torch.tensor([t.off_policy for t in trajs]).unsqueeze(1)  # [N, 1]
    batch = replace(batch, replayed=replayed.flatten().float())
    if algo.old_logprobs is OldLogprobs.sampler:
        if replayed.any():
            learner.policy.eval()
            now = learner.logprobs(learner.policy, batch, [replayed.flatten().nonzero().flatten()])
            batch = replace(batch, old_logp=torch.where(replayed, now, batch.old_logp))
        return batch, {}
    learner.policy.eval()
    old_logp = learner.logprobs(learner.policy, batch, first_epoch)
    sampler = torch.where(replayed, old_logp, batch.old_logp)
    fix = rollout_correction(old_logp, sampler, batch.mask, algo.rollout_is.value, algo.rollout_is_threshold)
    batch = replace(batch, old_logp=old_logp, mask=fix.mask, is_weights=fix.weights)
    return batch, {key: value.item() for key, value in fix.metrics.items()}
