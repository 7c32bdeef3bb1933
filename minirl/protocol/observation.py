"""Tool results as the tool messages the model reads, each cut to a token budget.

The executor already caps an observation in characters; this cap is in tokens of the policy's
own tokenizer, so one tool result cannot eat the context. A longer result keeps its first
`max_tokens` tokens, cut on a token boundary, followed by a visible marker that says how many
tokens were dropped. Observations are environment text, not sampled tokens, so encoding and
decoding them here does not touch the token-in/token-out invariant.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minirl.tools.base import ToolResult

TRUNCATION_MARKER = "\n...[truncated {} tokens]"


def cap_tokens(tokenizer, text: str, max_tokens: int) -> str:
    """`text` if it has at most `max_tokens` tokens, else its first `max_tokens` tokens + the marker."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= max_tokens:
        return text
    return tokenizer.decode(ids[:max_tokens]) + TRUNCATION_MARKER.format(len(ids) - max_tokens)


def tool_messages(results: Sequence[ToolResult], tokenizer, max_tokens: int) -> list[dict]:
    """One `{"role": "tool", "tool_call_id", "name", "content"}` message per result, in call order."""
    return [{**r.to_message(), "content": cap_tokens(tokenizer, r.content, max_tokens)} for r in results]
