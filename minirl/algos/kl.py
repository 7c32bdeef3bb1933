"""Per-token estimators of KL(pi || pi_ref) from log-probs of tokens sampled from pi.

With d = ref_logp - logp = log(pi_ref / pi) at a token x ~ pi (Schulman, "Approximating KL
Divergence", 2020):

- k1 = -d                     unbiased, high variance, can be negative
- k2 = d^2 / 2                biased, low variance, >= 0
- k3 = exp(d) - d - 1         unbiased (E_pi[exp(d)] = 1), low variance, >= 0; GRPO's choice

Every estimator maps logp [B, T], ref_logp [B, T] -> [B, T]; masking is the caller's job.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from minirl.registry import Registry

KLEstimator = Callable[[Tensor, Tensor], Tensor]
KL_ESTIMATORS: Registry[KLEstimator] = Registry("kl estimator")


@KL_ESTIMATORS.register("k1")
def kl_k1(
    logp: Tensor,  # [B, T] log pi(x_t) under the policy being trained
    ref_logp: Tensor,  # [B, T] log pi_ref(x_t) under the frozen reference
) -> Tensor:  # [B, T]
    return logp - ref_logp


@KL_ESTIMATORS.register("k2")
def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:  # [B, T], [B, T] -> [B, T]
    return 0.5 * (logp - ref_logp).square()


K3_MAX_LOG_RATIO = 10.0


@KL_ESTIMATORS.register("k3")
def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:  # [B, T], [B, T] -> [B, T]
    # exp(d) grows without bound when the policy drops a token the reference likes; like verl,
    # clamp the log-ratio so that one such token cannot blow up the loss and the gradient
    d = (ref_logp - logp).clamp(-K3_MAX_LOG_RATIO, K3_MAX_LOG_RATIO)
    return torch.expm1(d) - d  # = exp(d) - 1 - d, without cancellation when pi ~ pi_ref
