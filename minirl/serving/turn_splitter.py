"""Split an assistant turn, as its text arrives, into content, reasoning and tool calls.

    TurnSplitter.feed(delta) -> [Piece]       text that is settled, as it arrives
    TurnSplitter.finish()    -> ([Piece], [ToolCall])

The split is `split_reasoning`'s, the rule training's `parse_turn` reads a turn by: outside markup
the text is `content`; inside `<think>...</think>` it is `reasoning` (an unclosed `<think>` runs to
the end of the turn) and tool-call markup there is reasoning text. Text that may be the start of a
tag is held until the next delta shows whether it is one, so no tag is ever sent in part. From the
first tag that may start the call format's markup outside reasoning on (`<tool_call>`; for Llama 3's
bare JSON a "{" that starts the content), everything is held until the turn ends, then split by
`split_reasoning` itself (inside a call block a think tag is the call's text) and, when calls are
read, `parse_turn` reads it: calls come out whole, with their blocks removed from the content; a
turn whose markup does not parse keeps its content exactly as written, markup and all. Without call
reading the blocks stay in the content as text. Holding the rest of the turn costs a stream its live
text after a call (rare) and buys two guarantees: a call is never sent and then found to be invalid,
and the pieces of any split of the text add up to the same result. A harmony turn (gpt-oss) is held whole
from its start and split by its channels at the end: its markup does not stream.

Both channels come out stripped, like parse_turn's content: leading whitespace is dropped and
whitespace is released only once text follows it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from minirl.protocol.formats import THINK_CLOSE, THINK_OPEN, CallMarkup
from minirl.protocol.parsing import ParsedTurn, ToolCall, TurnKind


class Channel(str, Enum):  # the values name the text fields of openai_api.ChoiceDelta
    content = "content"
    reasoning = "reasoning"


@dataclass
class Piece:
    channel: Channel
    text: str


class _Stripped:
    """One channel's text with leading and trailing whitespace removed, released as it settles."""

    def __init__(self) -> None:
        self.started = False
        self.pending = ""  # whitespace that is kept only if text follows it

    def push(self, text: str) -> str:
        if not self.started:
            text = text.lstrip()
            self.started = bool(text)
        text = self.pending + text
        body = text.rstrip()
        self.pending = text[len(body) :]
        return body


def _partial_tag(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `tags`."""
    return max((n for tag in tags for n in range(1, len(tag)) if text.endswith(tag[:n])), default=0)


class TurnSplitter:
    """`read_calls` parses a turn's tool calls (e.g. `parse_turn` with the protocol's format, whose markup is
    `markup`); None means the turn has no calls and tool-call markup is content text."""

    def __init__(self, read_calls: Callable[[str], ParsedTurn] | None, markup: CallMarkup) -> None:
        self.read_calls = read_calls
        self.markup = markup
        self.channels = {channel: _Stripped() for channel in Channel}
        self.channel = Channel.content
        self.pending = ""  # text whose channel is not known yet
        # the turn from the start of its call markup on (all of it, for markup that does not stream); None before
        self.held: str | None = None if markup.streams else ""

    def feed(self, delta: str) -> list[Piece]:
        if self.held is not None:
            self.held += delta
            return []
        self.pending += delta
        return self._split(final=False)

    def finish(self) -> tuple[list[Piece], list[ToolCall]]:
        """The pieces still held and the turn's calls; the splitter is spent afterwards."""
        pieces = self._split(final=True)
        if self.held is None:
            return pieces, []
        held, self.held = self.held, None
        parsed = self.read_calls(held) if self.read_calls else None
        valid = parsed is not None and parsed.kind is not TurnKind.INVALID  # its markup read: none goes out
        for reasoning, text in self.markup.split_turn(held):
            if reasoning:
                pieces += self._emit(Channel.reasoning, text)
            else:
                pieces += self._emit(Channel.content, self.markup.without_calls(text) if valid else text)
        return pieces, parsed.tool_calls if valid else []

    def _tags(self) -> tuple[str, ...]:
        if self.channel is Channel.reasoning:
            return (THINK_CLOSE,)
        if self.markup.anchored and self.channels[Channel.content].started:
            return (THINK_OPEN,)  # the content has begun: no call can start it now
        return (THINK_OPEN, *self.markup.starts)

    def _split(self, final: bool) -> list[Piece]:
        pieces: list[Piece] = []
        while self.pending:
            tags = self._tags()
            found = [(at, tag) for tag in tags if (at := self.pending.find(tag)) >= 0]
            if not found:
                cut = len(self.pending) - (0 if final else _partial_tag(self.pending, tags))
                pieces += self._emit(self.channel, self.pending[:cut])
                self.pending = self.pending[cut:]
                break
            at, tag = min(found)
            if tag in self.markup.starts and self.markup.anchored and self.pending[:at].strip():
                pieces += self._emit(self.channel, self.pending[:at])  # content begins before the tag
                self.pending = self.pending[at:]
                continue
            pieces += self._emit(self.channel, self.pending[:at])
            if tag in self.markup.starts:
                self.held, self.pending = self.pending[at:], ""
                break
            self.channel = Channel.reasoning if tag == THINK_OPEN else Channel.content
            self.pending = self.pending[at + len(tag) :]
        return pieces

    def _emit(self, channel: Channel, text: str) -> list[Piece]:
        text = self.channels[channel].push(text)
        return [Piece(channel, text)] if text else []
