"""Every registry name in a config resolved before any model loads, so a typo is one line at start-up rather
than a crash minutes into a run. Every entry point (train, sft, eval, serve) calls `validate` first.

The modules named by `imports` are imported here first: a user module's `@tool` functions, reward terms
(`REWARD_TERMS.register`), losses, advantage estimators or datasets are then known by name like ours.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from minirl.algos.advantages import ADV_ESTIMATORS, GROUP_BASELINE
from minirl.algos.kl import KL_ESTIMATORS
from minirl.algos.losses import AGGREGATIONS, LOSSES
from minirl.config import Config
from minirl.data import DATASETS, WARM_START_CORPORA
from minirl.distributed.strategies import STRATEGIES
from minirl.errors import ConfigError
from minirl.models.loading import check_checkpoint
from minirl.protocol.formats import CALL_FORMATS
from minirl.rewards import SUCCESS_CRITERIA, check_caps, check_weights
from minirl.rollout.engine import ENGINES
from minirl.tools import TOOLS
from minirl.tracking import BACKENDS


def import_user_modules(modules: Iterable[str]) -> None:
    """Import the modules named by `imports`, so that what they register is known. Python imports each module
    once; a failure raises ConfigError naming the module."""
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as err:
            hint = ""
            if isinstance(err, ModuleNotFoundError) and err.name and f"{module}.".startswith(f"{err.name}."):
                hint = "; run from the folder that holds it or add that folder to PYTHONPATH"
            raise ConfigError(f"imports: cannot import '{module}': {type(err).__name__}: {err}{hint}") from err


def validate(cfg: Config) -> None:
    """Resolve every registry name in the config; runs before any model loads."""
    import_user_modules(cfg.imports)  # what they register is known before the names resolve
    for name in cfg.tools.names:
        TOOLS.get(name).check_config(cfg.tools)
    check_weights(cfg.reward.weights)
    check_caps(cfg.reward.caps)
    if cfg.reward.model.name_or_path is not None:  # a reward model's local path that is not there
        check_checkpoint(cfg.reward.model.name_or_path, "reward.model.name_or_path")
    SUCCESS_CRITERIA.get(cfg.reward.success)
    LOSSES.get(cfg.loss.name)
    AGGREGATIONS.get(cfg.loss.agg)
    KL_ESTIMATORS.get(cfg.loss.kl_estimator)
    KL_ESTIMATORS.get(cfg.algo.kl_estimator)
    ADV_ESTIMATORS.get(cfg.algo.adv_estimator)
    if cfg.algo.adv_estimator in GROUP_BASELINE and cfg.rollout.group_size < 2:
        raise ConfigError(
            f"rollout.group_size: algo.adv_estimator={cfg.algo.adv_estimator} compares each sample with the rest of "
            "its group, so a group of 1 never learns; use >= 2 or algo.adv_estimator=reinforce_plus_plus"
        )
    engine = ENGINES.get(cfg.rollout.engine)
    if not cfg.rollout.barrier and not hasattr(engine, "session"):  # no decoding loop that rows join (agent_loop)
        raise ConfigError(
            f"rollout.barrier=false: the {cfg.rollout.engine} engine samples a turn of every live trajectory in one "
            "call, so no trajectory can join while others decode; use rollout=torch or rollout=vllm, or keep the "
            "barrier"
        )
    STRATEGIES.get(cfg.trainer.strategy)
    DATASETS.get(cfg.data.name)
    WARM_START_CORPORA.get(cfg.sft.corpus)
    BACKENDS.get(cfg.logger.backend)
    CALL_FORMATS.get(cfg.protocol.format)
