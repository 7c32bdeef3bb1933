"""Per-token estimators of KL(pi || pi_ref) from log-probs of tokens sampled from pi.

With d = ref_logp - logp = log(pi_ref / pi) at a token x ~ pi (Schulman, "Approximating KL
Divergence", 2020):

- k1 = -d                     unbiased, high variance, can be negative
- k2 = d^2 / 2                biased, low variance, >= 0
- k3 = exp(d) - d - 1         unbiased (E_pi[exp(d)] = 1), low variance, >= 0; GRPO's choice

Every estimator maps logp [B, T], ref_logp [B, T] -> [B, T]; masking is the caller's job.
The KL reaches training in one of two places: in the loss (loss.beta, per token, see losses.py) or
in the reward (algo.kl_in_reward, one sum per trajectory, `sequence_kl`).
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


def sequence_kl(
    logp: Tensor,  # [B, T] log pi_old of the sampled tokens (the policy that sampled them)
    ref_logp: Tensor,  # [B, T] log pi_ref of the same tokens
    mask: Tensor,  # [B, T] 1 = sampled by the policy; 0 = prompt, tool output, padding
    estimator: str,  # KL_ESTIMATORS key
) -> Tensor:  # [B] per-trajectory KL: the estimator summed over the trajectory's sampled tokens
    """The KL penalty folded into the reward (algo.kl_in_reward): r_i - kl_coef * sequence_kl_i.

    As verl's use_kl_in_reward for outcome rewards: its per-token penalty summed over a response is
    this sum. A constant of the step (no gradient): it only changes the advantages.
    """
    per_token = KL_ESTIMATORS.get(estimator)(logp.detach(), ref_logp.detach())
    return torch.where(mask > 0, per_token, torch.zeros_like(per_token)).sum(dim=1)
