"""Policy-gradient losses over a padded batch of multi-turn trajectories.

Every loss has the signature

    fn(logp, old_logp, ref_logp, advantages, mask, cfg) -> LossOut

    logp        [B, T]  log pi_theta of the sampled tokens (carries the gradient)
    old_logp    [B, T]  log pi_old of the same tokens, from the policy that sampled them
    ref_logp    [B, T]  log pi_ref (frozen reference); may be None when cfg.beta == 0
    advantages  [B]     one advantage per trajectory, broadcast over its tokens
    mask        [B, T]  1 = token sampled by the policy; 0 = prompt, tool output, padding

`cfg` is anything with `clip_low`, `clip_high`, `beta`, `kl_estimator` and `agg` (LossConfig).
old_logp, ref_logp and advantages are treated as constants (detached): gradients flow only through
logp. Masked-out positions never reach the result, but must hold finite numbers, since a NaN
there would still poison the gradient through exp().
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from minirl.algos.kl import KL_ESTIMATORS
from minirl.registry import Registry


@dataclass
class LossOut:
    loss: Tensor  # [] scalar to call backward() on
    metrics: dict[str, Tensor]  # name -> detached 0-dim tensor; loss/policy, loss/kl, loss/clip_frac, loss/ratio_mean


class LossSettings(Protocol):
    clip_low: float
    clip_high: float
    beta: float
    kl_estimator: str
    agg: str


# -- aggregation -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Aggregation:
    reduce: Callable[[Tensor, Tensor], Tensor]  # (values [B, T] zero where masked, keep [B, T] bool) -> []
    units: Callable[[Tensor], Tensor]  # keep [B, T] bool -> [] how many things the mean divides by


AGGREGATIONS: Registry[Aggregation] = Registry("loss aggregation")


def _token_mean(
    values: Tensor,  # [B, T] already zero where mask == 0
    keep: Tensor,  # [B, T] bool
) -> Tensor:  # []
    return values.sum() / keep.sum().clamp(min=1)


def _seq_mean_token_mean(values: Tensor, keep: Tensor) -> Tensor:  # [B, T], [B, T] -> []
    per_seq = keep.sum(dim=1)  # [B]
    seq_means = values.sum(dim=1) / per_seq.clamp(min=1)  # [B], 0 for empty rows
    return seq_means.sum() / (per_seq > 0).sum().clamp(min=1)


# Every sampled token weighs the same (DAPO, arXiv 2503.14476): long answers count more.
AGGREGATIONS.register("token-mean")(Aggregation(_token_mean, lambda keep: keep.sum()))
# Every trajectory weighs the same (original GRPO); trajectories with no sampled token are skipped.
AGGREGATIONS.register("seq-mean-token-mean")(
    Aggregation(_seq_mean_token_mean, lambda keep: (keep.sum(dim=1) > 0).sum())
)


def aggregate(
    per_token: Tensor,  # [B, T]
    mask: Tensor,  # [B, T] 1 = counts, 0 = ignored
    mode: str,  # AGGREGATIONS key: token-mean | seq-mean-token-mean
) -> Tensor:  # [] 0 (not NaN) when the mask is all zero
    """The one masked reduction every loss and metric goes through. Unknown mode -> ConfigError."""
    if per_token.shape != mask.shape or per_token.dim() != 2:
        raise ValueError(f"per_token {tuple(per_token.shape)} and mask {tuple(mask.shape)} must both be [B, T]")
    reduce = AGGREGATIONS.get(mode).reduce
    keep = mask > 0
    # where, not multiply: padding * 0 would still be NaN if padding held inf
    return reduce(torch.where(keep, per_token, torch.zeros_like(per_token)), keep)


def micro_batch_share(
    micro_mask: Tensor,  # [b, T] the rows of one micro-batch
    full_mask: Tensor,  # [B, T] the whole batch
    mode: str,
) -> float:
    """Weight of a micro-batch's aggregated loss so that the weighted micro-batch losses add up
    to the full batch's loss, and their gradients to its gradient (gradient accumulation)."""
    units = AGGREGATIONS.get(mode).units
    return float(units(micro_mask > 0)) / max(1.0, float(units(full_mask > 0)))


# -- losses ------------------------------------------------------------------------------------

Loss = Callable[[Tensor, Tensor, Tensor | None, Tensor, Tensor, LossSettings], LossOut]
LOSSES: Registry[Loss] = Registry("loss")


def _check_shapes(logp: Tensor, old_logp: Tensor, ref_logp: Tensor | None, advantages: Tensor, mask: Tensor) -> None:
    shapes = {"logp": logp.shape, "old_logp": old_logp.shape, "mask": mask.shape}
    if ref_logp is not None:
        shapes["ref_logp"] = ref_logp.shape
    if logp.dim() != 2 or len(set(shapes.values())) != 1:
        got = ", ".join(f"{k} {tuple(v)}" for k, v in shapes.items())
        raise ValueError(f"expected equal [B, T] shapes, got {got}")
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages must be [B] = [{logp.shape[0]}], got {tuple(advantages.shape)}")


def _finish(
    pg: Tensor,  # [B, T] per-token policy-gradient loss (already negated: we minimise it)
    ratio: Tensor,  # [B, T] pi_theta / pi_old
    clipped: Tensor,  # [B, T] bool, where the clip was active
    logp: Tensor,  # [B, T]
    ref_logp: Tensor | None,  # [B, T]
    mask: Tensor,  # [B, T]
    cfg: LossSettings,
) -> LossOut:
    """Add beta * KL per token, aggregate, and collect the metrics shared by every loss."""
    per_token = pg
    kl_metric = pg.new_zeros(())
    if cfg.beta > 0:
        if ref_logp is None:
            raise ValueError("loss.beta > 0 needs ref_logp from the reference model")
        kl = KL_ESTIMATORS.get(cfg.kl_estimator)(logp, ref_logp.detach())  # [B, T]
        per_token = pg + cfg.beta * kl  # we minimise -J + beta * KL(pi || pi_ref)
        kl_metric = aggregate(kl.detach(), mask, cfg.agg)
    metrics = {
        "loss/policy": aggregate(pg.detach(), mask, cfg.agg),
        "loss/kl": kl_metric,
        # shares of sampled tokens, whatever cfg.agg weighs the loss by
        "loss/clip_frac": aggregate(clipped.to(pg.dtype), mask, "token-mean"),
        "loss/ratio_mean": aggregate(ratio.detach(), mask, "token-mean"),
    }
    return LossOut(loss=aggregate(per_token, mask, cfg.agg), metrics=metrics)


@LOSSES.register("grpo")
def grpo_loss(
    logp: Tensor,  # [B, T] log pi_theta(sampled token)
    old_logp: Tensor,  # [B, T] log pi_old(sampled token)
    ref_logp: Tensor | None,  # [B, T] log pi_ref(sampled token); None iff beta == 0
    advantages: Tensor,  # [B]
    mask: Tensor,  # [B, T] float, 1 = sampled by the policy
    cfg: LossSettings,
) -> LossOut:
    """PPO clipped surrogate per token (GRPO, arXiv 2402.03300; asymmetric clip as in DAPO).

    J_t = min(r_t A, clip(r_t, 1 - clip_low, 1 + clip_high) A), r_t = pi_theta / pi_old; we minimise -J.
    The clip binds on one side only: r > 1 + clip_high when A > 0, r < 1 - clip_low when A < 0;
    there the token gets no gradient.
    """
    _check_shapes(logp, old_logp, ref_logp, advantages, mask)
    a = advantages.detach().unsqueeze(1)  # [B, 1]
    ratio = torch.exp(logp - old_logp.detach())  # [B, T]
    low, high = 1.0 - cfg.clip_low, 1.0 + cfg.clip_high
    surrogate = torch.minimum(ratio * a, ratio.clamp(low, high) * a)
    clipped = ((a > 0) & (ratio > high)) | ((a < 0) & (ratio < low))
    return _finish(-surrogate, ratio, clipped, logp, ref_logp, mask, cfg)


@LOSSES.register("cispo")
def cispo_loss(
    logp: Tensor,  # [B, T]
    old_logp: Tensor,  # [B, T]
    ref_logp: Tensor | None,  # [B, T]; None iff beta == 0
    advantages: Tensor,  # [B]
    mask: Tensor,  # [B, T]
    cfg: LossSettings,
) -> LossOut:
    """CISPO (MiniMax-M1, arXiv 2506.13585): J_t = sg(min(r_t, 1 + clip_high)) A log pi_theta; we minimise -J.

    Unlike PPO's clip, which drops the gradient of clipped tokens (often the rare "reflection"
    tokens that matter), CISPO clips only the importance-sampling weight, so every token keeps a
    gradient of magnitude <= (1 + clip_high) |A|. The paper has no lower bound on the weight in
    practice (a very large eps_low), hence none here; clip_low is unused.
    """
    _check_shapes(logp, old_logp, ref_logp, advantages, mask)
    a = advantages.detach().unsqueeze(1)  # [B, 1]
    ratio = torch.exp(logp.detach() - old_logp.detach())  # [B, T] no gradient: a weight, not a path
    high = 1.0 + cfg.clip_high
    weight = ratio.clamp(max=high)
    pg = -(weight * a * logp)  # d pg / d logp = -weight * A
    return _finish(pg, ratio, ratio > high, logp, ref_logp, mask, cfg)
