"""Parse one assistant turn into an answer, tool call(s), or an invalid turn.

Calls sit in `<tool_call>...</tool_call>` blocks whose body the configured format reads
(`minirl.protocol.formats`: Hermes JSON or Qwen3-Coder XML). Two call policies:

    multi          (MiniMind)  up to `max_calls` blocks per turn; text around them is content
    strict_single  (ReTool)    exactly one block, nothing but whitespace after it, and no empty
                               argument value; reasoning before the call is allowed

Either way: no tool-call markup at all is an answer (whether it is a good one is the reward's
business); unbalanced or nested tags, a body the format cannot read, or too many calls make the
turn invalid, with a reason. The parser never raises on model text and runs in linear time.

Reasoning is never read for calls. `split_reasoning` is the one rule every reader of a turn applies
(training's parse_turn, the server's TurnSplitter, the evaluator through parse_message): scanning
from the start, `<think>` opens reasoning up to the next `</think>`, or to the end of the turn when
none follows; a `<tool_call>` with a `</tool_call>` after it is a call block, and its text (think
tags included) belongs to the call; tool-call markup inside reasoning is reasoning text. The call
rules above apply to the text outside reasoning only. A `</think>` with no block open is text: the
parser sees the turn, not the prompt, so it cannot tell a block the generation prompt opened from a
stray tag (docs/tool_calls.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from minirl.config import CallPolicy
from minirl.protocol.formats import CALL_FORMATS, read_name_and_arguments
from minirl.tools.base import ToolCall

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
THINK_OPEN = "<think>"  # reasoning before the answer or the calls; not part of either
THINK_CLOSE = "</think>"
_THINK_OR_CALL = re.compile(f"{re.escape(THINK_OPEN)}|{re.escape(TOOL_CALL_OPEN)}")


class TurnKind(str, Enum):
    ANSWER = "answer"
    TOOL = "tool"
    INVALID = "invalid"


@dataclass
class ParsedTurn:
    kind: TurnKind
    content: str  # the text outside tool-call markup and reasoning, stripped
    tool_calls: list[ToolCall] = field(default_factory=list)
    reason: str = ""  # why the turn is invalid; empty otherwise


def _without_blocks(text: str, open_tag: str, close_tag: str) -> str:
    """`text` minus every `open_tag ... close_tag` block, each closed by the nearest close tag."""
    kept, pos = [], 0
    while (start := text.find(open_tag, pos)) >= 0:
        end = text.find(close_tag, start + len(open_tag))
        if end < 0:
            break
        kept.append(text[pos:start])
        pos = end + len(close_tag)
    kept.append(text[pos:])
    return "".join(kept)


def _drop_last_chars(parts: list[str], n: int) -> None:
    """Remove the last `n` characters of `"".join(parts)` from `parts` (non-empty strings) in place."""
    while n:
        last = parts.pop()
        if len(last) > n:
            parts.append(last[:-n])
        n = max(0, n - len(last))


def _without_tags(text: str, tags: tuple[str, ...]) -> str:
    """`text` minus every occurrence of `tags`, including one that removing another brings together
    ("<tool_<tool_call>call>" -> ""), in linear time. Each tag has one ">", at its end, so a tag can
    only complete at a ">": the text is rebuilt piece by piece up to each ">", checking the end."""
    if not any(tag in text for tag in tags):
        return text
    longest = max(map(len, tags))
    *pieces, rest = text.split(">")
    kept: list[str] = []
    for piece in pieces:
        kept.append(piece + ">")
        tail = "".join(kept[-longest:])[-longest:]  # every kept part has at least one character
        for tag in tags:
            if tail.endswith(tag):
                _drop_last_chars(kept, len(tag))
                break
    return "".join(kept) + rest


def split_reasoning(text: str) -> list[tuple[bool, str]]:
    """`text` as (is_reasoning, piece) pairs in order, empty pieces left out: the inside of each <think>
    block (tags dropped) and the text around the blocks, by the rule in the module docstring."""
    pieces: list[tuple[bool, str]] = []
    last_call_close = text.rfind(TOOL_CALL_CLOSE)  # a <tool_call> after it is not closed: no search needed
    outside_from = pos = 0
    while found := _THINK_OR_CALL.search(text, pos):
        if found.group() == TOOL_CALL_OPEN:
            closed = found.start() < last_call_close
            pos = text.find(TOOL_CALL_CLOSE, found.end()) + len(TOOL_CALL_CLOSE) if closed else found.end()
            continue
        close = text.find(THINK_CLOSE, found.end())
        end = close if close >= 0 else len(text)
        pieces += [(False, text[outside_from : found.start()]), (True, text[found.end() : end])]
        outside_from = pos = end + len(THINK_CLOSE) if close >= 0 else end
    pieces.append((False, text[outside_from:]))
    return [(reasoning, piece) for reasoning, piece in pieces if piece]


def without_call_blocks(text: str) -> str:
    """`text` minus every `<tool_call> ... </tool_call>` block, each closed by the nearest close tag."""
    return _without_blocks(text, TOOL_CALL_OPEN, TOOL_CALL_CLOSE)


def _outside_reasoning(text: str) -> list[str]:
    return [piece for reasoning, piece in split_reasoning(text) if not reasoning]


def _visible(outside: list[str]) -> str:
    """The user-visible text of the pieces outside reasoning: call blocks removed, and any tool-call tag
    left over (unbalanced, or brought together by a removal), so it never holds tool-call markup."""
    joined = "".join(without_call_blocks(piece) for piece in outside)
    return _without_tags(joined, (TOOL_CALL_OPEN, TOOL_CALL_CLOSE)).strip()


def final_answer_text(text: str) -> str:
    """The user-visible part of an assistant turn: reasoning and tool-call markup removed, stripped."""
    return _visible(_outside_reasoning(text))


def _call_blocks(text: str) -> list[tuple[int, int]] | str:
    """(start, end) of each block's body, or why the tags do not pair up."""
    bodies: list[tuple[int, int]] = []
    pos = 0
    while True:
        start, close = text.find(TOOL_CALL_OPEN, pos), text.find(TOOL_CALL_CLOSE, pos)
        if start < 0 and close < 0:
            return bodies
        if start < 0 or 0 <= close < start:
            return f"{TOOL_CALL_CLOSE} without a {TOOL_CALL_OPEN} before it"
        if close < 0:
            return f"{TOOL_CALL_OPEN} is not closed"
        if text.find(TOOL_CALL_OPEN, start + len(TOOL_CALL_OPEN), close) >= 0:
            return f"nested {TOOL_CALL_OPEN} tags"
        bodies.append((start + len(TOOL_CALL_OPEN), close))
        pos = close + len(TOOL_CALL_CLOSE)


def _call_bodies(outside: list[str]) -> tuple[list[str], str] | str:
    """The body of each call block in the pieces outside reasoning and the text after the last block, or
    why the tags do not pair up. A block never spans pieces: split_reasoning keeps each one whole."""
    bodies: list[str] = []
    after = ""
    for piece in outside:
        blocks = _call_blocks(piece)
        if isinstance(blocks, str):
            return blocks
        bodies += [piece[start:end] for start, end in blocks]
        after = piece[blocks[-1][1] + len(TOOL_CALL_CLOSE) :] if blocks else after + piece
    return bodies, after


def _too_many_calls(count: int, policy: CallPolicy, max_calls: int) -> str:
    """Why `count` calls are too many for one turn; empty when they are not."""
    limit = 1 if policy is CallPolicy.strict_single else max_calls
    return f"{count} tool calls in one turn (max {limit})" if count > limit else ""


def _empty_argument(calls: list[ToolCall]) -> str:
    """ReTool's rule on parsed calls: which argument is an empty string; empty when none is."""
    for call in calls:
        for key, value in call.arguments.items():
            if isinstance(value, str) and not value.strip():
                return f"argument '{key}' of '{call.name}' is empty"
    return ""


def _strict_problem(after: str, calls: list[ToolCall]) -> str:
    """ReTool's rules beyond the call count, given the text after the last call outside reasoning; empty
    when the turn follows them."""
    if after.strip():
        return f"text after {TOOL_CALL_CLOSE} (a turn either calls a tool or answers)"
    return _empty_argument(calls)


def parse_turn(
    text: str,
    call_format: str = "hermes",
    policy: CallPolicy = CallPolicy.multi,
    max_calls: int = 8,
    call_id_prefix: str = "call",
    tools: Sequence[dict] = (),
) -> ParsedTurn:
    """Classify an assistant turn. Calls get ids `{call_id_prefix}_{i}`; `tools` (the task's
    schemas) let a format read typed values. `max_calls` applies to the multi policy; the strict
    one allows a single call. An unknown `call_format` raises ConfigError."""
    read_call = CALL_FORMATS.get(call_format)
    outside = _outside_reasoning(text)
    content = _visible(outside)
    found = _call_bodies(outside)
    if isinstance(found, str):
        return ParsedTurn(TurnKind.INVALID, content, reason=found)
    bodies, after = found
    if not bodies:
        return ParsedTurn(TurnKind.ANSWER, content)
    too_many = _too_many_calls(len(bodies), policy, max_calls)
    if too_many:
        return ParsedTurn(TurnKind.INVALID, content, reason=too_many)
    calls: list[ToolCall] = []
    for i, body in enumerate(bodies):
        body = body.strip()
        read = read_call(body, tools) if body else "empty tool call"
        if isinstance(read, str):
            return ParsedTurn(TurnKind.INVALID, content, reason=read)
        calls.append(ToolCall(f"{call_id_prefix}_{i}", *read))
    problem = _strict_problem(after, calls) if policy is CallPolicy.strict_single else ""
    if problem:
        return ParsedTurn(TurnKind.INVALID, content, reason=problem)
    return ParsedTurn(TurnKind.TOOL, content, calls)


def parse_message(
    content: str,
    tool_calls: Sequence[tuple[str, Any, Any]],  # (id, name, arguments as an object or a JSON string)
    call_format: str = "hermes",
    policy: CallPolicy = CallPolicy.multi,
    max_calls: int = 8,
    tools: Sequence[dict] = (),
) -> ParsedTurn:
    """Classify an assistant message whose calls arrived structured, as an OpenAI-compatible endpoint returns
    them (`message.content`, `message.tool_calls`), by parse_turn's rules: tool-call markup left in `content`,
    too many calls, a call without a name or whose arguments are not a JSON object, and under strict_single an
    empty argument make the turn invalid. The calls keep the endpoint's ids."""
    parsed = parse_turn(content, call_format, policy, max_calls, tools=tools)
    if parsed.kind is not TurnKind.ANSWER:
        reason = parsed.reason or "tool-call markup in the message content, not in its tool_calls"
        return ParsedTurn(TurnKind.INVALID, parsed.content, reason=reason)
    if not tool_calls:
        return parsed
    too_many = _too_many_calls(len(tool_calls), policy, max_calls)
    if too_many:
        return ParsedTurn(TurnKind.INVALID, parsed.content, reason=too_many)
    calls: list[ToolCall] = []
    for call_id, name, arguments in tool_calls:
        read = read_name_and_arguments(name, arguments)
        if isinstance(read, str):
            return ParsedTurn(TurnKind.INVALID, parsed.content, reason=read)
        calls.append(ToolCall(call_id, *read))
    problem = _empty_argument(calls) if policy is CallPolicy.strict_single else ""
    if problem:
        return ParsedTurn(TurnKind.INVALID, parsed.content, reason=problem)
    return ParsedTurn(TurnKind.TOOL, parsed.content, calls)
