"""User-defined tools: `@tool` turns a plain Python function into a registered `Tool`.

    from minirl.tools import tool

    @tool
    def word_count(text: str, unique: bool = False) -> int:
        ...  # docstring: the first paragraph is the description, `Args:` lines describe arguments

The parameters' JSON schema comes from the type hints (str, int, float, bool, list, list[T],
dict, Optional[T], Literal[...]; a parameter with a default is optional) and from a Google-style
docstring, or is given as `@tool(parameters=...)`. The function is called with the checked
arguments as keywords; a dict result is the tool result, any other value becomes
`{"result": value}`, and whatever it raises becomes an error observation, as for any tool.

The config key `imports` names the modules that hold such functions; minirl/validate.py imports them
at start-up, before tool names are resolved.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, Union

from minirl.tools.base import TOOLS, Tool

_SCALARS: dict[type, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
_SUPPORTED = "str, int, float, bool, list, list[T], dict, Optional[T], Literal[...]"
_SECTION = re.compile(r"[A-Z][A-Za-z ]*:\s*")  # an unindented Google-style header: "Args:", "Returns:"
_ARGUMENT = re.compile(r"(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)")  # "name: text" or "name (type): text"


class FunctionTool(Tool):
    """A tool whose `run` calls a plain function with the arguments as keywords."""

    function: Callable[..., Any]

    def run(self, arguments: dict) -> dict:
        properties = self.parameters.get("properties", {})
        kwargs = {key: _as_declared(properties.get(key, {}), value) for key, value in arguments.items()}
        result = self.function(**kwargs)
        return result if isinstance(result, dict) else {"result": result}


def _as_declared(schema: dict, value: Any) -> Any:
    """`value` with integral floats made ints where the schema says integer (validation accepts 3.0)."""
    if schema.get("type") == "integer" and isinstance(value, float):
        return int(value)
    if isinstance(value, list) and "items" in schema:
        return [_as_declared(schema["items"], item) for item in value]
    return value


def _schema(hint: Any, where: str) -> dict:
    """The JSON schema of one type hint; `where` names the parameter in the error."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if isinstance(hint, type) and hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    if hint is list or origin is list:
        return {"type": "array", "items": _schema(args[0], where)} if args else {"type": "array"}
    if (hint is dict or origin is dict) and not args:
        return {"type": "object"}
    if origin in (Union, types.UnionType) and len(args) == 2 and type(None) in args:
        # Optional[T] is T's schema: JSON null is not an argument; leave the parameter out instead
        return _schema(next(arg for arg in args if arg is not type(None)), where)
    if origin is Literal and all(type(arg) in (str, int, bool) for arg in args):
        kinds = {_SCALARS[type(arg)] for arg in args}
        return {"type": kinds.pop(), "enum": list(args)} if len(kinds) == 1 else {"enum": list(args)}
    raise TypeError(f"{where} has unsupported type hint {inspect.formatannotation(hint)}; supported: {_SUPPORTED}")


def _read_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(description, argument descriptions) of a Google-style docstring: the first paragraph,
    and the `name: text` or `name (type): text` lines of its `Args:` section."""
    lines = inspect.cleandoc(doc).splitlines()
    summary: list[str] = []
    for line in lines:
        if not line.strip() or _SECTION.fullmatch(line):
            break
        summary.append(line.strip())
    arguments: dict[str, str] = {}
    in_args, name, indent = False, None, None
    for line in lines:
        if _SECTION.fullmatch(line):
            in_args, name, indent = line.split(":")[0] in ("Args", "Arguments"), None, None
            continue
        if not in_args or not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        indent = depth if indent is None else indent
        entry = _ARGUMENT.fullmatch(line.strip()) if depth == indent else None
        if entry:
            name = entry.group(1)
            arguments[name] = entry.group(2).strip()
        elif name is not None and depth > indent:  # a continuation line
            arguments[name] = f"{arguments[name]} {line.strip()}".strip()
    return " ".join(summary), arguments


def _parameters(fn: Callable[..., Any], label: str, argument_docs: dict[str, str]) -> dict:
    """The parameters schema from the signature: every keyword parameter, required unless it has a default."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception as err:
        raise TypeError(f"{label}: cannot resolve its type hints: {type(err).__name__}: {err}") from err
    properties: dict[str, dict] = {}
    required: list[str] = []
    for name, parameter in inspect.signature(fn).parameters.items():
        where = f"{label}: parameter '{name}'"
        if parameter.kind not in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            raise TypeError(f"{where} is {parameter.kind.description}; tool arguments are passed by name")
        if name not in hints:
            raise TypeError(f"{where} has no type hint; supported: {_SUPPORTED}")
        properties[name] = _schema(hints[name], where)
        if name in argument_docs:
            properties[name]["description"] = argument_docs[name]
        if parameter.default is parameter.empty:
            required.append(name)
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def _tool_class(
    fn: Callable[..., Any], name: str | None, description: str | None, parameters: dict | None
) -> type[FunctionTool]:
    label = f"@tool {fn.__module__}.{fn.__qualname__}"
    summary, argument_docs = _read_docstring(inspect.getdoc(fn) or "")
    description = description or summary
    if not description:
        raise ValueError(f"{label}: no description; write a docstring or pass description=")
    if parameters is None:
        parameters = _parameters(fn, label, argument_docs)
    elif not (isinstance(parameters, dict) and parameters.get("type") == "object"):
        raise ValueError(f"{label}: parameters= must be a JSON schema of type object")
    attributes = {
        "name": name or fn.__name__,
        "description": description,
        "parameters": parameters,
        "function": staticmethod(fn),
        "__module__": fn.__module__,
        "__doc__": description,
    }
    return type(fn.__name__, (FunctionTool,), attributes)


def tool(
    function: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: dict | None = None,
):
    """Register a plain function as a tool, as `@tool` or `@tool(name=, description=, parameters=)`.

    The name defaults to the function's, the description to its docstring's first paragraph, the
    parameters to the schema of its signature. Returns the function unchanged. Raises at
    decoration on an unsupported type hint, a missing description, or a name already registered.
    """
    if function is not None and not callable(function):
        raise TypeError("@tool takes keyword arguments: @tool(name=..., description=..., parameters=...)")

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        cls = _tool_class(fn, name, description, parameters)
        TOOLS.register(cls.name)(cls)
        return fn

    return register if function is None else register(function)
