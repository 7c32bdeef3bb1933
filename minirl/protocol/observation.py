"""Tool results as the tool messages the model reads: control tokens defused, each cut to a token budget.

A tool result is hostile text (model-written code prints whatever it likes), and the tokenizer reads
the text of a control token (`<|im_end|>`, `<|im_start|>`, `</tool_response>`, ...) anywhere in a
rendered conversation as that token: a result could end its own message and forge the turns after
it. Each such string in a result gets a zero-width space after its first character, so it reads the
same but tokenizes as plain text. A lone surrogate, which no tokenizer can encode (a user tool may
return one), becomes U+FFFD.

The executor already caps an observation in characters; this cap is in tokens of the policy's
own tokenizer, so one tool result cannot eat the context. A longer result keeps its first
`max_tokens` tokens, cut on a token boundary, followed by a visible marker that says how many
tokens were dropped. Observations are environment text, not sampled tokens, so encoding and
decoding them here does not touch the token-in/token-out invariant.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from minirl.protocol.formats import LONE_SURROGATE

if TYPE_CHECKING:
    from minirl.tools.base import ToolResult

TRUNCATION_MARKER = "\n...[truncated {} tokens]"
ZERO_WIDTH_SPACE = "\u200b"


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


def cap_tokens(tokenizer, text: str, max_tokens: int) -> str:
    """`text` if it has at most `max_tokens` tokens, else its first `max_tokens` tokens + the marker."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= max_tokens:
        return text
    return tokenizer.decode(ids[:max_tokens]) + TRUNCATION_MARKER.format(len(ids) - max_tokens)


def tool_messages(results: Sequence[ToolResult], tokenizer, max_tokens: int) -> list[dict]:
    """One `{"role": "tool", "tool_call_id", "name", "content"}` message per result, in call order."""
    tokens = control_tokens(tokenizer)  # once per turn, not per result
    contents = [defuse_control_tokens(encodable(r.content), tokens) for r in results]
    return [{**r.to_message(), "content": cap_tokens(tokenizer, c, max_tokens)} for r, c in zip(results, contents)]
