"""The worker thread that owns the model, and the queue requests wait in.

Batching policy (static batches, first come first served): requests wait in a bounded queue
(`serve.max_queue`; a full queue refuses with `QueueFull`, HTTP 429). Whenever the worker is free it
takes every waiting request in arrival order while their rows fit in `serve.max_batch_size` (a request
with n=k is k rows, and all of them go into the same batch), decodes them as one batch, and only then
looks at the queue again: requests that arrive while a batch runs wait for the next one. A batch ends
when its last row does; rows that finish early leave the batch (see `Decoder`). The decoding loop under the
decoder admits rows between steps (`minirl.inference.loop.DecodeLoop`): continuous batching would hand it
new requests' rows as others finish instead of waiting for the batch's last row.

The request handlers live on the asyncio event loop and never wait on the worker: a `Job` carries its
rows' output back to the loop through an asyncio queue, one event at a time.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from minirl.inference.sampling import SamplingParams
from minirl.serving.decoder import DecodeRow, RowResult

logger = logging.getLogger(__name__)


class QueueFull(Exception):
    """The queue holds `max_queue` requests already."""


class JobFailed(Exception):
    """The batch holding the job failed or the server shut down; the message says why."""


@dataclass
class TextEvent:
    index: int  # which of the job's rows (the choice index)
    text: str


@dataclass
class DoneEvent:
    index: int
    result: RowResult


@dataclass
class _FailedEvent:
    message: str


class BatchDecoder(Protocol):
    def decode(self, rows: list[DecodeRow]) -> None: ...


class _JobRow:
    """The sink of one of a job's rows: its output becomes events of the job."""

    def __init__(self, job: Job, index: int) -> None:
        self.job = job
        self.index = index

    def cancelled(self) -> bool:
        return self.job.cancelled

    def text(self, delta: str) -> None:
        self.job.push(TextEvent(self.index, delta))

    def done(self, result: RowResult) -> None:
        self.job.push(DoneEvent(self.index, result))


class Job:
    """One request: one row per SamplingParams, all with the same prompt. Create it on the event loop."""

    def __init__(self, prompt: list[int], samplings: list[SamplingParams]) -> None:
        self.prompt = prompt
        self.samplings = samplings
        self._loop = asyncio.get_running_loop()
        self._events: asyncio.Queue = asyncio.Queue()
        self._cancelled = threading.Event()

    @property
    def rows_needed(self) -> int:
        return len(self.samplings)

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Stop the job's rows at their next step (the client went away); harmless once it is done."""
        self._cancelled.set()

    def rows(self) -> list[DecodeRow]:
        return [DecodeRow(self.prompt, spec, _JobRow(self, i)) for i, spec in enumerate(self.samplings)]

    def push(self, event: TextEvent | DoneEvent | _FailedEvent) -> None:
        """From any thread: hand `event` to the job's reader on the event loop."""
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)

    def fail(self, message: str) -> None:
        self.push(_FailedEvent(message))

    async def events(self) -> AsyncIterator[TextEvent | DoneEvent]:
        """The rows' events in order, until every row is done; raises JobFailed."""
        remaining = self.rows_needed
        while remaining:
            event = await self._events.get()
            if isinstance(event, _FailedEvent):
                raise JobFailed(event.message)
            remaining -= isinstance(event, DoneEvent)
            yield event


class Scheduler:
    """Owns `decoder` on one worker thread; see the module docstring for the batching policy."""

    def __init__(self, decoder: BatchDecoder, max_batch_size: int, max_queue: int) -> None:
        self.decoder = decoder
        self.max_batch_size = max_batch_size
        self.max_queue = max_queue
        self._waiting: deque[Job] = deque()
        self._running: list[Job] = []
        self._closed = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._work, name="minirl-decoder", daemon=True)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running_rows(self) -> int:
        return sum(job.rows_needed for job in self._running)

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue `job` for the next batch; raises QueueFull, or JobFailed once closed."""
        if job.rows_needed > self.max_batch_size:
            raise ValueError(f"a job of {job.rows_needed} rows never fits a batch of {self.max_batch_size}")
        with self._changed:
            if self._closed:
                raise JobFailed("the server is shutting down")
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(f"{self.max_queue} requests are waiting already")
            self._waiting.append(job)
            self._changed.notify()

    def close(self, timeout_s: float = 10.0) -> None:
        """Fail the waiting jobs, cancel the running ones and wait for the worker to stop."""
        with self._changed:
            self._closed = True
            for job in self._waiting:
                job.fail("the server is shutting down")
            self._waiting.clear()
            for job in self._running:
                job.cancel()
            self._changed.notify()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _next_batch(self) -> list[Job]:
        """Every waiting job that fits, in arrival order; empty once closed."""
        with self._changed:
            while not self._waiting and not self._closed:
                self._changed.wait()
            batch: list[Job] = []
            rows = 0
            while self._waiting and rows + self._waiting[0].rows_needed <= self.max_batch_size:
                job = self._waiting.popleft()
                rows += job.rows_needed
                batch.append(job)
            self._running = batch
            return batch

    def _work(self) -> None:
        while batch := self._next_batch():
            try:
                self.decoder.decode([row for job in batch for row in job.rows()])
            except Exception as err:  # one failed batch must not stop the server
                logger.exception("decoding a batch of %d requests failed", len(batch))
                for job in batch:
                    job.fail(f"decoding failed: {type(err).__name__}: {err}")
            finally:
                with self._changed:
                    self._running = []
