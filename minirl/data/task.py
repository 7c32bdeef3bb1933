"""One task: a prompt, the tools it may call, ground-truth values, and a reference continuation.

Rows use MiniMind's agent-RL format:

    {"conversations": [
        {"role": "system", "content": "...", "tools": [<OpenAI function schemas>] or "<that list as JSON>"},
        {"role": "user", "content": "What is 256 * 37?"},
        {"role": "assistant", "content": "", "tool_calls": [{"name": "calculate_math", "arguments": {...}}]},
        {"role": "tool", "content": "{\\"result\\": \\"9472\\"}"},
        {"role": "assistant", "content": "256 * 37 = 9472."}],
     "gt": ["9472"], "kind": "single", "id": "optional"}

Everything up to and including the last user message is the prompt; what follows is the
reference (what SFT trains on). `tool_calls` may also be a JSON string, and its entries may be
OpenAI-style `{"type": "function", "function": {...}}`. Each tool is an OpenAI function schema
`{"type": "function", "function": {"name": ..., "parameters": {"type": "object", ...}}}` whose
name follows OpenAI's rule (letters, digits, `_` and `-`, at most 64) and is offered once; a
reference call must name an offered tool. A row holds at most MAX_MESSAGES messages and
MAX_GT_VALUES gt values, each a non-blank string or a finite number.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from minirl.errors import DataError

MAX_MESSAGES = 256  # a conversation longer than this is a broken export, not an agent episode
MAX_GT_VALUES = 64  # more values than an answer can state; matching every one would reward listing
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names
_JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}


def _json_type(value: Any) -> str:
    """The JSON name of a decoded value's type, for error messages."""
    return "null" if value is None else _JSON_TYPES.get(type(value), type(value).__name__)


@dataclass
class Task:
    id: str
    messages: list[dict]  # the prompt: up to and including the last user message, no "tools" keys
    tools: list[dict]  # OpenAI function schemas the task offers
    gt: list[str]  # values a correct final answer contains
    reference: list[dict] = field(default_factory=list)  # normalised messages after the prompt
    kind: str = ""  # e.g. "single", "double", "no_tool"

    @property
    def conversation(self) -> list[dict]:
        """Prompt plus reference: the whole conversation SFT trains on."""
        return [*self.messages, *self.reference]

    @property
    def expected_tool_calls(self) -> int | None:
        """How many tool calls the reference answer makes; None when the row has no reference."""
        if not self.reference:
            return None
        return sum(len(m.get("tool_calls") or []) for m in self.reference if m["role"] == "assistant")

    @property
    def reference_tools(self) -> set[str]:
        """Names of the tools the reference answer calls."""
        return {call["function"]["name"] for m in self.reference for call in m.get("tool_calls", [])}


def _load_json_string(value: Any, what: str) -> Any:
    """A value that may arrive as JSON text, decoded."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as err:
        raise DataError(f"{what} is a string that is not JSON ({err.msg})") from None


def _check_parameters(parameters: Any, what: str) -> None:
    """A function's `parameters`: a JSON schema object, as chat templates and the XML reader expect."""
    if not isinstance(parameters, dict) or parameters.get("type") != "object":
        example = '{"type": "object", "properties": {...}}, or with no properties for no arguments'
        raise DataError(f"{what} 'parameters' must be a JSON schema object: {example}")
    properties = parameters.get("properties", {})
    if not isinstance(properties, dict) or not all(isinstance(spec, dict) for spec in properties.values()):
        raise DataError(f"{what} 'properties' must be an object mapping each argument name to its schema")
    required = parameters.get("required", [])
    if not isinstance(required, list) or not all(isinstance(key, str) for key in required):
        raise DataError(f"{what} 'required' must be a list of argument names")


def _read_tools(value: Any) -> list[dict]:
    tools = _load_json_string(value, "'tools'")
    if not isinstance(tools, list):
        raise DataError(f"'tools' must be a list of OpenAI function schemas, got {_json_type(tools)}")
    shape = '{"type": "function", "function": {"name": ..., "parameters": {...}}}'
    for k, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not (isinstance(tool, dict) and tool.get("type") == "function" and isinstance(function, dict)):
            raise DataError(f"tools[{k}] must look like {shape}")
        name = function.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
            raise DataError(f"tools[{k}] needs a 'name' of 1 to 64 letters, digits, '_' or '-', got {name!r}")
        if not isinstance(function.get("description", ""), str):
            raise DataError(f"tools[{k}] ('{name}') 'description' must be a string")
        if "parameters" not in function:
            raise DataError(f"tools[{k}] ('{name}') has no 'parameters' (a JSON schema object)")
        _check_parameters(function["parameters"], f"tools[{k}] ('{name}')")
    return tools


def _read_call(entry: Any, what: str) -> tuple[str, dict]:
    """(name, arguments) of one tool_calls entry, plain or OpenAI-style."""
    if not isinstance(entry, dict):
        raise DataError(f"{what} must be an object with a 'name' and 'arguments', got {_json_type(entry)}")
    function = entry.get("function", entry)
    if not isinstance(function, dict):
        raise DataError(f"{what} 'function' must be an object")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise DataError(f"{what} has no string 'name'")
    arguments = _load_json_string(function.get("arguments", {}), f"{what} arguments")
    if not isinstance(arguments, dict):
        raise DataError(f"{what} arguments must be an object, got {_json_type(arguments)}")
    return name, arguments


def _read_gt(value: Any) -> list[str]:
    if not isinstance(value, list):
        raise DataError(f"'gt' must be a list of strings or numbers, got {_json_type(value)}")
    if len(value) > MAX_GT_VALUES:
        raise DataError(f"'gt' has {len(value)} values, more than MAX_GT_VALUES={MAX_GT_VALUES}")
    for k, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise DataError(f"gt[{k}] must be a string or a number, got {_json_type(item)} {item!r}")
        if isinstance(item, float) and not math.isfinite(item):
            raise DataError(f"gt[{k}] must be a finite number, got {item}")
        if isinstance(item, str) and not item.strip():
            raise DataError(f"gt[{k}] is blank; expected a value a correct answer contains")
    return [str(item) for item in value]


class _ConversationReader:
    """Validates and normalises messages in order; tool messages answer the latest calls."""

    def __init__(self) -> None:
        self.messages: list[dict] = []
        self.tools: list[dict] = []
        self.called: list[str] = []  # the tool name of every call so far
        self.unanswered: list[tuple[str, str]] = []  # (call id, tool name) of the latest assistant calls
        self.readers = {"system": self._system, "user": self._user, "assistant": self._assistant, "tool": self._tool}

    @property
    def offered(self) -> list[str]:
        return [tool["function"]["name"] for tool in self.tools]

    def read(self, message: Any) -> None:
        if not isinstance(message, dict):
            raise DataError(f"must be an object with a 'role' and 'content', got {_json_type(message)}")
        roles = ", ".join(self.readers)
        if "role" not in message:
            raise DataError(f"missing 'role'; expected one of {roles}")
        role = message["role"]
        if not isinstance(role, str) or role not in self.readers:
            raise DataError(f"unknown role {role!r}; expected one of {roles}")
        if "tools" in message and role != "system":
            raise DataError("only system messages may carry 'tools'")
        content = message.get("content")
        if not (role == "assistant" and content is None):  # a message that only calls tools may omit its text
            if "content" not in message:
                raise DataError("missing 'content' (a string)")
            if not isinstance(content, str):
                raise DataError(f"'content' must be a string, got {_json_type(content)}")
        self.messages.append(self.readers[role](message, content or ""))

    def _system(self, message: dict, content: str) -> dict:
        for tool in _read_tools(message["tools"]) if "tools" in message else []:
            name = tool["function"]["name"]
            if name in self.offered:
                raise DataError(f"the tool '{name}' is offered twice")
            self.tools.append(tool)
        return {"role": "system", "content": content}

    def _user(self, message: dict, content: str) -> dict:
        return {"role": "user", "content": content}

    def _assistant(self, message: dict, content: str) -> dict:
        entries = _load_json_string(message.get("tool_calls") or [], "'tool_calls'")
        if not isinstance(entries, list):
            raise DataError(f"'tool_calls' must be a list, got {_json_type(entries)}")
        self.unanswered = []
        tool_calls = []
        for k, entry in enumerate(entries):
            name, arguments = _read_call(entry, f"tool_calls[{k}]")
            call_id = f"call_{len(self.called)}"
            self.called.append(name)
            self.unanswered.append((call_id, name))
            tool_calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
        return {"role": "assistant", "content": content, **({"tool_calls": tool_calls} if tool_calls else {})}

    def _tool(self, message: dict, content: str) -> dict:
        if not self.unanswered:
            raise DataError("tool message does not answer any tool call")
        call_id, name = self.unanswered.pop(0)
        return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


def _prompt_id(messages: list[dict], tools: list[dict]) -> str:
    text = json.dumps([messages, tools], sort_keys=True, ensure_ascii=False)
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


def _task(row: Any) -> Task:
    if not isinstance(row, dict):
        raise DataError(f"a row must be a JSON object with 'conversations' and 'gt', got {_json_type(row)}")
    conversations = row.get("conversations")
    if not isinstance(conversations, list) or not conversations:
        got = "nothing" if conversations is None else f"{_json_type(conversations)} {conversations!r:.40}"
        raise DataError(f"'conversations' must be a non-empty list of messages, got {got}")
    if len(conversations) > MAX_MESSAGES:
        raise DataError(f"'conversations' has {len(conversations)} messages, more than MAX_MESSAGES={MAX_MESSAGES}")
    if "gt" not in row:
        raise DataError("missing 'gt' (a list of the values a correct answer contains; [] for none)")
    gt = _read_gt(row["gt"])
    reader = _ConversationReader()
    for i, message in enumerate(conversations):
        try:
            reader.read(message)
        except DataError as err:
            raise DataError(f"message {i}: {err}") from None
    users = [i for i, message in enumerate(reader.messages) if message["role"] == "user"]
    if not users:
        raise DataError("no user message; the prompt ends at the last one")
    for name in reader.called:
        if name not in reader.offered:
            offered = ", ".join(reader.offered) or "none"
            raise DataError(f"a tool call names '{name}', which the row's tools do not offer (offered: {offered})")
    prompt, reference = reader.messages[: users[-1] + 1], reader.messages[users[-1] + 1 :]
    kind = row.get("kind", "")
    if not isinstance(kind, str):
        raise DataError(f"'kind' must be a string, got {_json_type(kind)}")
    row_id = row.get("id")
    if row_id is not None and (isinstance(row_id, bool) or not isinstance(row_id, (str, int))):
        raise DataError(f"'id' must be a string or integer, got {_json_type(row_id)}")
    task_id = str(row_id) if row_id is not None else _prompt_id(prompt, reader.tools)
    return Task(id=task_id, messages=prompt, tools=reader.tools, gt=gt, reference=reference, kind=kind)


def task_from_row(row: dict, where: str) -> Task:
    """A validated Task from one row; DataError messages start with `where`."""
    try:
        return _task(row)
    except DataError as err:
        raise DataError(f"{where}: {err}") from None
