"""Gradient accumulation: micro-batch losses weighted by `micro_batch_share` give the same
gradient as one full batch, for every aggregation mode, with and without rollout IS weights. (The
trainer's mini-batches are such full batches; tests/test_train.py checks its accumulation end to end.)"""

from __future__ import annotations

import pytest
import torch

from minirl.algos.losses import AGGREGATIONS, LOSSES, micro_batch_share
from minirl.config import LossConfig

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("agg", AGGREGATIONS.names())
@pytest.mark.parametrize("loss_name", LOSSES.names())
@pytest.mark.parametrize("weighted", [False, True])
def test_micro_batches_sum_to_the_full_batch_gradient(agg, loss_name, weighted):
    torch.manual_seed(0)
    B, T = 6, 9
    logp = (-torch.rand(B, T) * 3).requires_grad_()
    old = (logp.detach() + 0.1 * torch.randn(B, T)).clamp(max=0)
    ref = (logp.detach() + 0.1 * torch.randn(B, T)).clamp(max=0)
    adv = torch.randn(B)
    mask = (torch.rand(B, T) > 0.3).float()
    mask[2] = 0  # a trajectory with no sampled token
    mask[5] = 0  # and a micro-batch with none at all
    cfg = LossConfig(name=loss_name, beta=0.05, agg=agg, max_tokens_norm=7)
    loss_fn = LOSSES.get(loss_name)
    weights = 0.5 + 1.5 * torch.rand(B, T) if weighted else None  # [B, T] rollout IS weights
    extra = (lambda rows: {"is_weights": weights[rows]}) if weighted else (lambda rows: {})

    full = loss_fn(logp, old, ref, adv, mask, cfg, **extra(slice(None))).loss
    (full_grad,) = torch.autograd.grad(full, logp)

    total = torch.zeros(())
    for rows in (slice(0, 2), slice(2, 5), slice(5, 6)):
        part = loss_fn(logp[rows], old[rows], ref[rows], adv[rows], mask[rows], cfg, **extra(rows)).loss
        total = total + part * micro_batch_share(mask[rows], mask, agg)
    (micro_grad,) = torch.autograd.grad(total, logp)
    assert torch.allclose(total, full, atol=1e-6)
    assert torch.allclose(micro_grad, full_grad, atol=1e-5)
