"""Small exact statistics on outcomes, with no tensors: the paired sign test of tasks gained and lost, and the
mean and spread of a few replicate runs. The trainer, the evaluation comparison and the sweep report share them.

    sign_test_p(14, 4)          # 0.031: two-sided, 14 tasks gained and 4 lost
    mean_sd([0.30, 0.34, 0.32]) # (0.32, 0.02): the sample standard deviation (n - 1); None for one value
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import fmean, stdev


def sign_test_p(wins: int, losses: int) -> float:
    """Two-sided exact sign test: the probability, when each of the wins + losses discordant tasks is a fair
    coin, of a split at least as uneven as this one (McNemar's exact test for one sample per task)."""
    n = wins + losses
    tail = sum(math.comb(n, k) for k in range(min(wins, losses) + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired_split(before: Sequence[float], after: Sequence[float]) -> tuple[int, int]:
    """Task by task (the same order in both): (tasks `after` scores higher on, tasks `before` scores higher on)."""
    pairs = list(zip(before, after, strict=True))
    return sum(b > a for a, b in pairs), sum(a > b for a, b in pairs)


def mean_sd(values: Sequence[float]) -> tuple[float, float | None]:
    """(mean, sample standard deviation) of at least one value; the deviation is None for a single value."""
    if not values:
        raise ValueError("mean_sd needs at least one value")
    return fmean(values), stdev(values) if len(values) > 1 else None
