"""One trajectory as a JSON-able record: what `trajectories.jsonl` holds and every viewer reads.

    {"step": 10, "group": 0,
     "task": {"id": "calc", "kind": "double", "gt": ["9472", "42"]},
     "messages": [{"role": "user", "content": "What is 256 * 37 and 12 + 30?"},
                  {"role": "assistant", "content": "<tool_call>...</tool_call>", "kind": "tool",
                   "tool_calls": [{"id": "call_0_0", "name": "calculate_math", "arguments": {...}}]},
                  {"role": "tool", "tool_call_id": "call_0_0", "name": "calculate_math", "status": "ok",
                   "content": "{\"result\": \"9472\"}"}, ...],
     "finish_reason": "answer", "success": true, "off_policy": false,
     "reward": 2.5, "reward_terms": {"gt_hit": 2.5, ...}, "advantage": 0.71,
     "tokens": {"prompt": 143, "response": 88, "sampled": 61, "observation": 27},
     "response": [["<tool_call>...</tool_call><|im_end|>", 1], ["\n<|im_start|>user\n<tool_response>...", 0], ...]}

`messages` holds the prompt messages (their tool calls flattened to id, name, arguments), then each
assistant turn (its raw sampled text, how it parsed, the calls read from it, and `invalid_reason` for an
invalid turn) followed by its tool results. `response` is the response decoded in runs of consecutive
tokens with the same loss-mask value: 1 for tokens the policy sampled (they carry the loss), 0 for what the
framework added (template tokens closing a turn, tool observations, the next turn's header). The runs
concatenate to the decoded response; `observation` counts the mask-0 tokens. `off_policy` marks the task's
reference answer replayed in place of a sample (algo.guide): its mask-1 tokens are the reference's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import groupby
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from minirl.rewards import SuccessCriterion
    from minirl.rollout.trajectory import Trajectory, Turn


def mask_runs(tokenizer, token_ids: Sequence[int], mask: Sequence[int]) -> list[list]:
    """[[text, mask value], ...]: the tokens decoded in runs of equal mask value, special tokens kept."""
    runs = []
    for value, run in groupby(zip(token_ids, mask), key=lambda pair: pair[1]):
        text = tokenizer.decode([token for token, _ in run], skip_special_tokens=False)
        runs.append([text, int(value)])
    return runs


def _call(call_id: str, name: str, arguments: dict) -> dict[str, Any]:
    return {"id": call_id, "name": name, "arguments": arguments}


def _prompt_message(message: dict) -> dict[str, Any]:
    """A prompt message as given, its tool calls (OpenAI-style in a Task) flattened like a turn's."""
    if "tool_calls" not in message:
        return dict(message)
    calls = [_call(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]
    return {**message, "tool_calls": calls}


def _turn_messages(turn: Turn) -> list[dict[str, Any]]:
    """The assistant message of one turn, then a message per tool result."""
    parsed = turn.parsed
    assistant: dict[str, Any] = {
        "role": "assistant",
        "content": turn.text,
        "kind": parsed.kind.value,
        "tool_calls": [_call(c.id, c.name, c.arguments) for c in parsed.tool_calls],
    }
    if parsed.reason:
        assistant["invalid_reason"] = parsed.reason
    if parsed.dropped:  # protocol.call_policy=lenient: the calls left out, and why
        assistant["dropped_calls"] = parsed.dropped
    results = [
        {"role": "tool", "tool_call_id": r.call_id, "name": r.name, "status": r.status, "content": r.content}
        for r in turn.tool_results
    ]
    return [assistant, *results]


def trajectory_record(
    traj: Trajectory, step: int, advantage: float, tokenizer, solved: SuccessCriterion | None = None
) -> dict[str, Any]:
    """The record of one scored trajectory (module doc). `solved` (the run's success criterion) fills
    `success`; without it `success` is None."""
    sampled = sum(traj.action_mask)
    return {
        "step": step,
        "group": traj.group_index,
        "task": {"id": traj.task.id, "kind": traj.task.kind, "gt": list(traj.task.gt)},
        "messages": [_prompt_message(m) for m in traj.task.messages]
        + [m for turn in traj.turns for m in _turn_messages(turn)],
        "finish_reason": traj.finish_reason.value if traj.finish_reason else None,
        "success": bool(solved(traj)) if solved else None,
        "off_policy": traj.off_policy,
        "reward": float(traj.reward),
        "reward_terms": {name: float(value) for name, value in traj.reward_terms.items()},
        "advantage": float(advantage),
        "tokens": {
            "prompt": len(traj.prompt_ids),
            "response": len(traj.response_ids),
            "sampled": sampled,
            "observation": len(traj.response_ids) - sampled,
        },
        "response": mask_runs(tokenizer, traj.response_ids, traj.action_mask),
    }


# -- labels every viewer shares ------------------------------------------------------------------

LOSS_LABEL = "loss: sampled by the policy (mask 1)"
MASKED_LABEL = "no loss: template tokens and tool observations (mask 0)"


def is_turn(message: dict) -> bool:
    """Whether a message is a sampled assistant turn (not a message of the prompt)."""
    return message["role"] == "assistant" and "kind" in message


def message_label(message: dict) -> str:
    """What a viewer prints before a message: `assistant (tool)`, `tool calculate_math: ok`, `user`."""
    if is_turn(message):
        return f"assistant ({message['kind']})"
    if message["role"] == "tool" and "status" in message:
        return f"tool {message['name']}: {message['status']}"
    return message["role"]


def call_signature(call: dict) -> str:
    """`calculate_math({"expression": "256 * 37"}) [call_0_0]`"""
    return f"{call['name']}({json.dumps(call['arguments'], ensure_ascii=False)}) [{call['id']}]"


def outcome_fields(record: dict) -> list[tuple[str, str]]:
    """(label, value) pairs a viewer shows under the conversation: who wrote it, end reason, success, reward,
    advantage, every reward term (weighted), token counts."""
    tokens = record["tokens"]
    return [
        ("from", "the task's reference answer (algo.guide)" if record.get("off_policy") else "the policy"),
        ("end", str(record["finish_reason"])),
        ("success", {True: "yes", False: "no", None: "not recorded"}[record["success"]]),
        ("reward", f"{record['reward']:+.2f}"),
        ("advantage", f"{record['advantage']:+.2f}"),
        ("terms", ", ".join(f"{name} {value:+.2f}" for name, value in record["reward_terms"].items())),
        (
            "tokens",
            f"prompt {tokens['prompt']}, response {tokens['response']} "
            f"(sampled {tokens['sampled']}, observation {tokens['observation']})",
        ),
    ]


def record_title(record: dict) -> str:
    """`step 10 · group 0 · task calc (double) · gt 9472, 42`"""
    task = record["task"]
    kind = f" ({task['kind']})" if task["kind"] else ""
    gt = f" · gt {', '.join(task['gt'])}" if task["gt"] else ""
    return f"step {record['step']} · group {record['group']} · task {task['id']}{kind}{gt}"
