"""Records as a table of plain values, one row per trajectory, for `wandb.Table(columns=..., data=...)`."""

from __future__ import annotations

from collections.abc import Iterable

from minirl.inspection.record import call_signature, is_turn, message_label

TABLE_COLUMNS = [
    "step", "group", "task", "kind", "reward", "advantage", "success", "turns", "finish_reason", "conversation",
]  # fmt: skip


def conversation_text(record: dict) -> str:
    """The conversation as plain text: each message under its label, calls and the end reason spelled out."""
    blocks = []
    for message in record["messages"]:
        lines = [f"[{message_label(message)}]", message["content"]]
        lines += [f"-> {call_signature(call)}" for call in message.get("tool_calls", [])]
        if message.get("invalid_reason"):
            lines.append(f"invalid: {message['invalid_reason']}")
        blocks.append("\n".join(lines))
    blocks.append(f"[end: {record['finish_reason']}]")
    return "\n\n".join(blocks)


def trajectory_table(records: Iterable[dict]) -> tuple[list[str], list[list]]:
    """(TABLE_COLUMNS, one row per record); `success` is None when the record has none."""
    rows = [
        [
            r["step"],
            r["group"],
            r["task"]["id"],
            r["task"]["kind"],
            r["reward"],
            r["advantage"],
            r["success"],
            sum(map(is_turn, r["messages"])),
            r["finish_reason"],
            conversation_text(r),
        ]
        for r in records
    ]
    return list(TABLE_COLUMNS), rows
