"""Tool results as the tool messages the model reads: control tokens defused, each cut to a token budget.

A tool result is hostile text (model-written code prints whatever it likes), and the tokenizer reads
the text of a control token (`<|im_end|>`, `<|im_start|>`, `</tool_response>`, ...) anywhere in a
rendered conversation as that token: a result could end its own message and forge the turns after
it. Each such string in a result gets a zero-width space after its first character, so it reads the
same but tokenizes as plain text. A lone surrogate, which no tokenizer can encode (a user tool may
return one), becomes U+FFFD.

The executor already caps an observation in characters; this cap is in tokens of the policy's
own tokenizer, so one tool result cannot eat the context. A longer result keeps `max_tokens` of its
tokens, cut on token boundaries, with a visible marker that says how many were dropped; which ones
it keeps is `protocol.observation_cut` (`CUTS`): the first half and the last half (head_tail, the
default: a traceback ends at the bottom), the last ones (tail, ReTool's) or the first ones (head).
`fit_tool_messages` lowers that cap for one turn until its next prompt fits the trajectory's budget.
Observations are environment text, not sampled tokens, so encoding and decoding them here does not
touch the token-in/token-out invariant.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from minirl.config import ObservationCut
from minirl.protocol.formats import LONE_SURROGATE

if TYPE_CHECKING:
    from minirl.tools.base import ToolResult

ZERO_WIDTH_SPACE = "\u200b"
T = TypeVar("T")


def control_tokens(tokenizer) -> list[str]:
    """The texts of the tokenizer's added tokens that are special or markup (`<...>`), longest first."""
    added = tokenizer.added_tokens_decoder.values()
    texts = {t.content for t in added if t.special or (t.content.startswith("<") and t.content.endswith(">"))}
    return sorted(texts, key=len, reverse=True)


def defuse_control_tokens(text: str, tokens: Sequence[str]) -> str:
    """`text` with a zero-width space after the first character of every one of `tokens` (control_tokens) in it."""
    for token in tokens:
        text = text.replace(token, token[0] + ZERO_WIDTH_SPACE + token[1:])
    return text


def encodable(text: str) -> str:
    """`text` with each lone surrogate replaced by U+FFFD, the replacement character."""
    return LONE_SURROGATE.sub("\ufffd", text)


def _head(tokenizer, ids: list[int], keep: int) -> str:
    return tokenizer.decode(ids[:keep]) + f"\n...[truncated {len(ids) - keep} tokens]"


def _tail(tokenizer, ids: list[int], keep: int) -> str:
    return f"...[truncated {len(ids) - keep} tokens]...\n" + tokenizer.decode(ids[len(ids) - keep :])


def _head_tail(tokenizer, ids: list[int], keep: int) -> str:
    head = keep // 2  # the tail gets the odd token
    marker = f"\n...[truncated {len(ids) - keep} tokens]...\n"
    return tokenizer.decode(ids[:head]) + marker + tokenizer.decode(ids[len(ids) - (keep - head) :])


# (tokenizer, ids of a result longer than keep, keep >= 0 tokens to keep) -> the text the model reads
CUTS: dict[ObservationCut, Callable[[Any, list[int], int], str]] = {
    ObservationCut.head: _head,
    ObservationCut.tail: _tail,
    ObservationCut.head_tail: _head_tail,
}


def cap_tokens(tokenizer, text: str, max_tokens: int, cut: ObservationCut) -> str:
    """`text` if it has at most `max_tokens` tokens, else `max_tokens` of them as `cut` chooses, with the marker."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return text if len(ids) <= max_tokens else CUTS[cut](tokenizer, ids, max_tokens)


def tool_messages(results: Sequence[ToolResult], tokenizer, max_tokens: int, cut: ObservationCut) -> list[dict]:
    """One `{"role": "tool", "tool_call_id", "name", "content"}` message per result, in call order."""
    tokens = control_tokens(tokenizer)  # once per turn, not per result
    contents = [defuse_control_tokens(encodable(r.content), tokens) for r in results]
    return [{**r.to_message(), "content": cap_tokens(tokenizer, c, max_tokens, cut)} for r, c in zip(results, contents)]


def fit_tool_messages(
    results: Sequence[ToolResult],
    tokenizer,
    max_tokens: int,
    cut: ObservationCut,
    build: Callable[[list[dict]], T | None],
) -> T | None:
    """`build(messages)` for the turn's tool messages at the largest token cap of at most `max_tokens` for which it
    is not None (in the agent loop: the next prompt, None when it leaves too little room); None when no cap gives
    one, not even 0, where each cut result is its marker alone. One cap for every result: those shorter than it
    stay whole while the long ones share the rest. `max_tokens` is tried first (a turn that fits is built once),
    then lower caps by bisection."""
    built = build(tool_messages(results, tokenizer, max_tokens, cut))
    if built is not None:
        return built
    low, high = 0, max_tokens - 1
    while low <= high:
        cap = (low + high) // 2
        attempt = build(tool_messages(results, tokenizer, cap, cut))
        if attempt is None:
            high = cap - 1
        else:
            built, low = attempt, cap + 1
    return built
