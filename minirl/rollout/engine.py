"""The rollout-engine interface and its registry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from minirl.registry import Registry

if TYPE_CHECKING:
    from minirl.config import RolloutConfig


@dataclass
class SamplingParams:
    """Sampling for one generate call. temperature 0 = greedy."""

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


ENGINES: Registry[type] = Registry("rollout engine")


def build_engine(cfg: RolloutConfig, model, tokenizer, device, model_path: str) -> Engine:
    """The configured engine (`rollout.engine`) sampling from `model`, loaded from `model_path`."""
    return ENGINES.get(cfg.engine)(
        model, tokenizer, device, model_path=model_path, gpu_memory_utilization=cfg.gpu_memory_utilization
    )
