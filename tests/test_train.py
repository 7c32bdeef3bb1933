"""End-to-end runs of the real trainer on CPU with the debug preset (a very small tiny model)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from transformers import AutoModelForCausalLM

from minirl.config import register_configs, to_config
from minirl.entry import CONF_DIR
from minirl.trainer import Trainer, train

register_configs()


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("model-cache")


def debug_config(cache_dir: Path, run_dir: Path, *overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = to_config(compose("config", overrides=["debug=cpu", f"model.cache_dir={cache_dir}", *overrides]))
    cfg.output_dir = str(run_dir)
    return cfg


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_train_runs_end_to_end_and_logs_every_metric(cache_dir, tmp_path):
    cfg = debug_config(cache_dir, tmp_path, "logger.backend=wandb", "logger.mode=offline", "trainer.ppo_epochs=2")
    result = train(cfg)
    assert [step for step, _ in result.eval_history] == [0, 1, 2]
    rows = read_metrics(tmp_path)
    evals = [r for r in rows if "eval/success_rate" in r]
    assert [r["step"] for r in evals] == [0, 1, 2]
    assert all(0.0 <= r["eval/success_rate"] <= 1.0 for r in evals)
    steps = [r for r in rows if "reward/mean" in r and "eval/success_rate" not in r]
    assert [r["step"] for r in steps] == [1, 2]
    expected = {
        "reward/mean", "reward/std", "reward/gt_hit", "reward/tool_alignment", "reward/think_count",
        "loss/policy", "loss/kl", "loss/clip_frac", "loss/ratio_mean", "adv/mean", "adv/std", "adv/min", "adv/max",
        "rollout/response_tokens_mean", "rollout/turns", "tools/valid_frac", "tools/calls_per_traj",
        "rollout/finish_answer", "grad_norm", "lr", "time/rollout_s", "time/update_s",
    }  # fmt: skip
    assert expected <= set(steps[0])
    # the final policy loads back like any checkpoint, and W&B wrote an offline run
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoint") is not None
    assert list((tmp_path / "wandb").glob("offline-run-*"))


def test_beta_zero_loads_no_reference_model(cache_dir, tmp_path):
    trainer = Trainer(debug_config(cache_dir, tmp_path, "loss.beta=0"), console=None)
    assert trainer.reference is None
    assert Trainer(debug_config(cache_dir, tmp_path), console=None).reference is not None


def test_multirun_sweeps_two_losses(cache_dir, tmp_path):
    cmd = [
        sys.executable, "-m", "minirl.train", "-m", "loss=grpo,cispo", "debug=cpu", "trainer.steps=1",
        f"model.cache_dir={cache_dir}", f"hydra.sweep.dir={tmp_path}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    runs = sorted(p.parent for p in tmp_path.glob("*/metrics.jsonl"))
    assert len(runs) == 2
    for run in runs:
        assert any("eval/success_rate" in r and r["step"] == 1 for r in read_metrics(run))


def test_retool_recipe_runs_end_to_end_with_the_sandbox(cache_dir, tmp_path):
    cfg = debug_config(cache_dir, tmp_path, "experiment=retool", "rollout.max_new_tokens=48")
    assert cfg.tools.names == ["code_interpreter"] and cfg.reward.success == "boxed_answer"
    train(cfg)
    steps = [r for r in read_metrics(tmp_path) if "reward/mean" in r and "eval/success_rate" not in r]
    assert len(steps) == 2
    for row in steps:
        assert -1.0 <= row["reward/mean"] <= 1.0  # ReTool's reward is exactly +-1 per trajectory
        shares = [row[f"tools/{s}_frac"] for s in ("ok", "error", "timeout", "bad_arguments", "unknown_tool")]
        assert row["tools/calls_per_traj"] == 0 or sum(shares) + row["tools/over_budget_frac"] == pytest.approx(1.0)
        assert 0.0 <= row["tools/used_frac"] <= 1.0 and row["tools/latency_max_s"] >= 0.0
