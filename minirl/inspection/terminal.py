"""A record in the console: one rich Panel with the conversation (roles coloured, tool calls and results),
the end reason, reward terms and advantage, then the response's tokens with the loss-carrying ones
highlighted and the masked ones dimmed. Model text always enters as plain Text, never as rich markup."""

from __future__ import annotations

from rich.console import Group
from rich.panel import Panel
from rich.rule import Rule
from rich.text import Text

from minirl.inspection.record import (
    LOSS_LABEL,
    MASKED_LABEL,
    call_signature,
    message_label,
    outcome_fields,
    record_title,
)

ROLE_STYLES = {"system": "dim", "user": "bold green", "assistant": "bold cyan", "tool": "bold magenta"}
FAILED_STYLE = "bold red"  # a tool result that is not "ok", an invalid turn
CALL_STYLE = "yellow"
LOSS_STYLE = "black on green3"  # mask 1: sampled by the policy, carries the loss
MASKED_STYLE = "grey50"  # mask 0: template tokens and tool observations


def _message(message: dict) -> Text:
    failed = message.get("status", "ok") != "ok"
    text = Text()
    text.append(message_label(message), style=FAILED_STYLE if failed else ROLE_STYLES.get(message["role"], "bold"))
    text.append("\n" + message["content"], style="dim" if message["role"] == "system" else "")
    for call in message.get("tool_calls", []):
        text.append("\n-> " + call_signature(call), style=CALL_STYLE)
    if message.get("invalid_reason"):
        text.append(f"\ninvalid: {message['invalid_reason']}", style=FAILED_STYLE)
    return text


def outcome(record: dict) -> Text:
    """End reason, success, reward and its terms, advantage, token counts: one labelled line each."""
    fields = outcome_fields(record)
    return Text("\n").join(Text.assemble((f"{label} ", "bold"), value) for label, value in fields)


def mask_legend() -> Text:
    return Text.assemble((LOSS_LABEL, LOSS_STYLE), "   ", (MASKED_LABEL, MASKED_STYLE))


def token_view(record: dict) -> Text:
    """The decoded response, each run styled by its loss-mask value."""
    text = Text()
    for chunk, mask in record["response"]:
        text.append(chunk, style=LOSS_STYLE if mask else MASKED_STYLE)
    return text


def trajectory_panel(record: dict) -> Panel:
    """Everything about one trajectory, for `console.print`."""
    messages = [_message(m) for m in record["messages"]]
    body = Group(
        *[part for m in messages for part in (m, Text())],
        Rule(style="dim"),
        outcome(record),
        Rule("tokens", style="dim"),
        mask_legend(),
        token_view(record),
    )
    return Panel(body, title=Text(record_title(record)), title_align="left")
