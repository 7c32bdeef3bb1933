"""Top-k / top-p filtering shared by the trainer's log-prob recomputation and the server's sampler."""

from __future__ import annotations

import math

import torch


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
