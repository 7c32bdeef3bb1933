"""The real config tree: every option composes, registries and configs match in both
directions, and bad values fail at start-up with a message naming the key."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from minirl.config import Config, register_configs, to_config
from minirl.entry import CONF_DIR, check_group_choices, check_value_overrides
from minirl.errors import ConfigError
from minirl.validate import validate

register_configs()
ROOT = Path(__file__).resolve().parent.parent  # the repository
GROUPS = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir())


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def compose_cfg(*overrides: str) -> Config:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return to_config(compose("config", overrides=list(overrides)))


@pytest.mark.fast
def test_defaults_list_names_every_axis():
    defaults = OmegaConf.load(CONF_DIR / "config.yaml").defaults
    named = {next(iter(d)) for d in defaults if isinstance(d, dict) or OmegaConf.is_dict(d)}
    assert set(GROUPS) <= named
    axes = {"model", "tools", "protocol", "reward", "rollout", "loss", "data", "trainer", "logger", "experiment"}
    assert axes | {"debug"} <= set(GROUPS)


@pytest.mark.fast
@pytest.mark.parametrize(("group", "option"), [(g, o) for g in GROUPS for o in options(g)])
def test_every_option_composes_and_resolves_its_registry_names(group, option):
    overrides = [f"{group}={option}"]
    if (group, option) == ("data", "jsonl"):
        overrides.append("data.path=tasks.jsonl")
    cfg = compose_cfg(*overrides)
    validate(cfg)


@pytest.mark.fast
def test_registries_and_configs_match_in_both_directions():
    from minirl.algos.advantages import ADV_ESTIMATORS
    from minirl.algos.losses import LOSSES
    from minirl.data import DATASETS, WARM_START_CORPORA
    from minirl.protocol.formats import CALL_FORMATS
    from minirl.rewards import REWARD_TERMS, SUCCESS_CRITERIA
    from minirl.rollout.engine import ENGINES
    from minirl.tools import TOOLS
    from minirl.tracking import BACKENDS

    def values(group: str, key: str) -> set:
        return {OmegaConf.select(OmegaConf.load(CONF_DIR / group / f"{o}.yaml"), key) for o in options(group)}

    assert values("loss", "name") == set(LOSSES.names())
    assert values("rollout", "engine") == set(ENGINES.names())
    assert values("data", "name") == set(DATASETS.names())
    assert set(WARM_START_CORPORA.names()) <= set(DATASETS.names())  # sft.corpus=X pairs with data=X
    assert values("logger", "backend") == set(BACKENDS.names())
    assert values("protocol", "format") == set(CALL_FORMATS.names())
    assert {n for o in options("tools") for n in OmegaConf.load(CONF_DIR / "tools" / f"{o}.yaml").names} == set(
        TOOLS.names()
    )
    for option in options("reward"):  # every preset weighs every term, 0 included, so none is forgotten
        assert set(OmegaConf.load(CONF_DIR / "reward" / f"{option}.yaml").weights) == set(REWARD_TERMS.names())
    assert values("reward", "success") == set(SUCCESS_CRITERIA.names())
    presets = [compose_cfg(f"{g}={o}") for g in ("loss", "experiment") for o in options(g)]
    assert {cfg.algo.adv_estimator for cfg in presets} <= set(ADV_ESTIMATORS.names())


@pytest.mark.fast
def test_every_algorithm_is_documented():
    """docs/algorithms.md has a row for every registered loss, estimator, aggregation and KL estimator,
    and the config comments that list the options name them all."""
    from minirl.algos.advantages import ADV_ESTIMATORS
    from minirl.algos.kl import KL_ESTIMATORS
    from minirl.algos.losses import AGGREGATIONS, LOSSES

    docs = (ROOT / "docs" / "algorithms.md").read_text()
    config_yaml = (CONF_DIR / "config.yaml").read_text()
    for registry in (LOSSES, ADV_ESTIMATORS, AGGREGATIONS, KL_ESTIMATORS):
        for name in registry.names():
            assert f"`{name}`" in docs, f"{registry.kind} {name} is not in docs/algorithms.md"
    for name in [*LOSSES.names(), *ADV_ESTIMATORS.names()]:
        assert name in config_yaml, f"{name} is missing from the option comments in minirl/conf/config.yaml"


# what a hub model's preset decides beyond the model: its call format, budgets, lr and memory
MODEL_PRESET_SECTIONS = {"model", "protocol", "rollout", "trainer"}


@pytest.mark.fast
def test_only_experiment_search_debug_and_model_presets_reach_outside_their_group():
    """A group file sets its own section; presets that set several (`# @package _global_`), such as an
    algorithm's loss and algo.* together, are experiments (or a search, whose sweep is Hydra's, or the debug
    preset). A model preset may also set what its model decides (MODEL_PRESET_SECTIONS), and nothing else."""
    for group in set(GROUPS) - {"experiment", "hparams_search", "debug", "model"}:
        for option in options(group):
            assert "@package" not in (CONF_DIR / group / f"{option}.yaml").read_text(), f"{group}/{option}.yaml"
    for option in options("model"):
        text = (CONF_DIR / "model" / f"{option}.yaml").read_text()
        if "@package _global_" in text:
            assert set(yaml.safe_load(text)) <= MODEL_PRESET_SECTIONS, f"model/{option}.yaml"


@pytest.mark.fast
def test_algorithm_and_loss_presets_set_what_their_paper_needs():
    dr = compose_cfg("experiment=dr_grpo")
    assert dr.algo.adv_estimator == "dr_grpo" and dr.loss.agg == "seq-mean-token-sum-norm"
    assert dr.loss.max_tokens_norm == dr.rollout.max_turns * dr.rollout.max_new_tokens  # 0 resolves to the budget
    assert compose_cfg("experiment=dr_grpo", "loss.max_tokens_norm=500").loss.max_tokens_norm == 500
    assert compose_cfg("experiment=dr_grpo", "algo.adv_estimator=rloo").algo.adv_estimator == "rloo"  # the CLI wins
    dapo = compose_cfg("experiment=dapo")
    assert (dapo.loss.clip_low, dapo.loss.clip_high, dapo.loss.agg) == (0.2, 0.28, "token-mean")
    assert dapo.algo.dynamic_sampling and dapo.algo.overlong.value == "penalty"
    gspo = compose_cfg("loss=gspo")
    assert (gspo.loss.clip_low, gspo.loss.clip_high, gspo.loss.beta) == (3e-4, 4e-4, 0.0)
    assert compose_cfg("loss=cispo").loss.clip_low >= 1  # the paper's CISPO has no lower bound
    assert compose_cfg().algo.adv_estimator == "grpo"  # presets that do not name an estimator leave it alone


@pytest.mark.fast
def test_experiment_and_debug_presets_apply():
    cfg = compose_cfg("experiment=cispo_4turns", "debug=cpu")
    assert cfg.loss.name == "cispo" and cfg.rollout.max_turns == 4
    assert cfg.trainer.steps == 2 and cfg.logger.backend == "none"


@pytest.mark.fast
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("rollout.max_turns=0", "rollout.max_turns"),
        ("loss.clip_high=-0.1", "loss.clip_high"),
        ("loss.clip_ratio_c=1", "loss.clip_ratio_c: must be 0 \\(off\\) or > 1, got 1"),
        ("loss.beta=-1", "loss.beta"),
        ("loss.max_tokens_norm=-1", "loss.max_tokens_norm"),
        ("algo.kl_coef=-0.1", "algo.kl_coef"),
        ("trainer.steps=0", "trainer.steps"),
        ("rollout.temperature=0", "rollout.temperature"),
        ("rollout.temperature=1e-50", "rollout.temperature: must be >= 1e-05"),
        ("rollout.temperature=inf", "rollout.temperature: must be a finite number, got inf"),
        ("rollout.max_model_len=512", r"rollout.max_model_len: must be 0 \(derived\) or at least rollout.max_total_"),
        ("trainer.lr=inf", "trainer.lr: must be a finite number, got inf"),
        ("reward.weights.gt_hit=-inf", "reward.weights.gt_hit: must be a finite number, got -inf"),
        ("trainer.weight_decay=-1", "trainer.weight_decay: must be >= 0"),
        ("trainer.warmup_steps=-5", "trainer.warmup_steps: must be >= 0"),
        ("protocol.max_calls_per_turn=0", "protocol.max_calls_per_turn"),
        ("protocol.max_tool_output_tokens=0", "protocol.max_tool_output_tokens"),
        ("protocol.min_sample_room=0", "protocol.min_sample_room: must be > 0"),
        ("protocol.call_policy=strict_single", "protocol.max_calls_per_turn: must be 1 under call_policy=strict"),
    ],
)
def test_out_of_range_values_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        compose_cfg(override)


@pytest.mark.fast
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["trainer.async_rollout=true"],
            "a step-old sampler's log-probs are not pi_old: set algo.old_logprobs=recompute",
        ),
        (["experiment=async", "algo.max_staleness=0"], "algo.max_staleness: must be >= 1 under trainer.async_rollout"),
        (["experiment=async", "model.lora.r=8", "model.lora.dropout=0.1"], "set model.lora.dropout=0"),
    ],
)
def test_one_step_off_refuses_what_it_cannot_do_with_a_reason(overrides, message):
    with pytest.raises(ConfigError, match=message):
        compose_cfg(*overrides)
    assert compose_cfg("experiment=async").trainer.async_rollout


@pytest.mark.fast
@pytest.mark.parametrize(
    "override",
    [
        "rollout.max_turnz=3",
        "loss.beta=abc",
        "+trainer.stepz=1",
        "protocol.call_policy=several",
        "protocol.observation_cut=mid",
    ],
)
def test_wrong_keys_and_types_fail_at_composition(override):
    with pytest.raises(Exception, match=override.split("=")[0].lstrip("+").split(".")[-1]):
        compose_cfg(override)


@pytest.mark.fast
def test_typo_inside_a_group_file_fails(tmp_path):
    conf = tmp_path / "conf"
    subprocess.run(["cp", "-r", str(CONF_DIR), str(conf)], check=True)
    (conf / "loss" / "grpo.yaml").write_text("name: grpo\nclip_hgh: 0.3\n")
    with initialize_config_dir(config_dir=str(conf), version_base=None), pytest.raises(Exception, match="clip_hgh"):
        compose("config")


@pytest.mark.fast
def test_unknown_registry_names_list_the_known_ones():
    with pytest.raises(ConfigError, match="unknown loss 'nope'; known: cispo, grpo, gspo"):
        validate(compose_cfg("loss.name=nope"))
    with pytest.raises(ConfigError, match="unknown advantage estimator 'gae'; known: dr_grpo, grpo, reinforce_"):
        validate(compose_cfg("algo.adv_estimator=gae"))
    with pytest.raises(ConfigError, match="unknown kl estimator 'k4'; known: k1, k2, k3"):
        validate(compose_cfg("algo.kl_estimator=k4"))
    with pytest.raises(ConfigError, match="unknown tool 'rm_rf'"):
        validate(compose_cfg("tools.names=[rm_rf]"))
    with pytest.raises(ConfigError, match="reward term"):
        validate(compose_cfg("+reward.weights.bogus=1.0"))
    with pytest.raises(ConfigError, match="unknown success criterion 'boxed'; known: boxed_answer, gt_in_answer"):
        validate(compose_cfg("reward.success=boxed"))
    with pytest.raises(
        ConfigError,
        match="unknown tool-call format 'json'; known: deepseek_v3, harmony, hermes, llama3_json, qwen3_coder",
    ):
        validate(compose_cfg("protocol.format=json"))
    with pytest.raises(
        ConfigError, match="unknown sft.corpus 'nope'; known: jsonl, synthetic_math, synthetic_math_no_tool, synthetic_"
    ):
        validate(compose_cfg("sft.corpus=nope"))
    with pytest.raises(ConfigError, match="unknown loss aggregation 'bogus'; known: seq-mean-token-mean, seq-mean-t"):
        validate(compose_cfg("loss.agg=bogus"))


@pytest.mark.fast
def test_a_group_of_one_is_refused_where_the_baseline_is_the_group():
    with pytest.raises(ConfigError, match=r"^rollout.group_size: algo.adv_estimator=grpo compares each sample"):
        validate(compose_cfg("rollout.group_size=1"))
    validate(compose_cfg("rollout.group_size=1", "algo.adv_estimator=reinforce_plus_plus"))
    validate(compose_cfg("rollout.group_size=2"))


@pytest.mark.fast
def test_no_barrier_is_refused_on_an_engine_that_samples_every_turn_in_one_call():
    with pytest.raises(ConfigError, match=r"^rollout.barrier=false: the hf engine samples a turn of every live"):
        validate(compose_cfg("rollout=hf", "rollout.barrier=false"))
    validate(compose_cfg("rollout=torch", "rollout.barrier=false"))
    validate(compose_cfg("rollout=vllm", "rollout.barrier=false"))


@pytest.mark.fast
def test_unknown_group_option_is_one_line_with_the_options():
    with pytest.raises(ConfigError, match=r"unknown loss 'nope'; known: cispo, grpo, gspo$"):
        check_group_choices(["loss=nope"])
    check_group_choices(["loss=cispo", "-m", "loss=grpo,cispo", "rollout.max_turns=4", "experiment=null"])


@pytest.mark.fast
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.steps=1.5", "trainer.steps: Value '1.5' of type 'float' could not be converted to Integer"),
        ("model.dtype=int8", "model.dtype: Invalid value 'int8', expected one of [float32, bfloat16, float16]"),
        ("rollout.max_turnz=3", "rollout.max_turnz: Key 'max_turnz' not in 'RolloutConfig'"),
        ("trainer.nan_loss_steps=[abc]", "trainer.nan_loss_steps: Value 'abc' of type 'str' could not be converted"),
    ],
)
def test_a_value_of_the_wrong_type_is_one_line_naming_the_key(override, message):
    with pytest.raises(ConfigError) as error:
        check_value_overrides([override])
    assert str(error.value).startswith(message)
    # what Hydra itself handles passes: group choices, sweeps, additions, deletions, its own keys
    check_value_overrides(["-m", "loss=grpo,cispo", "trainer.steps=2", "+trainer.x=1", "~trainer.seed", "hydra.a=b"])


@pytest.mark.parametrize(
    "override", ["rollout.max_turns=0", "loss=nope", "protocol=nope", "trainer.device=nope", "trainer.steps=1.5"]
)
def test_cli_rejects_bad_config_with_one_line(override, tmp_path):
    cmd = [sys.executable, "-m", "minirl.train", override]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) == 1, lines
    assert override.split("=")[0] in lines[0] and any(word in lines[0] for word in ("known:", "must be", "Value"))


def _run_time_error_cases() -> list:
    cases = [
        ("data=jsonl data.path=missing.jsonl", "data error: missing.jsonl: cannot read it (No such file or directory)"),
        ("data=jsonl data.path=bad.jsonl", "data error: bad.jsonl:1: not valid JSON"),
        ("model.name_or_path=./no_such_checkpoint", "config error: model.name_or_path: no checkpoint directory"),
        ("model.name_or_path=empty_dir", "config error: model.name_or_path: 'empty_dir' holds no saved model"),
        ("reward.model.name_or_path=./no_such_rm", "config error: reward.model.name_or_path: no checkpoint directory"),
        ("tools=code", "config error: tools.names: the tasks offer calculate_math, get_current_time, "),
    ]
    if not torch.cuda.is_available():
        cases.append(("trainer.device=cuda", "config error: trainer.device=cuda: no cuda device here"))
    if importlib.util.find_spec("vllm") is None:  # the install hint's brackets must survive the console's markup
        cases.append(("rollout=vllm", 'config error: rollout=vllm needs vLLM: pip install -e ".[vllm]"'))
    return cases


@pytest.mark.parametrize(("overrides", "message"), _run_time_error_cases())
def test_cli_reports_bad_files_and_unusable_settings_in_one_line(overrides, message, tool_model_dir, tmp_path):
    """Errors found after the config is valid (a dataset file, a checkpoint, a device, an engine's package):
    one line naming the problem, exit status 2, no traceback."""
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    (tmp_path / "empty_dir").mkdir()
    model = [] if "model.name_or_path" in overrides else [f"model.name_or_path={tool_model_dir}"]
    cmd = [sys.executable, "-m", "minirl.train", *overrides.split(), *model, "logger=none", f"hydra.run.dir={tmp_path}"]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path, env={**os.environ, "COLUMNS": "80"}
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), lines


def test_cfg_job_prints_the_composed_config(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "minirl.train", "--cfg", "job", "loss=cispo"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 0
    printed = OmegaConf.create(proc.stdout)
    assert printed.loss.name == "cispo" and printed.rollout.engine == "torch" and printed.protocol.format == "hermes"


COMMANDS = ["train", "eval", "serve", "sft"]


@pytest.mark.fast
@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_names_a_job_that_exists(command):
    """The shells name their job as a dotted path (imported late, after the config is valid): a typo would
    surface only at run time, so resolve each one here."""
    (job,) = re.findall(r'cli\("([\w.]+:\w+)"\)', (ROOT / "minirl" / f"{command}.py").read_text())
    module, name = job.split(":")
    assert callable(getattr(importlib.import_module(module), name)), job


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_runs_under_its_own_hydra_job_name(command, tmp_path):
    """From a directory without configs (the packaged tree is found from anywhere), and named after the command,
    not the shared entry helper: hydra.job.name names the run directory's log file."""
    proc = subprocess.run(
        [sys.executable, "-m", f"minirl.{command}", "--cfg", "hydra"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert OmegaConf.create(proc.stdout).hydra.job.name == command


def test_imports_registers_reward_terms_losses_estimators_and_datasets_too(tmp_path):
    """`imports` is the one hook: a user module's reward term, loss, advantage estimator and dataset resolve by
    name like ours (checked in a fresh interpreter, so the registrations do not leak into other tests)."""
    (tmp_path / "user_parts.py").write_text(
        "from minirl.algos.advantages import ADV_ESTIMATORS\n"
        "from minirl.algos.losses import LOSSES\n"
        "from minirl.data import DATASETS\n"
        "from minirl.rewards import REWARD_TERMS\n"
        "REWARD_TERMS.register('user_brevity')(lambda traj: -len(traj.response_ids) / 100)\n"
        "LOSSES.register('user_loss')(LOSSES.get('grpo'))\n"
        "ADV_ESTIMATORS.register('user_adv')(ADV_ESTIMATORS.get('rloo'))\n"
        "DATASETS.register('user_data')(DATASETS.get('synthetic_tools'))\n"
    )
    chosen = ["loss.name=user_loss", "algo.adv_estimator=user_adv", "data.name=user_data"]
    chosen.append("+reward.weights.user_brevity=0.1")
    script = (
        "import sys\n"
        "from hydra import compose, initialize_config_dir\n"
        "from minirl.config import register_configs, to_config\n"
        "from minirl.entry import CONF_DIR\n"
        "from minirl.errors import ConfigError\n"
        "from minirl.validate import validate\n"
        "register_configs()\n"
        "with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):\n"
        "    cfg = to_config(compose('config', overrides=sys.argv[1:]))\n"
        "try:\n"
        "    validate(cfg)\n"
        "except ConfigError as err:\n"
        "    sys.exit(f'config error: {err}')\n"
    )
    run = partial(subprocess.run, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    without = run([sys.executable, "-c", script, *chosen])
    assert without.returncode == 1 and "config error: unknown" in without.stderr
    with_imports = run([sys.executable, "-c", script, "imports=[user_parts]", *chosen])
    assert with_imports.returncode == 0, with_imports.stderr[-2000:]
