"""The rollout-engine interface and its registry. Sampling settings are `minirl.inference.sampling.SamplingParams`
(re-exported here); a turn ends on any of `minirl.inference.loop.end_of_turn_ids`."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from minirl.inference.loop import end_of_turn_ids
from minirl.inference.sampling import SamplingParams
from minirl.registry import Registry

if TYPE_CHECKING:
    from minirl.config import RolloutConfig

__all__ = ["ENGINES", "Completion", "Engine", "ModuleEngine", "SamplingParams", "build_engine", "sequence_logprobs"]


@dataclass
class Completion:
    """One sampled continuation of one prompt."""

    token_ids: list[int]  # [T] sampled tokens, the end-of-turn token included when produced
    logprobs: list[float]  # [T] log-prob of each sampled token under the distribution it was drawn from
    stopped: bool  # True if it ended with an end-of-turn token, False if it hit max_new_tokens


class Engine(Protocol):
    end_ids: frozenset[int]  # the tokens that end a turn (end_of_turn_ids); not part of the turn's text

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """One completion per prompt, in order."""

    def sync_weights(self, model) -> None:
        """Make the next generate() sample from `model`'s current weights."""

    def detach(self) -> None:
        """From now on sample from weights of the engine's own, which only sync_weights changes, so that the
        trained module can change while a rollout runs (trainer.async_rollout)."""

    def free_memory(self) -> None:
        """Called after a rollout, before the update: free what sampling holds that training could use (vLLM on
        CUDA sleeps); the next sync_weights restores it."""

    def score(self, token_ids: list[int]) -> torch.Tensor:
        """[T - 1] log p(token_ids[t] | token_ids[:t]) for t >= 1 under the weights the engine samples from, of
        the raw distribution (temperature 1, no top-k/top-p); draws no random numbers."""


@torch.no_grad()
def sequence_logprobs(model, token_ids: list[int], device: torch.device) -> torch.Tensor:
    """[T - 1] log p(token_ids[t] | token_ids[:t]) under `model`'s raw distribution, in fp32, on the CPU; the
    module is in eval mode for the forward pass, then back in the mode it was in."""
    was_training = model.training
    model.eval()
    try:
        ids = torch.tensor([token_ids], device=device)
        logits = model(ids).logits[0, :-1].float()
    finally:
        model.train(was_training)
    return logits.log_softmax(dim=-1).gather(-1, ids[0, 1:, None]).squeeze(-1).cpu()


class ModuleEngine:
    """Base of the engines that sample on the trained module itself (CPU or one GPU): a weight sync has
    nothing to copy (once detached, it copies the weights into the engine's own module), and the module samples
    in eval mode, then goes back to the mode it was in. They work
    on tokens only: text stop strings (`SamplingParams.stop`) are refused."""

    def __init__(self, model, tokenizer, device: torch.device, **_: object) -> None:
        self.model = model
        self.device = device
        self.end_ids = end_of_turn_ids(tokenizer, model)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.detached = False  # True: self.model is a copy of the trained module, refreshed by sync_weights

    def sync_weights(self, model) -> None:
        if self.detached:
            self.model.load_state_dict(model.state_dict())
        else:
            self.model = model

    def detach(self) -> None:
        """A copy of the module to sample from (Engine.detach): the trained module's memory once more."""
        if not self.detached:
            self.model, self.detached = copy.deepcopy(self.model), True

    def free_memory(self) -> None:
        pass  # generate holds nothing past its call

    def score(self, token_ids: list[int]) -> torch.Tensor:
        return sequence_logprobs(self.model, token_ids, self.device)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        if params.stop:
            raise ValueError(
                f"{type(self).__name__} stops on end-of-turn tokens only, not on the stop strings {params.stop}"
            )
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
    """The configured engine (`rollout.engine`) sampling from `model`, loaded from `model_path`; an engine reads
    what it needs of `cfg` (vllm: its memory share and context length)."""
    return ENGINES.get(cfg.engine)(model, tokenizer, device, model_path=model_path, config=cfg)
