"""The server's sampler: each request row decoded through the decoding loop (`minirl.inference.loop`), with
its text streamed to a sink.

`Decoder.decode(rows)` admits a fixed set of rows into one `DecodeLoop` and steps it to the end. A row
finishes on an end-of-turn token (`end_of_turn_ids`: the tokenizer's EOS and the model's generation-config
ones), on one of its stop strings, at its own max_new_tokens, or when its sink reports the request
cancelled; finished rows leave the batch and the KV cache at once.

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
from typing import Protocol

import torch

from minirl.inference.loop import DecodeLoop, RowRequest, StopReason, end_of_turn_ids
from minirl.inference.sampling import SamplingParams

INCOMPLETE_CHAR = "\ufffd"  # what the byte-level decoder writes for a UTF-8 character cut short


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
    sampling: SamplingParams  # its seed: None = a fresh random seed; its stop strings end its text
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


def _generator(sampling: SamplingParams, device: torch.device) -> torch.Generator | None:
    """A sampled row's own generator, seeded with its seed or a fresh random one; None for a greedy row."""
    if sampling.greedy:
        return None
    seed = random.getrandbits(64) if sampling.seed is None else sampling.seed % 2**64
    return torch.Generator(device).manual_seed(seed)


class _LiveRow:
    """One row while it decodes: its tokens and how much text it has sent."""

    def __init__(self, row: DecodeRow, tokenizer) -> None:
        self.row = row
        self.spec = row.sampling
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.sent = 0  # characters of the text already given to the sink

    def advance(self, token: int, stop: StopReason | None) -> bool:
        """Take the sampled token and why the loop ended the row with it (None: it did not); True when the row
        is finished (its sink has the result)."""
        self.tokens.append(token)
        if self.row.sink.cancelled():
            return self._finish(self._decode(self.tokens), StopReason.cancelled)
        if stop is StopReason.stop:  # an end-of-turn token, not part of the text
            return self._finish(self._decode(self.tokens[:-1]), StopReason.stop)
        text = self._decode(self.tokens)
        cut = self._stop_at(text)
        if cut >= 0:
            return self._finish(text[:cut], StopReason.stop)
        if stop is StopReason.length:
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
        self.end_ids = end_of_turn_ids(tokenizer, model)

    @torch.no_grad()
    def decode(self, rows: list[DecodeRow]) -> None:
        """Decode `rows` to the end; every row's sink gets its text and then exactly one result."""
        admitted = []
        for row in rows:
            if row.sink.cancelled():  # gave up while it waited for this batch
                row.sink.done(RowResult("", StopReason.cancelled, 0))
            else:
                admitted.append(row)
        loop = DecodeLoop(self.model, self.pad_id, self.end_ids)
        ids = loop.admit(
            [RowRequest(row.prompt, row.sampling, _generator(row.sampling, self.device)) for row in admitted]
        )
        live = {id_: _LiveRow(row, self.tokenizer) for id_, row in zip(ids, admitted)}
        while loop.rows:
            for sampled in loop.step():
                if live[sampled.row].advance(sampled.token, sampled.stop):
                    loop.evict(sampled.row)  # a stop string or a cancellation: the loop did not end it
