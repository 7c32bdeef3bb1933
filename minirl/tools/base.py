"""The tool interface and its registry: what a call asks for (`ToolCall`), what it returns (`ToolResult`).

A tool is a class with a `name`, a `description`, a JSON-schema `parameters` object and a
`run(arguments) -> dict` method; it registers itself by name:

    @TOOLS.register("calculate_math")
    class CalculateMath(Tool): ...

Arguments are checked against the schema by minirl/tools/schema.py; minirl/tools/executor.py runs calls.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Collection, Iterable
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
