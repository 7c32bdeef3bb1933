"""Advantages, KL estimators, aggregation and losses against hand-written scalar computations."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minirl.algos.advantages import ADV_ESTIMATORS, grpo_advantages
from minirl.algos.kl import KL_ESTIMATORS
from minirl.algos.losses import LOSSES, LossOut, aggregate
from minirl.registry import ConfigError

F64 = torch.float64


@dataclass
class Cfg:
    clip_low: float = 0.2
    clip_high: float = 0.3
    beta: float = 0.0
    kl_estimator: str = "k3"
    agg: str = "token-mean"


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


@pytest.mark.parametrize("eps", [0.0, 1e-6])
def test_grpo_advantages_flat_groups_and_singletons_are_zero(eps):
    equal = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.7, 0.7])
    assert torch.equal(grpo_advantages(equal, 3, eps), torch.zeros(6))
    singles = torch.tensor([3.0, -1.0, 0.5])
    assert torch.equal(grpo_advantages(singles, 1, eps), torch.zeros(3))


def test_grpo_advantages_bad_shapes():
    with pytest.raises(ValueError, match="groups of 4"):
        grpo_advantages(torch.zeros(6), 4, 1e-4)
    with pytest.raises(ValueError):
        grpo_advantages(torch.zeros(2, 3), 3, 1e-4)
    with pytest.raises(ValueError):
        grpo_advantages(torch.zeros(6), 0, 1e-4)


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
)
def test_grpo_advantages_properties(case, eps):
    g, values = case
    adv = grpo_advantages(torch.tensor(values, dtype=F64), g, eps).view(-1, g)
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
    with pytest.raises(ConfigError, match="unknown advantage estimator 'rloo'; known: grpo"):
        ADV_ESTIMATORS.get("rloo")


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


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_aggregate_empty_mask_is_zero_and_padding_cannot_leak(mode):
    x = torch.tensor(VALUES, requires_grad=True)
    out = aggregate(x, torch.zeros(3, 4), mode)
    assert out.item() == 0.0
    (g,) = torch.autograd.grad(out, x)
    assert torch.equal(g, torch.zeros(3, 4))
    poisoned = torch.tensor(VALUES)
    poisoned[0, 3], poisoned[1, 1] = float("nan"), float("inf")
    assert aggregate(poisoned, torch.tensor(MASK, dtype=torch.float32), mode).item() == pytest.approx(
        aggregate(torch.tensor(VALUES), torch.tensor(MASK, dtype=torch.float32), mode).item()
    )


def test_aggregate_errors():
    with pytest.raises(ConfigError, match="known: seq-mean-token-mean, token-mean"):
        aggregate(torch.zeros(2, 2), torch.ones(2, 2), "sum")
    with pytest.raises(ValueError):
        aggregate(torch.zeros(2, 3), torch.ones(2, 2), "token-mean")


# -- losses ------------------------------------------------------------------------------------

# ratios exp(logp - old): row 0 = [1.5, 0.7, 1.0, pad], row 1 = [1.1, 0.6, 1.4, 2.0], row 2 all pad
OLD = [[-1.0, -0.5, -2.0, -0.3], [-0.8, -1.5, -0.2, -1.0], [-0.4, -0.4, -0.4, -0.4]]
RATIOS = [[1.5, 0.7, 1.0, 3.0], [1.1, 0.6, 1.4, 2.0], [1.0, 1.0, 1.0, 1.0]]
NEW = [[o + math.log(r) for o, r in zip(orow, rrow, strict=True)] for orow, rrow in zip(OLD, RATIOS, strict=True)]
REFP = [[-1.1, -0.4, -2.5, -0.3], [-0.9, -1.0, -0.2, -1.3], [-0.4, -0.4, -0.4, -0.4]]
ADV = [1.2, -0.8, 0.5]
LMASK = [[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]]


def _token_weights(mask: list[list[int]], agg: str) -> list[list[float]]:
    """d aggregate / d per_token for each position, by hand."""
    if agg == "token-mean":
        n = sum(map(sum, mask))
        return [[m / n for m in row] for row in mask]
    rows = [sum(row) for row in mask]
    s = sum(1 for r in rows if r)
    return [[m / (r * s) if r else 0.0 for m in row] for row, r in zip(mask, rows, strict=True)]


def _hand_loss(name: str, cfg: Cfg) -> dict:
    """Loss, d loss / d logp, and metrics, token by token in Python floats."""
    w = _token_weights(LMASK, cfg.agg)
    low, high = 1 - cfg.clip_low, 1 + cfg.clip_high
    loss = policy = kl_total = 0.0
    clipped = ratio_sum = 0.0
    n = sum(map(sum, LMASK))
    grad = [[0.0] * 4 for _ in range(3)]
    for b in range(3):
        a = ADV[b]
        for t in range(4):
            r = math.exp(NEW[b][t] - OLD[b][t])
            if name == "grpo":
                unclipped, clip_term = r * a, min(max(r, low), high) * a
                pg = -min(unclipped, clip_term)
                is_clipped = (a > 0 and r > high) or (a < 0 and r < low)
                g = 0.0 if is_clipped else -r * a  # d(-r A)/d logp = -r A; a clipped token is constant
            else:
                weight = min(r, high)
                pg = -weight * a * NEW[b][t]
                is_clipped = r > high
                g = -weight * a
            kl, dkl = _hand_kl(cfg.kl_estimator, NEW[b][t], REFP[b][t]) if cfg.beta > 0 else (0.0, 0.0)
            loss += w[b][t] * (pg + cfg.beta * kl)
            policy += w[b][t] * pg
            kl_total += w[b][t] * kl
            grad[b][t] = w[b][t] * (g + cfg.beta * dkl)
            if LMASK[b][t]:
                clipped += is_clipped
                ratio_sum += r
    return {
        "loss": loss,
        "grad": grad,
        "loss/policy": policy,
        "loss/kl": kl_total,
        "loss/clip_frac": clipped / n,
        "loss/ratio_mean": ratio_sum / n,
    }


def _run(name: str, cfg: Cfg, with_ref: bool = True) -> tuple[LossOut, torch.Tensor, torch.Tensor]:
    logp = torch.tensor(NEW, dtype=F64, requires_grad=True)
    old = torch.tensor(OLD, dtype=F64, requires_grad=True)  # must not receive a gradient
    ref = torch.tensor(REFP, dtype=F64) if with_ref else None
    out = LOSSES.get(name)(logp, old, ref, torch.tensor(ADV, dtype=F64), torch.tensor(LMASK, dtype=F64), cfg)
    out.loss.backward()
    return out, logp, old


@pytest.mark.parametrize("name", ["grpo", "cispo"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("beta,kl", [(0.0, "k3"), (0.1, "k3"), (0.05, "k1"), (0.2, "k2")])
def test_loss_values_gradients_and_metrics(name, agg, beta, kl):
    cfg = Cfg(beta=beta, kl_estimator=kl, agg=agg)
    out, logp, old = _run(name, cfg)
    hand = _hand_loss(name, cfg)
    assert out.loss.dim() == 0
    assert out.loss.item() == pytest.approx(hand["loss"], rel=1e-10, abs=1e-12)
    assert logp.grad.flatten().tolist() == pytest.approx([g for row in hand["grad"] for g in row], rel=1e-10, abs=1e-12)
    assert old.grad is None  # old log-probs are constants
    assert set(out.metrics) == {"loss/policy", "loss/kl", "loss/clip_frac", "loss/ratio_mean"}
    for key, value in out.metrics.items():
        assert value.dim() == 0 and not value.requires_grad
        assert value.item() == pytest.approx(hand[key], rel=1e-10, abs=1e-12), key
    assert out.loss.item() == pytest.approx((out.metrics["loss/policy"] + beta * out.metrics["loss/kl"]).item())


def test_clip_fractions_are_the_binding_side():
    # grpo: row 0 (A > 0) clips ratio 1.5 > 1.3; row 1 (A < 0) clips ratio 0.6 < 0.8; ratios 1.4, 2.0
    # with A < 0 and 0.7 with A > 0 are outside the band but on the side that does not bind
    out, _, _ = _run("grpo", Cfg())
    assert out.metrics["loss/clip_frac"].item() == pytest.approx(2 / 7)
    # cispo: ratio > 1.3 whatever the sign of A: 1.5, 1.4, 2.0
    out, _, _ = _run("cispo", Cfg())
    assert out.metrics["loss/clip_frac"].item() == pytest.approx(3 / 7)


def test_on_policy_both_losses_are_reinforce():
    # ratio == 1: the clip is inactive and both gradients are -A / n per sampled token
    logp = torch.tensor(NEW, dtype=F64)
    adv, mask = torch.tensor(ADV, dtype=F64), torch.tensor(LMASK, dtype=F64)
    expected = -(adv[:, None] * mask) / mask.sum()
    for name in ("grpo", "cispo"):
        lp = logp.clone().requires_grad_(True)
        out = LOSSES.get(name)(lp, logp, None, adv, mask, Cfg())
        out.loss.backward()
        assert torch.allclose(lp.grad, expected, rtol=0, atol=1e-14), name
        assert out.metrics["loss/clip_frac"].item() == 0.0
        assert out.metrics["loss/ratio_mean"].item() == pytest.approx(1.0)


@pytest.mark.parametrize("name", ["grpo", "cispo"])
def test_loss_without_reference_and_empty_mask(name):
    out, _, _ = _run(name, Cfg(beta=0.0), with_ref=False)
    assert out.metrics["loss/kl"].item() == 0.0
    lp = torch.tensor(NEW, requires_grad=True)
    out = LOSSES.get(name)(lp, torch.tensor(OLD), None, torch.tensor(ADV), torch.zeros(3, 4), Cfg())
    out.loss.backward()
    assert out.loss.item() == 0.0 and torch.equal(lp.grad, torch.zeros(3, 4))
    assert all(torch.isfinite(v) for v in out.metrics.values())


@pytest.mark.parametrize("name", ["grpo", "cispo"])
def test_loss_errors(name):
    fn = LOSSES.get(name)
    lp, adv, m = torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 3)
    with pytest.raises(ValueError, match="ref_logp"):
        fn(lp, lp, None, adv, m, Cfg(beta=0.1))
    with pytest.raises(ConfigError, match="unknown kl estimator 'k9'; known: k1, k2, k3"):
        fn(lp, lp, lp, adv, m, Cfg(beta=0.1, kl_estimator="k9"))
    with pytest.raises(ConfigError, match="known: seq-mean-token-mean, token-mean"):
        fn(lp, lp, None, adv, m, Cfg(agg="sum"))
    with pytest.raises(ValueError, match="advantages"):
        fn(lp, lp, None, torch.zeros(3), m, Cfg())
    with pytest.raises(ValueError):
        fn(lp, torch.zeros(2, 4), None, adv, m, Cfg())


def test_loss_registry():
    assert LOSSES.names() == ["cispo", "grpo"]
    with pytest.raises(ConfigError, match="unknown loss 'ppo'; known: cispo, grpo"):
        LOSSES.get("ppo")
