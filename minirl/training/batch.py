"""Trajectories as tensors, and the log-probs a model gives them: the layout every part of an update reads.

A batch is right-padded prompt + response rows; its target columns start at the shortest prompt's last
token, so column t scores input_ids[:, start + t + 1]. Micro-batches keep a prompt's rows together so
that each prompt is encoded once; mini-batches are the optimizer steps of a PPO epoch.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from minirl.inference.decoding import prompt_shared_logits
from minirl.inference.sampling import SamplingParams
from minirl.rollout.trajectory import Trajectory


@dataclass
class PolicyBatch:
    """Trajectories as tensors in target space: column t scores input_ids[:, start + t + 1]. Every log-prob
    is of the distribution the sampler drew from: logits / temperature, then top-k and top-p, renormalised."""

    input_ids: torch.Tensor  # [N, L] prompt + response, right-padded
    attention_mask: torch.Tensor  # [N, L]
    start: int  # first position whose next token can be an action (shortest prompt - 1)
    # [N, L - 1 - start] log pi_old of the target tokens: the sampler's (collate), or the trainer's own
    # recomputation under algo.old_logprobs=recompute (minirl/training/update.py prepare_batch)
    old_logp: torch.Tensor
    mask: torch.Tensor  # [N, L - 1 - start] 1.0 at action tokens: sampled by the policy, or a replayed reference's
    advantages: torch.Tensor  # [N]
    prompt_lengths: torch.Tensor  # [N] tokens of each row's prompt (a group's rows share theirs)
    ref_logp: torch.Tensor | None = None  # [N, L - 1 - start] frozen reference's log-probs; None without one
    is_weights: torch.Tensor | None = None  # [N, L - 1 - start] rollout IS weights (algo.rollout_is=token); None = 1
    replayed: torch.Tensor | None = None  # [N] 1.0 for a replayed reference answer (algo.guide), else 0.0

    def _map(self, fn) -> PolicyBatch:
        tensors = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "start"}
        return replace(self, **{name: fn(t) for name, t in tensors.items() if t is not None})

    def rows(self, index: slice | torch.Tensor) -> PolicyBatch:
        return self._map(lambda t: t[index])

    def to(self, device: torch.device) -> PolicyBatch:
        return self._map(lambda t: t.to(device))

    def narrowed(self) -> tuple[PolicyBatch, int]:
        """(the same rows over only the columns they use, its first target column in this batch's columns).
        Inputs end at the longest row; targets start at the first column where a row has an action. A
        model's log-probs on it equal its log-probs on this batch at those columns: the rows are
        right-padded and attention is causal, so cut columns change nothing before them."""
        width = int(self.attention_mask.sum(dim=1).max())
        actions = (self.mask > 0).any(dim=0).nonzero()
        first = int(actions[0]) if len(actions) else 0  # an action's column always lies before `width`
        targets = slice(first, width - 1 - self.start)
        per_target = {name: getattr(self, name) for name in ("old_logp", "mask", "ref_logp", "is_weights")}
        narrow = {name: t[:, targets] for name, t in per_target.items() if t is not None}
        inputs = {"input_ids": self.input_ids[:, :width], "attention_mask": self.attention_mask[:, :width]}
        return replace(self, **inputs, **narrow, start=self.start + first), first


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
    prompt_lengths = torch.tensor([len(t.prompt_ids) for t in trajs])
    return PolicyBatch(input_ids, attention, start, old_logp, mask, advantages, prompt_lengths)


def action_logits(model, batch: PolicyBatch, share_prompts: bool = True) -> torch.Tensor:
    """[N, L - 1 - start, V] the model's logits at every target column, float32 (each scores the next token).
    `share_prompts`: each prompt encoded once (prompt_shared_logits), else one plain forward of every row."""
    keep = batch.input_ids.shape[1] - batch.start  # logits only where an action can be predicted
    if share_prompts:  # each prompt once; its last token stays in every row, its logit predicts the first action
        logits = prompt_shared_logits(model, batch.input_ids, batch.attention_mask, batch.prompt_lengths - 1, keep)
    else:
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=keep).logits
    return logits[:, :-1].float()  # no copy when the model computes in float32


def targets(batch: PolicyBatch) -> torch.Tensor:
    """[N, L - 1 - start] the token each target column scores."""
    return batch.input_ids[:, batch.start + 1 :]


def token_logprobs(model, batch: PolicyBatch, sampling: SamplingParams, share_prompts: bool = True) -> torch.Tensor:
    """[N, L - 1 - start] log-probs of the target tokens under the distribution each was sampled from
    (`SamplingParams.token_logprobs`: the policy's logits divided by the temperature, filtered by top-k then
    top-p, renormalised; the target token always stays in); what the engines report as sampler log-probs."""
    return sampling.token_logprobs(action_logits(model, batch, share_prompts), targets(batch))


def micro_batches(
    batch: PolicyBatch, rows: torch.Tensor, size: int, shard: tuple[int, int] = (0, 1)
) -> list[tuple[torch.Tensor, PolicyBatch, int]]:
    """batch[rows] in micro-batches of `size` rows, each narrowed (PolicyBatch.narrowed): (its row indices, the
    micro-batch, its first target column in the batch). The rows of one prompt stay together, so a micro-batch
    encodes each of its prompts once (prompt_shared_logits); prompts go shortest first, and a prompt's rows
    shortest first, so little compute goes to padding. `shard` (rank, ranks): every ranks-th one from rank's."""
    lengths = batch.attention_mask.sum(dim=1).tolist()  # [N]
    prompt_lengths = batch.prompt_lengths.tolist()
    prompts = {row: tuple(batch.input_ids[row, : prompt_lengths[row]].tolist()) for row in rows.tolist()}
    ordered = sorted(prompts, key=lambda row: (len(prompts[row]), prompts[row], lengths[row]))
    split = torch.tensor(ordered).split(size)[shard[0] :: shard[1]]
    return [(micro_rows, *batch.rows(micro_rows).narrowed()) for micro_rows in split]


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


@torch.no_grad()
def batch_logprobs(
    model,
    batch: PolicyBatch,
    mini_batches: list[torch.Tensor],
    micro_batch_size: int,
    device: torch.device,
    sampling: SamplingParams,
    shard: tuple[int, int] = (0, 1),
) -> torch.Tensor:
    """[N, L - 1 - start] `model`'s log-probs of the batch's targets under the `sampling` distribution,
    computed over the micro-batches (micro_batches) of each mini-batch of row indices, or `shard`'s share
    of them; 0 in columns a row's micro-batch cut off, and in the rows of other shards' micro-batches."""
    logp = torch.zeros_like(batch.old_logp)
    for rows in mini_batches:
        for micro_rows, micro, first in micro_batches(batch, rows, micro_batch_size, shard):
            micro_logp = token_logprobs(model, micro.to(device), sampling).cpu()
            logp[micro_rows, first : first + micro_logp.shape[1]] = micro_logp
    return logp
