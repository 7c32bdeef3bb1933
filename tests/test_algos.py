"""Advantages, KL estimators, aggregation and losses against hand-written scalar computations."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minirl.algos.advantages import ADV_ESTIMATORS, GROUP_BASELINE, grpo_advantages
from minirl.algos.kl import KL_ESTIMATORS, sequence_kl
from minirl.algos.losses import AGGREGATIONS, LOSSES, LossOut, aggregate, reference_nll
from minirl.errors import ConfigError

pytestmark = pytest.mark.fast

F64 = torch.float64


@dataclass
class Cfg:
    clip_low: float = 0.2
    clip_high: float = 0.3
    clip_ratio_c: float = 3.0
    beta: float = 0.0
    kl_estimator: str = "k3"
    agg: str = "token-mean"
    max_tokens_norm: int = 6  # not the batch width (4): the constant must come from here


# -- advantages --------------------------------------------------------------------------------


def test_grpo_advantages_match_hand_computation():
    rewards = torch.tensor([1.0, 2.0, 3.0, 0.0, 0.0, 4.0], dtype=F64)
    eps = 1e-4
    out = grpo_advantages(rewards, group_size=3, eps=eps)
    # group 1: mean 2, population std sqrt(2/3); group 2: mean 4/3, std sqrt(((16+16+64)/9)/3)
    s1 = math.sqrt(2 / 3)
    m2 = 4 / 3
    s2 = math.sqrt(((0 - m2) ** 2 * 2 + (4 - m2) ** 2) / 3)
    expected = [-1 / (s1 + eps), 0.0, 1 / (s1 + eps), -m2 / (s2 + eps), -m2 / (s2 + eps), (4 - m2) / (s2 + eps)]
    assert out.tolist() == pytest.approx(expected, rel=1e-12)
    assert out.shape == (6,)


REWARDS = [1.0, 2.0, 6.0, 0.0, 0.0, 4.0, 3.0, 3.0, 3.0]  # three groups of 3; the last one flat


def _hand_group_advantages(name: str, rewards: list[float], g: int, eps: float) -> list[float]:
    """Each estimator written out with Python floats, one trajectory at a time."""
    out = []
    for i, r in enumerate(rewards):
        group = rewards[i // g * g : i // g * g + g]
        others = group[: i % g] + group[i % g + 1 :]
        if name == "dr_grpo":
            out.append(r - sum(group) / g)
        elif name == "rloo":
            out.append(r - sum(others) / len(others) if others else 0.0)
        else:  # reinforce_plus_plus: the whole batch is one pool
            mean = sum(rewards) / len(rewards)
            std = math.sqrt(sum((x - mean) ** 2 for x in rewards) / len(rewards))
            out.append((r - mean) / (std + eps) if std > 0 else 0.0)
    return out


@pytest.mark.parametrize("name", ["dr_grpo", "rloo", "reinforce_plus_plus"])
@pytest.mark.parametrize("g", [1, 3])
def test_advantages_match_hand_computation(name, g):
    eps = 1e-3
    out = ADV_ESTIMATORS.get(name)(torch.tensor(REWARDS, dtype=F64), g, eps)
    assert out.shape == (9,) and out.dtype == F64
    assert out.tolist() == pytest.approx(_hand_group_advantages(name, REWARDS, g, eps), rel=1e-12, abs=1e-15)


def test_advantages_by_hand_on_one_group():
    r = torch.tensor([1.0, 2.0, 6.0], dtype=F64)  # mean 3; leave-one-out means 4, 3.5, 1.5
    assert ADV_ESTIMATORS.get("dr_grpo")(r, 3, 0.0).tolist() == pytest.approx([-2.0, -1.0, 3.0])
    assert ADV_ESTIMATORS.get("rloo")(r, 3, 0.0).tolist() == pytest.approx([-3.0, -1.5, 4.5])
    std = math.sqrt((4 + 1 + 9) / 3)
    expected = [-2 / (std + 0.5), -1 / (std + 0.5), 3 / (std + 0.5)]
    assert ADV_ESTIMATORS.get("reinforce_plus_plus")(r, 3, 0.5).tolist() == pytest.approx(expected)
    # reinforce_plus_plus ignores the groups: the same batch in groups of 1 gives the same advantages
    assert ADV_ESTIMATORS.get("reinforce_plus_plus")(r, 1, 0.5).tolist() == pytest.approx(expected)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_plus_plus"])
@pytest.mark.parametrize("eps", [0.0, 1e-6])
def test_flat_rewards_and_singletons_give_exact_zeros(name, eps):
    fn = ADV_ESTIMATORS.get(name)
    equal = torch.full((12,), 0.3)  # the float32 mean of six 0.3 rounds away from 0.3
    assert torch.equal(fn(equal, 6, eps), torch.zeros(12))
    if name != "reinforce_plus_plus":  # two flat groups at different levels; its batch pool is not flat
        assert torch.equal(fn(torch.tensor([0.1, 0.1, 0.1, 0.7, 0.7, 0.7]), 3, eps), torch.zeros(6))
    if name != "reinforce_plus_plus":  # its batch pool is not flat here; groups of one mean nothing to it
        assert torch.equal(fn(torch.tensor([3.0, -1.0, 0.5]), 1, eps), torch.zeros(3))
    assert torch.equal(fn(torch.tensor([2.5]), 1, eps), torch.zeros(1))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_plus_plus"])
def test_advantages_bad_shapes(name):
    fn = ADV_ESTIMATORS.get(name)
    with pytest.raises(ValueError, match="groups of 4"):
        fn(torch.zeros(6), 4, 1e-4)
    with pytest.raises(ValueError):
        fn(torch.zeros(2, 3), 3, 1e-4)
    with pytest.raises(ValueError):
        fn(torch.zeros(6), 0, 1e-4)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 4).flatmap(
        lambda g: st.tuples(
            st.just(g),
            st.lists(st.sampled_from([-3.0, -0.5, 0.0, 0.1, 1.0, 2.5]), min_size=g, max_size=4 * g).map(
                lambda xs, g=g: xs[: len(xs) // g * g]
            ),
        )
    ),
    st.sampled_from([0.0, 1e-4]),
    st.sampled_from(["grpo", "dr_grpo", "rloo"]),
)
def test_group_advantages_properties(case, eps, name):
    g, values = case
    adv = ADV_ESTIMATORS.get(name)(torch.tensor(values, dtype=F64), g, eps).view(-1, g)
    assert torch.isfinite(adv).all()
    assert adv.sum(dim=1).abs().max().item() < 1e-9  # zero mean per group
    rewards = torch.tensor(values, dtype=F64).view(-1, g)
    # order-preserving within a group
    for r_row, a_row in zip(rewards.tolist(), adv.tolist(), strict=True):
        for i in range(g):
            for j in range(g):
                if r_row[i] < r_row[j]:
                    assert a_row[i] < a_row[j]


def test_adv_registry():
    assert ADV_ESTIMATORS.get("grpo") is grpo_advantages
    assert ADV_ESTIMATORS.names() == ["dr_grpo", "grpo", "reinforce_plus_plus", "rloo"]
    with pytest.raises(ConfigError, match="unknown advantage estimator 'gae'; known: dr_grpo, grpo, reinforce_plus_"):
        ADV_ESTIMATORS.get("gae")


# -- KL estimators -----------------------------------------------------------------------------

LOGP = [[-0.5, -2.0, -0.1], [-1.2, -0.7, -3.0]]
REF = [[-0.7, -1.0, -0.1], [-2.0, -0.2, -2.5]]


def _hand_kl(name: str, lp: float, rf: float) -> tuple[float, float]:
    """(value, d value / d logp) written out per estimator."""
    if name == "k1":
        return lp - rf, 1.0
    if name == "k2":
        return 0.5 * (lp - rf) ** 2, lp - rf
    return math.exp(rf - lp) - (rf - lp) - 1, 1 - math.exp(rf - lp)


@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
def test_kl_values_and_gradients(name):
    logp = torch.tensor(LOGP, dtype=F64, requires_grad=True)
    ref = torch.tensor(REF, dtype=F64)
    out = KL_ESTIMATORS.get(name)(logp, ref)
    out.sum().backward()
    for b in range(2):
        for t in range(3):
            value, grad = _hand_kl(name, LOGP[b][t], REF[b][t])
            assert out[b, t].item() == pytest.approx(value, rel=1e-12, abs=1e-15)
            assert logp.grad[b, t].item() == pytest.approx(grad, rel=1e-12, abs=1e-15)


def test_k1_and_k3_are_unbiased_and_k3_nonnegative():
    # exact expectation over x ~ p of the estimator equals KL(p || q)
    p = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=F64)
    q = torch.tensor([0.25, 0.25, 0.25, 0.25], dtype=F64)
    kl = (p * (p / q).log()).sum()
    for name in ("k1", "k3"):
        est = KL_ESTIMATORS.get(name)(p.log().view(1, -1), q.log().view(1, -1))
        assert (p * est[0]).sum().item() == pytest.approx(kl.item(), rel=1e-12)
    k3 = KL_ESTIMATORS.get("k3")(p.log().view(1, -1), q.log().view(1, -1))
    assert (k3 >= 0).all()
    same = torch.tensor([[-1e-9, -0.3]], dtype=F64)
    assert torch.equal(KL_ESTIMATORS.get("k3")(same, same), torch.zeros(1, 2, dtype=F64))


@pytest.mark.parametrize("d", [5.0, 8.0, 25.0])
def test_k3_caps_the_estimate_at_10_with_no_gradient(d):
    # verl's low_var_kl: at d = log pi_ref - log pi = 5, exp(5) - 5 - 1 = 142.4 is capped at 10, and the
    # token pushed down that hard pulls with no gradient; d = 25 is also clamped to 20 before exp()
    logp = torch.tensor([[-d - 0.5, -0.5]], dtype=F64, requires_grad=True)
    ref = torch.tensor([[-0.5, -0.5 - 1.0]], dtype=F64)
    out = KL_ESTIMATORS.get("k3")(logp, ref)
    out.sum().backward()
    assert out[0, 0].item() == 10.0 and logp.grad[0, 0].item() == 0.0
    # below the cap the estimate keeps its value and gradient: d = -1
    assert out[0, 1].item() == pytest.approx(math.exp(-1) + 1 - 1, rel=1e-12)
    assert logp.grad[0, 1].item() == pytest.approx(1 - math.exp(-1), rel=1e-12)


def test_dual_clip_caps_the_loss_of_a_negative_advantage_token():
    # ratios 2, 4, 10 with A = -1: plain PPO loses r (no clip binds above 1 for A < 0); dual-clip with
    # c = 3 caps the loss at 3 with no gradient once r > 3; c = 0 turns it off
    logp = torch.tensor([[math.log(2.0), math.log(4.0), math.log(10.0)]], dtype=F64, requires_grad=True)
    old, mask, adv = torch.zeros(1, 3, dtype=F64), torch.ones(1, 3, dtype=F64), torch.tensor([-1.0], dtype=F64)
    out = LOSSES.get("grpo")(logp, old, None, adv, mask, Cfg(agg="token-mean"))
    out.loss.backward()
    assert out.loss.item() == pytest.approx((2 + 3 + 3) / 3, rel=1e-12)
    assert logp.grad[0].tolist() == pytest.approx([2 / 3, 0.0, 0.0], rel=1e-12)
    assert out.metrics["loss/clip_frac"].item() == pytest.approx(2 / 3)
    off = LOSSES.get("grpo")(logp.detach(), old, None, adv, mask, Cfg(agg="token-mean", clip_ratio_c=0.0))
    assert off.loss.item() == pytest.approx((2 + 4 + 10) / 3, rel=1e-12)
    # A > 0 is never dual-clipped: r = 10 is clipped at 1 + clip_high as ever
    pos = LOSSES.get("grpo")(logp.detach(), old, None, -adv, mask, Cfg(agg="token-mean"))
    assert pos.loss.item() == pytest.approx(-1.3, rel=1e-12)


@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
def test_sequence_kl_sums_the_sampled_tokens_only(name):
    logp = torch.tensor(LOGP, dtype=F64, requires_grad=True)
    ref = torch.tensor(REF, dtype=F64)
    mask = torch.tensor([[1, 0, 1], [0, 0, 0]], dtype=F64)
    poisoned = logp.detach().clone()
    poisoned[0, 1], poisoned[1, 2] = float("nan"), float("inf")  # padding can hold anything
    expected = [_hand_kl(name, LOGP[0][0], REF[0][0])[0] + _hand_kl(name, LOGP[0][2], REF[0][2])[0], 0.0]
    for lp in (logp, poisoned):
        out = sequence_kl(lp, ref, mask, name)
        assert out.shape == (2,) and not out.requires_grad  # a constant of the step: it shapes the reward
        assert out.tolist() == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_kl_registry():
    assert KL_ESTIMATORS.names() == ["k1", "k2", "k3"]
    with pytest.raises(ConfigError, match="known: k1, k2, k3"):
        KL_ESTIMATORS.get("k4")


# -- aggregation -------------------------------------------------------------------------------

VALUES = [[1.0, 2.0, 3.0, 100.0], [4.0, 99.0, 98.0, 97.0], [50.0, 60.0, 70.0, 80.0]]
MASK = [[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]]  # padded rows; the last has no sampled token


def test_aggregate_modes_by_hand():
    x = torch.tensor(VALUES, dtype=F64, requires_grad=True)
    m = torch.tensor(MASK, dtype=F64)
    tm = aggregate(x, m, "token-mean")
    assert tm.item() == pytest.approx((1 + 2 + 3 + 4) / 4)
    (g,) = torch.autograd.grad(tm, x)
    assert g.tolist() == [[0.25, 0.25, 0.25, 0], [0.25, 0, 0, 0], [0, 0, 0, 0]]

    sm = aggregate(x, m, "seq-mean-token-mean")
    assert sm.dim() == 0
    assert sm.item() == pytest.approx(((1 + 2 + 3) / 3 + 4 / 1) / 2)  # the empty row is skipped
    (g,) = torch.autograd.grad(sm, x)
    assert g.flatten().tolist() == pytest.approx([1 / 6, 1 / 6, 1 / 6, 0, 0.5, 0, 0, 0, 0, 0, 0, 0])

    # Dr. GRPO: each row's token sum over the constant 5, then the mean over the 2 non-empty rows
    sn = aggregate(x, m, "seq-mean-token-sum-norm", max_tokens_norm=5)
    assert sn.dim() == 0
    assert sn.item() == pytest.approx(((1 + 2 + 3) / 5 + 4 / 5) / 2)
    (g,) = torch.autograd.grad(sn, x)
    assert g.flatten().tolist() == pytest.approx([0.1, 0.1, 0.1, 0, 0.1, 0, 0, 0, 0, 0, 0, 0])


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_aggregate_empty_mask_is_zero_and_padding_cannot_leak(mode):
    x = torch.tensor(VALUES, requires_grad=True)
    out = aggregate(x, torch.zeros(3, 4), mode, max_tokens_norm=5)
    assert out.item() == 0.0
    (g,) = torch.autograd.grad(out, x)
    assert torch.equal(g, torch.zeros(3, 4))
    poisoned = torch.tensor(VALUES)
    poisoned[0, 3], poisoned[1, 1] = float("nan"), float("inf")
    assert aggregate(poisoned, torch.tensor(MASK, dtype=torch.float32), mode, 5).item() == pytest.approx(
        aggregate(torch.tensor(VALUES), torch.tensor(MASK, dtype=torch.float32), mode, 5).item()
    )


def test_aggregate_errors():
    with pytest.raises(ConfigError, match="known: seq-mean-token-mean, seq-mean-token-sum-norm, token-mean"):
        aggregate(torch.zeros(2, 2), torch.ones(2, 2), "sum")
    with pytest.raises(ValueError):
        aggregate(torch.zeros(2, 3), torch.ones(2, 2), "token-mean")
    with pytest.raises(ValueError, match="loss.max_tokens_norm > 0"):
        aggregate(torch.zeros(2, 2), torch.ones(2, 2), "seq-mean-token-sum-norm")


# -- losses ------------------------------------------------------------------------------------

# ratios exp(logp - old): row 0 = [1.5, 0.7, 1.0, pad], row 1 = [1.1, 0.6, 1.4, 2.0], row 2 all pad
OLD = [[-1.0, -0.5, -2.0, -0.3], [-0.8, -1.5, -0.2, -1.0], [-0.4, -0.4, -0.4, -0.4]]
RATIOS = [[1.5, 0.7, 1.0, 3.0], [1.1, 0.6, 1.4, 2.0], [1.0, 1.0, 1.0, 1.0]]
NEW = [[o + math.log(r) for o, r in zip(orow, rrow, strict=True)] for orow, rrow in zip(OLD, RATIOS, strict=True)]
REFP = [[-1.1, -0.4, -2.5, -0.3], [-0.9, -1.0, -0.2, -1.3], [-0.4, -0.4, -0.4, -0.4]]
ADV = [1.2, -0.8, 0.5]
LMASK = [[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]]


def _token_weights(mask: list[list[int]], cfg: Cfg) -> list[list[float]]:
    """d aggregate / d per_token for each position, by hand."""
    rows = [sum(row) for row in mask]
    s = sum(1 for r in rows if r)
    if cfg.agg == "token-mean":
        n = sum(rows)
        return [[m / n for m in row] for row in mask]
    if cfg.agg == "seq-mean-token-sum-norm":
        return [[m / (s * cfg.max_tokens_norm) for m in row] for row in mask]
    return [[m / (r * s) if r else 0.0 for m in row] for row, r in zip(mask, rows, strict=True)]


def _seq_ratio(b: int) -> float:
    """GSPO's s_b: exp of the mean log-ratio over row b's sampled tokens (1 for an empty row)."""
    logs = [NEW[b][t] - OLD[b][t] for t in range(4) if LMASK[b][t]]
    return math.exp(sum(logs) / len(logs)) if logs else 1.0


def _hand_loss(name: str, cfg: Cfg) -> dict:
    """Loss, d loss / d logp, and metrics, token by token in Python floats."""
    w = _token_weights(LMASK, cfg)
    low, high = 1 - cfg.clip_low, 1 + cfg.clip_high
    loss = policy = kl_total = 0.0
    clipped_low = clipped_high = ratio_sum = 0.0
    n = sum(map(sum, LMASK))
    grad = [[0.0] * 4 for _ in range(3)]
    for b in range(3):
        a = ADV[b]
        for t in range(4):
            # gspo: every token carries its sequence's ratio, with d s_bt / d logp_bt = s_b (GSPO-token)
            r = _seq_ratio(b) if name == "gspo" else math.exp(NEW[b][t] - OLD[b][t])
            if name in ("grpo", "gspo"):
                unclipped, clip_term = r * a, min(max(r, low), high) * a
                pg = -min(unclipped, clip_term)
                is_clipped = (a > 0 and r > high) or (a < 0 and r < low)
                g = 0.0 if is_clipped else -r * a  # d(-r A)/d logp = -r A; a clipped token is constant
            else:
                weight = min(max(r, low), high)
                pg = -weight * a * NEW[b][t]
                is_clipped = r > high or r < low
                g = -weight * a
            kl, dkl = _hand_kl(cfg.kl_estimator, NEW[b][t], REFP[b][t]) if cfg.beta > 0 else (0.0, 0.0)
            loss += w[b][t] * (pg + cfg.beta * kl)
            policy += w[b][t] * pg
            kl_total += w[b][t] * kl
            grad[b][t] = w[b][t] * (g + cfg.beta * dkl)
            if LMASK[b][t]:
                clipped_low += is_clipped and r < 1
                clipped_high += is_clipped and r > 1
                ratio_sum += r
    return {
        "loss": loss,
        "grad": grad,
        "loss/policy": policy,
        "loss/kl": kl_total,
        "loss/clip_frac": (clipped_low + clipped_high) / n,
        "loss/clip_frac_low": clipped_low / n,
        "loss/clip_frac_high": clipped_high / n,
        "loss/ratio_mean": ratio_sum / n,
    }


def _run(name: str, cfg: Cfg, with_ref: bool = True) -> tuple[LossOut, torch.Tensor, torch.Tensor]:
    logp = torch.tensor(NEW, dtype=F64, requires_grad=True)
    old = torch.tensor(OLD, dtype=F64, requires_grad=True)  # must not receive a gradient
    ref = torch.tensor(REFP, dtype=F64) if with_ref else None
    out = LOSSES.get(name)(logp, old, ref, torch.tensor(ADV, dtype=F64), torch.tensor(LMASK, dtype=F64), cfg)
    out.loss.backward()
    return out, logp, old


@pytest.mark.parametrize("name", ["grpo", "cispo", "gspo"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("beta,kl", [(0.0, "k3"), (0.1, "k3"), (0.05, "k1"), (0.2, "k2")])
@pytest.mark.parametrize("clip", [(0.2, 0.3), (0.01, 0.01)])  # the tight range clips a GSPO sequence too
def test_loss_values_gradients_and_metrics(name, agg, beta, kl, clip):
    cfg = Cfg(clip_low=clip[0], clip_high=clip[1], beta=beta, kl_estimator=kl, agg=agg)
    out, logp, old = _run(name, cfg)
    hand = _hand_loss(name, cfg)
    assert out.loss.dim() == 0
    assert out.loss.item() == pytest.approx(hand["loss"], rel=1e-10, abs=1e-12)
    assert logp.grad.flatten().tolist() == pytest.approx([g for row in hand["grad"] for g in row], rel=1e-10, abs=1e-12)
    assert old.grad is None  # old log-probs are constants
    assert set(out.metrics) == set(hand) - {"loss", "grad"}
    for key, value in out.metrics.items():
        assert value.dim() == 0 and not value.requires_grad
        assert value.item() == pytest.approx(hand[key], rel=1e-10, abs=1e-12), key
    assert out.loss.item() == pytest.approx((out.metrics["loss/policy"] + beta * out.metrics["loss/kl"]).item())


def test_clip_fractions_are_the_binding_side():
    # grpo: row 0 (A > 0) clips ratio 1.5 > 1.3; row 1 (A < 0) clips ratio 0.6 < 0.8; ratios 1.4, 2.0
    # with A < 0 and 0.7 with A > 0 are outside the band but on the side that does not bind
    out, _, _ = _run("grpo", Cfg())
    assert out.metrics["loss/clip_frac"].item() == pytest.approx(2 / 7)
    # cispo: the weight is clamped whatever the sign of A: above 1.3 (1.5, 1.4, 2.0), below 0.8 (0.7, 0.6)
    out, _, _ = _run("cispo", Cfg())
    assert out.metrics["loss/clip_frac"].item() == pytest.approx(5 / 7)
    # gspo: s_0 = exp(mean(log 1.5, log 0.7, log 1)) ~ 1.016 > 1.01 with A > 0 clips all of row 0;
    # s_1 ~ 1.166 with A < 0 does not bind
    out, _, _ = _run("gspo", Cfg(clip_low=0.01, clip_high=0.01))
    assert out.metrics["loss/clip_frac"].item() == pytest.approx(3 / 7)
    assert out.metrics["loss/ratio_mean"].item() == pytest.approx((3 * _seq_ratio(0) + 4 * _seq_ratio(1)) / 7)


def test_cispo_without_a_lower_bound_keeps_small_weights():
    # minirl/conf/loss/cispo.yaml: clip_low 1 puts the lower bound at 0, so ratios 0.7 and 0.6 stay as they are
    out, logp, _ = _run("cispo", Cfg(clip_low=1.0, clip_high=0.3))
    assert out.metrics["loss/clip_frac"].item() == pytest.approx(3 / 7)  # 1.5, 1.4, 2.0 only
    assert logp.grad[0, 1].item() == pytest.approx(-0.7 * ADV[0] / 7)  # token-mean: weight 1/7 per token
    assert logp.grad[1, 1].item() == pytest.approx(-0.6 * ADV[1] / 7)


@pytest.mark.parametrize("clip", [(0.2, 0.3), (0.01, 0.01), (3e-4, 4e-4)])
def test_gspo_equals_the_sequence_level_objective(clip):
    # the paper's form, written independently: J_i = min(s_i A_i, clip(s_i) A_i), s_i a differentiable
    # geometric mean; the loss is -(1/S) sum_i J_i over the S non-empty sequences
    cfg = Cfg(clip_low=clip[0], clip_high=clip[1], agg="seq-mean-token-mean")
    out, logp, _ = _run("gspo", cfg)
    lp = torch.tensor(NEW, dtype=F64, requires_grad=True)
    old, m, a = torch.tensor(OLD, dtype=F64), torch.tensor(LMASK, dtype=F64), torch.tensor(ADV, dtype=F64)
    s = torch.exp(((lp - old) * m).sum(dim=1) / m.sum(dim=1).clamp(min=1))
    j = torch.minimum(s * a, s.clamp(1 - clip[0], 1 + clip[1]) * a)
    expected = -j[m.sum(dim=1) > 0].mean()
    expected.backward()
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-12)
    assert torch.allclose(logp.grad, lp.grad, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_on_policy_every_loss_is_reinforce(agg):
    # ratio == 1: the clip is inactive and every gradient is -A times the aggregation's token weight
    logp = torch.tensor(NEW, dtype=F64)
    adv, mask = torch.tensor(ADV, dtype=F64), torch.tensor(LMASK, dtype=F64)
    expected = -adv[:, None] * torch.tensor(_token_weights(LMASK, Cfg(agg=agg)), dtype=F64)
    for name in ("grpo", "cispo", "gspo"):
        lp = logp.clone().requires_grad_(True)
        out = LOSSES.get(name)(lp, logp, None, adv, mask, Cfg(agg=agg))
        out.loss.backward()
        assert torch.allclose(lp.grad, expected, rtol=0, atol=1e-14), name
        assert out.metrics["loss/clip_frac"].item() == 0.0
        assert out.metrics["loss/ratio_mean"].item() == pytest.approx(1.0)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_reference_nll_weighs_a_replayed_row_as_one_more_unit_of_advantage(agg):
    # at ratio 1, loss + c * reference_nll has the gradient of the loss with c added to the replayed rows' advantages
    logp = torch.tensor(NEW, dtype=F64)
    adv, mask, cfg = torch.tensor(ADV, dtype=F64), torch.tensor(LMASK, dtype=F64), Cfg(agg=agg)
    replayed = torch.tensor([0.0, 1.0, 0.0], dtype=F64)
    for name in ("grpo", "cispo", "gspo"):
        lp, shifted = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
        (
            LOSSES.get(name)(lp, logp, None, adv, mask, cfg).loss + 0.5 * reference_nll(lp, mask, replayed, cfg)
        ).backward()
        LOSSES.get(name)(shifted, logp, None, adv + 0.5 * replayed, mask, cfg).loss.backward()
        assert torch.allclose(lp.grad, shifted.grad, rtol=0, atol=1e-14), name
    # by hand: the replayed row's NLL (4 tokens) over 7 tokens, 2 trajectories, or 2 trajectories x C = 6
    row_nll = -sum(NEW[1])
    by_hand = {
        "token-mean": row_nll / 7,
        "seq-mean-token-mean": row_nll / 4 / 2,
        "seq-mean-token-sum-norm": row_nll / 12,
    }
    assert reference_nll(logp, mask, replayed, cfg).item() == pytest.approx(by_hand[agg], rel=1e-12)


@pytest.mark.parametrize("name", ["grpo", "cispo", "gspo"])
def test_loss_without_reference_and_empty_mask(name):
    out, _, _ = _run(name, Cfg(beta=0.0), with_ref=False)
    assert out.metrics["loss/kl"].item() == 0.0
    lp = torch.tensor(NEW, requires_grad=True)
    out = LOSSES.get(name)(lp, torch.tensor(OLD), None, torch.tensor(ADV), torch.zeros(3, 4), Cfg())
    out.loss.backward()
    assert out.loss.item() == 0.0 and torch.equal(lp.grad, torch.zeros(3, 4))
    assert all(torch.isfinite(v) for v in out.metrics.values())


@pytest.mark.parametrize("name", ["grpo", "cispo", "gspo"])
def test_loss_errors(name):
    fn = LOSSES.get(name)
    lp, adv, m = torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 3)
    with pytest.raises(ValueError, match="ref_logp"):
        fn(lp, lp, None, adv, m, Cfg(beta=0.1))
    with pytest.raises(ConfigError, match="unknown kl estimator 'k9'; known: k1, k2, k3"):
        fn(lp, lp, lp, adv, m, Cfg(beta=0.1, kl_estimator="k9"))
    with pytest.raises(ConfigError, match="known: seq-mean-token-mean, seq-mean-token-sum-norm, token-mean"):
        fn(lp, lp, None, adv, m, Cfg(agg="sum"))
    with pytest.raises(ValueError, match="max_tokens_norm"):
        fn(lp, lp, None, adv, m, Cfg(agg="seq-mean-token-sum-norm", max_tokens_norm=0))
    with pytest.raises(ValueError, match="advantages"):
        fn(lp, lp, None, torch.zeros(3), m, Cfg())
    with pytest.raises(ValueError):
        fn(lp, torch.zeros(2, 4), None, adv, m, Cfg())


def test_loss_registry():
    assert LOSSES.names() == ["cispo", "grpo", "gspo"]
    assert AGGREGATIONS.names() == ["seq-mean-token-mean", "seq-mean-token-sum-norm", "token-mean"]
    with pytest.raises(ConfigError, match="unknown loss 'ppo'; known: cispo, grpo, gspo"):
        LOSSES.get("ppo")


@pytest.mark.parametrize("name", ADV_ESTIMATORS.names())
def test_group_baseline_names_exactly_the_estimators_that_give_a_group_of_one_nothing(name):
    rewards = torch.tensor([0.0, 1.0, 0.5, 0.2])  # four groups of one, all different
    silent = torch.equal(ADV_ESTIMATORS.get(name)(rewards, 1, 1e-6), torch.zeros(4))
    assert silent == (name in GROUP_BASELINE)
