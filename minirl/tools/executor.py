"""The executor that runs tool calls safely. `ToolExecutor` checks each call's arguments against the tool's
schemas (`Tool.accept`), runs it in a worker thread with a timeout, caps the observation, and never raises: every
outcome, failures included, becomes a `ToolResult` the model reads as a tool message.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from minirl.config import ToolsConfig
from minirl.tools.base import Tool, ToolCall, ToolResult, ToolStatus, ToolTimeout, build_tools

_TRUNCATION_MARKER = "...[truncated {} chars]"


def cap_text(text: str, max_chars: int) -> str:
    """`text` cut to at most `max_chars` characters (marker included) when longer."""
    if len(text) <= max_chars:
        return text
    keep = max(0, max_chars - len(_TRUNCATION_MARKER.format(len(text))))
    return text[:keep] + _TRUNCATION_MARKER.format(len(text) - keep)


_OVER_BUDGET = "tool-call budget of this conversation is used up; answer with what you have"


def _to_json(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


def _error_json(message: str) -> str:
    return _to_json({"error": message})


def _describe(err: BaseException) -> str:
    """'Type: message'; a user tool's exception whose message itself raises still names its type."""
    try:
        return f"{type(err).__name__}: {err}"
    except Exception:
        return f"{type(err).__name__} (its message raised an error)"


class _Run:
    """One call running in a daemon thread (a hung tool cannot block the process from exiting); `arguments` are
    the call's in the tool's own spelling."""

    def __init__(self, call: ToolCall, tool: Tool, arguments: dict) -> None:
        self.call = call
        self.outcome: tuple[ToolStatus, str] | None = None
        self.started = time.perf_counter()
        self._thread = threading.Thread(
            target=self._work, args=(tool, arguments), name=f"tool-{call.name}", daemon=True
        )
        self._thread.start()

    def _work(self, tool: Tool, arguments: dict) -> None:
        try:
            self.outcome = ("ok", _to_json(tool.run(arguments)))
        except ToolTimeout as err:
            self.outcome = ("timeout", _error_json(_describe(err)))
        except BaseException as err:  # a worker thread: whatever the tool raised is the model's observation
            self.outcome = ("error", _error_json(_describe(err)))

    def wait(self, deadline: float) -> None:
        self._thread.join(max(0.0, deadline - time.perf_counter()))


# one turn's calls: (the calls, the task's tool names or None for every tool, the conversation's remaining budget
# of calls or None for no limit)
CallRequest = tuple[Sequence[ToolCall], Collection[str] | None, int | None]


class PendingCalls:
    """One turn's calls on a `CallPool`: each a finished result (refused up front) or a running future."""

    def __init__(self, slots: list[ToolResult | Future]) -> None:
        self.slots = slots

    def futures(self) -> list[Future]:
        return [slot for slot in self.slots if isinstance(slot, Future)]

    def done(self) -> bool:
        return all(future.done() for future in self.futures())

    def results(self) -> list[ToolResult]:
        """The results in call order, waiting for those still running."""
        return [slot.result() if isinstance(slot, Future) else slot for slot in self.slots]


@dataclass
class CallPool:
    """Calls submitted one turn at a time and run `executor.max_concurrent` at once, in submission order, while
    the submitter goes on (an agent loop decoding other rows); from `ToolExecutor.pool`."""

    executor: ToolExecutor
    slots: ThreadPoolExecutor

    def submit(self, request: CallRequest) -> PendingCalls:
        """Start a turn's calls (execute_many's budget rule: calls past it get an "over_budget" observation)."""
        calls, allowed, budget = request
        budget = len(calls) if budget is None else max(0, budget)
        refused = _error_json(_OVER_BUDGET)
        return PendingCalls([
            self.slots.submit(self.executor._run, call, allowed) if position < budget
            else self.executor._result(call, "over_budget", refused, time.perf_counter())
            for position, call in enumerate(calls)
        ])  # fmt: skip


class ToolExecutor:
    """Runs tool calls with schema checks, a per-call timeout and an observation cap, at most `max_concurrent`
    at once. Never raises."""

    def __init__(
        self, tools: dict[str, Tool], timeout_s: float, max_output_chars: int, max_concurrent: int = 4
    ) -> None:
        self.tools = tools
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars
        self.max_concurrent = max_concurrent

    @classmethod
    def from_config(cls, cfg: ToolsConfig) -> ToolExecutor:
        """An executor of the configured tools (`tools.names`), with their timeout, observation cap and concurrency."""
        return cls(build_tools(cfg.names, cfg), cfg.timeout_s, cfg.max_output_chars, cfg.max_concurrent_calls)

    def execute(self, call: ToolCall, allowed: Collection[str] | None = None) -> ToolResult:
        """Run one call; `allowed` is the task's tool list (None = every tool of the executor)."""
        return self.execute_many([call], allowed)[0]

    def execute_many(
        self, calls: Sequence[ToolCall], allowed: Collection[str] | None = None, budget: int | None = None
    ) -> list[ToolResult]:
        """Run calls concurrently, each with its own timeout; results in call order. Calls past
        `budget` (the conversation's remaining tool calls; None = no limit) are not run: they get
        an "over_budget" error observation telling the model to answer."""
        return self.execute_batch([(calls, allowed, budget)])[0]

    def execute_batch(self, requests: Sequence[CallRequest]) -> list[list[ToolResult]]:
        """The calls of several turns (one per trajectory) together, `max_concurrent` running at once in request
        and call order, so that one trajectory's calls need not wait for another's; per request its results in
        call order (execute_many's). A call's timeout counts from its start, not from the wait for a slot."""
        with self.pool() as pool:
            pending = [pool.submit(request) for request in requests]
            return [calls.results() for calls in pending]

    @contextmanager
    def pool(self) -> Iterator[CallPool]:
        """Slots for `max_concurrent` calls at once, open while the block runs (`CallPool`). When the block
        raises, the calls not yet started are cancelled: the error comes out after the running ones, not after
        every queued call has run."""
        with ThreadPoolExecutor(max_workers=self.max_concurrent, thread_name_prefix="tool-slot") as slots:
            try:
                yield CallPool(self, slots)
            except BaseException:
                slots.shutdown(wait=False, cancel_futures=True)
                raise

    def _run(self, call: ToolCall, allowed: Collection[str] | None) -> ToolResult:
        started = self._start(call, allowed)
        return started if isinstance(started, ToolResult) else self._finish(started)

    def _result(self, call: ToolCall, status: ToolStatus, content: str, started: float) -> ToolResult:
        return ToolResult(
            call_id=str(call.id),
            name=str(call.name),
            content=cap_text(content, self.max_output_chars),
            status=status,
            latency_s=time.perf_counter() - started,
        )

    def _start(self, call: ToolCall, allowed: Collection[str] | None) -> ToolResult | _Run:
        """A finished result when the call is rejected up front, else the running call."""
        started = time.perf_counter()
        try:
            available = sorted(name for name in self.tools if allowed is None or name in allowed)
            if call.name not in available:
                listing = ", ".join(available) if available else "none"
                message = f"unknown tool '{call.name}'; available tools: {listing}"
                return self._result(call, "unknown_tool", _error_json(message), started)
            tool = self.tools[call.name]
            arguments = tool.accept(call.arguments)
            if isinstance(arguments, list):
                message = f"bad arguments for '{call.name}': " + "; ".join(arguments)
                return self._result(call, "bad_arguments", _error_json(message), started)
            return _Run(call, tool, arguments)
        except Exception as err:  # a malformed call object or schema must not escape the executor
            return self._result(call, "error", _error_json(_describe(err)), started)

    def _finish(self, run: _Run) -> ToolResult:
        run.wait(run.started + self.timeout_s)
        outcome = run.outcome
        if outcome is None:
            message = f"tool '{run.call.name}' timed out after {self.timeout_s:g} s"
            return self._result(run.call, "timeout", _error_json(message), run.started)
        return self._result(run.call, outcome[0], outcome[1], run.started)
