"""Batched step-wise decoding with a KV cache: the server's sampler.

`Decoder.decode(rows)` decodes a fixed set of rows together on one KV cache (`minirl.inference.decoding`). A row
finishes on an end-of-turn token, on one of its stop strings, at its own max_tokens, or when its sink
reports the request cancelled; finished rows leave the batch and the KV cache at once.

Each row samples with its own temperature (0, or below 1e-5 as in vLLM, = greedy), top-p and top-k
(filtered as the trainer assumes: `minirl.inference.sampling`) and its own torch.Generator, so a seeded row draws
the same tokens whatever it is batched with, up to the rounding of batched matrix products.

Text reaches the sink as it settles: the completion is decoded as a whole after every token, and
text that a later token could still change is held back (an incomplete UTF-8 character, or a
suffix that may be the start of a stop string).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

import torch

from minirl.inference.decoding import CachedBatch
from minirl.inference.sampling import draw, is_greedy, warped

INCOMPLETE_CHAR = "\ufffd"  # what the byte-level decoder writes for a UTF-8 character cut short


@dataclass
class SamplingSpec:
    """How one row samples and when it stops."""

    max_tokens: int
    temperature: float = 1.0  # 0 (or below GREEDY_BELOW) = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None  # None = a fresh random seed
    stop: tuple[str, ...] = ()  # the text ends before the first occurrence of any of them


class StopReason(str, Enum):
    stop = "stop"  # an end-of-turn token or a stop string
    length = "length"  # max_tokens
    cancelled = "cancelled"  # the sink asked to stop


@dataclass
class RowResult:
    text: str  # the completion's text without the end-of-turn token and without the stop string
    finish_reason: StopReason
    completion_tokens: int  # tokens sampled, an end-of-turn token included


class RowSink(Protocol):
    """Where one row's output goes; called from the decoding thread."""

    def cancelled(self) -> bool: ...

    def text(self, delta: str) -> None: ...

    def done(self, result: RowResult) -> None: ...


@dataclass
class DecodeRow:
    prompt: list[int]
    sampling: SamplingSpec
    sink: RowSink


def _partial_suffix(text: str, needles: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `needles`."""
    longest = 0
    for needle in needles:
        for size in range(min(len(needle) - 1, len(text)), longest, -1):
            if text.endswith(needle[:size]):
                longest = size
                break
    return longest


class _LiveRow:
    """One row while it decodes: its tokens, how much text it has sent, its generator."""

    def __init__(self, row: DecodeRow, tokenizer, end_ids: frozenset[int], device: torch.device) -> None:
        self.row = row
        self.spec = row.sampling
        self.tokenizer = tokenizer
        self.end_ids = end_ids
        self.tokens: list[int] = []
        self.sent = 0  # characters of the text already given to the sink
        self.generator = None
        if not is_greedy(self.spec.temperature):
            seed = random.getrandbits(64) if self.spec.seed is None else self.spec.seed % 2**64
            self.generator = torch.Generator(device).manual_seed(seed)

    def sample(self, logits: torch.Tensor) -> int:  # logits: [V] float32
        spec = self.spec
        if is_greedy(spec.temperature):
            return int(logits.argmax())
        probs = warped(logits, spec.temperature, spec.top_p, spec.top_k).softmax(-1)  # [V]
        return int(draw(probs[None], self.generator))

    def advance(self, token: int) -> bool:
        """Take the sampled token; True when the row is finished (its sink has the result)."""
        self.tokens.append(token)
        if self.row.sink.cancelled():
            return self._finish(self._decode(self.tokens), StopReason.cancelled)
        if token in self.end_ids:
            return self._finish(self._decode(self.tokens[:-1]), StopReason.stop)
        text = self._decode(self.tokens)
        cut = self._stop_at(text)
        if cut >= 0:
            return self._finish(text[:cut], StopReason.stop)
        if len(self.tokens) >= self.spec.max_tokens:
            return self._finish(text, StopReason.length)
        settled = text.rstrip(INCOMPLETE_CHAR)
        self._send(text, len(settled) - _partial_suffix(settled, self.spec.stop))
        return False

    def _decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=False)

    def _stop_at(self, text: str) -> int:
        """Where the first stop string starts, or -1; text already sent holds none."""
        starts = [text.find(stop, max(0, self.sent - len(stop))) for stop in self.spec.stop]
        return min((start for start in starts if start >= 0), default=-1)

    def _send(self, text: str, end: int) -> None:
        if end > self.sent:
            self.row.sink.text(text[self.sent : end])
            self.sent = end

    def _finish(self, text: str, reason: StopReason) -> bool:
        self._send(text, len(text))
        self.row.sink.done(RowResult(text, reason, len(self.tokens)))
        return True


class Decoder:
    """Decodes batches of rows on `model` (an eval-mode causal LM) with its KV cache."""

    def __init__(self, model, tokenizer) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.pad_id = tokenizer.pad_token_id
        generation_eos = model.generation_config.eos_token_id
        generation_eos = generation_eos if isinstance(generation_eos, list) else [generation_eos]
        self.end_ids = frozenset(t for t in [tokenizer.eos_token_id, *generation_eos] if t is not None)

    @torch.no_grad()
    def decode(self, rows: list[DecodeRow]) -> None:
        """Decode `rows` to the end; every row's sink gets its text and then exactly one result."""
        live = []
        for row in rows:
            if row.sink.cancelled():  # gave up while it waited for this batch
                row.sink.done(RowResult("", StopReason.cancelled, 0))
            else:
                live.append(_LiveRow(row, self.tokenizer, self.end_ids, self.device))
        if not live:
            return
        batch = CachedBatch(self.model, [row.row.prompt for row in live], self.pad_id)
        while True:
            tokens = [row.sample(batch.logits[i]) for i, row in enumerate(live)]
            keep = [i for i, (row, token) in enumerate(zip(live, tokens)) if not row.advance(token)]
            if not keep:
                return
            dropped = len(keep) < len(live)
            live, tokens = [live[i] for i in keep], [tokens[i] for i in keep]
            batch.step(torch.tensor(tokens), torch.tensor(keep) if dropped else None)
