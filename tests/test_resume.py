"""Checkpoints, exact resume after SIGKILL, and the faults a run survives or stops on, with the real
trainer on the debug preset (CPU)."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from rich.console import Console
from support import SHAPED_REWARD, debug_config

from minirl.bootstrap import model_path
from minirl.errors import TrainingError
from minirl.inspection import TRAJECTORIES_FILE, read_trajectories
from minirl.trainer import Trainer, train
from minirl.training.checkpoint import CHECKPOINTS, checkpoints, latest_checkpoint, load_trainer_state
from minirl.training.faults import reported_out_of_memory

REPO = Path(__file__).resolve().parents[1]
STEPS = 6


def read_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def without_timings(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in rows]


def train_command(cache_dir: Path, run_dir: Path, *overrides: str) -> list[str]:
    return [
        sys.executable, "-m", "minirl.train", "debug=cpu", f"model.cache_dir={cache_dir}", f"hydra.run.dir={run_dir}",
        f"trainer.steps={STEPS}", "trainer.eval_every=3", "trainer.save_every=1", "trainer.keep_last=2",
        "trainer.trajectories_every=2", *overrides,
    ]  # fmt: skip


def run_to_end(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


# one step off, a checkpoint also holds the next step's rollout, sampled but not trained (training/pipeline.py); the
# shaped reward moves the weights, so that a rollout from the wrong weights would show
@pytest.mark.parametrize("schedule", [[], ["experiment=async", SHAPED_REWARD]], ids=["synchronous", "one_step_off"])
def test_sigkill_then_resume_loses_and_repeats_no_step_and_matches_an_uninterrupted_run(cache_dir, tmp_path, schedule):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    run_to_end(train_command(cache_dir, whole, *schedule))  # also builds the debug model into the cache
    reference = read_rows(whole)

    rng = random.Random()
    # kill once this many steps are logged, plus a random part of a step (which may fall in its checkpoint
    # write), so that a whole step still lies ahead however fast the steps run
    kill_after = rng.randint(1, STEPS - 2)
    delay = rng.uniform(0.0, max(row["time/step_s"] for row in reference if "time/step_s" in row))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        train_command(cache_dir, killed, *schedule),
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    metrics = killed / "metrics.jsonl"
    while proc.poll() is None:
        logged = metrics.read_text().count('"reward/mean"') if metrics.exists() else 0
        if logged >= kill_after + 1:  # the step-0 evaluation row also carries reward/mean
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    proc.wait()
    when = f"killed after {kill_after} steps + {delay:.2f}s"
    assert proc.returncode == -signal.SIGKILL, f"the run ended before it was {when}"

    run_to_end(train_command(cache_dir, killed, *schedule, "trainer.resume=auto"))
    resumed = read_rows(killed)
    train_steps = [r["step"] for r in resumed if "reward/mean" in r and "eval/success_rate" not in r]
    assert train_steps == list(range(1, STEPS + 1)), when
    assert without_timings(resumed) == without_timings(reference), when
    assert [r["step"] for r in read_trajectories(killed / TRAJECTORIES_FILE)] == [
        r["step"] for r in read_trajectories(whole / TRAJECTORIES_FILE)
    ]
    assert [p.name for p in checkpoints(killed)] == ["step_000005", "step_000006"]  # keep_last=2
    pending = load_trainer_state(checkpoints(whole)[0])["pending_rollout"]  # step 5's holds step 6's rollout
    assert {t.policy_version for t in pending.sampled} == {4} if schedule else pending is None


def test_checkpoint_holds_the_policy_and_the_state_of_an_exact_resume(cache_dir, tmp_path):
    cfg = debug_config(cache_dir, tmp_path, "trainer.save_every=1", "trainer.keep_last=1")
    train(cfg)
    (tmp_path / CHECKPOINTS / ".tmp-step_000009-1").mkdir()  # an interrupted write is never resumed from
    newest = latest_checkpoint(tmp_path)
    assert newest.name == "step_000002" and [p.name for p in checkpoints(tmp_path)] == ["step_000002"]
    state = load_trainer_state(newest)
    assert state["step"] == 2 and state["eval_history"][0][0] == 0 and len(state["solved_at_start"]) == 4
    assert {"optimizer", "scheduler", "rng", "task_rng", "task_queue", "shuffle_rng", "run_id"} <= set(state)
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(newest)  # loads by path like any checkpoint
    final = AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoint")
    for (name, a), (_, b) in zip(saved.state_dict().items(), final.state_dict().items()):
        assert torch.equal(a, b), name


def test_resume_auto_without_a_checkpoint_starts_from_step_zero(cache_dir, tmp_path):
    result = train(debug_config(cache_dir, tmp_path, "trainer.resume=auto"))
    assert [step for step, _ in result.eval_history] == [0, 1, 2]


def test_a_nan_step_skips_its_update_and_is_counted(cache_dir, tmp_path):
    cfg = debug_config(cache_dir, tmp_path, "trainer.steps=3", "trainer.nan_loss_steps=[2]", SHAPED_REWARD)
    trainer = Trainer(cfg, model_path(cfg, Console(quiet=True)))
    before = {}

    def weights() -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in trainer.policy.state_dict().items()}

    rows = []
    for step in (1, 2, 3):
        trainer.step = step
        before = weights()
        metrics, _ = trainer.train_step()
        trainer.bad_steps.count(step, int(metrics["faults/skipped_updates"]), trainer.console)
        rows.append(metrics)
        changed = any(not torch.equal(before[k], v) for k, v in weights().items())
        assert changed == (step != 2), step
    assert [r["faults/skipped_updates"] for r in rows] == [0.0, 1.0, 0.0]
    assert trainer.bad_steps.in_a_row == 0


def test_non_finite_steps_in_a_row_stop_the_run_with_a_clear_message(cache_dir, tmp_path):
    cfg = debug_config(
        cache_dir, tmp_path, "trainer.steps=4", "trainer.nan_loss_steps=[2,3]", "trainer.max_bad_steps=2"
    )
    with pytest.raises(TrainingError, match=r"steps 2-3: every one had a non-finite loss or gradient"):
        train(cfg)
    rows = read_rows(tmp_path)
    assert [r["faults/skipped_updates"] for r in rows if "faults/skipped_updates" in r] == [0.0, 1.0, 1.0]


def test_trajectories_are_written_every_n_steps_with_their_advantages(cache_dir, tmp_path):
    train(debug_config(cache_dir, tmp_path, "trainer.steps=2", "trainer.trajectories_every=1"))
    records = list(read_trajectories(tmp_path / TRAJECTORIES_FILE))
    assert sorted({r["step"] for r in records}) == [1, 2]
    assert len(records) == 2 * 2 * 2  # steps x prompts_per_step x group_size
    for group in range(2):  # group-normalised advantages sum to ~0 within each group
        advantages = [r["advantage"] for r in records if r["step"] == 1 and r["group"] == group]
        assert abs(sum(advantages)) < 1e-4


def test_out_of_memory_names_the_phase_the_sizes_and_what_to_lower():
    hint = "lower trainer.micro_batch_size"
    with pytest.raises(TrainingError) as caught, reported_out_of_memory("the policy update", 16, 900, hint):
        torch.empty(1 << 62, dtype=torch.uint8)  # the CPU allocator refuses: a real out-of-memory error
    assert str(caught.value) == (
        "out of memory during the policy update: 16 sequences, the longest 900 tokens; lower trainer.micro_batch_size"
    )
    with pytest.raises(ZeroDivisionError), reported_out_of_memory("rollout", 1, 1, ""):  # others pass unchanged
        _ = 1 / 0


def test_a_resumed_run_continues_the_same_wandb_run(cache_dir, tmp_path):
    wandb = ("logger.backend=wandb", "logger.mode=offline", "trainer.save_every=1")
    train(debug_config(cache_dir, tmp_path, *wandb))
    first = load_trainer_state(latest_checkpoint(tmp_path))["run_id"]
    train(debug_config(cache_dir, tmp_path, *wandb, "trainer.steps=3", "trainer.resume=auto"))
    assert first and load_trainer_state(latest_checkpoint(tmp_path))["run_id"] == first
    runs = sorted(p.name for p in (tmp_path / "wandb").glob("offline-run-*"))
    # `wandb sync` joins them; wandb adds "-1" to a second folder made in the same second
    assert len(runs) == 2 and all(re.fullmatch(rf"offline-run-\d{{8}}_\d{{6}}-{first}(-\d+)?", name) for name in runs)
