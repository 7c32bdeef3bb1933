"""The trainer with `rollout=vllm` for real, on vLLM's CPU build (`make test-vllm`, docs/vllm.md): a run of the
debug preset whose model has head size 32 (hidden 64, 2 heads), one vLLM engine for the module.

- The sync check (minirl/training/sync_check.py) stays quiet while every weight sync lands and warns on the
  one step whose sync is skipped on purpose: the engine then still samples from the weights before that step's
  update. The same with LoRA adapters, which reach vLLM merged into the weights.
- A head size vLLM's CPU attention lacks (the debug preset's own, 16) is refused at start with a ConfigError
  that says what to set, before vLLM is started.
"""

from __future__ import annotations

import pytest
from rich.console import Console

pytest.importorskip(
    "vllm", reason="vLLM is not installed here: `make test-vllm` runs these tests in the vLLM CPU venv (docs/vllm.md)"
)
from support import SHAPED_REWARD, debug_config  # noqa: E402
from vllm.platforms import current_platform  # noqa: E402

from minirl.bootstrap import model_path  # noqa: E402
from minirl.config import register_configs  # noqa: E402
from minirl.errors import ConfigError  # noqa: E402
from minirl.trainer import Trainer  # noqa: E402

pytestmark = pytest.mark.vllm
register_configs()

VLLM = ("rollout=vllm", "rollout.max_new_tokens=24", "rollout.max_total_tokens=1024", "rollout.group_size=2")
SKIPPED = 2  # the step whose sync never reaches vLLM


# LoRA: vLLM gets the adapters merged into the weights; a larger lr, so that one step of adapters that start at
# zero moves the sampled sequence past vLLM's kernel noise
LORA = ("model.lora.r=4", "model.lora.alpha=8", "trainer.lr=1e-2")


@pytest.mark.parametrize("adapters", [(), LORA], ids=["full", "lora"])
def test_the_sync_check_warns_on_the_step_whose_vllm_sync_was_skipped_and_only_then(cache_dir, tmp_path, adapters):
    overrides = (*VLLM, "model.tiny.hidden_size=64", "trainer.steps=4", "rollout.sync_check_every=1", *adapters)
    cfg = debug_config(cache_dir, tmp_path, *overrides, SHAPED_REWARD, "loss.beta=0")
    console = Console(record=True, width=400)
    trainer = Trainer(cfg, model_path(cfg, Console(quiet=True)), console)
    sync = trainer.sampler.engine.sync_weights
    trainer.sampler.engine.sync_weights = lambda model: None if trainer.step == SKIPPED else sync(model)
    metrics = []
    for step in range(1, cfg.trainer.steps + 1):
        trainer.step = step
        metrics.append(trainer.train_step()[0])
    printed = console.export_text()
    assert [m["rollout/sync_stale"] for m in metrics] == [0.0, 1.0, 0.0, 0.0]
    for m in metrics[:1] + metrics[2:]:  # synced: at the new weights, up to vLLM's CPU kernels
        assert m["rollout/sync_gap"] < 1e-4 < m["rollout/sync_gap_prev"]
    assert metrics[1]["rollout/sync_gap_prev"] < 1e-4 < metrics[1]["rollout/sync_gap"]  # still at the old weights
    assert printed.count("not sampling from the updated weights") == 1
    assert f"step {SKIPPED}: the vllm engine is not sampling" in printed


@pytest.mark.skipif(not current_platform.is_cpu(), reason="the head sizes checked are vLLM's CPU attention's")
def test_a_head_size_the_cpu_attention_lacks_is_refused_before_vllm_starts(cache_dir, tmp_path):
    cfg = debug_config(cache_dir, tmp_path, *VLLM)  # the debug model: hidden 32 / 2 heads = head size 16
    with pytest.raises(ConfigError, match=r"head sizes \[32, 64.*this model's is 16.*model.tiny.hidden_size=64"):
        Trainer(cfg, model_path(cfg, Console(quiet=True)))
