"""Where evaluation trajectories come from: `eval.backend` names one of EVAL_BACKENDS.

    local   model.name_or_path loaded in this process, run through the training agent loop (run_agent)
    openai  any OpenAI-compatible endpoint (eval.base_url), run through a message-level loop (chat_loop)

A backend is built from the config (loading what it needs) and returns `eval.samples` trajectories per
task, the samples of one task contiguous, with `group_index` the task's position in the list.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Protocol

from rich.console import Console

from minirl.bootstrap import model_path
from minirl.config import Config
from minirl.data.task import Task
from minirl.errors import ConfigError
from minirl.models.loading import load_model, load_tokenizer
from minirl.registry import Registry
from minirl.rollout.agent_loop import AgentLimits, run_agent
from minirl.rollout.engine import SamplingParams, build_engine
from minirl.rollout.trajectory import Trajectory
from minirl.runtime import resolve_device
from minirl.tools import ToolExecutor


class EvalBackend(Protocol):
    model: str  # the model the report names

    def run(self, tasks: list[Task]) -> list[Trajectory]:
        """`eval.samples` trajectories per task, contiguous, in task order."""


EVAL_BACKENDS: Registry[Callable[[Config, Console], EvalBackend]] = Registry("eval backend")


@EVAL_BACKENDS.register("local")
class LocalBackend:
    """The policy at model.name_or_path (`tiny` = the embedded warm-started model) through exactly the training
    agent loop: the rollout engine, limits and protocol of the config; eval.samples trajectories per task at
    eval.temperature (0 = greedy), the sampler seeded by eval.seed."""

    def __init__(self, cfg: Config, console: Console) -> None:
        device = resolve_device(cfg.trainer.device)
        path = model_path(cfg, console)
        self.tokenizer = load_tokenizer(path, cfg)
        policy = load_model(path, cfg, device, trainable=False)
        self.engine = build_engine(cfg.rollout, policy, self.tokenizer, device, path)
        self.executor = ToolExecutor.from_config(cfg.tools)
        self.cfg = cfg
        self.model = cfg.model.name_or_path

    def run(self, tasks: list[Task]) -> list[Trajectory]:
        cfg = self.cfg
        sampling = SamplingParams.from_config(cfg.rollout, cfg.eval.temperature, seed=cfg.eval.seed)
        limits = AgentLimits.from_config(cfg.rollout)
        return run_agent(
            self.engine, self.tokenizer, self.executor, tasks, cfg.eval.samples, limits, sampling, cfg.protocol
        )


@EVAL_BACKENDS.register("openai")
class OpenAIBackend:
    """An OpenAI-compatible endpoint at eval.base_url, asked for eval.model_id (default: the first model it
    lists), through the message-level loop of chat_loop.py with eval.concurrency conversations in flight."""

    def __init__(self, cfg: Config, console: Console) -> None:
        if cfg.eval.base_url is None:
            raise ConfigError("eval.base_url: the openai backend needs an endpoint (eval.base_url=http://HOST:PORT/v1)")
        if importlib.util.find_spec("openai") is None:
            raise ConfigError("eval.backend=openai needs the openai client: pip install -e '.[serve]'")
        from minirl.evaluation.chat_loop import connect, first_model  # late: it needs the optional openai client

        self.client = connect(cfg.eval.base_url, cfg.eval.api_key)
        self.model = cfg.eval.model_id or first_model(self.client)
        self.executor = ToolExecutor.from_config(cfg.tools)
        self.cfg = cfg

    def run(self, tasks: list[Task]) -> list[Trajectory]:
        from minirl.evaluation.chat_loop import run_chat_agent  # late: it needs the optional openai client

        cfg = self.cfg
        sampling = SamplingParams.from_config(cfg.rollout, cfg.eval.temperature, seed=cfg.eval.seed)
        limits = AgentLimits.from_config(cfg.rollout)
        return run_chat_agent(
            self.client, self.model, self.executor, tasks, cfg.eval.samples, limits, sampling, cfg.protocol,
            cfg.eval.concurrency,
        )  # fmt: skip
