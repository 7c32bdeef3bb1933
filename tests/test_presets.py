"""Preset quality: each preset's warm start, built from an empty cache, against the figures its docs give.

A change to what the embedded model is built from (the tiny architecture, the tokenizer, copy pretraining,
the SFT corpus or recipe, the chat template) rebuilds every preset's warm start; nothing else would notice
if one of them got worse while every other test passed. Each case builds one warm start from scratch
(minutes) and evaluates it greedily on the held-out tasks, as the trainer does at step 0.
"""

from __future__ import annotations

import json

import pytest
from rich.console import Console
from support import compose_config

from minirl.bootstrap import BUILD_RECORD
from minirl.evaluation.evaluator import evaluate

# preset: (its overrides, the final SFT epoch loss, the greedy held-out success at step 0), as documented in
# experiments/README.md ("Default run", "ReTool recipe"); change them only with the docs, from a re-measurement
DOCUMENTED = {
    "default": ([], 0.090, 0.312),
    "retool": (["experiment=retool"], 0.003, 0.730),
}
LOSS_FACTOR = 2.0  # a final SFT loss above LOSS_FACTOR x the documented one fails
SUCCESS_MARGIN = 0.05  # a step-0 held-out success more than 5 points below the documented one fails


@pytest.mark.slow
@pytest.mark.parametrize("preset", DOCUMENTED)
def test_a_presets_warm_start_is_as_good_as_documented(preset, tmp_path):
    overrides, documented_loss, documented_success = DOCUMENTED[preset]
    cache = tmp_path / "cache"
    cfg = compose_config(cache, tmp_path / "run", "logger=none", *overrides)
    report = evaluate(cfg, Console(quiet=True))  # builds the warm start in the empty cache first
    (record_path,) = cache.glob(f"tiny-*/sft/{BUILD_RECORD}")
    loss = json.loads(record_path.read_text())["final_epoch_loss"]
    success = report.metrics["success_rate"]
    measured = f"{preset}: final SFT loss {loss:.4f}, held-out success at step 0 {success:.1%}"
    assert loss <= LOSS_FACTOR * documented_loss, f"{measured}; documented {documented_loss} (experiments/README.md)"
    assert success >= documented_success - SUCCESS_MARGIN, f"{measured}; documented {documented_success:.1%}"
