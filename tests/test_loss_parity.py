"""minirl's advantages, losses, aggregations, KL estimators and rollout IS against verl's published formulas.

Each `verl_*` function below is written here from the formula verl publishes (verl/trainer/ppo/core_algos.py,
verl/utils/torch_functional.py, verl/trainer/ppo/rollout_corr_helper.py, as of verl 0.9.1), one row or one group
at a time, not from its code; gradients are written out by hand. Where minirl departs from verl on purpose
(docs/algorithms.md, "Where minirl departs from verl"), a test named for the departure pins the exact relation.
Values and gradients agree to 1e-10 in float64 and 1e-5 in float32 (the reference always runs in float64).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor

from minirl.algos.advantages import ADV_ESTIMATORS
from minirl.algos.kl import KL_ESTIMATORS, sequence_kl
from minirl.algos.losses import LOSSES, aggregate
from minirl.algos.rollout_correction import rollout_correction

pytestmark = pytest.mark.fast

F64, F32 = torch.float64, torch.float32
DTYPES = [F64, F32]
AGGS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
GARBAGE = 1e3  # what padding holds: finite, but far past every clamp, so a leak would show


def assert_close(got: Tensor, want: Tensor, dtype: torch.dtype) -> None:
    """float64: 1e-10 relative (1e-12 absolute near 0); float32: 1e-5 relative and absolute."""
    rtol, atol = (1e-10, 1e-12) if dtype == F64 else (1e-5, 1e-5)
    torch.testing.assert_close(got.double(), want.double(), rtol=rtol, atol=atol)


@dataclass
class Cfg:
    clip_low: float = 0.2
    clip_high: float = 0.28
    clip_ratio_c: float = 3.0  # verl's vanilla default
    beta: float = 0.0
    kl_estimator: str = "k3"
    agg: str = "token-mean"
    max_tokens_norm: int = 10  # verl's loss_scale_factor; not the batch width (8), so the constant must come from here


# -- inputs ------------------------------------------------------------------------------------

LENGTHS = [8, 5, 1, 0, 3, 8]  # two full rows, ragged rows, a one-token row and an all-padding row
WIDTH = 8


def make_batch(case: str, dtype: torch.dtype) -> dict[str, Tensor]:
    """A padded batch [6, 8]: `ragged` has random log-probs whose ratios bind every clip; `ties` has ratios of
    exactly 1, the reference equal to the policy, equal and zero advantages. Padding holds GARBAGE."""
    g = torch.Generator().manual_seed(27)
    rows = len(LENGTHS)
    mask = (torch.arange(WIDTH).unsqueeze(0) < torch.tensor(LENGTHS).unsqueeze(1)).to(F64)  # [B, T]
    logp = -3 * torch.rand(rows, WIDTH, generator=g, dtype=F64)
    if case == "ragged":
        old = logp + 1.2 * torch.randn(rows, WIDTH, generator=g, dtype=F64)
        ref = logp + torch.randn(rows, WIDTH, generator=g, dtype=F64)
        sampler = old + 0.3 * torch.randn(rows, WIDTH, generator=g, dtype=F64)
        adv = torch.tensor([1.3, -0.7, 0.4, -2.0, -1.1, 0.9], dtype=F64)
    else:
        old, ref, sampler = logp.clone(), logp.clone(), logp.clone()
        adv = torch.tensor([1.0, 1.0, 0.0, -1.0, -1.0, 0.0], dtype=F64)
    pad = mask == 0
    logp[pad], old[pad], ref[pad], sampler[pad] = GARBAGE, -GARBAGE, GARBAGE / 2, -GARBAGE
    is_weights = (0.5 + torch.rand(rows, WIDTH, generator=g, dtype=F64)) * mask + GARBAGE * (1 - mask)
    batch = {"logp": logp, "old": old, "ref": ref, "sampler": sampler, "adv": adv, "mask": mask, "is": is_weights}
    return {k: v.to(dtype) for k, v in batch.items()}


def test_ragged_case_reaches_every_clip_region():
    # the loss parity below is only as strong as the regions its inputs reach
    b = make_batch("ragged", F64)
    keep = b["mask"] > 0
    r = torch.exp(b["logp"] - b["old"])[keep]
    a = b["adv"].unsqueeze(1).expand_as(b["mask"])[keep]
    cfg = Cfg()
    assert ((a > 0) & (r > 1 + cfg.clip_high)).any()  # PPO's upper bound binds
    assert ((a < 0) & (r < 1 - cfg.clip_low)).any()  # PPO's lower bound binds
    assert ((a < 0) & (r > cfg.clip_ratio_c)).any()  # the dual clip binds
    assert ((r > 1 - cfg.clip_low) & (r < 1 + cfg.clip_high)).any()  # and some tokens are unclipped


# -- references: verl's formulas ---------------------------------------------------------------


def verl_agg_loss(loss_mat: Tensor, mask: Tensor, mode: str, loss_scale_factor: float) -> Tensor:
    """verl's agg_loss, one row at a time; the seq means leave out rows with no token.

    token-mean: Σ tokens / #tokens; seq-mean-token-mean: mean over rows of the row's token mean;
    seq-mean-token-sum-norm: mean over rows of the row's token sum, / loss_scale_factor (default the padded width).
    """
    row_sums, row_counts = [], []
    for values, m in zip(loss_mat, mask, strict=True):
        kept = values[m > 0]
        row_sums.append(kept.sum())
        row_counts.append(len(kept))
    if mode == "token-mean":
        return sum(row_sums) / sum(row_counts)
    if mode == "seq-mean-token-mean":
        means = [s / n for s, n in zip(row_sums, row_counts, strict=True) if n > 0]
        return sum(means) / len(means)
    sums = [s for s, n in zip(row_sums, row_counts, strict=True) if n > 0]
    return sum(sums) / len(sums) / loss_scale_factor


def token_weights(mask: Tensor, mode: str, loss_scale_factor: float) -> Tensor:
    """d verl_agg_loss / d loss_mat [B, T]."""
    per_token = torch.zeros_like(mask, requires_grad=True)
    verl_agg_loss(per_token, mask, mode, loss_scale_factor).backward()
    return per_token.grad


def verl_vanilla(logp: Tensor, old: Tensor, adv: Tensor, cfg: Cfg) -> tuple[Tensor, Tensor, Tensor]:
    """verl's vanilla (dual-clip PPO) loss per token, in a piecewise form equal to verl's max/min form:

        A >= 0:  -A min(r, 1 + ε_high)
        A <  0:  -A min(max(r, 1 - ε_low), c)      r = exp(clamp(logp - old, ±20))

    Returns (loss [B, T], d loss / d logp [B, T], where a clip binds [B, T]: verl's pg_clipfrac tokens plus its
    pg_clipfrac_lower tokens). The gradient is -A r where r is inside its bounds (bounds included), else 0.
    """
    r = torch.exp((logp - old).clamp(-20, 20))
    a = adv.unsqueeze(1).expand_as(r)
    low, high, c = 1 - cfg.clip_low, 1 + cfg.clip_high, cfg.clip_ratio_c
    loss, grad, clipped = torch.zeros_like(r), torch.zeros_like(r), torch.zeros_like(r, dtype=torch.bool)
    for b in range(r.shape[0]):
        for t in range(r.shape[1]):
            rt, at = r[b, t].item(), a[b, t].item()
            if at >= 0:
                bound = min(rt, high)
                cut = rt > high and at > 0
            else:
                bound = min(max(rt, low), c)
                cut = rt < low or rt > c
            loss[b, t] = -at * bound
            grad[b, t] = 0.0 if cut else -at * rt
            clipped[b, t] = cut
    return loss, grad, clipped


def verl_gspo(logp: Tensor, old: Tensor, mask: Tensor, adv: Tensor, cfg: Cfg) -> tuple[Tensor, Tensor, Tensor]:
    """verl's gspo loss per token: s_i = exp(min(mean_t (logp - old) over row i, 10)), then PPO's clip of s_i
    (no dual clip). GSPO-token form: d s_it / d logp_t = s_i below verl's cap of 10 on log s_i, 0 above it."""
    loss, grad, clipped = torch.zeros_like(logp), torch.zeros_like(logp), torch.zeros_like(logp, dtype=torch.bool)
    low, high = 1 - cfg.clip_low, 1 + cfg.clip_high
    for b in range(logp.shape[0]):
        n = int(mask[b].sum())
        log_s = sum((logp[b, t] - old[b, t]).item() for t in range(logp.shape[1]) if mask[b, t] > 0) / max(n, 1)
        s, a = math.exp(min(log_s, 10.0)), adv[b].item()
        cut = (a > 0 and s > high) or (a < 0 and s < low)
        loss[b] = -a * (min(s, high) if a >= 0 else max(s, low))
        grad[b] = 0.0 if cut or log_s > 10 else -a * s
        clipped[b] = cut
    return loss, grad, clipped


def verl_cispo(logp: Tensor, old: Tensor, adv: Tensor, cfg: Cfg) -> tuple[Tensor, Tensor, Tensor]:
    """verl's cispo loss per token: -sg(clip(r, 1 - ε_low, 1 + ε_high)) A logp, r = exp(clamp(logp - old, ±20));
    d loss / d logp = -clip(r) A; clipped where clip(r) != r."""
    r = torch.exp((logp - old).clamp(-20, 20))
    w = r.clamp(1 - cfg.clip_low, 1 + cfg.clip_high)
    a = adv.unsqueeze(1)
    return -w * a * logp, -w * a.expand_as(r), w != r


def verl_policy_loss(name: str, b: dict[str, Tensor], cfg: Cfg) -> tuple[Tensor, Tensor, Tensor]:
    if name == "grpo":
        return verl_vanilla(b["logp"], b["old"], b["adv"], cfg)
    if name == "gspo":
        return verl_gspo(b["logp"], b["old"], b["mask"], b["adv"], cfg)
    return verl_cispo(b["logp"], b["old"], b["adv"], cfg)


def verl_kl(logp: Tensor, ref: Tensor, name: str) -> tuple[Tensor, Tensor]:
    """verl's kl_penalty (k1 = kl, k2 = mse, k3 = low_var_kl) and its d / d logp, token by token."""
    value, grad = torch.zeros_like(logp), torch.zeros_like(logp)
    for idx in range(logp.numel()):
        lp, rf = logp.view(-1)[idx].item(), ref.view(-1)[idx].item()
        if name == "k1":
            v, dv = lp - rf, 1.0
        elif name == "k2":
            v, dv = 0.5 * (lp - rf) ** 2, lp - rf
        else:  # d = ref - logp clamped to ±20 (no gradient past it), exp(d) - d - 1 capped at 10 (none past it)
            d = min(max(rf - lp, -20.0), 20.0)
            v = math.exp(d) - d - 1
            dv = 1 - math.exp(d) if abs(rf - lp) <= 20 and v <= 10 else 0.0
            v = min(v, 10.0)
        value.view(-1)[idx], grad.view(-1)[idx] = v, dv
    return value, grad


def verl_grpo_advantages(scores: list[float], group_size: int, eps: float, unbiased: bool, by_std: bool) -> list[float]:
    """verl's compute_grpo_outcome_advantage, group by group: (r - mean) / (std + eps), or r - mean without
    norm_adv_by_std_in_grpo; a group of one gets mean 0 and std 1. verl's std is unbiased (torch.std)."""
    out = []
    for start in range(0, len(scores), group_size):
        group = scores[start : start + group_size]
        n = len(group)
        mean = sum(group) / n if n > 1 else 0.0
        std = math.sqrt(sum((x - mean) ** 2 for x in group) / (n - 1 if unbiased else n)) if n > 1 else 1.0
        scale = 1 / (std + eps) if std + eps > 0 else math.nan  # a tied group at eps = 0: 0 / 0
        out += [(x - mean) * scale if by_std else x - mean for x in group]
    return out


def verl_rloo_advantages(scores: list[float], group_size: int) -> list[float]:
    """verl's compute_rloo_outcome_advantage as the leave-one-out baseline r_i - mean_{j != i} r_j; a group of
    one is left as it is."""
    out = []
    for start in range(0, len(scores), group_size):
        group = scores[start : start + group_size]
        if len(group) == 1:
            out += group
            continue
        out += [x - (sum(group) - x) / (len(group) - 1) for x in group]
    return out


def verl_reinforce_plus_plus(token_rewards: Tensor, mask: Tensor, gamma: float, whiten_eps: float) -> Tensor:
    """verl's compute_reinforce_plus_plus_outcome_advantage: per-token discounted returns G_t = r_t + γ G_{t+1}
    over the row's tokens (carried across masked spans, 0 on them), then whitened over all the batch's tokens:
    (G - token mean) / sqrt(unbiased token variance + whiten_eps) (verl's masked_whiten: whiten_eps = 1e-8).
    -> [B, T], 0 on padding."""
    returns = torch.zeros_like(token_rewards)
    for b in range(token_rewards.shape[0]):
        running = 0.0
        for t in reversed(range(token_rewards.shape[1])):
            if mask[b, t] > 0:
                running = token_rewards[b, t].item() + gamma * running
                returns[b, t] = running
    kept = returns[mask > 0]
    var = ((kept - kept.mean()) ** 2).sum() / (len(kept) - 1)
    return torch.where(mask > 0, (returns - kept.mean()) / torch.sqrt(var + whiten_eps), torch.zeros_like(returns))


def verl_rollout_is_token(gap: Tensor, mask: Tensor, threshold: float) -> Tensor:
    """verl's rollout_is=token weights: min(exp(clamp(log π_old - log π_rollout, ±20)), C), 0 on padding."""
    return torch.where(mask > 0, torch.exp(gap.clamp(-20, 20)).clamp(max=threshold), torch.zeros_like(gap))


def verl_rollout_rs_seq_sum_k1(gap: Tensor, mask: Tensor, threshold: float) -> Tensor:
    """verl's rollout_rs=seq_sum_k1 with rollout_rs_threshold=C (lower bound 1/C): a row is kept iff
    log(1/C) <= Σ_t -clamp(gap_t, ±20) <= log C, compared in the inputs' dtype. -> the mask, rejected rows zeroed."""
    keep = torch.zeros_like(mask)
    lower = torch.tensor(math.log(1.0 / threshold), dtype=gap.dtype)
    upper = torch.tensor(math.log(threshold), dtype=gap.dtype)
    for b in range(gap.shape[0]):
        stat = torch.zeros((), dtype=gap.dtype)
        for g, m in zip(gap[b], mask[b], strict=True):
            if m > 0:
                stat = stat - g.clamp(-20, 20)
        keep[b] = float(lower <= stat <= upper)
    return mask * keep


# -- advantages --------------------------------------------------------------------------------

REWARD_CASES = {
    # continuous rewards with one group whose rewards all tie (the 1st group of 4 or the 2nd of 2)
    "continuous": [0.3, 0.3, 0.3, 0.3, 1.5, -0.2, 0.7, 2.0, -1.0, 0.25, 0.5, 0.125],
    # pass/fail rewards: ties inside groups
    "binary": [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0],
}
GROUP_SIZES = [2, 3, 4]


def _flat_groups(scores: list[float], g: int) -> list[bool]:
    """per trajectory: its group's rewards all tie."""
    return [len(set(scores[i // g * g : i // g * g + g])) == 1 for i in range(len(scores))]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("g", GROUP_SIZES)
@pytest.mark.parametrize("rewards", REWARD_CASES.keys())
@pytest.mark.parametrize("eps", [0.0, 1e-6, 1e-4])
def test_grpo_is_verls_formula_with_the_population_std(eps, rewards, g, dtype):
    scores = REWARD_CASES[rewards]
    got = ADV_ESTIMATORS.get("grpo")(torch.tensor(scores, dtype=dtype), g, eps)
    want = verl_grpo_advantages(scores, g, eps, unbiased=False, by_std=True)
    # a group whose rewards all tie: minirl gives exact 0; verl's formula 0 / (0 + eps), NaN at eps = 0
    want = [0.0 if flat else w for w, flat in zip(want, _flat_groups(scores, g), strict=True)]
    assert_close(got, torch.tensor(want, dtype=F64), dtype)


@pytest.mark.parametrize("g", GROUP_SIZES)
@pytest.mark.parametrize("rewards", REWARD_CASES.keys())
def test_departure_grpo_std_is_population_so_advantages_are_verls_times_sqrt_g_over_g_minus_1(rewards, g):
    scores = REWARD_CASES[rewards]
    got = ADV_ESTIMATORS.get("grpo")(torch.tensor(scores, dtype=F64), g, 0.0)
    verl = verl_grpo_advantages(scores, g, 0.0, unbiased=True, by_std=True)
    for a, v, flat in zip(got.tolist(), verl, _flat_groups(scores, g), strict=True):
        if not flat:  # with eps = 0 the two stds differ by exactly this factor
            assert a == pytest.approx(v * math.sqrt(g / (g - 1)), rel=1e-12)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("g", GROUP_SIZES)
@pytest.mark.parametrize("rewards", REWARD_CASES.keys())
def test_dr_grpo_is_verls_grpo_without_std(rewards, g, dtype):
    scores = REWARD_CASES[rewards]
    got = ADV_ESTIMATORS.get("dr_grpo")(torch.tensor(scores, dtype=dtype), g, 1e-6)
    want = verl_grpo_advantages(scores, g, 1e-6, unbiased=True, by_std=False)
    assert_close(got, torch.tensor(want, dtype=F64), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("g", GROUP_SIZES)
@pytest.mark.parametrize("rewards", REWARD_CASES.keys())
def test_rloo_is_verls_leave_one_out(rewards, g, dtype):
    scores = REWARD_CASES[rewards]
    got = ADV_ESTIMATORS.get("rloo")(torch.tensor(scores, dtype=dtype), g, 1e-6)
    assert_close(got, torch.tensor(verl_rloo_advantages(scores, g), dtype=F64), dtype)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_departure_a_group_of_one_gets_zero_where_verl_keeps_its_reward(name):
    # verl: mean 0 and std 1 for a lone sample, so grpo gives r / (1 + eps), dr_grpo and rloo give r itself;
    # minirl: nothing to compare with, so 0 (GROUP_BASELINE)
    scores = [2.0, -0.5, 0.0]
    got = ADV_ESTIMATORS.get(name)(torch.tensor(scores, dtype=F64), 1, 1e-6)
    verl = (
        verl_rloo_advantages(scores, 1)
        if name == "rloo"
        else verl_grpo_advantages(scores, 1, 1e-6, unbiased=True, by_std=name == "grpo")
    )
    assert verl == pytest.approx([2.0 / (1 + 1e-6), -0.5 / (1 + 1e-6), 0.0] if name == "grpo" else scores)
    assert got.tolist() == [0.0, 0.0, 0.0]


def _outcome_token_rewards(scores: list[float], lengths: list[int]) -> tuple[Tensor, Tensor]:
    """verl's layout of outcome rewards: the score on each row's last response token. -> (rewards, mask) [N, T]"""
    width = max(lengths)
    mask = (torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).to(F64)
    rewards = torch.zeros(len(scores), width, dtype=F64)
    for b, (s, n) in enumerate(zip(scores, lengths, strict=True)):
        rewards[b, n - 1] = s
    return rewards, mask


@pytest.mark.parametrize("length", [1, 3, 7])
@pytest.mark.parametrize("rewards", REWARD_CASES.keys())
def test_departure_reinforce_plus_plus_equal_lengths_is_verls_token_whitening_up_to_a_constant(rewards, length):
    # outcome rewards, γ = 1 (verl's default), every response `length` tokens: verl's per-token returns are
    # the score on every token, so its advantage is one per trajectory too; its variance is unbiased over the
    # N L tokens and minirl's the population variance over N trajectories, so with no eps on either side
    # minirl = verl * sqrt(N L / (N L - 1))
    scores = REWARD_CASES[rewards]
    token_rewards, mask = _outcome_token_rewards(scores, [length] * len(scores))
    verl = verl_reinforce_plus_plus(token_rewards, mask, gamma=1.0, whiten_eps=0.0)
    got = ADV_ESTIMATORS.get("reinforce_plus_plus")(torch.tensor(scores, dtype=F64), 4, 0.0)
    nl = len(scores) * length
    assert_close(verl, got.unsqueeze(1) * mask * math.sqrt((nl - 1) / nl), F64)


@pytest.mark.parametrize("rewards", REWARD_CASES.keys())
def test_departure_reinforce_plus_plus_ragged_lengths_verl_weighs_a_trajectory_by_its_tokens(rewards):
    # with ragged lengths verl's mean and variance are over tokens, so trajectory i weighs L_i; minirl weighs
    # every trajectory once. Both are (r_i - μ) / σ with, for weights w_i:
    #   μ = Σ w r / Σ w,  verl: w = L, σ = sqrt(Σ w (r - μ)² / (Σ w - 1) + 1e-8);  minirl: w = 1, σ = pop. std + eps
    scores, lengths = REWARD_CASES[rewards], [1, 4, 2, 7, 3, 3, 5, 1, 2, 6, 4, 2]
    token_rewards, mask = _outcome_token_rewards(scores, lengths)
    r, w = torch.tensor(scores, dtype=F64), torch.tensor(lengths, dtype=F64)
    mu = (w * r).sum() / w.sum()
    by_tokens = (r - mu) / torch.sqrt((w * (r - mu) ** 2).sum() / (w.sum() - 1) + 1e-8)
    assert_close(verl_reinforce_plus_plus(token_rewards, mask, 1.0, 1e-8), by_tokens.unsqueeze(1) * mask, F64)
    eps = 1e-4
    by_trajectories = (r - r.mean()) / (r.std(unbiased=False) + eps)
    assert_close(ADV_ESTIMATORS.get("reinforce_plus_plus")(r, 4, eps), by_trajectories, F64)
    assert not torch.allclose(by_tokens, by_trajectories, atol=1e-3)  # the difference is real on these inputs


# -- aggregation -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("case", ["ragged", "ties"])
@pytest.mark.parametrize("mode", AGGS)
def test_aggregation_is_verls_agg_loss(mode, case, dtype):
    b = make_batch(case, dtype)
    per_token = b["logp"] * b["old"]  # GARBAGE² on padding
    got = aggregate(per_token, b["mask"], mode, max_tokens_norm=10)
    want = verl_agg_loss(per_token.double(), b["mask"].double(), mode, loss_scale_factor=10)
    assert_close(got, want, dtype)


@pytest.mark.parametrize("mode", AGGS)
def test_departure_an_all_padding_batch_aggregates_to_zero(mode):
    # verl's token-mean and seq-mean-token-mean divide 0 by 0 there (NaN); minirl returns 0
    mask = torch.zeros(2, 3, dtype=F64)
    assert aggregate(torch.full((2, 3), GARBAGE, dtype=F64), mask, mode, max_tokens_norm=4).item() == 0.0


# -- policy losses -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("with_is", [False, True], ids=["no_is", "is"])
@pytest.mark.parametrize("beta,kl", [(0.0, "k3"), (0.1, "k3"), (0.05, "k2")])
@pytest.mark.parametrize("case", ["ragged", "ties"])
@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("name", ["grpo", "gspo", "cispo"])
def test_policy_loss_values_gradients_and_clip_fraction_match_verl(name, agg, case, beta, kl, with_is, dtype):
    # verl's actor: agg(pg * rollout_is_weights) + kl_loss_coef * agg(kl_penalty(logp, ref)), in the same mode
    cfg = Cfg(beta=beta, kl_estimator=kl, agg=agg)
    b = make_batch(case, dtype)
    logp = b["logp"].clone().requires_grad_(True)
    is_weights = b["is"] if with_is else None
    out = LOSSES.get(name)(logp, b["old"], b["ref"], b["adv"], b["mask"], cfg, is_weights=is_weights)
    out.loss.backward()

    ref64 = {k: v.double() for k, v in b.items()}
    pg, pg_grad, clipped = verl_policy_loss(name, ref64, cfg)
    w_is = ref64["is"] if with_is else torch.ones_like(pg)
    kl_value, kl_grad = verl_kl(ref64["logp"], ref64["ref"], kl)
    mask = ref64["mask"]
    want = verl_agg_loss(pg * w_is + beta * kl_value, mask, agg, cfg.max_tokens_norm)
    want_grad = token_weights(mask, agg, cfg.max_tokens_norm) * (pg_grad * w_is + beta * kl_grad)

    assert_close(out.loss, want, dtype)
    assert_close(logp.grad, want_grad, dtype)
    assert_close(out.metrics["loss/clip_frac"], clipped[mask > 0].double().mean(), dtype)


def _at_bounds() -> tuple[Tensor, Tensor, Cfg]:
    """log-probs whose ratios sit exactly on 1 - ε_low, 1 + ε_high and c (the config is read off the ratios
    as exp() computes them, so the ties are exact), with A > 0 on row 0 and A < 0 on row 1."""
    logp = torch.tensor([[math.log(1.25), 0.1, -0.3], [math.log(0.75), math.log(2.5), 0.5]], dtype=F64)
    r = torch.exp(logp)  # old = 0
    cfg = Cfg(clip_low=1 - r[1, 0].item(), clip_high=r[0, 0].item() - 1, clip_ratio_c=r[1, 1].item())
    assert 1 - cfg.clip_low == r[1, 0] and 1 + cfg.clip_high == r[0, 0]  # exact in float64
    return logp, r, cfg


@pytest.mark.parametrize("agg", AGGS)
def test_grpo_at_the_clip_bounds_keeps_the_gradient_as_verl(agg):
    logp, r, cfg = _at_bounds()
    cfg.agg, adv = agg, torch.tensor([0.8, -1.5], dtype=F64)
    old, mask = torch.zeros_like(logp), torch.ones_like(logp)
    x = logp.clone().requires_grad_(True)
    out = LOSSES.get("grpo")(x, old, None, adv, mask, cfg)
    out.loss.backward()
    pg, pg_grad, _ = verl_vanilla(logp, old, adv, cfg)
    assert_close(out.loss, verl_agg_loss(pg, mask, agg, cfg.max_tokens_norm), F64)
    want_grad = token_weights(mask, agg, cfg.max_tokens_norm) * pg_grad
    # at r = 1 + ε_high (A > 0) and r = 1 - ε_low (A < 0) both sides of verl's max carry -A r: the full gradient
    assert_close(x.grad, want_grad, F64)
    # at r = c (A < 0) minirl's `r > c` keeps the whole gradient too, but verl writes the dual clip as
    # min(-A c, -A r), and torch gives each side of a tie half (a measure-zero departure)
    ratio = r[1, 1].clone().requires_grad_(True)
    torch.minimum(1.5 * torch.tensor(cfg.clip_ratio_c, dtype=F64), 1.5 * ratio).backward()
    assert ratio.grad.item() == 0.75 and pg_grad[1, 1].item() == pytest.approx(1.5 * r[1, 1].item(), rel=1e-15)


def test_gspo_caps_the_sequence_log_ratio_as_verl():
    # verl caps log s_i at 10 (value exp(10), gradient 0); so does minirl: at log s = 12 with A < 0 the loss
    # is exp(10), not exp(12), and the sequence pulls with no gradient
    logp = torch.tensor([[12.0, 12.0]], dtype=F64)
    old, mask, adv = torch.zeros_like(logp), torch.ones_like(logp), torch.tensor([-1.0], dtype=F64)
    x = logp.clone().requires_grad_(True)
    out = LOSSES.get("gspo")(x, old, None, adv, mask, Cfg(agg="seq-mean-token-mean"))
    out.loss.backward()
    pg, pg_grad, _ = verl_gspo(logp, old, mask, adv, Cfg())
    assert out.loss.item() == pytest.approx(math.exp(10), rel=1e-12) == pg[0, 0].item()
    assert x.grad.abs().sum().item() == 0.0 == pg_grad.abs().sum().item()


def test_cispo_clamps_the_log_ratio_at_plus_minus_20_as_verl():
    # it shows only where no clip bound binds (loss=cispo sets clip_low: 1, a lower bound of 0): at
    # log r = -25 the weight is exp(-20) in both
    logp = torch.tensor([[-25.0, -0.1]], dtype=F64)
    old, mask, adv = torch.zeros_like(logp), torch.ones_like(logp), torch.tensor([1.0], dtype=F64)
    cfg = Cfg(clip_low=1.0, clip_high=4.0)
    x = logp.clone().requires_grad_(True)
    LOSSES.get("cispo")(x, old, None, adv, mask, cfg).loss.backward()
    _, verl_grad, _ = verl_cispo(logp, old, adv, cfg)
    assert x.grad[0].tolist() == pytest.approx((verl_grad[0] / 2).tolist(), rel=1e-12)  # token-mean over 2
    assert x.grad[0, 0].item() == pytest.approx(-math.exp(-20) / 2, rel=1e-12)


# -- KL ----------------------------------------------------------------------------------------

# d = log π_ref - log π: both sides of the ±20 clamp, of the cap at 10 (k3 reaches 10 near d = 2.53 and d = -11),
# and values next to 0 where exp(d) - 1 cancels
KL_GAPS = [-25.0, -20.0, -12.0, -8.0, -1.0, -1e-3, 0.0, 1e-6, 0.5, 2.4, 2.6, 5.0, 8.0, 20.0, 25.0]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
def test_kl_estimators_are_verls_kl_penalty(name, dtype):
    g = torch.Generator().manual_seed(3)
    logp = -2 * torch.rand(2, len(KL_GAPS), generator=g, dtype=F64)
    ref = logp + torch.tensor([KL_GAPS, [3 * x for x in torch.randn(len(KL_GAPS), generator=g, dtype=F64).tolist()]])
    x = logp.to(dtype).requires_grad_(True)
    out = KL_ESTIMATORS.get(name)(x, ref.to(dtype))
    out.sum().backward()
    want, want_grad = verl_kl(x.detach().double(), ref.to(dtype).double(), name)
    assert_close(out, want, dtype)
    assert_close(x.grad, want_grad, dtype)


def test_k3_at_log_ratio_5_is_10_with_no_gradient():
    x = torch.tensor([[-5.0]], dtype=F64, requires_grad=True)
    out = KL_ESTIMATORS.get("k3")(x, torch.zeros(1, 1, dtype=F64))
    out.backward()
    assert out.item() == 10.0 and x.grad.item() == 0.0
    assert verl_kl(x.detach(), torch.zeros(1, 1, dtype=F64), "k3")[0].item() == 10.0


@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
def test_kl_in_reward_is_verls_token_penalty_summed_over_the_response(name):
    # verl's use_kl_in_reward subtracts kl_coef * kl_penalty(old, ref) from every token's reward; its outcome
    # estimators (grpo, rloo, ...) sum the token rewards, so the trajectory's reward is r - kl_coef * this sum
    b = make_batch("ragged", F64)
    per_token, _ = verl_kl(b["old"], b["ref"], name)
    want = torch.tensor([row[m > 0].sum().item() for row, m in zip(per_token, b["mask"], strict=True)], dtype=F64)
    assert_close(sequence_kl(b["old"], b["ref"], b["mask"], name), want, F64)


# -- rollout importance sampling ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("threshold", [1.0, 2.0, 5.0])
@pytest.mark.parametrize("case", ["ragged", "ties"])
def test_token_is_weights_are_verls_truncated_weights(case, threshold, dtype):
    b = make_batch(case, dtype)
    old = b["old"].clone()
    old[0, :2] = b["sampler"][0, :2] + torch.tensor([25.0, -25.0], dtype=dtype)  # past the ±20 clamp both ways
    out = rollout_correction(old, b["sampler"], b["mask"], "token", threshold)
    want = verl_rollout_is_token((old - b["sampler"]).double(), b["mask"].double(), threshold)
    keep = b["mask"] > 0
    assert_close(out.weights[keep], want[keep], dtype)
    assert torch.equal(out.mask, b["mask"])


# rows of per-token gaps log π_old - log π_sampler: inside, above C, below 1/C, exactly on log C and on -log C,
# a row whose tokens cancel, and an empty row
SEQ_GAPS = [[0.3, -0.2, 0.1], [0.5, 0.4, 0.0], [-0.9, 0.0, 0.0], [math.log(2.0), 0.0, 0.0], [-math.log(2.0), 0, 0]]
SEQ_GAPS += [[3.0, -3.0, 0.0], [0.0, 0.0, 0.0]]
SEQ_MASK = [[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 1, 0], [0, 0, 0]]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_sequence_rejection_is_verls_seq_sum_k1(dtype):
    gap, mask = torch.tensor(SEQ_GAPS, dtype=dtype), torch.tensor(SEQ_MASK, dtype=dtype)
    out = rollout_correction(gap, torch.zeros_like(gap), mask, "sequence", threshold=2.0)  # π_sampler = 1
    assert torch.equal(out.mask, verl_rollout_rs_seq_sum_k1(gap, mask, 2.0))
    assert out.mask.sum(dim=1).tolist() == [3, 0, 0, 1, 1, 2, 0]  # the ties at ±log 2 are kept on both sides


def test_departure_sequence_rejection_sums_unclamped_gaps():
    # verl clamps each token's gap to ±20 before summing; minirl sums the gaps as they are. With C = exp(15)
    # a row of gaps (25, -8) sums to 17 (rejected by minirl) but to 20 - 8 = 12 under verl's clamp (kept)
    gap, mask = torch.tensor([[25.0, -8.0]], dtype=F64), torch.ones(1, 2, dtype=F64)
    out = rollout_correction(gap, torch.zeros_like(gap), mask, "sequence", threshold=math.exp(15))
    assert out.mask.sum().item() == 0
    assert verl_rollout_rs_seq_sum_k1(gap, mask, math.exp(15)).sum().item() == 2
