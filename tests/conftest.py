"""Shared fixtures: the real tiny tokenizer and the third-party chat templates."""

from __future__ import annotations

from pathlib import Path

import pytest

from minirl.config import TinyModelConfig
from minirl.models.tiny import build_tokenizer, render_texts

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = REPO.parent / "shared" / "fixtures" / "chat_templates"

CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calculate_math",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 256 * 37"}},
            "required": ["expression"],
            "additionalProperties": False,
        },
    },
}

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant with tools."},
    {"role": "user", "content": "What is 256 * 37 and 12 + 30?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_0",
                "type": "function",
                "function": {"name": "calculate_math", "arguments": {"expression": "256 * 37"}},
            },
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "calculate_math", "arguments": {"expression": "12 + 30"}},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "call_0", "name": "calculate_math", "content": '{"result": "9472"}'},
    {"role": "tool", "tool_call_id": "call_1", "name": "calculate_math", "content": '{"result": "42"}'},
    {"role": "assistant", "content": "256 * 37 = 9472 and 12 + 30 = 42."},
]


@pytest.fixture(scope="session")
def tokenizer():
    """The project's real tokenizer type and template, trained on a small corpus."""
    corpus = render_texts([(CONVERSATION, [CALC_TOOL])] * 20)
    return build_tokenizer(TinyModelConfig(vocab_size=400), corpus)


def third_party_template(name: str) -> str:
    path = TEMPLATES / name
    if not path.exists():
        pytest.skip(f"third-party chat template fixtures not found at {TEMPLATES} (a user's clone has none)")
    return path.read_text()


@pytest.fixture(params=["own", "qwen2_5.jinja", "qwen3_coder.jinja"])
def any_template_tokenizer(request, tokenizer):
    """The real tokenizer under our template and under each third-party template."""
    original = tokenizer.chat_template
    if request.param != "own":
        tokenizer.chat_template = third_party_template(request.param)
    yield tokenizer
    tokenizer.chat_template = original


@pytest.fixture(scope="session")
def tiny_policy():
    """A small, untrained Qwen2 policy with the real tokenizer type, plus a few synthetic tasks."""
    from minirl.data.synthetic_tools import sft_rows, train_heldout_split
    from minirl.data.task import task_from_row
    from minirl.models.tiny import build_model

    rows = sft_rows(200, seed=0, exclude_prompts=set())
    tasks = [task_from_row(r, "corpus") for r in rows]
    cfg = TinyModelConfig(
        vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128
    )
    tokenizer = build_tokenizer(cfg, render_texts((t.conversation, t.tools) for t in tasks))
    model = build_model(cfg, tokenizer).eval()
    _, heldout = train_heldout_split(20, 8, seed=1)
    return model, tokenizer, heldout
