"""Tool-call formats: how the body of one `<tool_call>...</tool_call>` block names a tool and
its arguments. `protocol.format` picks one by name; it must match the model's chat template.

    hermes       (MiniMind, Qwen2.5)   {"name": "calculate_math", "arguments": {"expression": "2+2"}}
    qwen3_coder  (Qwen3-Coder, ReTool) <function=code_interpreter>
                                       <parameter=code>
                                       print(2 + 2)
                                       </parameter>
                                       </function>

A reader takes a block body and the task's tool schemas and returns `(name, arguments)` or a
short reason why the body is malformed. Readers never raise on model text and run in time
linear in its length.

Hermes values are JSON and carry their types. Qwen3-Coder values are text, typed by the tool's schema
(`_typed`): a parameter's types are its `type` (one or a list), `nullable: true`, and the types of its
`anyOf` / `oneOf` alternatives, in schema order. When the schema allows null, `null` (and `None`, how the
template's `| string` writes Python's None) is null; otherwise the text becomes the first of those types
that reads it (string reads any text), and stays text when none does, for the tool's schema check
(minirl.tools.schema) to name the mismatch. Only JSON is read, never Python literals.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from minirl.registry import Registry
from minirl.tools.schema import TYPE_CHECKS, allowed_types

ReadCall = tuple[str, dict[str, Any]]  # (tool name, arguments)
CallReader = Callable[[str, Sequence[dict]], "ReadCall | str"]

CALL_FORMATS: Registry[CallReader] = Registry("tool-call format")
LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # JSON can escape one; no text encoding can hold it


def _snippet(text: str, limit: int = 40) -> str:
    """`text` shortened for a reason string (model text can be huge)."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _load_json(text: str) -> Any:
    """json.loads that reports like any other syntax error: deep nesting (RecursionError), an integer too long
    for Python to convert (ValueError beyond sys.get_int_max_str_digits) and an escape of a lone surrogate
    ("\\ud800": no text, and no tokenizer or UTF-8 writer takes it)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text[:40], 0) from None
    except ValueError:
        raise json.JSONDecodeError("an integer with too many digits", text[:40], 0) from None
    if lone_surrogate_at(value) is not None:
        raise json.JSONDecodeError("a \\u escape of a lone surrogate", text[:40], 0)
    return value


def lone_surrogate_at(value: Any, where: str = "") -> str | None:
    """Where in `value` (JSON data, keys included) the first string holding a lone surrogate is, as a path
    under `where` (e.g. `messages[0].content`; `where` itself for the top level); None if nowhere."""
    if isinstance(value, str):
        return where if LONE_SURROGATE.search(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{where}.{key}" if where else str(key)
            found = path if LONE_SURROGATE.search(str(key)) else lone_surrogate_at(item, path)
            if found is not None:
                return found
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = lone_surrogate_at(item, f"{where}[{i}]")
            if found is not None:
                return found
    return None


@CALL_FORMATS.register("hermes")
def read_hermes(body: str, tools: Sequence[dict]) -> ReadCall | str:
    """A JSON object with a string `name` and `arguments` given as an object or as a JSON string
    holding one (missing or empty = no arguments). `tools` is not needed: JSON carries types."""
    try:
        obj = _load_json(body)
    except json.JSONDecodeError as err:
        return f"tool call is not valid JSON ({err.msg})"
    if not isinstance(obj, dict):
        return "tool call must be a JSON object"
    return read_name_and_arguments(obj.get("name"), obj.get("arguments", {}))


def read_name_and_arguments(name: Any, arguments: Any) -> ReadCall | str:
    """`(name, arguments)` from a string name and arguments given as an object or as a JSON string holding
    one (empty = no arguments), as Hermes bodies and OpenAI-style `tool_calls` carry them; else why not."""
    if not isinstance(name, str) or not name:
        return "tool call has no string 'name'"
    if isinstance(arguments, str):
        try:
            arguments = _load_json(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return f"arguments of '{name}' are a string that is not JSON"
    if not isinstance(arguments, dict):
        return f"arguments of '{name}' must be an object"
    return name, arguments


FUNCTION_OPEN, FUNCTION_CLOSE = "<function=", "</function>"
PARAMETER_OPEN, PARAMETER_CLOSE = "<parameter=", "</parameter>"
_NAME = re.compile(r"[^\s<>=/]+")
_SPACE = re.compile(r"\s*")


def _parameter_schemas(tools: Sequence[dict], name: str) -> dict[str, dict]:
    """Parameter name -> its schema for tool `name`; a schema that is not the object it should be declares
    nothing (the values stay text)."""
    for tool in tools:
        function = tool.get("function", tool)
        if isinstance(function, dict) and function.get("name") == name:
            parameters = function.get("parameters")
            properties = parameters.get("properties") if isinstance(parameters, dict) else None
            if not isinstance(properties, dict):
                return {}
            return {key: spec for key, spec in properties.items() if isinstance(spec, dict)}
    return {}


def _schema_types(schema: Any) -> list[str]:
    """The JSON types `schema` allows, in schema order: its own (`type`, one or a list, and "null" for
    `nullable: true`), then the types of each `anyOf` and `oneOf` alternative."""
    if not isinstance(schema, dict):
        return []
    types = [kind for kind in allowed_types(schema) if isinstance(kind, str)]
    for key in ("anyOf", "oneOf"):
        alternatives = schema.get(key)
        for alternative in alternatives if isinstance(alternatives, list) else []:
            types += _schema_types(alternative)
    return types


_UNREAD = object()  # what a text reader returns for text that is not a value of its type


def _json_value(text: str) -> Any:
    try:
        return _load_json(text)
    except json.JSONDecodeError:
        return _UNREAD


def _json_of(kind: str) -> Callable[[str], Any]:
    """A reader of JSON text that is a value of JSON type `kind`, by the argument check's own type test."""

    def read(text: str) -> Any:
        value = _json_value(text)
        return value if value is not _UNREAD and TYPE_CHECKS[kind](value) else _UNREAD

    return read


_SPELLINGS = {  # JSON's and the template's (`| string` on Python values)
    "null": {"null": None, "None": None},
    "boolean": {"true": True, "false": False, "True": True, "False": False},
}

_TEXT_READERS: dict[str, Callable[[str], Any]] = {  # JSON type -> text to a value of it, or _UNREAD
    "string": lambda text: text,
    "null": lambda text: _SPELLINGS["null"].get(text.strip(), _UNREAD),
    "boolean": lambda text: _SPELLINGS["boolean"].get(text.strip(), _UNREAD),
    "integer": _json_of("integer"),
    "number": _json_of("number"),
    "object": _json_of("object"),
    "array": _json_of("array"),
}


def _typed(value: str, schema: dict | None) -> Any:
    """`value` read as the first of the schema's types that reads it, null first when the schema allows it
    (module docstring). A type the table does not know (e.g. "float") reads any JSON value."""
    types = _schema_types(schema)
    for kind in (["null"] if "null" in types else []) + types:
        read = _TEXT_READERS.get(kind, _json_value)(value)
        if read is not _UNREAD:
            return read
    return value


def _unframe(value: str) -> str:
    """Drop the one newline the template writes after `<parameter=...>` and before `</parameter>`."""
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


@CALL_FORMATS.register("qwen3_coder")
def read_qwen3_coder(body: str, tools: Sequence[dict]) -> ReadCall | str:
    """`<function=NAME>` then `<parameter=ARG>\\nVALUE\\n</parameter>` blocks separated by
    whitespace, then `</function>`; nothing else. A value may span lines and keeps them; nested
    `<function=`/`<parameter=` markup, a repeated argument or stray text make the call malformed."""
    body = body.strip()
    if not body.startswith(FUNCTION_OPEN):
        return f"tool call does not start with {FUNCTION_OPEN}NAME>"
    head_end = body.find(">")
    name = body[len(FUNCTION_OPEN) : head_end] if head_end >= 0 else ""
    if not _NAME.fullmatch(name):
        return f"tool call has no valid function name (got {_snippet(name)})"
    if not body.endswith(FUNCTION_CLOSE):
        return f"{FUNCTION_OPEN}{name}> is not closed by {FUNCTION_CLOSE}"
    inner = body[head_end + 1 : len(body) - len(FUNCTION_CLOSE)]
    schemas = _parameter_schemas(tools, name)
    arguments: dict[str, Any] = {}
    pos = _SPACE.match(inner).end()
    while pos < len(inner):
        if not inner.startswith(PARAMETER_OPEN, pos):
            return f"unexpected text in {FUNCTION_OPEN}{name}>: {_snippet(inner[pos:])}"
        arg_end = inner.find(">", pos)
        arg = inner[pos + len(PARAMETER_OPEN) : arg_end] if arg_end >= 0 else ""
        if not _NAME.fullmatch(arg):
            return f"a parameter of '{name}' has no valid name (got {_snippet(arg)})"
        value_end = inner.find(PARAMETER_CLOSE, arg_end)
        if value_end < 0:
            return f"{PARAMETER_OPEN}{arg}> is not closed by {PARAMETER_CLOSE}"
        value = inner[arg_end + 1 : value_end]
        if any(tag in value for tag in (FUNCTION_OPEN, FUNCTION_CLOSE, PARAMETER_OPEN)):
            return f"nested tool-call markup in argument '{arg}'"
        if arg in arguments:
            return f"argument '{arg}' of '{name}' is given twice"
        arguments[arg] = _typed(_unframe(value), schemas.get(arg))
        pos = _SPACE.match(inner, value_end + len(PARAMETER_CLOSE)).end()
    return name, arguments
