"""The RL training loop. Each step reads top to bottom:

    rollout -> reward -> advantage -> loss + optimizer step -> weight sync -> log

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

import numpy as np
import torch
from rich.console import Console

from minirl.algos.advantages import ADV_ESTIMATORS
from minirl.algos.kl import KL_ESTIMATORS
from minirl.algos.losses import LOSSES, micro_batch_share
from minirl.config import Config, LRSchedule
from minirl.data import DATASETS, WARM_START_CORPORA
from minirl.data.task import Task
from minirl.metrics import advantage_metrics, rollout_metrics, success_by_kind
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
    """Trajectories as tensors in target space: column t scores input_ids[:, start + t + 1]."""

    input_ids: torch.Tensor  # [N, L] prompt + response, right-padded
    attention_mask: torch.Tensor  # [N, L]
    start: int  # first position whose next token can be an action (shortest prompt - 1)
    old_logp: torch.Tensor  # [N, L - 1 - start] sampler log-probs of the target tokens
    mask: torch.Tensor  # [N, L - 1 - start] 1.0 where the target token was sampled by the policy
    advantages: torch.Tensor  # [N]

    def _map(self, fn) -> PolicyBatch:
        tensors = {f.name: fn(getattr(self, f.name)) for f in fields(self) if f.name != "start"}
        return replace(self, **tensors)

    def rows(self, index: slice) -> PolicyBatch:
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


def token_logprobs(model, batch: PolicyBatch, temperature: float) -> torch.Tensor:
    """[N, L - 1 - start] log-probs of the target tokens, logits divided by the sampling temperature."""
    keep = batch.input_ids.shape[1] - batch.start  # logits only where an action can be predicted
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=keep).logits
    logits = logits[:, :-1].float() / temperature  # [N, L - 1 - start, V]
    targets = batch.input_ids[:, batch.start + 1 :]
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


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
        # beta = 0: no KL term, so no reference model in memory
        self.reference = load_model(path, cfg, self.device, trainable=False) if cfg.loss.beta > 0 else None
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

    def _lr_factor(self, step: int) -> float:
        t = self.cfg.trainer
        if step < t.warmup_steps:
            return (step + 1) / t.warmup_steps
        if t.lr_schedule is LRSchedule.cosine:
            progress = (step - t.warmup_steps) / max(1, t.steps * t.ppo_epochs - t.warmup_steps)  # optimizer steps
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

    def update_policy(self, batch: PolicyBatch) -> dict[str, float]:
        """One optimizer step over the batch in micro-batches whose gradients add up to the full batch's."""
        self.policy.train()
        n = batch.input_ids.shape[0]
        temperature = self.cfg.rollout.temperature
        sums: dict[str, torch.Tensor] = {}
        size = self.cfg.trainer.micro_batch_size
        for first in range(0, n, size):
            micro = batch.rows(slice(first, first + size)).to(self.device)
            logp = token_logprobs(self.policy, micro, temperature)
            ref_logp = None
            if self.reference is not None:
                with torch.no_grad():
                    ref_logp = token_logprobs(self.reference, micro, temperature)
            out = self.loss_fn(logp, micro.old_logp, ref_logp, micro.advantages, micro.mask, self.cfg.loss)
            share = micro_batch_share(micro.mask, batch.mask, self.cfg.loss.agg)
            (out.loss * share).backward()
            for key, value in out.metrics.items():
                sums[key] = sums.get(key, 0.0) + value.detach().cpu() * share
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.cfg.trainer.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {
            **{k: float(v) for k, v in sums.items()},
            "grad_norm": grad_norm.item(),
            "lr": self.scheduler.get_last_lr()[0],
        }

    def fit(self) -> TrainResult:
        cfg, console = self.cfg, self.console
        tracker = Tracker(cfg, self.run_dir, console)
        result = TrainResult(run_dir=self.run_dir)
        started = time.perf_counter()
        self._log_eval(0, tracker, result)
        for step in range(1, cfg.trainer.steps + 1):
            t0 = time.perf_counter()
            trajs = self.rollout(self.next_tasks(), cfg.rollout.group_size, cfg.rollout.temperature)  # rollout
            t1 = time.perf_counter()
            score_all(trajs, cfg.reward)  # reward
            rewards = torch.tensor([t.reward for t in trajs])
            advantages = self.adv_fn(rewards, cfg.rollout.group_size, cfg.algo.adv_eps)  # advantage
            batch = collate(trajs, advantages, self.tokenizer.pad_token_id)
            for _ in range(cfg.trainer.ppo_epochs):
                update = self.update_policy(batch)  # loss and optimizer step
            self.engine.sync_weights(self.policy)  # the next rollout samples from the new weights
            t2 = time.perf_counter()
            metrics = {
                **rollout_metrics(trajs, self.solved), **advantage_metrics(advantages), **update,
                "time/rollout_s": t1 - t0, "time/update_s": t2 - t1, "time/step_s": t2 - t0,
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
