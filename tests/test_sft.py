"""SFT on a user's own conversations (`sft.corpus=jsonl`) for any model minirl loads, and the warm start of a model
loaded by path (`model.warm_start=true`): `python -m minirl.sft` writes a checkpoint that an RL run then takes with
`model.name_or_path=`, and `model.warm_start=true` runs the same SFT before RL, cached."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file
from support import SHAPED_REWARD, debug_config

from minirl.bootstrap import model_path
from minirl.config import TinyModelConfig
from minirl.data import WARM_START_CORPORA, DataError
from minirl.data.jsonl import write_jsonl
from minirl.data.synthetic_tools import sft_rows
from minirl.data.task import task_from_row
from minirl.errors import ConfigError
from minirl.models.tiny import build_model, build_tokenizer, render_texts
from minirl.trainer import Trainer


@pytest.fixture(scope="module")
def conversations(tmp_path_factory) -> Path:
    """40 tool conversations in the agent format (MiniMind's), references included, as a user's file."""
    path = tmp_path_factory.mktemp("sft-data") / "conversations.jsonl"
    write_jsonl(path, sft_rows(40, seed=7, exclude_prompts=set()))
    return path


@pytest.fixture(scope="module")
def random_qwen2(tmp_path_factory, conversations) -> Path:
    """An untrained 1-layer Qwen2 with a tokenizer of its own, saved with save_pretrained: a model by path."""
    path = tmp_path_factory.mktemp("random-qwen2")
    tasks = [task_from_row(row, "corpus") for row in sft_rows(200, seed=0, exclude_prompts=set())]
    shape = TinyModelConfig(vocab_size=400, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    tokenizer = build_tokenizer(shape, render_texts((t.conversation, t.tools) for t in tasks))
    build_model(shape, tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_the_sft_command_on_a_users_file_then_rl_from_its_checkpoint_by_path(
    random_qwen2, conversations, cache_dir, tmp_path
):
    run = tmp_path / "sft"
    cmd = [
        sys.executable, "-m", "minirl.sft", "debug=cpu", f"model.name_or_path={random_qwen2}", "sft.corpus=jsonl",
        f"sft.path={conversations}", "sft.epochs=2", f"model.cache_dir={cache_dir}", f"hydra.run.dir={run}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "SFT on 40 jsonl conversations, 2 epochs" in proc.stdout and "final SFT loss" in proc.stdout
    before, after = load_file(random_qwen2 / "model.safetensors"), load_file(run / "checkpoint" / "model.safetensors")
    assert any(not torch.equal(before[name], after[name]) for name in before)

    cfg = debug_config(cache_dir, tmp_path / "rl", f"model.name_or_path={run / 'checkpoint'}", SHAPED_REWARD)
    assert model_path(cfg, Console(quiet=True)) == str(run / "checkpoint")  # a checkpoint is taken as it is
    result = Trainer(cfg, cfg.model.name_or_path, Console(quiet=True)).fit()
    assert [step for step, _ in result.eval_history] == [0, 1, 2]


def test_warm_start_true_sfts_a_model_by_path_once_and_caches_it(random_qwen2, conversations, tmp_path):
    overrides = [f"model.name_or_path={random_qwen2}", "model.warm_start=true", "sft.corpus=jsonl"]
    cfg = debug_config(tmp_path / "cache", tmp_path / "run", *overrides, f"sft.path={conversations}")
    console = Console(record=True, width=200)
    warm = Path(model_path(cfg, console))
    assert warm.parent.parent == tmp_path / "cache" and "warm start" in console.export_text()
    trained = load_file(warm / "model.safetensors")
    assert any(
        not torch.equal(trained[name], tensor) for name, tensor in load_file(random_qwen2 / "model.safetensors").items()
    )
    console = Console(record=True, width=200)
    assert model_path(cfg, console) == str(warm) and "warm start" not in console.export_text()  # cached
    other = debug_config(tmp_path / "cache", tmp_path / "run", *overrides, f"sft.path={conversations}", "sft.epochs=2")
    assert model_path(other, Console(quiet=True)) != str(warm)  # other SFT settings: another warm start
    off = debug_config(tmp_path / "cache", tmp_path / "run", f"model.name_or_path={random_qwen2}")
    assert model_path(off, Console(quiet=True)) == str(random_qwen2)  # by default a model by path is taken as is


def test_a_jsonl_corpus_needs_a_file_of_conversations_with_assistant_turns(tmp_path):
    cfg = debug_config(tmp_path / "cache", tmp_path / "run", "sft.corpus=jsonl")
    corpus = WARM_START_CORPORA.get("jsonl")
    with pytest.raises(ConfigError, match=r"sft.path: sft.corpus=jsonl needs a file"):
        corpus.conversations(cfg, 10, 0, set())
    prompt_only = tmp_path / "prompts.jsonl"
    row = sft_rows(1, seed=0, exclude_prompts=set())[0]
    last_user = max(i for i, m in enumerate(row["conversations"]) if m["role"] == "user")
    write_jsonl(prompt_only, [row, {**row, "conversations": row["conversations"][: last_user + 1]}])
    cfg.sft.path = str(prompt_only)
    with pytest.raises(DataError, match=r"row 2 .* no assistant message after its last user message"):
        corpus.conversations(cfg, 10, 0, set())
