"""Shared fixtures: the real tiny tokenizer, the third-party chat templates, small memorising models, a model
cache, a served model. Constants, config builders and fakes are in support.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import (
    CALC_TOOL,
    CONVERSATION,
    TEMPLATES,
    memorising_model,
    start_server,
    third_party_template,
)

from minirl.config import TinyModelConfig
from minirl.models.tiny import build_tokenizer, render_texts


def pytest_terminal_summary(terminalreporter) -> None:
    """Say at the end, in red, how many tests the missing chat template fixtures skipped."""
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if "chat template fixtures" in str(r.longrepr)]
    if skipped:
        terminalreporter.write_sep(
            "=",
            f"{len(skipped)} tests SKIPPED: the third-party chat template fixtures are not at {TEMPLATES}",
            red=True,
        )


@pytest.fixture(scope="session")
def tokenizer():
    """The project's real tokenizer type and template, trained on a small corpus."""
    corpus = render_texts([(CONVERSATION, [CALC_TOOL])] * 20)
    return build_tokenizer(TinyModelConfig(vocab_size=400), corpus)


@pytest.fixture(params=["own", "qwen2_5.jinja", "qwen3_coder.jinja"])
def any_template_tokenizer(request, tokenizer):
    """The real tokenizer under our template and under each third-party template."""
    original = tokenizer.chat_template
    if request.param != "own":
        tokenizer.chat_template = third_party_template(request.param)
    yield tokenizer
    tokenizer.chat_template = original


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """One model cache for the session: each embedded tiny model (the debug one, a preset's) is built once."""
    return tmp_path_factory.mktemp("model-cache")


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


@pytest.fixture(scope="session")
def tool_model_dir(tmp_path_factory):
    """A small Qwen2 policy that has memorised two conversations, saved with save_pretrained and
    loaded back by path like any checkpoint: asked CONVERSATION's question with CALC_TOOL it writes
    the two tool calls, given their results it answers, and asked GREETING's it thinks, then greets.
    Servers and evaluators get real tool calls to parse, deterministically under greedy decoding."""
    path = tmp_path_factory.mktemp("tool_model")
    memorising_model(CONVERSATION, path, num_heads=4)
    return path


@pytest.fixture(scope="session")
def openai_server(tool_model_dir, tmp_path_factory):
    """`python -m minirl.serve` serving `tool_model_dir` on 127.0.0.1 (any free port) for the session:
    `openai_server.base_url` ("http://127.0.0.1:PORT/v1") and `openai_server.model_id`."""
    server = start_server(tmp_path_factory.mktemp("serve"), f"model.name_or_path={tool_model_dir}")
    yield server
    server.stop()
