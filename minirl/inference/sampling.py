"""Top-k / top-p filtering shared by the trainer's log-prob recomputation and the samplers, and the draw
the samplers make from the filtered distribution."""

from __future__ import annotations

import math

import torch

from minirl.config import GREEDY_BELOW


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
    scaled = logits / temperature
    if top_k > 0 or top_p < 1:
        removed = outside_top_k_top_p(scaled, top_p, top_k)
        if kept is not None:
            removed.scatter_(-1, kept.unsqueeze(-1), False)
        scaled = scaled.masked_fill(removed, -torch.inf)
    return scaled


def draw(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:  # [B, V] -> [B]
    """One token per row of `probs` (non-negative, rows need not sum to 1) by inverse-CDF sampling: a
    uniform draw located in the row's cumulative sum. Same distribution as `torch.multinomial(probs, 1)`,
    several times faster on CPU (multinomial draws an exponential variate for every entry). A token of
    probability 0 is never drawn: the row's CDF is scaled to end at exactly 1 and the search is strict."""
    cdf = probs.cumsum(dim=-1)  # [B, V]
    cdf = cdf / cdf[:, -1:]
    u = torch.rand((probs.shape[0], 1), generator=generator, device=probs.device, dtype=cdf.dtype)  # [B, 1] in [0, 1)
    return torch.searchsorted(cdf, u, right=True).squeeze(-1)
