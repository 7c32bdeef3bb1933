"""The rollout-engine interface and its registry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from minirl.registry import Registry

if TYPE_CHECKING:
    from minirl.config import RolloutConfig


@dataclass
class SamplingParams:
    """Sampling for one generate call. temperature 0 (or below GREEDY_BELOW, minirl/config.py) = greedy."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None

    @classmethod
    def from_config(cls, cfg: RolloutConfig, temperature: float, seed: int | None = None) -> SamplingParams:
        """The rollout's per-turn token limit, top-p and top-k at `temperature`."""
        return cls(cfg.max_new_tokens, temperature, cfg.top_p, cfg.top_k, seed)


@dataclass
class Completion:
    """One sampled continuation of one prompt."""

    token_ids: list[int]  # [T] sampled tokens, the end-of-turn token included when produced
    logprobs: list[float]  # [T] log-prob of each sampled token under the distribution it was drawn from
    stopped: bool  # True if it ended with the end-of-turn token, False if it hit max_new_tokens


class Engine(Protocol):
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """One completion per prompt, in order."""

    def sync_weights(self, model) -> None:
        """Make the next generate() sample from `model`'s current weights."""


class ModuleEngine:
    """Base of the engines that sample on the trained module itself (CPU or one GPU): a weight sync has
    nothing to copy, and the module samples in eval mode, then goes back to the mode it was in."""

    def __init__(self, model, tokenizer, device: torch.device, **_: object) -> None:
        self.model = model
        self.device = device
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id

    def sync_weights(self, model) -> None:
        self.model = model

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        if not prompts:
            return []
        if params.seed is not None:
            torch.manual_seed(params.seed)
        was_training = self.model.training
        self.model.eval()
        try:
            return self.sample(prompts, params)
        finally:
            self.model.train(was_training)

    def sample(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """One completion per prompt (at least one prompt), in order, from the eval-mode module."""
        raise NotImplementedError


ENGINES: Registry[type] = Registry("rollout engine")


def build_engine(cfg: RolloutConfig, model, tokenizer, device, model_path: str) -> Engine:
    """The configured engine (`rollout.engine`) sampling from `model`, loaded from `model_path`."""
    return ENGINES.get(cfg.engine)(
        model, tokenizer, device, model_path=model_path, gpu_memory_utilization=cfg.gpu_memory_utilization
    )
