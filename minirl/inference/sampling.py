"""How a row samples: `SamplingParams`, the one spelling of the sampling settings for the rollout engines,
the server and the trainer's log-probs; the top-k / top-p filter (`warped`) they all apply; and the draw
(`sample_tokens`, `draw`) the decoding loop makes from the filtered distribution."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from minirl.config import GREEDY_BELOW

if TYPE_CHECKING:
    from minirl.config import RolloutConfig


def is_greedy(temperature: float) -> bool:
    """Whether a sampler given `temperature` decodes greedily: at 0, and below GREEDY_BELOW."""
    return temperature < GREEDY_BELOW


def outside_top_k_top_p(
    logits: torch.Tensor,  # [..., V] already divided by the temperature
    top_p: float,
    top_k: int,  # 0 = off
) -> torch.Tensor:  # [..., V] bool, True for tokens the sampler could not draw
    """HF generate's TopKLogitsWarper then TopPLogitsWarper (vLLM filters the same way): top-k keeps the k
    largest logits (ties included); top-p then drops the smallest tokens whose cumulative probability,
    renormalised over what top-k kept, stays <= 1 - top_p, always keeping the largest."""
    removed = torch.zeros_like(logits, dtype=torch.bool)
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[..., -1:]  # [..., 1]
        removed = logits < kth
    if top_p < 1:
        ascending, order = torch.sort(logits.masked_fill(removed, -math.inf), dim=-1)
        drop = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p  # [..., V] in ascending order
        drop[..., -1] = False
        removed = removed | drop.scatter(-1, order, drop)
    return removed


def warped(
    logits: torch.Tensor,  # [..., V]
    temperature: float,  # >= GREEDY_BELOW
    top_p: float,
    top_k: int,
    kept: torch.Tensor | None = None,  # [...] a token id per row that stays in whatever the filter says
) -> torch.Tensor:  # [..., V]
    """What a sampler draws from, as logits: divided by `temperature`, then -inf outside top-k / top-p.
    `kept` is for scoring tokens that were sampled: they lay in the sampler's kept set, so a rounding
    difference at the set's edge must not give one of them log-prob -inf."""
    scaled = logits if temperature == 1.0 else logits / temperature  # x / 1 == x: no [..., V] copy
    if top_k > 0 or top_p < 1:
        removed = outside_top_k_top_p(scaled, top_p, top_k)
        if kept is not None:
            removed.scatter_(-1, kept.unsqueeze(-1), False)
        scaled = scaled.masked_fill(removed, -torch.inf)
    return scaled


Generators = torch.Generator | Sequence[torch.Generator] | None


def draw(probs: torch.Tensor, generator: Generators = None) -> torch.Tensor:  # [B, V] -> [B]
    """One token per row of `probs` (non-negative, rows need not sum to 1) by inverse-CDF sampling: a
    uniform draw located in the row's cumulative sum. Same distribution as `torch.multinomial(probs, 1)`,
    several times faster on CPU (multinomial draws an exponential variate for every entry). A token of
    probability 0 is never drawn: the row's CDF is scaled to end at exactly 1 and the search is strict.
    `generator`: one for the whole batch (its uniforms in row order; None = the global RNG), or a sequence of
    one per row, each row's uniform drawn from its own."""
    cdf = probs.cumsum(dim=-1)  # [B, V]
    cdf = cdf / cdf[:, -1:]
    if generator is None or isinstance(generator, torch.Generator):
        u = torch.rand((probs.shape[0], 1), generator=generator, device=probs.device, dtype=cdf.dtype)  # [B, 1]
    else:
        u = torch.cat([torch.rand((1, 1), generator=g, device=probs.device, dtype=cdf.dtype) for g in generator])
    return torch.searchsorted(cdf, u, right=True).squeeze(-1)


ENTROPY_ELEMENTS = 1 << 24  # probabilities SamplingParams.entropy holds at once: 64 MiB of float32


@dataclass
class SamplingParams:
    """How one row samples and when it stops. temperature 0 (or below GREEDY_BELOW, minirl/config.py) = greedy.

    `seed` seeds the draws. A rollout engine seeds the global torch RNG with it once per generate call, so
    every prompt of the call draws from that one stream; the server gives each of its rows a torch.Generator
    of its own, seeded with it (None: a fresh random seed), so a seeded row draws the same tokens whatever it
    is batched with. `stop` is text: the server ends a row's text before the first occurrence of any of them
    (and vLLM's rollouts take them); the module engines, which work on tokens only, refuse them."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None
    stop: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, cfg: RolloutConfig, temperature: float, seed: int | None = None) -> SamplingParams:
        """The rollout's per-turn token limit, top-p and top-k at `temperature`."""
        return cls(cfg.max_new_tokens, temperature, cfg.top_p, cfg.top_k, seed)

    @property
    def greedy(self) -> bool:
        return is_greedy(self.temperature)

    def logits(
        self,
        logits: torch.Tensor,  # [..., V]
        kept: torch.Tensor | None = None,  # [...] a token id per row that stays in whatever the filter says
    ) -> torch.Tensor:  # [..., V]
        """The logits of the distribution a row with these settings draws from: `warped` (temperature, then
        top-k and top-p); under greedy decoding the raw logits, as generate scores them (`kept`: see `warped`).
        Without a filter at temperature 1 they are `logits` itself, no copy."""
        return logits if self.greedy else warped(logits, self.temperature, self.top_p, self.top_k, kept)

    def logprobs(self, logits: torch.Tensor, kept: torch.Tensor | None = None) -> torch.Tensor:  # [..., V] -> [..., V]
        """Log-probs of that distribution (`logits`), renormalised: what the sampler reports."""
        return self.logits(logits, kept).log_softmax(dim=-1)

    def token_logprobs(self, logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:  # [..., V], [...] -> [...]
        """The log-probs of `tokens` under that distribution, as `logprobs` gathered at them, without making
        the [..., V] log-softmax: the token's logit minus the row's logsumexp (whose backward makes the one
        softmax it needs). What the trainer scores sampled tokens with."""
        scaled = self.logits(logits, kept=tokens)
        return scaled.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - scaled.logsumexp(dim=-1)

    @torch.no_grad()
    def entropy(
        self,
        logits: torch.Tensor,  # [B, T, V]
        tokens: torch.Tensor,  # [B, T] the tokens sampled (`kept`)
        mask: torch.Tensor,  # [B, T] weight of each position
    ) -> torch.Tensor:  # []
        """The mask-weighted sum of that distribution's entropy over the positions, ENTROPY_ELEMENTS of the
        [B, T, V] probabilities at a time (filtered tokens have probability 0, and entr(0) = 0)."""
        rows = max(1, ENTROPY_ELEMENTS // max(1, logits.shape[1] * logits.shape[2]))
        total = logits.new_zeros((), dtype=torch.float32)
        for chunk, chunk_tokens, chunk_mask in zip(logits.split(rows), tokens.split(rows), mask.split(rows)):
            probs = self.logprobs(chunk.float(), kept=chunk_tokens).exp_()  # [b, T, V]
            total += (torch.special.entr(probs).sum(dim=-1) * chunk_mask).sum()
        return total


def sample_tokens(
    logits: torch.Tensor,  # [B, V] float32
    params: SamplingParams,
    generator: Generators = None,  # None: the global torch RNG; a sequence: one per row (`draw`)
) -> tuple[torch.Tensor, torch.Tensor]:  # [B] tokens, [B] their log-probs
    """One token per row of `logits` and its log-prob under the distribution it was drawn from
    (`SamplingParams.logprobs`): the argmax under greedy decoding, else one `draw` for the whole batch."""
    logprobs = params.logprobs(logits)  # [B, V]
    tokens = logits.argmax(dim=-1) if params.greedy else draw(logprobs.exp(), generator)  # [B]
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)
