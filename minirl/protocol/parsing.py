"""Parse one assistant turn into an answer, tool call(s), or an invalid turn.

Hermes-style calls (MiniMind, Qwen2.5):

    <tool_call>
    {"name": "calculate_math", "arguments": {"expression": "256 * 37"}}
    </tool_call>

`arguments` may be a JSON object or a JSON string holding one. The parser never raises on
model text: anything it cannot read becomes an invalid turn with a reason.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_CALL_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)


class TurnKind(str, Enum):
    ANSWER = "answer"
    TOOL = "tool"
    INVALID = "invalid"


@dataclass
class ToolCall:
    """One call the model asked for. `arguments` is always a dict once parsed."""

    id: str
    name: str
    arguments: dict[str, Any]

    def to_message_dict(self) -> dict[str, Any]:
        """OpenAI-style entry for an assistant message's `tool_calls` list."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class ParsedTurn:
    kind: TurnKind
    content: str  # the text outside tool-call markup and <think> blocks, stripped
    tool_calls: list[ToolCall] = field(default_factory=list)
    reason: str = ""  # why the turn is invalid; empty otherwise


def _read_call(body: str, call_id: str) -> ToolCall | str:
    """A ToolCall from one block's JSON body, or a string saying why it is malformed."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as err:
        return f"tool call is not valid JSON ({err.msg})"
    if not isinstance(obj, dict):
        return "tool call must be a JSON object"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return "tool call has no string 'name'"
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return f"arguments of '{name}' are a string that is not JSON"
    if not isinstance(arguments, dict):
        return f"arguments of '{name}' must be an object"
    return ToolCall(id=call_id, name=name, arguments=arguments)


def final_answer_text(text: str) -> str:
    """The user-visible part of an assistant turn: tool-call blocks and <think> removed."""
    return _CALL_BLOCK.sub("", _THINK_BLOCK.sub("", text)).strip()


def parse_turn(text: str, call_id_prefix: str = "call", max_calls: int = 8) -> ParsedTurn:
    """Classify an assistant turn (several calls per turn allowed, MiniMind policy).

    - no tool-call markup at all          -> ANSWER
    - balanced blocks that all parse      -> TOOL with one ToolCall per block
    - unbalanced tags, a block that does not parse, or more than `max_calls` -> INVALID
    """
    content = final_answer_text(text)
    opens, closes = text.count(TOOL_CALL_OPEN), text.count(TOOL_CALL_CLOSE)
    if opens == 0 and closes == 0:
        return ParsedTurn(TurnKind.ANSWER, content)
    blocks = _CALL_BLOCK.findall(text)
    if opens != closes or len(blocks) != opens:
        return ParsedTurn(TurnKind.INVALID, content, reason="unbalanced <tool_call> tags")
    if len(blocks) > max_calls:
        return ParsedTurn(TurnKind.INVALID, content, reason=f"{len(blocks)} tool calls in one turn (max {max_calls})")
    calls: list[ToolCall] = []
    for i, body in enumerate(blocks):
        call = _read_call(body.strip(), f"{call_id_prefix}_{i}")
        if isinstance(call, str):
            return ParsedTurn(TurnKind.INVALID, content, reason=call)
        calls.append(call)
    return ParsedTurn(TurnKind.TOOL, content, calls)
