"""The run-time check that the sampler moved with the trainer (minirl/training/sync_check.py), in real training
runs of the debug preset: quiet while every sync lands, loud on the step whose sync is skipped, and drawing no
random number (a run with it equals a run without it).

The module engines sample on the policy itself, so their sync cannot miss; the stale case runs the torch engine
on a copy of the policy that a sync overwrites, as vLLM holds weights of its own. tests/test_vllm_training.py
skips a sync of the real vLLM engine."""

from __future__ import annotations

import copy

from rich.console import Console
from support import SHAPED_REWARD, debug_config

from minirl.bootstrap import model_path
from minirl.config import register_configs
from minirl.inference.decoding import PrefixStore
from minirl.rollout.torch_engine import TorchEngine
from minirl.trainer import Trainer

register_configs()

STEPS = ("trainer.steps=3", "rollout.sync_check_every=1", SHAPED_REWARD, "loss.beta=0")


class CopyEngine(TorchEngine):
    """The torch engine on weights of its own, which a sync overwrites with the policy's; `skip_at` is the
    step whose sync never arrives."""

    def __init__(self, trainer: Trainer, skip_at: int) -> None:
        super().__init__(copy.deepcopy(trainer.policy), trainer.tokenizer, trainer.device)
        self.trainer, self.skip_at = trainer, skip_at

    def sync_weights(self, model) -> None:
        if self.trainer.step != self.skip_at:
            self.model.load_state_dict(model.state_dict())
        self.finished = PrefixStore()


def run(cfg, skip_at: int | None = None) -> tuple[list[dict[str, float]], str]:
    """(every step's metrics, what the run printed) of a run of cfg, its engine skipping step skip_at's sync."""
    console = Console(record=True, width=400)
    trainer = Trainer(cfg, model_path(cfg, Console(quiet=True)), console)
    if skip_at is not None:
        trainer.sampler.engine = CopyEngine(trainer, skip_at)
    metrics = []
    for step in range(1, cfg.trainer.steps + 1):
        trainer.step = step
        step_metrics, _ = trainer.train_step()
        metrics.append(step_metrics)
    return metrics, console.export_text()


def test_the_check_warns_on_the_step_whose_sync_was_skipped_and_only_then(cache_dir, tmp_path):
    metrics, printed = run(debug_config(cache_dir, tmp_path, *STEPS), skip_at=2)
    assert [m["rollout/sync_stale"] for m in metrics] == [0.0, 1.0, 0.0]
    synced, skipped = metrics[0], metrics[1]
    assert synced["rollout/sync_gap"] < 1e-5 < synced["rollout/sync_gap_prev"]
    # the engine kept step 1's weights: step 2's "before the update"
    assert skipped["rollout/sync_gap_prev"] < 1e-5 < skipped["rollout/sync_gap"]
    assert printed.count("not sampling from the updated weights") == 1
    assert "step 2: the torch engine is not sampling" in printed


def test_the_check_is_quiet_and_draws_no_random_number(cache_dir, tmp_path):
    checked, printed = run(debug_config(cache_dir, tmp_path / "checked", *STEPS))
    assert [m["rollout/sync_stale"] for m in checked] == [0.0, 0.0, 0.0]
    assert all(m["rollout/sync_gap"] == 0.0 < m["rollout/sync_gap_prev"] for m in checked)
    assert "not sampling" not in printed
    unchecked, _ = run(debug_config(cache_dir, tmp_path / "unchecked", *STEPS, "rollout.sync_check_every=0"))
    timeless = [{k: v for k, v in m.items() if not k.startswith(("time/", "rollout/sync_"))} for m in checked]
    assert timeless == [{k: v for k, v in m.items() if not k.startswith("time/")} for m in unchecked]
    assert "rollout/sync_gap" not in unchecked[0]


def test_the_check_runs_every_n_steps(cache_dir, tmp_path):
    metrics, _ = run(debug_config(cache_dir, tmp_path, *STEPS, "rollout.sync_check_every=2"))
    assert ["rollout/sync_gap" in m for m in metrics] == [False, True, False]
