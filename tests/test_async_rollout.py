"""One step off (trainer.async_rollout, minirl/training/pipeline.py) with the real trainer on the debug preset:
the next step's rollout runs on the worker while this step updates, samples from the weights before the update
however the update changes them meanwhile, each step trains on trajectories exactly one version old, and nothing
older than algo.max_staleness is trained on. Resume: tests/test_resume.py runs its SIGKILL test one step off too."""

from __future__ import annotations

import copy
import importlib.util
import threading

import pytest
import torch
from rich.console import Console
from support import SHAPED_REWARD, debug_config

from minirl.bootstrap import model_path
from minirl.data.task import Task
from minirl.errors import ConfigError
from minirl.models.loading import load_policy
from minirl.rollout.agent_loop import RolloutCancelled
from minirl.rollout.trajectory import Trajectory
from minirl.trainer import Trainer
from minirl.training.batch import collate, token_logprobs
from minirl.training.pipeline import fresh

STEPS = 4
WAIT_S = 120.0  # a bound on waiting for the other thread, never an expectation of speed
GAP = 1e-4  # an engine's log-probs against the trainer's at the same weights: below (vLLM's CPU kernels: ~5e-6)
NO_VLLM = "vLLM is not installed in this venv: `make test-vllm` runs the vllm case in the vLLM CPU venv (docs/vllm.md)"
# the engine samples on a worker thread: the torch engine on a copy of the module, vLLM on weights of its own
ENGINES = {
    "torch": (),
    "vllm": ("rollout=vllm", "model.tiny.hidden_size=64", "rollout.max_total_tokens=1024", "rollout.max_new_tokens=24"),
}


class Interleaved(Trainer):
    """A trainer whose update waits until the next step's rollout has started on the worker, and whose worker
    samples only after the update has changed the weights: a schedule that ran the rollout after the update (or
    before it) would never get past the first wait, and an engine that read the trained module would sample
    from the new weights."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rollout_started, self.updated = threading.Event(), threading.Event()
        groups = self.sampler.groups

        def groups_after_the_update():
            if threading.current_thread() is not threading.main_thread():
                self.rollout_started.set()
                assert self.updated.wait(WAIT_S), "the update never finished while the next rollout waited"
                self.updated.clear()
            return groups()

        self.sampler.groups = groups_after_the_update

    def update(self, batch, trajs):
        if self.step < self.cfg.trainer.steps:
            assert self.rollout_started.wait(WAIT_S), "the next step's rollout did not start before the update"
            self.rollout_started.clear()
        metrics = super().update(batch, trajs)
        self.updated.set()
        return metrics


def sampler_gap(model, trajs: list[Trajectory], trainer: Trainer) -> float:
    """The largest |log p - sampler log-prob| over the trajectories' sampled tokens under `model`."""
    batch = collate(trajs, torch.zeros(len(trajs)), trainer.tokenizer.pad_token_id)
    with torch.no_grad():
        logp = token_logprobs(model.eval(), batch, trainer.learner.sampling)
    return ((logp - batch.old_logp).abs() * batch.mask).max().item()


@pytest.mark.parametrize(
    "engine",
    [
        "torch",
        pytest.param(
            "vllm", marks=[pytest.mark.vllm, pytest.mark.skipif(not importlib.util.find_spec("vllm"), reason=NO_VLLM)]
        ),
    ],
)
def test_the_next_rollout_runs_during_the_update_on_the_weights_before_it(cache_dir, tmp_path, engine):
    overrides = ("experiment=async", f"trainer.steps={STEPS}", SHAPED_REWARD, *ENGINES[engine])
    cfg = debug_config(cache_dir, tmp_path, *overrides)
    trainer = Interleaved(cfg, model_path(cfg, Console(quiet=True)))
    before = copy.deepcopy(trainer.policy)
    for step in range(1, STEPS + 1):
        trainer.step = step
        before.load_state_dict(trainer.policy.state_dict())
        metrics, trajs = trainer.train_step()
        # step 1 trains on its own rollout; every later one on the rollout sampled during the step before it
        assert {t.policy_version for t in trajs} == {max(0, step - 2)}, step
        assert metrics["async/staleness_max"] == (0.0 if step == 1 else 1.0)
        assert metrics["async/dropped_stale"] == 0.0
        assert metrics["rollout_is/logp_gap_abs_mean"] > 0 or step == 1  # the older sampler's gap is logged
        if step == STEPS:
            assert trainer.pending is None  # no rollout for a step that does not come
            continue
        pending = trainer.pending.sampled
        assert {t.policy_version for t in pending} == {step - 1}
        old, new = sampler_gap(before, pending, trainer), sampler_gap(trainer.policy, pending, trainer)
        assert old < GAP, f"step {step}: the rollout did not sample from the weights before the update ({old})"
        assert new > 10 * GAP, f"step {step}: the update did not move the weights far enough to tell ({new})"


def versioned(version: int) -> Trajectory:
    return Trajectory(Task("t", [], [], []), 0, [1], policy_version=version)


def test_trajectories_older_than_max_staleness_are_dropped_and_counted():
    trajs = [versioned(v) for v in (5, 4, 3, 2, 4)]
    kept, metrics = fresh(trajs, 5, 1)
    assert [t.policy_version for t in kept] == [5, 4, 4]
    assert metrics == {"async/staleness_mean": 2 / 3, "async/staleness_max": 1.0, "async/dropped_stale": 2.0}
    kept, metrics = fresh(trajs, 5, 3)
    assert len(kept) == 5 and metrics["async/staleness_max"] == 3.0
    assert fresh([], 5, 1) == (
        [],
        {"async/staleness_mean": 0.0, "async/staleness_max": 0.0, "async/dropped_stale": 0.0},
    )


def test_a_run_that_fails_during_an_update_stops_the_rollout_running_ahead(cache_dir, tmp_path):
    """The update fails while the next step's rollout runs: the run cancels that rollout and waits for it to stop
    at its next turn, so no thread samples on (holding the engine, drawing from the RNG) once the run is over."""
    cfg = debug_config(cache_dir, tmp_path, "experiment=async", f"trainer.steps={STEPS}")
    trainer = Trainer(cfg, model_path(cfg, Console(quiet=True)))
    started, ended, workers = threading.Event(), [], []
    groups = trainer.sampler.groups

    def groups_ahead():
        if threading.current_thread() is threading.main_thread():
            return groups()
        workers.append(threading.current_thread())
        started.set()
        trainer.sampler.cancel.wait(WAIT_S)  # still running when the update fails
        try:
            return groups()
        except BaseException as err:
            ended.append(type(err))
            raise

    def failing_update(batch, trajs):
        assert started.wait(WAIT_S), "the next step's rollout did not start"
        raise RuntimeError("the update failed")

    trainer.sampler.groups, trainer.update = groups_ahead, failing_update
    with pytest.raises(RuntimeError, match="the update failed"):
        trainer.fit()
    assert ended == [RolloutCancelled]
    assert len(workers) == 1 and not workers[0].is_alive()


def test_one_step_off_refuses_a_model_with_dropout(cache_dir, tmp_path):
    """The update would draw from the global RNG that the rollout worker draws from: refused at load, naming it."""
    cfg = debug_config(cache_dir, tmp_path)
    model = load_policy(model_path(cfg, Console(quiet=True)), cfg, torch.device("cpu"))
    model.config.attention_dropout = 0.1
    model.save_pretrained(tmp_path / "dropout")
    one_step_off = debug_config(cache_dir, tmp_path, "experiment=async", f"model.name_or_path={tmp_path / 'dropout'}")
    with pytest.raises(ConfigError, match=r"trainer.async_rollout: .*config.attention_dropout=0.1"):
        load_policy(str(tmp_path / "dropout"), one_step_off, torch.device("cpu"))
    load_policy(str(tmp_path / "dropout"), cfg, torch.device("cpu"))  # a synchronous run trains it as it is


@pytest.mark.parametrize("async_rollout", [False, True])
def test_gradient_checkpointing_rewinds_the_global_rng_only_in_a_synchronous_run(cache_dir, tmp_path, async_rollout):
    """torch's checkpointing sets the RNG back to the forward's state while it recomputes (so dropout repeats):
    a draw made then, as the rollout worker's may be one step off, would repeat one already made."""
    overrides = ["model.gradient_checkpointing=true", *(["experiment=async"] if async_rollout else [])]
    cfg = debug_config(cache_dir, tmp_path, *overrides)
    model = load_policy(model_path(cfg, Console(quiet=True)), cfg, torch.device("cpu")).train()
    draws = []
    model.model.layers[0].input_layernorm.register_forward_pre_hook(lambda *_: draws.append(torch.rand(1).item()))
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    assert len(draws) == 2  # the forward and its recomputation
    assert (draws[0] != draws[1]) is async_rollout
