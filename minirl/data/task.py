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
OpenAI-style `{"type": "function", "function": {...}}`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any


class DataError(ValueError):
    """A task row is malformed; the message starts with where it came from (e.g. `data.jsonl:12`)."""


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


def _load_json_string(value: Any, what: str) -> Any:
    """A value that may arrive as JSON text, decoded."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as err:
        raise DataError(f"{what} is a string that is not JSON ({err.msg})") from None


def _read_tools(value: Any) -> list[dict]:
    tools = _load_json_string(value, "'tools'")
    if not isinstance(tools, list):
        raise DataError("'tools' must be a list of OpenAI function schemas")
    for k, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not (isinstance(tool, dict) and tool.get("type") == "function" and isinstance(function, dict)):
            raise DataError(f"tools[{k}] must look like {{'type': 'function', 'function': {{...}}}}")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise DataError(f"tools[{k}] has no function name")
        if not isinstance(function.get("parameters", {}), dict):
            raise DataError(f"tools[{k}] parameters must be an object")
    return tools


def _read_call(entry: Any, what: str) -> tuple[str, dict]:
    """(name, arguments) of one tool_calls entry, plain or OpenAI-style."""
    if not isinstance(entry, dict):
        raise DataError(f"{what} must be an object")
    function = entry.get("function", entry)
    if not isinstance(function, dict):
        raise DataError(f"{what} 'function' must be an object")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise DataError(f"{what} has no string 'name'")
    arguments = _load_json_string(function.get("arguments", {}), f"{what} arguments")
    if not isinstance(arguments, dict):
        raise DataError(f"{what} arguments must be an object")
    return name, arguments


def _read_gt(value: Any) -> list[str]:
    if not isinstance(value, list):
        raise DataError("'gt' must be a list of strings or numbers")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise DataError(f"gt value {item!r} is not a string or number")
    return [str(item) for item in value]


class _ConversationReader:
    """Validates and normalises messages in order; tool messages answer the latest calls."""

    def __init__(self) -> None:
        self.messages: list[dict] = []
        self.tools: list[dict] = []
        self.calls_made = 0
        self.unanswered: list[tuple[str, str]] = []  # (call id, tool name) of the latest assistant calls
        self.readers = {"system": self._system, "user": self._user, "assistant": self._assistant, "tool": self._tool}

    def read(self, message: Any) -> None:
        if not isinstance(message, dict):
            raise DataError("must be an object")
        role = message.get("role")
        if not isinstance(role, str) or role not in self.readers:
            raise DataError(f"unknown role {role!r}; expected one of {', '.join(self.readers)}")
        if "tools" in message and role != "system":
            raise DataError("only system messages may carry 'tools'")
        content = message.get("content")
        if not isinstance(content, str) and not (role == "assistant" and content is None):
            raise DataError("'content' must be a string")
        self.messages.append(self.readers[role](message, content or ""))

    def _system(self, message: dict, content: str) -> dict:
        if "tools" in message:
            self.tools += _read_tools(message["tools"])
        return {"role": "system", "content": content}

    def _user(self, message: dict, content: str) -> dict:
        return {"role": "user", "content": content}

    def _assistant(self, message: dict, content: str) -> dict:
        entries = _load_json_string(message.get("tool_calls") or [], "'tool_calls'")
        if not isinstance(entries, list):
            raise DataError("'tool_calls' must be a list")
        self.unanswered = []
        tool_calls = []
        for k, entry in enumerate(entries):
            name, arguments = _read_call(entry, f"tool_calls[{k}]")
            call_id = f"call_{self.calls_made}"
            self.calls_made += 1
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
        raise DataError("a row must be a JSON object")
    conversations = row.get("conversations")
    if not isinstance(conversations, list) or not conversations:
        raise DataError("'conversations' must be a non-empty list of messages")
    if "gt" not in row:
        raise DataError("missing 'gt'")
    gt = _read_gt(row["gt"])
    reader = _ConversationReader()
    for i, message in enumerate(conversations):
        try:
            reader.read(message)
        except DataError as err:
            raise DataError(f"message {i}: {err}") from None
    users = [i for i, message in enumerate(reader.messages) if message["role"] == "user"]
    if not users:
        raise DataError("no user message")
    prompt, reference = reader.messages[: users[-1] + 1], reader.messages[users[-1] + 1 :]
    kind = row.get("kind", "")
    if not isinstance(kind, str):
        raise DataError("'kind' must be a string")
    row_id = row.get("id")
    if row_id is not None and (isinstance(row_id, bool) or not isinstance(row_id, (str, int))):
        raise DataError("'id' must be a string or integer")
    task_id = str(row_id) if row_id is not None else _prompt_id(prompt, reader.tools)
    return Task(id=task_id, messages=prompt, tools=reader.tools, gt=gt, reference=reference, kind=kind)


def task_from_row(row: dict, where: str) -> Task:
    """A validated Task from one row; DataError messages start with `where`."""
    try:
        return _task(row)
    except DataError as err:
        raise DataError(f"{where}: {err}") from None
