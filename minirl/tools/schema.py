"""The JSON-schema subset tool arguments are checked against (types, one or a list of them, `nullable`,
required keys, enums, nested objects and arrays, `anyOf` and `oneOf`): model-written arguments are hostile
input, so every problem is named, none raises. A value matching none of the anyOf / oneOf alternatives is a
problem that names each alternative's own; oneOf also rejects a value that matches more than one."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any


def _is_number(value: Any) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, float) and math.isfinite(value)
    )


def _is_integer(value: Any) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float) and value.is_integer())


TYPE_CHECKS: dict[str, Callable[[Any], bool]] = {  # JSON type -> whether a Python value is one
    "string": lambda value: isinstance(value, str),
    "number": _is_number,
    "integer": _is_integer,
    "boolean": lambda value: isinstance(value, bool),
    "object": lambda value: isinstance(value, dict),
    "array": lambda value: isinstance(value, list),
    "null": lambda value: value is None,
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


def allowed_types(schema: dict) -> list[str]:
    """The schema's own `type` (one or a list), with "null" added by `nullable: true`; empty = any type."""
    expected = schema.get("type")
    types = [expected] if isinstance(expected, str) else list(expected) if isinstance(expected, list) else []
    return types + ["null"] if types and schema.get("nullable") is True else types


def _alternatives_problems(schema: dict, value: Any, path: str) -> list[str]:
    problems: list[str] = []
    for key in ("anyOf", "oneOf"):
        if key not in schema:
            continue
        failures = [_problems(alternative, value, path) for alternative in schema[key]]
        matches = sum(not failure for failure in failures)
        if not matches:
            reasons = "; ".join(failure[0] for failure in failures)
            problems.append(f"{_label(path)} matches none of the {key} alternatives ({reasons})")
        elif key == "oneOf" and matches > 1:
            problems.append(f"{_label(path)} matches {matches} of the oneOf alternatives; it must match exactly one")
    return problems


def _problems(schema: dict, value: Any, path: str) -> list[str]:
    types = allowed_types(schema)
    if types and not any(TYPE_CHECKS[expected](value) for expected in types):
        got = _JSON_TYPE_NAMES.get(type(value), type(value).__name__)
        return [f"{_label(path)} must be of type {' or '.join(types)}, got {got}"]
    problems = _alternatives_problems(schema, value, path)
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
    """Problems of `arguments` against a JSON schema subset (type, nullable, required, enum, properties,
    additionalProperties, items, anyOf, oneOf); empty when they are fine. bool is not a number."""
    return _problems(parameters, arguments, "")


# -- results and execution ----------------------------------------------------------------------
