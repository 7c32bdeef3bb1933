"""Shared fixtures: the real tiny tokenizer and the third-party chat templates."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from minirl.config import TinyModelConfig
from minirl.models.tiny import build_tokenizer, render_texts
from minirl.serving.launch import ServerProcess, launch_server

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


GREETING = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Say hello."},
    {"role": "assistant", "content": "<think>A greeting.</think>Hello! How can I help?"},
]


@pytest.fixture(scope="session")
def tool_model_dir(tmp_path_factory):
    """A small Qwen2 policy that has memorised two conversations, saved with save_pretrained and
    loaded back by path like any checkpoint: asked CONVERSATION's question with CALC_TOOL it writes
    the two tool calls, given their results it answers, and asked GREETING's it thinks, then greets.
    Servers and evaluators get real tool calls to parse, deterministically under greedy decoding."""
    from minirl.config import SFTConfig
    from minirl.models.tiny import build_model
    from minirl.training.sft import tokenize_conversation, train_sft

    cfg = TinyModelConfig(vocab_size=400, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2)
    tokenizer = build_tokenizer(cfg, render_texts([(CONVERSATION, [CALC_TOOL]), (GREETING, [])] * 20))
    model = build_model(cfg, tokenizer)
    examples = [
        tokenize_conversation(tokenizer, CONVERSATION, [CALC_TOOL]),
        tokenize_conversation(tokenizer, GREETING, None),
    ]
    sft = SFTConfig(epochs=100, batch_size=8, lr=5e-3, warmup_steps=10)  # 100 steps, ~15 s on one core
    train_sft(model, tokenizer, examples * 4, sft, torch.device("cpu"))
    path = tmp_path_factory.mktemp("tool_model")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


# the untrained debug model solves nothing, so under the default outcome reward every group ties and its
# advantages are 0; tests that need the weights to move use MiniMind's shaped reward
SHAPED_REWARD = "reward=minimind"


def compose_config(cache_dir: Path, run_dir: Path, *overrides: str):
    """The composed, validated config of `overrides`, building the tiny model in `cache_dir`, run in `run_dir`."""
    from hydra import compose, initialize_config_dir

    from minirl.config import register_configs, to_config
    from minirl.entry import CONF_DIR

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = to_config(compose("config", overrides=[f"model.cache_dir={cache_dir}", *overrides]))
    cfg.output_dir = str(run_dir)
    return cfg


def debug_config(cache_dir: Path, run_dir: Path, *overrides: str):
    """The composed config of the debug preset (a very small tiny model, two steps) with `overrides`."""
    return compose_config(cache_dir, run_dir, "debug=cpu", *overrides)


def start_server(run_dir: Path, *overrides: str, api_key: str | None = None) -> ServerProcess:
    """`python -m minirl.serve` on a free loopback port, ready; with `base_url`, `model_id` and `stop()`.
    `api_key` goes in as $MINIRL_API_KEY; without it the server gets no key, whatever this environment holds."""
    env = {name: value for name, value in os.environ.items() if name != "MINIRL_API_KEY"}
    if api_key is not None:
        env["MINIRL_API_KEY"] = api_key
    return launch_server(["serve.host=127.0.0.1", "serve.port=0", "logger=none", *overrides], run_dir, env=env)


@pytest.fixture(scope="session")
def openai_server(tool_model_dir, tmp_path_factory):
    """`python -m minirl.serve` serving `tool_model_dir` on 127.0.0.1 (any free port) for the session:
    `openai_server.base_url` ("http://127.0.0.1:PORT/v1") and `openai_server.model_id`."""
    server = start_server(tmp_path_factory.mktemp("serve"), f"model.name_or_path={tool_model_dir}")
    yield server
    server.stop()
