"""The decoding loop: rows of token prompts sampled one token a step on one KV cache, with rows admitted and
leaving between steps. The `torch` rollout engine and the server's decoder are its two consumers.

    loop = DecodeLoop(model, pad_id, end_of_turn_ids(tokenizer, model))
    loop.admit([RowRequest(prompt, SamplingParams(64, temperature=0.7))])
    while loop.rows:
        for sampled in loop.step():  # one token for every row in the batch
            ...  # sampled.row, .token, .logprob; .stop is why the row left with it, None while it goes on
            loop.evict(sampled.row)  # the consumer's own reason to end a row (a stop string, a cancelled request)

A step (1) feeds every row that goes on the token it sampled last step, dropping the rows that left from
the batch and its cache, (2) prefills the rows admitted since the last step, whose cache joins the batch's
(`minirl.inference.decoding.CachedBatch.admit`), and (3) samples one token for every row. A row leaves
once it samples an end-of-turn token (`StopReason.stop`) or its `max_new_tokens`-th token
(`StopReason.length`), or when it is evicted (`StopReason.cancelled`); the token it leaves with is never
fed. Rows admitted while others decode join them at the next step: continuous batching (the agent loop
without a round barrier admits a trajectory's next turn so).

Greedy rows take their argmax together. Rows without a torch.Generator of their own and with the same
temperature, top-p and top-k draw together from the global torch RNG: one `minirl.inference.sampling.draw`
over their logits as one batch (one uniform per row, in batch order), the rollout's draws since the torch
engine was written. Rows with generators of their own and the same settings draw together too, each row's
uniform from its own generator, so a row's tokens do not depend on what it is batched with, up to the
rounding of batched matrix products.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import torch

from minirl.inference.decoding import CachedBatch, PrefixStore
from minirl.inference.sampling import SamplingParams, sample_tokens


class StopReason(str, Enum):
    """Why one decoding row stopped; why a whole trajectory ended is the rollout's TrajectoryEnd."""

    stop = "stop"  # an end-of-turn token (or, in the server, one of the row's stop strings)
    length = "length"  # max_new_tokens
    cancelled = "cancelled"  # evicted by its consumer (the server: the request was cancelled)


def end_of_turn_ids(tokenizer, model) -> frozenset[int]:
    """The tokens that end a turn: the tokenizer's EOS and every `eos_token_id` of the model's generation
    config (an int or a list). Chat checkpoints list their end-of-turn token there next to the tokenizer's
    EOS (Qwen2.5 Instruct: <|im_end|> and <|endoftext|>), and `generate` stops on each of them."""
    config = model.generation_config  # None for a model that cannot generate
    listed = config.eos_token_id if config is not None else None
    listed = list(listed) if isinstance(listed, (list, tuple)) else [listed]
    return frozenset(token for token in [tokenizer.eos_token_id, *listed] if token is not None)


@dataclass
class RowRequest:
    """A row to admit."""

    prompt: list[int]  # token ids, not empty
    params: SamplingParams  # its temperature, top-p, top-k and max_new_tokens (seed and stop: the consumer's)
    generator: torch.Generator | None = None  # None: draw from the global torch RNG, batched (module docstring)


@dataclass
class Sampled:
    """One row's token from one step."""

    row: int  # the id `DecodeLoop.admit` gave the row
    token: int
    logprob: float  # under the distribution it was drawn from (SamplingParams.logprobs)
    stop: StopReason | None  # why the row left with this token; None: it goes on


@dataclass(eq=False)
class _Row:
    id: int
    request: RowRequest
    sampled: int = 0  # tokens sampled so far
    last: int = -1  # the last token sampled, fed at the next step
    stop: StopReason | None = None


class DecodeLoop:
    """Rows decoding on `model` (an eval-mode causal LM, called under torch.no_grad by the consumer); see the
    module docstring. `end_ids`: the tokens that end a row (`end_of_turn_ids`). With `reuse`, a prompt that
    extends a stored sequence encodes only its new tokens; with `store`, every row that leaves the cache is
    stored there with the tokens it was fed (`minirl.inference.decoding.CachedBatch`). `reuse` is read at
    every prefill; set it to None to release it once nothing admitted later can extend what it holds."""

    def __init__(
        self, model, pad_id: int, end_ids: frozenset[int],
        reuse: PrefixStore | None = None, store: PrefixStore | None = None,
    ) -> None:  # fmt: skip
        self.model, self.pad_id, self.end_ids = model, pad_id, end_ids
        self.reuse, self.store = reuse, store
        self._ids = itertools.count()
        self._live: dict[int, _Row] = {}  # every row that has not left, by id, in the order admitted
        self._admitted: list[_Row] = []  # admitted since the last step: not prefilled yet
        self._batch: CachedBatch | None = None
        self._rows: list[_Row] = []  # the batch's rows, in its order (the rows of its logits)

    @property
    def rows(self) -> list[int]:
        """The ids of the rows that have not left (those admitted since the last step included)."""
        return list(self._live)

    def admit(self, rows: Sequence[RowRequest]) -> list[int]:
        """Add `rows`; they are prefilled together at the next step and sample from it on. Their ids, in order."""
        admitted = [_Row(next(self._ids), request) for request in rows]
        self._admitted += admitted
        self._live.update((row.id, row) for row in admitted)
        return [row.id for row in admitted]

    def evict(self, row: int) -> None:
        """Make row `row` leave before the next step (`StopReason.cancelled`); nothing once it has left."""
        evicted = self._live.pop(row, None)
        if evicted is not None:
            evicted.stop = StopReason.cancelled
            self._admitted = [row for row in self._admitted if row is not evicted]

    def step(self) -> list[Sampled]:
        """Feed, admit, sample (module docstring): one `Sampled` per row in the batch, in its order."""
        self._feed()
        self._prefill()
        if not self._rows:
            return []
        tokens, logprobs = self._sample(self._batch.logits)
        out = []
        for row, token, logprob in zip(self._rows, tokens, logprobs):
            row.sampled, row.last = row.sampled + 1, token
            if token in self.end_ids:
                row.stop = StopReason.stop
            elif row.sampled >= row.request.params.max_new_tokens:
                row.stop = StopReason.length
            if row.stop is not None:
                del self._live[row.id]
            out.append(Sampled(row.id, token, logprob, row.stop))
        if all(row.stop is not None for row in self._rows):  # nothing left to feed: release the cache now
            self._release()
        return out

    def _feed(self) -> None:
        """Give every row that goes on the token it sampled; the others leave the batch (and its cache)."""
        if self._batch is None:
            return
        going = [i for i, row in enumerate(self._rows) if row.stop is None]
        if not going:
            self._release()
            return
        tokens = torch.tensor([self._rows[i].last for i in going])  # [B']
        keep = None if len(going) == len(self._rows) else torch.tensor(going)
        self._batch.step(tokens, keep)
        self._rows = [self._rows[i] for i in going]

    def _prefill(self) -> None:
        if not self._admitted:
            return
        prompts = [row.request.prompt for row in self._admitted]
        if self._batch is None:
            self._batch = CachedBatch(self.model, prompts, self.pad_id, reuse=self.reuse, store=self.store)
        else:
            self._batch.admit(prompts, self.reuse)
        self._rows += self._admitted
        self._admitted = []

    def _release(self) -> None:
        """Drop the batch; with a store, its rows go there first (the rows that left earlier already did)."""
        if self.store is not None:
            self._batch.store_live_rows()
        self._batch, self._rows = None, []

    def _sample(self, logits: torch.Tensor) -> tuple[list[int], list[float]]:  # logits: [B, V] float32
        """A token and its log-prob for every row, drawn in groups (module docstring)."""
        groups: dict[tuple, list[int]] = {}
        for i, row in enumerate(self._rows):
            params, generator = row.request.params, row.request.generator
            settings = (params.temperature, params.top_p, params.top_k)
            key: tuple = ("greedy",) if params.greedy else ("global" if generator is None else "own", *settings)
            groups.setdefault(key, []).append(i)
        tokens, logprobs = [0] * len(self._rows), [0.0] * len(self._rows)
        for members in groups.values():
            request = self._rows[members[0]].request
            whole = len(members) == len(self._rows)
            part = logits if whole else logits[torch.tensor(members, device=logits.device)]  # [b, V]
            own = [self._rows[i].request.generator for i in members] if request.generator is not None else None
            drawn, scores = sample_tokens(part, request.params, None if request.params.greedy else own)
            for i, token, logprob in zip(members, drawn.tolist(), scores.tolist()):
                tokens[i], logprobs[i] = token, logprob
        return tokens, logprobs
