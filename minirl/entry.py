"""What every command-line entry point shares (`cli`): fail fast with one clear line on a bad config, convert the
composed config once to typed dataclasses, point it at the Hydra run directory, record the job there (job.json,
minirl/sweep.py: what a multirun does with failed, finished and interrupted jobs), and only then load the job."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from rich.console import Console
from rich.markup import escape

from minirl.config import Config, register_configs, to_config
from minirl.errors import ConfigError, DataError
from minirl.sweep import Job, swept_keys

# errors in what the user gave (config values, dataset files): one line and exit status 2, no traceback
USER_ERRORS = {ConfigError: "config error", DataError: "data error"}

CONF_DIR = Path(__file__).resolve().parent / "conf"  # package data: installed with the code, found from any directory


def check_group_choices(argv: list[str], conf_dir: Path = CONF_DIR) -> None:
    """Reject `group=option` overrides whose option file does not exist, before Hydra starts,
    with one line naming the group and the valid options (Hydra's own message spans several)."""
    groups = {p.name for p in conf_dir.iterdir() if p.is_dir()}
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            continue
        key, value = arg.split("=", 1)
        key = key.lstrip("+~")
        if key not in groups or value in ("null", ""):
            continue
        options = sorted(p.stem for p in (conf_dir / key).glob("*.yaml"))
        for choice in value.split(","):  # multirun sweeps list several
            if choice not in options:
                raise ConfigError(f"unknown {key} '{choice}'; known: {', '.join(options)}")


def check_value_overrides(argv: list[str], conf_dir: Path = CONF_DIR) -> None:
    """Set each plain `key=value` override on the schema before Hydra starts, so that a wrong type, a value
    outside an enum or a key the schema lacks is one line naming the key (Hydra's own message spans several).
    Group choices, sweeps, `+`/`~` edits, packages and hydra.* keys are left to Hydra."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from hydra.errors import HydraException

    groups = {p.name for p in conf_dir.iterdir() if p.is_dir()}
    try:
        overrides = OverridesParser.create().parse_overrides([a for a in argv if "=" in a and not a.startswith("-")])
    except HydraException:  # a syntax error: Hydra names it
        return
    schema = OmegaConf.structured(Config)
    for override in overrides:
        key = override.key_or_group
        if override.type is not OverrideType.CHANGE or override.is_sweep_override() or override.package is not None:
            continue
        if key in groups or key.split(".")[0].split("/")[0] == "hydra":  # hydra.run.dir, hydra/launcher=joblib
            continue
        try:
            OmegaConf.update(schema, key, override.value(), merge=True)
        except OmegaConfBaseException as err:
            raise ConfigError(f"{key}: {str(err).splitlines()[0]}") from None


def cli(job: str) -> None:
    """The whole of `python -m minirl.<command> [overrides]`: the fast checks of group options and values, then
    Hydra on the packaged config tree (multirun `-m`, `--cfg job` and Hydra's other flags included), then `job`,
    "package.module:function", called as function(cfg, console) with the typed config.

    `job` is a dotted path, imported only once the config is valid, so that a config error is one line with exit
    status 2 before torch and the library load."""
    register_configs()
    try:
        check_group_choices(sys.argv[1:])
        check_value_overrides(sys.argv[1:])
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        sys.exit(2)

    command, swept = Path(sys.argv[0]).stem, swept_keys(sys.argv[1:])

    # a closure, so that the launchers that run jobs in other processes (joblib, submitit) carry what it needs
    def main(dict_cfg: DictConfig) -> float | None:
        return run_job(dict_cfg, job, command, swept)

    # Hydra names the job (hydra.job.name, the run directory's <name>.log) after its function's module: make that
    # the command's (train, eval, serve, sft), not this helper's
    main.__module__ = f"minirl.{command}"
    hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")(main)()


def run_job(dict_cfg: DictConfig, job: str, command: str = "", swept: Sequence[str] = ()) -> float | None:
    """Convert the composed config, point it at the Hydra run directory and run `job` ("module:function") on it,
    recorded in the run directory's job.json; returns the job's objective (sweep.objective) for the sweeper. A
    multirun job that finished before is skipped, one that was interrupted resumes (minirl/sweep.py). A user error
    (a config value, a dataset file) is one line and exit status 2, no traceback; in a multirun it fails the job
    and the sweep goes on."""
    console = Console()
    run = Job.from_hydra(HydraConfig.get(), command, swept)
    try:
        cfg = to_config(dict_cfg)
        cfg.output_dir = str(run.run_dir)
        if run.prepare(cfg, console):  # finished before, in a rerun of the sweep
            return run.skipped_objective
        run.start()
        from transformers.utils import logging as hf_logging  # slow to import: only once the config is valid

        hf_logging.disable_progress_bar()  # the console shows our own progress; keep it readable
        module, _, name = job.partition(":")
        # late on purpose: the job's module loads torch and the library, which a config error should not wait for
        function = getattr(importlib.import_module(module), name)
        function(cfg, console)
        return run.finish(cfg.sweep)
    except tuple(USER_ERRORS) as err:
        run.fail(err, console)  # in a multirun it says so on the console
        if run.multirun:
            raise  # Hydra records the job as failed and runs the others
        label = next(label for kind, label in USER_ERRORS.items() if isinstance(err, kind))
        console.print(f"[bold red]{label}:[/] {escape(str(err))}", highlight=False, soft_wrap=True)  # one line
        sys.exit(2)
    except BaseException as err:
        run.fail(err, console)
        raise
