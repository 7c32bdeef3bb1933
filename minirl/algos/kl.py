"""Per-token estimators of KL(pi || pi_ref) from log-probs of tokens sampled from pi.

With d = ref_logp - logp = log(pi_ref / pi) at a token x ~ pi (Schulman, "Approximating KL
Divergence", 2020):

- k1 = -d                     unbiased, high variance, can be negative
- k2 = d^2 / 2                biased, low variance, >= 0
- k3 = exp(d) - d - 1         unbiased (E_pi[exp(d)] = 1), low variance, >= 0; GRPO's choice

k3 is computed as verl's `low_var_kl`: d clamped to +-20, then the estimate capped at 10 (where the cap
binds the token gets no gradient).

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


K3_MAX_LOG_RATIO = 20.0  # |d| beyond this is clamped before exp()
K3_MAX_ESTIMATE = 10.0  # the estimate is capped here, and the capped token has no gradient


@KL_ESTIMATORS.register("k3")
def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:  # [B, T], [B, T] -> [B, T]
    # exp(d) grows without bound when the policy drops a token the reference likes. As verl's low_var_kl:
    # clamp d so exp() stays finite, then cap the estimate, so that one such token weighs at most
    # K3_MAX_ESTIMATE and pulls with no gradient instead of outweighing a whole sequence's policy gradient
    d = (ref_logp - logp).clamp(-K3_MAX_LOG_RATIO, K3_MAX_LOG_RATIO)
    return (torch.expm1(d) - d).clamp(max=K3_MAX_ESTIMATE)  # = exp(d) - 1 - d, without cancellation at pi ~ pi_ref


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
