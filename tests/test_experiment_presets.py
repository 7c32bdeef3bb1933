"""Every experiment preset runs: one trainer step of `debug=cpu experiment=<name>` for each
minirl/conf/experiment/*.yaml, globbed at collection (lightning-hydra-template's `experiment=glob(*)`), so a
new preset is run without a line here and none can rot.

debug=cpu comes after the preset in the defaults list, so where both set a key the debug value wins. That is
the point for what makes a run cheap (the model, the budgets, the step count); for anything else (dynamic
sampling, say) the run would no longer be the preset's, so those keys get the preset's own values back.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from support import compose_config, debug_config

from minirl.algos.advantages import ADV_ESTIMATORS
from minirl.config import ObservationCut, register_configs
from minirl.entry import CONF_DIR
from minirl.trainer import train

PRESETS = sorted(path.stem for path in (CONF_DIR / "experiment").glob("*.yaml"))
# keys debug/cpu.yaml may take from a preset: they set the cost of the run, not what it does
COST = ("model.", "sft.", "trainer.", "data.", "logger.", "rollout.group_size", "rollout.max_new_tokens")


def flat_tree(node: dict, prefix: str = "") -> dict[str, object]:
    """A config tree's leaves by their dotted paths (a study's `hydra.sweeper.params.trainer.seed` included)."""
    out = {}
    for key, value in node.items():
        out.update(flat_tree(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def flat(path: Path) -> dict[str, object]:
    """The keys a config file sets, dotted (its defaults list left out)."""
    tree = OmegaConf.to_container(OmegaConf.load(path))
    tree.pop("defaults", None)
    return flat_tree(tree)


def kept_from_debug(preset: str) -> list[str]:
    """Overrides that give the preset back its own values where debug=cpu would change what the run does."""
    own, debug = flat(CONF_DIR / "experiment" / f"{preset}.yaml"), flat(CONF_DIR / "debug" / "cpu.yaml")
    shared = [key for key in own if key in debug and own[key] != debug[key] and not key.startswith(COST)]
    return [f"{key}={json.dumps(own[key]) if isinstance(own[key], bool) else own[key]}" for key in shared]


@pytest.mark.fast
def test_presets_are_found():
    assert PRESETS, f"no presets in {CONF_DIR / 'experiment'}"  # else every case below would be skipped


@pytest.mark.fast
@pytest.mark.parametrize("preset", PRESETS)
def test_debug_keeps_what_each_preset_does(preset):
    """The composed debug run has every setting of the preset but the ones that set its cost."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        overrides = ["debug=cpu", f"experiment={preset}", *kept_from_debug(preset)]
        cfg = compose("config", overrides=overrides, return_hydra_config=True)  # a study's sweep settings too
    composed = flat_tree(OmegaConf.to_container(cfg))
    for key, value in flat(CONF_DIR / "experiment" / f"{preset}.yaml").items():
        if not key.startswith(COST):
            assert composed[key] == value, key


@pytest.mark.fast
def test_retool_paper_trains_with_retools_algorithm(tmp_path):
    """The seed design's ReTool (agentic-rl-lab 05-retool): clip-higher 0.2 / 0.28, no KL term and so no reference
    model, the reward minus its group's mean as the advantage, one optimizer step per rollout batch, every group
    kept, only the model's own samples learned from, and the end of a long tool output."""
    cfg = compose_config(tmp_path, tmp_path, "experiment=retool_paper")
    assert (cfg.loss.name, cfg.loss.clip_low, cfg.loss.clip_high, cfg.loss.beta) == ("grpo", 0.2, 0.28, 0.0)
    assert not cfg.algo.kl_in_reward  # and beta 0: the trainer loads no reference model
    assert (cfg.trainer.ppo_epochs, cfg.trainer.mini_batches) == (1, 1) and not cfg.algo.dynamic_sampling
    assert not cfg.algo.guide and cfg.loss.reference_nll == 0
    advantages = ADV_ESTIMATORS.get(cfg.algo.adv_estimator)(torch.tensor([1.0, -1.0, -1.0, -1.0]), 4, cfg.algo.adv_eps)
    assert advantages.tolist() == [1.5, -0.5, -0.5, -0.5]  # r - mean(r) = r + 0.5, not divided by the std
    assert cfg.protocol.observation_cut is ObservationCut.tail


@pytest.mark.fast
def test_the_retool_recipe_departs_from_retools_algorithm_only_where_it_says(tmp_path):
    """experiment=retool is retool_paper plus a KL term, guidance learned with a supervised term, and the lr
    schedule and steps that go with them."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        recipe, paper = (
            flat_tree(OmegaConf.to_container(compose("config", overrides=[f"experiment={name}"])))
            for name in ("retool", "retool_paper")
        )
    departures = {key for key in recipe if recipe[key] != paper[key]}
    guidance = {"algo.guide", "algo.guide_solved_share", "loss.reference_nll"}
    assert departures == {"loss.beta", *guidance, "trainer.lr", "trainer.warmup_steps", "trainer.steps"}
    assert (recipe["loss.beta"], recipe["algo.guide"], recipe["loss.reference_nll"]) == (0.02, True, 20.0)


@pytest.mark.parametrize("preset", PRESETS)
def test_every_experiment_preset_runs_a_step(preset, cache_dir, tmp_path):
    cfg = debug_config(cache_dir, tmp_path, f"experiment={preset}", "trainer.steps=1", *kept_from_debug(preset))
    result = train(cfg)
    assert [step for step, _ in result.eval_history] == [0, 1]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    [step] = [row for row in rows if "reward/mean" in row and "eval/success_rate" not in row]
    assert step["step"] == 1
    expected = {"reward/mean", "reward/std", "rollout/turns", "rollout/response_tokens_mean", "tools/calls_per_traj"}
    assert expected <= set(step), sorted(expected - set(step))
    assert all(math.isfinite(value) for value in step.values() if isinstance(value, float))
    assert (tmp_path / "checkpoint").is_dir()  # the run got to its end
