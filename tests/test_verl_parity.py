"""minirl's losses, aggregations, KL estimators, advantages and rollout IS against verl's own functions.

`make parity` installs verl 0.9.1 (with --no-deps, on the project's torch) into a scratch venv, .venv-parity, and
runs this module there; anywhere else it is skipped. The formulas themselves are checked without verl in
tests/test_loss_parity.py, which also pins each deliberate departure (docs/algorithms.md).

Tolerances: 1e-10 relative in float64 and 1e-5 in float32, except where verl adds 1e-8 to a denominator
(seq-mean-token-mean's per-row token count, masked_mean's count in the clip fractions, masked_whiten's variance):
there 1e-6 relative (1e-8 on a row of one token, and the rows partly cancel).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torch import Tensor

core_algos = pytest.importorskip(
    "verl.trainer.ppo.core_algos", reason="verl is not installed here: `make parity` runs this module against it"
)
rollout_corr = pytest.importorskip("verl.trainer.ppo.rollout_corr_helper")
from verl.workers.config import ActorConfig  # noqa: E402

from minirl.algos.advantages import ADV_ESTIMATORS  # noqa: E402
from minirl.algos.kl import KL_ESTIMATORS  # noqa: E402
from minirl.algos.losses import LOSSES, aggregate  # noqa: E402
from minirl.algos.rollout_correction import rollout_correction  # noqa: E402

F64, F32 = torch.float64, torch.float32
DTYPES = [F64, F32]
AGGS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
VERL_LOSS = {"grpo": "vanilla", "gspo": "gspo", "cispo": "cispo"}
MAX_TOKENS_NORM = 10  # minirl's loss.max_tokens_norm = verl's loss_scale_factor; not the batch width
GARBAGE = 1e3  # what padding holds: finite, far past every clamp


def assert_close(got: Tensor, want: Tensor, dtype: torch.dtype, loose: bool = False) -> None:
    """float64: 1e-10 relative (1e-6 where verl adds 1e-8 to a denominator); float32: 1e-5."""
    rtol = 1e-5 if dtype == F32 else 1e-6 if loose else 1e-10
    torch.testing.assert_close(got.double(), want.double(), rtol=rtol, atol=rtol * 1e-2)


class Minirl:
    """minirl's LossConfig fields, set to the values handed to verl's ActorConfig."""

    def __init__(self, agg: str, beta: float, kl_estimator: str, clip_low: float, clip_high: float) -> None:
        self.agg, self.beta, self.kl_estimator = agg, beta, kl_estimator
        self.clip_low, self.clip_high, self.clip_ratio_c = clip_low, clip_high, 3.0
        self.max_tokens_norm = MAX_TOKENS_NORM


def make_batch(case: str, dtype: torch.dtype) -> dict[str, Tensor]:
    """[7, 9]: ragged rows, a one-token row, an all-padding row; `ties` has ratios of exactly 1 and equal advantages."""
    g = torch.Generator().manual_seed(11)
    lengths = torch.tensor([9, 4, 1, 0, 6, 9, 2])
    mask = (torch.arange(9).unsqueeze(0) < lengths.unsqueeze(1)).to(F64)
    logp = -3 * torch.rand(7, 9, generator=g, dtype=F64)
    if case == "ragged":
        old = logp + 1.2 * torch.randn(7, 9, generator=g, dtype=F64)
        ref = logp + torch.randn(7, 9, generator=g, dtype=F64)
        adv = torch.tensor([1.3, -0.7, 0.4, -2.0, -1.1, 0.9, -0.3], dtype=F64)
    else:
        old, ref = logp.clone(), logp.clone()
        adv = torch.tensor([1.0, 1.0, 0.0, -1.0, -1.0, 0.0, 0.5], dtype=F64)
    pad = mask == 0
    logp[pad], old[pad], ref[pad] = GARBAGE, -GARBAGE, GARBAGE / 2
    is_weights = (0.5 + torch.rand(7, 9, generator=g, dtype=F64)) * mask
    batch = {"logp": logp, "old": old, "ref": ref, "adv": adv, "mask": mask, "is": is_weights}
    return {k: v.to(dtype) for k, v in batch.items()}


# -- policy losses -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("with_is", [False, True], ids=["no_is", "is"])
@pytest.mark.parametrize("beta,kl", [(0.0, "k3"), (0.1, "k3"), (0.05, "k1"), (0.2, "k2")])
@pytest.mark.parametrize("case", ["ragged", "ties"])
@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("name", ["grpo", "gspo", "cispo"])
def test_policy_loss_matches_verls(name, agg, case, beta, kl, with_is, dtype):
    # verl's ppo_loss (verl/workers/utils/losses.py): policy loss fn + kl_loss_coef * agg_loss(kl_penalty(...))
    clip_low, clip_high = (1.0, 4.0) if name == "cispo" else (0.2, 0.28)
    b = make_batch(case, dtype)
    is_weights = b["is"] if with_is else None

    logp = b["logp"].clone().requires_grad_(True)
    cfg = Minirl(agg, beta, kl, clip_low, clip_high)
    out = LOSSES.get(name)(logp, b["old"], b["ref"], b["adv"], b["mask"], cfg, is_weights=is_weights)
    out.loss.backward()

    verl_cfg = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio_low=clip_low,
        clip_ratio_high=clip_high,
        loss_agg_mode=agg,
        global_batch_info={"loss_scale_factor": MAX_TOKENS_NORM},
    )
    verl_logp = b["logp"].clone().requires_grad_(True)
    adv = b["adv"].unsqueeze(1) * b["mask"]  # verl's [B, T] advantages
    pg, metrics = core_algos.get_policy_loss_fn(VERL_LOSS[name])(
        b["old"], verl_logp, adv, b["mask"], agg, verl_cfg, rollout_is_weights=is_weights
    )
    kld = core_algos.kl_penalty(verl_logp, b["ref"], kl)
    verl_loss = pg + beta * core_algos.agg_loss(kld, b["mask"], agg, **verl_cfg.global_batch_info)
    verl_loss.backward()

    loose = agg == "seq-mean-token-mean"
    assert_close(out.loss, verl_loss.detach(), dtype, loose)
    assert_close(logp.grad, verl_logp.grad, dtype, loose)
    # minirl counts every binding clip; verl's pg_clipfrac_lower is vanilla's dual clip (0 for gspo and cispo)
    verl_clip = torch.tensor(metrics["actor/pg_clipfrac"] + metrics["actor/pg_clipfrac_lower"])
    assert_close(out.metrics["loss/clip_frac"], verl_clip, dtype, loose=True)


# -- aggregation and KL ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("case", ["ragged", "ties"])
@pytest.mark.parametrize("mode", AGGS)
def test_aggregate_matches_verls_agg_loss(mode, case, dtype):
    b = make_batch(case, dtype)
    per_token = b["logp"] * b["old"]
    got = aggregate(per_token, b["mask"], mode, max_tokens_norm=MAX_TOKENS_NORM)
    want = core_algos.agg_loss(per_token, b["mask"], mode, loss_scale_factor=MAX_TOKENS_NORM)
    assert_close(got, want, dtype, loose=mode == "seq-mean-token-mean")


KL_GAPS = [-25.0, -20.0, -12.0, -8.0, -1.0, -1e-3, 0.0, 1e-6, 0.5, 2.4, 2.6, 5.0, 8.0, 20.0, 25.0]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
def test_kl_estimators_match_verls_kl_penalty(name, dtype):
    g = torch.Generator().manual_seed(5)
    logp = (-2 * torch.rand(2, len(KL_GAPS), generator=g, dtype=F64)).to(dtype)
    gaps = torch.stack([torch.tensor(KL_GAPS, dtype=F64), 3 * torch.randn(len(KL_GAPS), generator=g, dtype=F64)])
    ref = (logp.double() + gaps).to(dtype)
    ours, theirs = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
    got, want = KL_ESTIMATORS.get(name)(ours, ref), core_algos.kl_penalty(theirs, ref, name)
    got.sum().backward()
    want.sum().backward()
    assert_close(got, want.detach(), dtype)
    assert_close(ours.grad, theirs.grad, dtype)


# -- advantages --------------------------------------------------------------------------------

REWARDS = {
    "continuous": [0.3, 0.3, 0.3, 0.3, 1.5, -0.2, 0.7, 2.0, -1.0, 0.25, 0.5, 0.125],
    "binary": [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0],
}


def verl_outcome(scores: list[float], group_size: int, lengths: list[int] | None = None) -> tuple[Tensor, ...]:
    """verl's inputs: the score on each response's last token [N, T], the response mask [N, T], group ids [N]."""
    lengths = lengths or [3] * len(scores)
    mask = (torch.arange(max(lengths)).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).to(F64)
    token_rewards = torch.zeros_like(mask)
    token_rewards[torch.arange(len(scores)), torch.tensor(lengths) - 1] = torch.tensor(scores, dtype=F64)
    return token_rewards, mask, np.arange(len(scores)) // group_size


def flat_groups(scores: list[float], g: int) -> Tensor:
    return torch.tensor([len(set(scores[i // g * g : i // g * g + g])) == 1 for i in range(len(scores))])


@pytest.mark.parametrize("g", [2, 3, 4])
@pytest.mark.parametrize("rewards", REWARDS.keys())
def test_grpo_is_verls_times_sqrt_g_over_g_minus_1(rewards, g):
    # population std against verl's torch.std: with eps = 0 the factor is exact; a tied group is exactly 0 here
    # and 0 / 1e-6 (rounding noise) in verl
    scores = REWARDS[rewards]
    token_rewards, mask, index = verl_outcome(scores, g)
    verl, _ = core_algos.compute_grpo_outcome_advantage(token_rewards, mask, index, epsilon=0.0)
    verl_eps, _ = core_algos.compute_grpo_outcome_advantage(token_rewards, mask, index, epsilon=1e-6)
    got = ADV_ESTIMATORS.get("grpo")(torch.tensor(scores, dtype=F64), g, 0.0)
    flat = flat_groups(scores, g)
    assert_close(got[~flat], verl[~flat, 0] * math.sqrt(g / (g - 1)), F64)
    assert torch.equal(got[flat], torch.zeros(int(flat.sum()), dtype=F64))
    assert verl_eps[flat].abs().le(1e-9).all()


@pytest.mark.parametrize("g", [2, 3, 4])
@pytest.mark.parametrize("rewards", REWARDS.keys())
@pytest.mark.parametrize("name", ["dr_grpo", "rloo"])
def test_dr_grpo_and_rloo_match_verls(name, rewards, g):
    scores = REWARDS[rewards]
    token_rewards, mask, index = verl_outcome(scores, g)
    if name == "dr_grpo":
        verl, _ = core_algos.compute_grpo_outcome_advantage(token_rewards, mask, index, norm_adv_by_std_in_grpo=False)
    else:
        verl, _ = core_algos.compute_rloo_outcome_advantage(token_rewards, mask, index)
    got = ADV_ESTIMATORS.get(name)(torch.tensor(scores, dtype=F64), g, 1e-6)
    assert_close(got.unsqueeze(1) * mask, verl, F64)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_a_group_of_one_is_zero_where_verl_keeps_the_reward(name):
    scores = [2.0, -0.5, 0.0]
    token_rewards, mask, index = verl_outcome(scores, 1)
    if name == "rloo":
        verl, _ = core_algos.compute_rloo_outcome_advantage(token_rewards, mask, index)
    else:
        by_std = name == "grpo"
        verl, _ = core_algos.compute_grpo_outcome_advantage(token_rewards, mask, index, norm_adv_by_std_in_grpo=by_std)
    want = [s / (1 + 1e-6) for s in scores] if name == "grpo" else scores
    assert verl[:, -1].tolist() == pytest.approx(want, rel=1e-6)  # verl's std of a lone sample is a float32 1
    assert ADV_ESTIMATORS.get(name)(torch.tensor(scores, dtype=F64), 1, 1e-6).tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("length", [1, 3, 7])
@pytest.mark.parametrize("rewards", REWARDS.keys())
def test_reinforce_plus_plus_with_equal_lengths_is_verls_up_to_a_constant(rewards, length):
    # outcome rewards, gamma = 1: verl's whitening over N L tokens (unbiased) vs minirl's over N trajectories
    scores = REWARDS[rewards]
    token_rewards, mask, _ = verl_outcome(scores, 4, [length] * len(scores))
    verl, _ = core_algos.compute_reinforce_plus_plus_outcome_advantage(
        token_rewards, mask, config=OmegaConf.create({"gamma": 1.0})
    )
    got = ADV_ESTIMATORS.get("reinforce_plus_plus")(torch.tensor(scores, dtype=F64), 4, 0.0)
    nl = len(scores) * length
    assert_close(got.unsqueeze(1) * mask * math.sqrt((nl - 1) / nl), verl, F64, loose=True)


# -- rollout importance sampling ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("threshold", [1.0, 2.0, 5.0])
def test_token_is_weights_match_verls(threshold, dtype):
    b = make_batch("ragged", dtype)
    sampler = b["old"] + 0.4 * torch.randn(b["old"].shape, generator=torch.Generator().manual_seed(2)).to(dtype)
    sampler[0, :2] = b["old"][0, :2] + torch.tensor([-25.0, 25.0], dtype=dtype)  # past verl's ±20 clamp
    out = rollout_correction(b["old"], sampler, b["mask"], "token", threshold)
    weights, _ = rollout_corr.compute_rollout_correction_weights(b["old"] - sampler, b["mask"], "token", threshold)
    keep = b["mask"] > 0
    assert_close(out.weights[keep], weights[keep], dtype)


SEQ_GAPS = [[0.3, -0.2, 0.1], [0.5, 0.4, 0.0], [-0.9, 0.0, 0.0], [math.log(2.0), 0.0, 0.0], [-math.log(2.0), 0, 0]]
SEQ_GAPS += [[3.0, -3.0, 0.0], [0.0, 0.0, 0.0]]
SEQ_MASK = [[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 1, 0], [0, 0, 0]]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_sequence_rejection_matches_verls_seq_sum_k1(dtype):
    gap, mask = torch.tensor(SEQ_GAPS, dtype=dtype), torch.tensor(SEQ_MASK, dtype=dtype)
    out = rollout_correction(gap, torch.zeros_like(gap), mask, "sequence", threshold=2.0)
    verl_mask, _ = rollout_corr.compute_rollout_rejection_mask(gap, mask, "seq_sum_k1", 2.0)
    assert torch.equal(out.mask, verl_mask)
    assert out.mask.sum(dim=1).tolist() == [3, 0, 0, 1, 1, 2, 0]
