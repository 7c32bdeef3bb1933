"""The tool interface and its registry: what a call asks for (`ToolCall`), what it returns (`ToolResult`).

A tool is a class with a `name`, a `description`, a JSON-schema `parameters` object and a
`run(arguments) -> dict` method; it registers itself by name:

    @TOOLS.register("calculate_math")
    class CalculateMath(Tool): ...

A tool may also accept other spellings of its arguments (`Spelling`: another parameters schema, e.g. the
one MiniMind's data offers); `run` always gets its own. Arguments are checked against the schemas by
minirl/tools/schema.py; minirl/tools/executor.py runs calls.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from minirl.errors import ConfigError
from minirl.registry import Registry
from minirl.tools.schema import validate_arguments

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


@dataclass(frozen=True)
class Spelling:
    """Another interface a tool accepts: a parameters schema whose arguments mean the tool's own under other
    names (`renamed`: this spelling's name -> the tool's), and whose properties' `default` values fill in
    arguments left out."""

    parameters: dict  # JSON schema of an object
    renamed: dict[str, str] = field(default_factory=dict)

    def own(self, arguments: dict) -> dict:
        """`arguments` (valid under `parameters`) in the tool's own spelling."""
        properties = self.parameters.get("properties", {})
        defaults = {key: spec["default"] for key, spec in properties.items() if "default" in spec}
        return {self.renamed.get(key, key): value for key, value in {**defaults, **arguments}.items()}


class Tool:
    """One callable tool. `run` receives arguments already checked against `parameters`, or against one of
    `spellings` and put in the tool's own spelling."""

    name: str
    description: str
    parameters: dict  # JSON schema of an object: what the tool offers
    spellings: tuple[Spelling, ...] = ()  # other interfaces it also accepts (e.g. MiniMind's)

    def run(self, arguments: dict) -> dict:
        """A JSON-serialisable result; may raise ToolError."""
        raise NotImplementedError

    @classmethod
    def accept(cls, arguments: Any) -> dict | list[str]:
        """`arguments` in the tool's own spelling when `parameters` or a spelling accepts them; else the
        problems `parameters` finds (what the model is told, whatever the spellings)."""
        problems = validate_arguments(cls.parameters, arguments)
        if not problems:
            return arguments
        for spelling in cls.spellings:
            if not validate_arguments(spelling.parameters, arguments):
                return spelling.own(arguments)
        return problems

    @classmethod
    def interfaces(cls) -> list[dict]:
        """Every parameters schema the tool accepts, its own first."""
        return [cls.parameters, *(spelling.parameters for spelling in cls.spellings)]

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
    arguments than its tool checks (its own parameters or a spelling's) would hold the model to an interface it
    never saw; either is a ConfigError, raised before any model loads."""
    offered = list(offered)
    missing = sorted({schema["function"]["name"] for schema in offered} - set(names))
    if missing:
        raise ConfigError(
            f"tools.names: the tasks offer {', '.join(missing)}, which tools.names ({', '.join(names)}) does not "
            "run; add them to tools.names or pick the tools group that matches the data"
        )
    for schema in offered:
        name, shown = schema["function"]["name"], schema["function"].get("parameters")
        checked = TOOLS.get(name).interfaces()
        if _interface(shown) not in map(_interface, checked):
            accepted = " or ".join(map(json.dumps, checked))
            raise ConfigError(
                f"tools.names: the tasks offer {name} with parameters {json.dumps(shown)}, but the {name} tool "
                f"checks {accepted}; fix the data's schema or register a tool that matches it"
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
