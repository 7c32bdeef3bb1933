"""Parse one assistant turn into an answer, tool call(s), or an invalid turn.

Where calls sit in a turn and how their bodies read is the configured format's
(`minirl.protocol.formats`: `<tool_call>` blocks of Hermes JSON or Qwen3-Coder XML, Llama 3's bare
JSON, DeepSeek-V3's tagged calls). Three call policies (CALL_RULES):

    multi          (MiniMind's call count)  up to `max_calls` blocks per turn; text around them is content
    strict_single  (ReTool)    exactly one block, nothing but whitespace after it, and no empty
                               argument value; reasoning before the call is allowed
    lenient        (MiniMind's parse)  as multi, but a call that cannot be read is dropped and the
                               others kept, as MiniMind's regex and `json.loads` skip it: unpaired or
                               nested tags and unreadable bodies are left out, each counted with its reason
                               (`ParsedTurn.dropped`, the metric tools/dropped_count); a turn left with no
                               call is an answer, and more than `max_calls` readable calls make it invalid

Under multi and strict_single: no tool-call markup at all is an answer (whether it is a good one is the
reward's business); unbalanced or nested tags, a body the format cannot read, or too many calls make the
turn invalid, with a reason. The parser never raises on model text and runs in linear time.

Reasoning is never read for calls. `split_reasoning` is the one rule every reader of a turn applies
(training's parse_turn, the server's TurnSplitter, the evaluator through parse_message): scanning
from the start, `<think>` opens reasoning up to the next `</think>`, or to the end of the turn when
none follows; a call's open tag (`<tool_call>`) with its close tag after it is a call block, and its
text (think tags included) belongs to the call; tool-call markup inside reasoning is reasoning text. The call
rules above apply to the text outside reasoning only. A `</think>` with no block open is text: the
parser sees the turn, not the prompt, so it cannot tell a block the generation prompt opened from a
stray tag (docs/tool_calls.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from minirl.config import CallPolicy
from minirl.protocol.formats import (
    CALL_FORMATS,
    TOOL_CALL,
    CallMarkup,
    ReadCall,
    read_name_and_arguments,
    without_tags,
)
from minirl.tools.base import ToolCall

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = TOOL_CALL.open, TOOL_CALL.close


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
    dropped: list[str] = field(default_factory=list)  # lenient: why each call left out could not be read


def split_reasoning(text: str, markup: CallMarkup = TOOL_CALL) -> list[tuple[bool, str]]:
    """`text` as (is_reasoning, piece) pairs in order, empty pieces left out, by the rule of the module docstring
    (for harmony, its channels): what every reader of a turn applies."""
    return markup.split_turn(text)


def _outside_reasoning(text: str, markup: CallMarkup) -> list[str]:
    """The pieces of `text` outside reasoning; one piece, joined, for markup whose calls must start it."""
    pieces = [piece for reasoning, piece in markup.split_turn(text) if not reasoning]
    return ["".join(pieces)] if markup.anchored else pieces


def _visible(outside: list[str], markup: CallMarkup) -> str:
    """The user-visible text of the pieces outside reasoning: call blocks removed, and any tag of the format
    left over (unbalanced, or brought together by a removal), so it never holds call markup; stripped."""
    joined = "".join(markup.without_calls(piece) for piece in outside)
    return without_tags(joined, markup.tags).strip()


def _call_bodies(outside: list[str], markup: CallMarkup) -> tuple[list[str], str, list[str]]:
    """The body of each call in the pieces outside reasoning, the text after the last call (wrapper tags
    dropped), and what in the markup does not pair up. A block never spans pieces: split_reasoning keeps each
    one whole."""
    bodies: list[str] = []
    problems: list[str] = []
    after = ""
    for piece in outside:
        spans, unpaired = markup.scan(piece)
        problems += unpaired
        bodies += [piece[start:end] for start, end in spans]
        after = piece[markup.end_of(spans[-1]) :] if spans else after + piece
    return bodies, markup.without_calls(after), problems


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
        return "text after the tool call (a turn either calls a tool or answers)"
    return _empty_argument(calls)


@dataclass(frozen=True)
class CallRules:
    """What a call policy allows in one turn."""

    single: bool  # at most one call, whatever max_calls says
    drops_malformed: bool  # a call that cannot be read is left out and counted, not the end of the turn
    check: Callable[[str, list[ToolCall]], str]  # further rules on (text after the last call, calls): a problem or ""


def _no_further_rules(after: str, calls: list[ToolCall]) -> str:
    return ""


CALL_RULES: dict[CallPolicy, CallRules] = {
    CallPolicy.multi: CallRules(single=False, drops_malformed=False, check=_no_further_rules),
    CallPolicy.strict_single: CallRules(single=True, drops_malformed=False, check=_strict_problem),
    CallPolicy.lenient: CallRules(single=False, drops_malformed=True, check=_no_further_rules),
}


def _classify(
    content: str,
    reads: list[tuple[str, ReadCall | str]],  # (call id, the call read, or why it cannot be) in order
    after: str,
    unpaired: list[str],
    rules: CallRules,
    max_calls: int,
) -> ParsedTurn:
    """The turn of these calls under `rules`: markup that does not pair up (`unpaired`), then the call count,
    then the first call that cannot be read, then the policy's further rules make it invalid; a lenient policy
    drops the first and third instead and counts them."""
    dropped: list[str] = []
    if rules.drops_malformed:
        dropped = unpaired + [read for _, read in reads if isinstance(read, str)]
        reads = [(call_id, read) for call_id, read in reads if not isinstance(read, str)]
    elif unpaired:
        return ParsedTurn(TurnKind.INVALID, content, reason=unpaired[0])
    if not reads:
        return ParsedTurn(TurnKind.ANSWER, content, dropped=dropped)
    limit = 1 if rules.single else max_calls
    if len(reads) > limit:
        reason = f"{len(reads)} tool calls in one turn (max {limit})"
        return ParsedTurn(TurnKind.INVALID, content, reason=reason, dropped=dropped)
    malformed = next((read for _, read in reads if isinstance(read, str)), None)
    if malformed is not None:
        return ParsedTurn(TurnKind.INVALID, content, reason=malformed)
    calls = [ToolCall(call_id, *read) for call_id, read in reads]
    problem = rules.check(after, calls)
    if problem:
        return ParsedTurn(TurnKind.INVALID, content, reason=problem, dropped=dropped)
    return ParsedTurn(TurnKind.TOOL, content, calls, dropped=dropped)


def parse_turn(
    text: str,
    call_format: str = "hermes",
    policy: CallPolicy = CallPolicy.multi,
    max_calls: int = 8,
    call_id_prefix: str = "call",
    tools: Sequence[dict] = (),
) -> ParsedTurn:
    """Classify an assistant turn. Calls get ids `{call_id_prefix}_{i}`, i the call's place in the turn; `tools`
    (the task's schemas) let a format read typed values. `max_calls` applies to the multi and lenient policies;
    the strict one allows a single call. An unknown `call_format` raises ConfigError."""
    markup, read_call = CALL_FORMATS.get(call_format).markup, CALL_FORMATS.get(call_format).read
    outside = _outside_reasoning(text, markup)
    content = _visible(outside, markup)
    bodies, after, unpaired = _call_bodies(outside, markup)
    reads = [
        (f"{call_id_prefix}_{i}", read_call(body.strip(), tools) if body.strip() else "empty tool call")
        for i, body in enumerate(bodies)
    ]
    return _classify(content, reads, after, unpaired, CALL_RULES[policy], max_calls)


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
    too many calls, a call without a name or whose arguments are not a JSON object (under lenient: dropped and
    counted), and under strict_single an empty argument make the turn invalid. The calls keep the endpoint's ids."""
    parsed = parse_turn(content, call_format, policy, max_calls, tools=tools)
    if parsed.kind is not TurnKind.ANSWER:
        reason = parsed.reason or "tool-call markup in the message content, not in its tool_calls"
        return ParsedTurn(TurnKind.INVALID, parsed.content, reason=reason, dropped=parsed.dropped)
    reads = [(call_id, read_name_and_arguments(name, arguments)) for call_id, name, arguments in tool_calls]
    turn = _classify(parsed.content, reads, "", [], CALL_RULES[policy], max_calls)
    turn.dropped = parsed.dropped + turn.dropped
    return turn
