"""Tools the policy may call, their argument schemas, and the executor that runs calls safely.

A tool is a class with a `name`, a `description`, a JSON-schema `parameters` object and a
`run(arguments) -> dict` method; it registers itself by name:

    @TOOLS.register("calculate_math")
    class CalculateMath(Tool): ...

Model-written arguments are hostile input. `ToolExecutor` checks them against the schema, runs
the call in a worker thread with a timeout, caps the observation, and never raises: every
outcome, failures included, becomes a `ToolResult` the model reads as a tool message.
"""

from __future__ import annotations

import inspect
import json
import math
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from minirl.errors import ConfigError
from minirl.registry import Registry

if TYPE_CHECKING:
    from minirl.config import ToolsConfig


@dataclass
class ToolCall:
    """One call the model asked for. `arguments` is always a dict once parsed."""

    id: str
    name: str
    arguments: dict[str, Any]

    def to_message_dict(self) -> dict[str, Any]:
        """OpenAI-style entry for an assistant message's `tool_calls` list."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


class ToolError(ValueError):
    """A tool refuses its arguments; the message is shown to the model."""


class ToolTimeout(ToolError):
    """A tool stopped its own work at a time limit (e.g. a killed sandbox run): status "timeout"."""


class Tool:
    """One callable tool. `run` receives arguments already checked against `parameters`."""

    name: str
    description: str
    parameters: dict  # JSON schema of an object

    def run(self, arguments: dict) -> dict:
        """A JSON-serialisable result; may raise ToolError."""
        raise NotImplementedError

    @classmethod
    def check_config(cls, cfg: ToolsConfig) -> None:
        """Raise ConfigError if the tool cannot run under `cfg` on this machine; runs before any model loads."""

    @classmethod
    def schema(cls) -> dict:
        """The OpenAI function schema chat templates render."""
        return {
            "type": "function",
            "function": {"name": cls.name, "description": cls.description, "parameters": cls.parameters},
        }


TOOLS: Registry[type[Tool]] = Registry("tool")


def build_tools(names: Iterable[str], cfg: ToolsConfig | None = None) -> dict[str, Tool]:
    """Instances of the registered tools, by name; a tool whose constructor takes `cfg` gets the
    tools config (None: its own defaults). Unknown names raise ConfigError."""
    classes = {name: TOOLS.get(name) for name in names}
    return {name: cls(cfg) if "cfg" in inspect.signature(cls).parameters else cls() for name, cls in classes.items()}


def _interface(parameters: Any) -> tuple[list[tuple[str, str]], list[str]]:
    """What a parameters schema asks of a call: ([(argument, its type)], required arguments), sorted."""
    parameters = parameters if isinstance(parameters, dict) else {}
    properties = parameters.get("properties") if isinstance(parameters.get("properties"), dict) else {}
    types = sorted(
        (key, json.dumps(spec.get("type") if isinstance(spec, dict) else None)) for key, spec in properties.items()
    )
    return types, sorted(map(str, parameters.get("required") or []))


def check_offered_tools(offered: Iterable[dict], names: Collection[str]) -> None:
    """`offered`: the function schemas the tasks show the model; `names`: the tools the executor runs
    (tools.names). A tool shown but not run would fail every call as unknown, and one shown with other
    arguments than its tool checks would hold the model to an interface it never saw; either is a ConfigError,
    raised before any model loads."""
    offered = list(offered)
    missing = sorted({schema["function"]["name"] for schema in offered} - set(names))
    if missing:
        raise ConfigError(
            f"tools.names: the tasks offer {', '.join(missing)}, which tools.names ({', '.join(names)}) does not "
            "run; add them to tools.names or pick the tools group that matches the data"
        )
    for schema in offered:
        name, shown = schema["function"]["name"], schema["function"].get("parameters")
        checked = TOOLS.get(name).parameters
        if _interface(shown) != _interface(checked):
            raise ConfigError(
                f"tools.names: the tasks offer {name} with parameters {json.dumps(shown)}, but the {name} tool "
                f"checks {json.dumps(checked)}; fix the data's schema or register a tool that matches it"
            )


# -- argument validation ------------------------------------------------------------------------


def _is_number(value: Any) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, float) and math.isfinite(value)
    )


def _is_integer(value: Any) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float) and value.is_integer())


_TYPE_CHECKS: dict[str, Callable[[Any], bool]] = {
    "string": lambda value: isinstance(value, str),
    "number": _is_number,
    "integer": _is_integer,
    "boolean": lambda value: isinstance(value, bool),
    "object": lambda value: isinstance(value, dict),
    "array": lambda value: isinstance(value, list),
}

_JSON_TYPE_NAMES: dict[type, str] = {
    bool: "boolean",
    int: "number",
    float: "number",
    str: "string",
    dict: "object",
    list: "array",
    type(None): "null",
}


def _same_json(a: Any, b: Any) -> bool:
    """Equal as JSON values: true is not 1, as it is in Python (1 and 1.0 are one number in both)."""
    return isinstance(a, bool) is isinstance(b, bool) and a == b


def _label(path: str) -> str:
    return f"argument '{path}'" if path else "arguments"


def _problems(schema: dict, value: Any, path: str) -> list[str]:
    expected = schema.get("type")
    if expected is not None and not _TYPE_CHECKS[expected](value):
        got = _JSON_TYPE_NAMES.get(type(value), type(value).__name__)
        return [f"{_label(path)} must be of type {expected}, got {got}"]
    problems: list[str] = []
    if "enum" in schema and not any(_same_json(value, option) for option in schema["enum"]):
        options = ", ".join(str(option) for option in schema["enum"])
        problems.append(f"{_label(path)} must be one of: {options}; got {json.dumps(value, ensure_ascii=False)}")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        prefix = f"{path}." if path else ""
        problems += [
            f"missing required {_label(prefix + key)}" for key in schema.get("required", ()) if key not in value
        ]
        for key, item in value.items():
            if key in properties:
                problems += _problems(properties[key], item, prefix + key)
            elif schema.get("additionalProperties", True) is False:
                problems.append(f"unexpected {_label(prefix + key)}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            problems += _problems(schema["items"], item, f"{path}[{i}]")
    return problems


def validate_arguments(parameters: dict, arguments: dict) -> list[str]:
    """Problems of `arguments` against a JSON schema subset (type, required, enum, properties,
    additionalProperties, items); empty when they are fine. bool is not a number."""
    return _problems(parameters, arguments, "")


# -- results and execution ----------------------------------------------------------------------

ToolStatus = Literal["ok", "unknown_tool", "bad_arguments", "error", "timeout", "over_budget"]


@dataclass
class ToolResult:
    """The outcome of one call; `content` is the (capped) observation text the model sees."""

    call_id: str
    name: str
    content: str
    status: ToolStatus
    latency_s: float

    @property
    def valid_call(self) -> bool:
        """Whether the call named an available tool with schema-valid arguments."""
        return self.status not in ("unknown_tool", "bad_arguments")

    def to_message(self) -> dict:
        return {"role": "tool", "tool_call_id": self.call_id, "name": self.name, "content": self.content}


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
    """One call running in a daemon thread (a hung tool cannot block the process from exiting)."""

    def __init__(self, call: ToolCall, tool: Tool) -> None:
        self.call = call
        self.outcome: tuple[ToolStatus, str] | None = None
        self.started = time.perf_counter()
        self._thread = threading.Thread(target=self._work, args=(tool,), name=f"tool-{call.name}", daemon=True)
        self._thread.start()

    def _work(self, tool: Tool) -> None:
        try:
            self.outcome = ("ok", _to_json(tool.run(self.call.arguments)))
        except ToolTimeout as err:
            self.outcome = ("timeout", _error_json(_describe(err)))
        except BaseException as err:  # a worker thread: whatever the tool raised is the model's observation
            self.outcome = ("error", _error_json(_describe(err)))

    def wait(self, deadline: float) -> None:
        self._thread.join(max(0.0, deadline - time.perf_counter()))


class ToolExecutor:
    """Runs tool calls with schema checks, a per-call timeout and an observation cap. Never raises."""

    def __init__(self, tools: dict[str, Tool], timeout_s: float, max_output_chars: int) -> None:
        self.tools = tools
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars

    @classmethod
    def from_config(cls, cfg: ToolsConfig) -> ToolExecutor:
        """An executor of the configured tools (`tools.names`), with their timeout and observation cap."""
        return cls(build_tools(cfg.names, cfg), cfg.timeout_s, cfg.max_output_chars)

    def execute(self, call: ToolCall, allowed: Collection[str] | None = None) -> ToolResult:
        """Run one call; `allowed` is the task's tool list (None = every tool of the executor)."""
        return self.execute_many([call], allowed)[0]

    def execute_many(
        self, calls: Sequence[ToolCall], allowed: Collection[str] | None = None, budget: int | None = None
    ) -> list[ToolResult]:
        """Run calls concurrently, each with its own timeout; results in call order. Calls past
        `budget` (the conversation's remaining tool calls; None = no limit) are not run: they get
        an "over_budget" error observation telling the model to answer."""
        budget = len(calls) if budget is None else max(0, budget)
        started = [self._start(call, allowed) for call in calls[:budget]]
        refused = [
            self._result(call, "over_budget", _error_json(_OVER_BUDGET), time.perf_counter()) for call in calls[budget:]
        ]
        return [item if isinstance(item, ToolResult) else self._finish(item) for item in started] + refused

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
            problems = validate_arguments(tool.parameters, call.arguments)
            if problems:
                message = f"bad arguments for '{call.name}': " + "; ".join(problems)
                return self._result(call, "bad_arguments", _error_json(message), started)
            return _Run(call, tool)
        except Exception as err:  # a malformed call object or schema must not escape the executor
            return self._result(call, "error", _error_json(_describe(err)), started)

    def _finish(self, run: _Run) -> ToolResult:
        run.wait(run.started + self.timeout_s)
        outcome = run.outcome
        if outcome is None:
            message = f"tool '{run.call.name}' timed out after {self.timeout_s:g} s"
            return self._result(run.call, "timeout", _error_json(message), run.started)
        return self._result(run.call, outcome[0], outcome[1], run.started)
