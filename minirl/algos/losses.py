"""Policy-gradient losses over a padded batch of multi-turn trajectories.

Every loss has the signature

    fn(logp, old_logp, ref_logp, advantages, mask, cfg) -> LossOut

    logp        [B, T]  log pi_theta of the sampled tokens (carries the gradient)
    old_logp    [B, T]  log pi_old of the same tokens, from the policy that sampled them
    ref_logp    [B, T]  log pi_ref (frozen reference); may be None when cfg.beta == 0
    advantages  [B]     one advantage per trajectory, broadcast over its tokens
    mask        [B, T]  1 = token sampled by the policy; 0 = prompt, tool output, padding

and an optional keyword `is_weights` [B, T]: sampler/trainer mismatch weights (algo.rollout_is=token,
minirl/algos/rollout_correction.py) that multiply the per-token policy-gradient term, not the KL, as
constants (verl's `rollout_is_weights`); None = all 1.
`cfg` is anything with `clip_low`, `clip_high`, `clip_ratio_c`, `beta`, `kl_estimator`, `agg` and `max_tokens_norm`
(LossConfig).
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
    # name -> detached 0-dim tensor: loss/policy, loss/kl, loss/clip_frac (= clip_frac_low + clip_frac_high),
    # loss/ratio_mean
    metrics: dict[str, Tensor]


class LossSettings(Protocol):
    clip_low: float
    clip_high: float
    clip_ratio_c: float
    beta: float
    kl_estimator: str
    agg: str
    max_tokens_norm: int


# -- aggregation -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Aggregation:
    # (values [B, T] zero where masked, keep [B, T] bool, max_tokens_norm) -> []; every mode is a sum of
    # per-row terms divided by units(keep), so micro-batch losses weighted by their share of the units add up
    # to the full batch's loss exactly (micro_batch_share)
    reduce: Callable[[Tensor, Tensor, int], Tensor]
    units: Callable[[Tensor], Tensor]  # keep [B, T] bool -> [] how many things the mean divides by


AGGREGATIONS: Registry[Aggregation] = Registry("loss aggregation")


def _tokens(keep: Tensor) -> Tensor:  # [B, T] bool -> [] sampled tokens
    return keep.sum()


def _sequences(keep: Tensor) -> Tensor:  # [B, T] bool -> [] trajectories with at least one sampled token
    return (keep.sum(dim=1) > 0).sum()


def _token_mean(
    values: Tensor,  # [B, T] already zero where mask == 0
    keep: Tensor,  # [B, T] bool
    max_tokens_norm: int,  # unused
) -> Tensor:  # []
    return values.sum() / _tokens(keep).clamp(min=1)


def _seq_mean_token_mean(values: Tensor, keep: Tensor, max_tokens_norm: int) -> Tensor:  # [B, T], [B, T], unused
    seq_means = values.sum(dim=1) / keep.sum(dim=1).clamp(min=1)  # [B], 0 for empty rows
    return seq_means.sum() / _sequences(keep).clamp(min=1)


def _seq_mean_token_sum_norm(values: Tensor, keep: Tensor, max_tokens_norm: int) -> Tensor:  # [B, T], [B, T], C
    if max_tokens_norm <= 0:
        raise ValueError(f"seq-mean-token-sum-norm needs loss.max_tokens_norm > 0, got {max_tokens_norm}")
    return values.sum() / (max_tokens_norm * _sequences(keep).clamp(min=1))


# Every sampled token weighs the same (DAPO, arXiv 2503.14476): long answers count more.
AGGREGATIONS.register("token-mean")(Aggregation(_token_mean, _tokens))
# Every trajectory weighs the same (original GRPO): a token of a short answer counts more than one of a
# long answer. Trajectories with no sampled token are skipped.
AGGREGATIONS.register("seq-mean-token-mean")(Aggregation(_seq_mean_token_mean, _sequences))
# Dr. GRPO (arXiv 2503.20783): each trajectory's token sum over one constant C = max_tokens_norm, then the mean
# over trajectories, i.e. sum / (S * C) for S non-empty trajectories: every token weighs the same whatever its
# trajectory's length, and unlike token-mean that weight does not shrink when the batch's answers grow.
AGGREGATIONS.register("seq-mean-token-sum-norm")(Aggregation(_seq_mean_token_sum_norm, _sequences))


def aggregate(
    per_token: Tensor,  # [B, T]
    mask: Tensor,  # [B, T] 1 = counts, 0 = ignored
    mode: str,  # AGGREGATIONS key: token-mean | seq-mean-token-mean | seq-mean-token-sum-norm
    max_tokens_norm: int = 0,  # the constant C of seq-mean-token-sum-norm; the other modes ignore it
) -> Tensor:  # [] 0 (not NaN) when the mask is all zero
    """The one masked reduction every loss and metric goes through. Unknown mode -> ConfigError."""
    if per_token.shape != mask.shape or per_token.dim() != 2:
        raise ValueError(f"per_token {tuple(per_token.shape)} and mask {tuple(mask.shape)} must both be [B, T]")
    reduce = AGGREGATIONS.get(mode).reduce
    keep = mask > 0
    # where, not multiply: padding * 0 would still be NaN if padding held inf
    return reduce(torch.where(keep, per_token, torch.zeros_like(per_token)), keep, max_tokens_norm)


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

# as verl, so that exp() stays finite: grpo and cispo clamp log pi_theta - log pi_old to +-MAX_LOG_RATIO, gspo
# caps log s_i at MAX_SEQ_LOG_RATIO (a capped sequence has no gradient)
MAX_LOG_RATIO = 20.0
MAX_SEQ_LOG_RATIO = 10.0

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
    is_weights: Tensor | None = None,  # [B, T] rollout IS weights on the policy-gradient term; None = 1
) -> LossOut:
    """Weigh by the rollout IS weights, add beta * KL per token, aggregate, and collect the metrics shared
    by every loss."""
    if is_weights is not None:
        pg = pg * is_weights.detach()
    per_token = pg
    kl_metric = pg.new_zeros(())
    if cfg.beta > 0:
        if ref_logp is None:
            raise ValueError("loss.beta > 0 needs ref_logp from the reference model")
        kl = KL_ESTIMATORS.get(cfg.kl_estimator)(logp, ref_logp.detach())  # [B, T]
        per_token = pg + cfg.beta * kl  # we minimise -J + beta * KL(pi || pi_ref)
        kl_metric = aggregate(kl.detach(), mask, cfg.agg, cfg.max_tokens_norm)
    metrics = {
        "loss/policy": aggregate(pg.detach(), mask, cfg.agg, cfg.max_tokens_norm),
        "loss/kl": kl_metric,
        # shares of sampled tokens, whatever cfg.agg weighs the loss by
        "loss/clip_frac": aggregate(clipped.to(pg.dtype), mask, "token-mean"),
        # a bound 1 - clip_low <= 1 binds below ratio 1, a bound 1 + clip_high >= 1 above it
        "loss/clip_frac_low": aggregate((clipped & (ratio < 1)).to(pg.dtype), mask, "token-mean"),
        "loss/clip_frac_high": aggregate((clipped & (ratio > 1)).to(pg.dtype), mask, "token-mean"),
        "loss/ratio_mean": aggregate(ratio.detach(), mask, "token-mean"),
    }
    return LossOut(loss=aggregate(per_token, mask, cfg.agg, cfg.max_tokens_norm), metrics=metrics)


def reference_nll(
    logp: Tensor,  # [B, T] log pi_theta(token)
    mask: Tensor,  # [B, T] float, 1 = an action token
    replayed: Tensor,  # [B] 1.0 for a replayed reference answer, else 0.0
    cfg: LossSettings,
) -> Tensor:  # []
    """The supervised term of loss.reference_nll: the reference rows' negative log-likelihood, aggregated as
    cfg.agg over every row (a sampled row adds 0), so that it splits into micro-batches as the loss does and a
    reference row weighs what one more unit of its advantage would at ratio 1."""
    return aggregate(-logp * replayed.unsqueeze(1), mask, cfg.agg, cfg.max_tokens_norm)


def _ppo_clip(
    ratio: Tensor,  # [B, T] importance ratio pi_theta / pi_old (carries the gradient)
    a: Tensor,  # [B, 1] advantages
    cfg: LossSettings,
    dual_clip: float = 0.0,  # c > 1: a token with A < 0 loses at most -c A; 0 = no dual clip
) -> tuple[Tensor, Tensor]:  # per-token loss [B, T], where a clip binds [B, T] bool
    """PPO's clipped surrogate, negated since we minimise: -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A).

    The clip binds on one side only: r > 1 + clip_high when A > 0, r < 1 - clip_low when A < 0; there the
    token gets no gradient. With dual_clip = c (Ye et al., arXiv 1912.09729) a token with A < 0 and r > c is
    also cut: its loss is -c A, with no gradient.
    """
    low, high = 1.0 - cfg.clip_low, 1.0 + cfg.clip_high
    loss = -torch.minimum(ratio * a, ratio.clamp(low, high) * a)
    clipped = ((a > 0) & (ratio > high)) | ((a < 0) & (ratio < low))
    if dual_clip > 0:
        capped = (a < 0) & (ratio > dual_clip)
        loss = torch.where(capped, -dual_clip * a, loss)
        clipped = clipped | capped
    return loss, clipped


@LOSSES.register("grpo")
def grpo_loss(
    logp: Tensor,  # [B, T] log pi_theta(sampled token)
    old_logp: Tensor,  # [B, T] log pi_old(sampled token)
    ref_logp: Tensor | None,  # [B, T] log pi_ref(sampled token); None iff beta == 0
    advantages: Tensor,  # [B]
    mask: Tensor,  # [B, T] float, 1 = sampled by the policy
    cfg: LossSettings,
    is_weights: Tensor | None = None,  # [B, T] rollout IS weights on the policy-gradient term; None = 1
) -> LossOut:
    """PPO clipped surrogate per token (PPO arXiv 1707.06347, GRPO arXiv 2402.03300; the asymmetric clip
    clip_high > clip_low is DAPO's clip-higher, arXiv 2503.14476).

    J_t = min(r_t A, clip(r_t, 1 - clip_low, 1 + clip_high) A), r_t = pi_theta / pi_old; we minimise -J. With
    cfg.clip_ratio_c = c > 0 (dual-clip), a token with A < 0 has J_t = max(J_t, c A).
    This is PPO's policy loss (verl's "vanilla"); with no value model the advantage comes from algo.adv_estimator.
    As there, log r_t is clamped to +-MAX_LOG_RATIO before exp().
    """
    _check_shapes(logp, old_logp, ref_logp, advantages, mask)
    a = advantages.detach().unsqueeze(1)  # [B, 1]
    ratio = torch.exp((logp - old_logp.detach()).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))  # [B, T]
    pg, clipped = _ppo_clip(ratio, a, cfg, dual_clip=cfg.clip_ratio_c)
    return _finish(pg, ratio, clipped, logp, ref_logp, mask, cfg, is_weights)


@LOSSES.register("gspo")
def gspo_loss(
    logp: Tensor,  # [B, T]
    old_logp: Tensor,  # [B, T]
    ref_logp: Tensor | None,  # [B, T]; None iff beta == 0
    advantages: Tensor,  # [B]
    mask: Tensor,  # [B, T]
    cfg: LossSettings,
    is_weights: Tensor | None = None,  # [B, T] rollout IS weights on the policy-gradient term; None = 1
) -> LossOut:
    """GSPO (arXiv 2507.18071): one importance ratio per sequence, the geometric mean of its token ratios
    s_i = exp(mean over i's sampled tokens of (log pi_theta - log pi_old)), in PPO's clipped surrogate
    J_i = min(s_i A_i, clip(s_i, 1 - clip_low, 1 + clip_high) A_i); we minimise -J.

    Written in the paper's GSPO-token form (as verl does) so that it goes through the shared per-token
    aggregation: token t of sequence i carries s_it = sg(s_i) * pi_theta(y_t) / sg(pi_theta(y_t)), whose value
    is s_i and whose gradient d s_it / d log pi_theta(y_t) is s_i. With one advantage per sequence this equals
    the plain form in value and gradient under every aggregation (each weighs a sequence's tokens alike, and
    d s_i / d log pi_theta(y_t) = s_i / |y_i|). With agg=seq-mean-token-mean (minirl/conf/loss/gspo.yaml) the loss is
    the paper's (1/G) sum_i J_i; token-mean weighs a sequence by its length instead. The clip is decided per
    sequence: a clipped sequence gives none of its tokens a gradient, and loss/clip_frac counts the tokens of
    clipped sequences. Since s_i is a per-token geometric mean, the paper's range is tiny (3e-4, 4e-4).
    As verl, log s_i is capped at MAX_SEQ_LOG_RATIO: a sequence past it has s_i = exp(10) and no gradient.
    """
    _check_shapes(logp, old_logp, ref_logp, advantages, mask)
    a = advantages.detach().unsqueeze(1)  # [B, 1]
    keep = mask > 0
    token_log_ratio = torch.where(keep, logp - old_logp.detach(), torch.zeros_like(logp))  # [B, T]
    seq_log_ratio = token_log_ratio.sum(dim=1) / keep.sum(dim=1).clamp(min=1)  # [B] log s_i; 0 for an empty row
    log_ratio = seq_log_ratio.detach().unsqueeze(1) + logp - logp.detach()  # [B, T] value log s_i, grad 1
    ratio = torch.exp(log_ratio.clamp(max=MAX_SEQ_LOG_RATIO))  # [B, T] value s_i, grad s_i
    pg, clipped = _ppo_clip(ratio, a, cfg)
    return _finish(pg, ratio, clipped, logp, ref_logp, mask, cfg, is_weights)


@LOSSES.register("cispo")
def cispo_loss(
    logp: Tensor,  # [B, T]
    old_logp: Tensor,  # [B, T]
    ref_logp: Tensor | None,  # [B, T]; None iff beta == 0
    advantages: Tensor,  # [B]
    mask: Tensor,  # [B, T]
    cfg: LossSettings,
    is_weights: Tensor | None = None,  # [B, T] rollout IS weights on the policy-gradient term; None = 1
) -> LossOut:
    """CISPO (MiniMax-M1, arXiv 2506.13585, Eq. 4-5): J_t = sg(clip(r_t, 1 - clip_low, 1 + clip_high)) A log pi_theta;
    we minimise -J.

    Unlike PPO's clip, which drops the gradient of clipped tokens (often the rare "reflection"
    tokens that matter), CISPO clips only the importance-sampling weight, so every token keeps a
    gradient of magnitude <= (1 + clip_high) |A|. The paper imposes no lower bound in practice (it sets
    eps_low large); minirl/conf/loss/cispo.yaml does the same with clip_low: 1.0, where the bound 1 - clip_low = 0
    never binds since r > 0. TRL's loss_type="cispo" clamps from above only, at epsilon_high = 1 + clip_high.
    As verl, log r_t is clamped to +-MAX_LOG_RATIO before exp().
    """
    _check_shapes(logp, old_logp, ref_logp, advantages, mask)
    a = advantages.detach().unsqueeze(1)  # [B, 1]
    log_ratio = (logp.detach() - old_logp.detach()).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)  # [B, T] no gradient: a weight, not a path
    low, high = 1.0 - cfg.clip_low, 1.0 + cfg.clip_high
    weight = ratio.clamp(low, high)
    pg = -(weight * a * logp)  # d pg / d logp = -weight * A
    return _finish(pg, ratio, (ratio > high) | (ratio < low), logp, ref_logp, mask, cfg, is_weights)
