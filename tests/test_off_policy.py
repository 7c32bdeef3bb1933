"""Off-policy machinery on real tensors: rollout IS (token weights, sequence masks), the sampling
distribution the trainer scores tokens under, mini-batch plans, DAPO's group filter and overlong
shaping, and the clip-side metrics of the loss."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from hydra import compose, initialize_config_dir
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from minirl.algos.dapo import overlong_penalty, tied_groups, tokens_to_limit, truncated
from minirl.algos.losses import LOSSES
from minirl.algos.rollout_correction import rollout_correction
from minirl.config import LossConfig, register_configs, to_config
from minirl.data.task import Task
from minirl.entry import CONF_DIR
from minirl.errors import ConfigError
from minirl.inference.sampling import SamplingParams
from minirl.rollout.trajectory import Trajectory, TrajectoryEnd
from minirl.training.batch import PolicyBatch, action_logits, mini_batch_plan, targets, token_logprobs

pytestmark = pytest.mark.fast

register_configs()

# -- rollout importance sampling -----------------------------------------------------------------


def test_token_weights_are_the_capped_ratio_of_trainer_to_sampler():
    old = torch.tensor([[-1.0, -2.0, -0.5, -9.0]])
    sampler = torch.tensor([[-1.5, -1.0, -0.5, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last column is a tool-output token
    out = rollout_correction(old, sampler, mask, "token", threshold=1.5)
    ratios = [math.exp(0.5), math.exp(-1.0), 1.0]
    assert out.weights[0].tolist() == pytest.approx([1.5, ratios[1], 1.0, 1.0])  # e^0.5 = 1.65 capped at 1.5
    assert torch.equal(out.mask, mask)
    metrics = {k: v.item() for k, v in out.metrics.items()}
    assert metrics["rollout_is/logp_gap_abs_mean"] == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    assert metrics["rollout_is/weight_min"] == pytest.approx(ratios[1])
    assert metrics["rollout_is/weight_max"] == pytest.approx(ratios[0])  # before truncation
    assert metrics["rollout_is/weight_mean"] == pytest.approx(sum(ratios) / 3)
    assert metrics["rollout_is/masked_frac"] == 0.0


def test_sequence_mode_masks_exactly_the_trajectories_outside_one_over_c_to_c():
    c, eps = 2.0, 1e-3
    # per-row sums of the log gaps: inside, above C, inside near 1/C, below 1/C; the last row has no action token
    sums = [math.log(c) - eps, math.log(c) + eps, -math.log(c) + eps, -math.log(c) - eps, 5.0]
    sampler = -torch.ones(5, 3)
    old = sampler.clone()
    old[:, 0] += torch.tensor(sums) / 2
    old[:, 1] += torch.tensor(sums) / 2
    mask = torch.ones(5, 3)
    mask[4] = 0
    out = rollout_correction(old, sampler, mask, "sequence", threshold=c)
    assert out.weights is None
    assert out.mask.sum(dim=1).tolist() == [3.0, 0.0, 3.0, 0.0, 0.0]
    assert out.metrics["rollout_is/masked_frac"].item() == pytest.approx(2 / 4)
    assert out.metrics["rollout_is/weight_max"].item() == pytest.approx(c * math.exp(eps), rel=1e-5)


def test_off_mode_only_measures_the_gap():
    old, sampler, mask = torch.zeros(2, 2), torch.full((2, 2), -0.25), torch.ones(2, 2)
    out = rollout_correction(old, sampler, mask, "off", threshold=2.0)
    assert out.weights is None and out.mask is mask
    assert set(out.metrics) == {"rollout_is/logp_gap_abs_mean"}
    assert out.metrics["rollout_is/logp_gap_abs_mean"].item() == pytest.approx(0.25)


def test_is_weights_multiply_the_policy_term_only():
    cfg = LossConfig(name="grpo", beta=0.5, agg="token-mean")
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.4]])).requires_grad_()
    ref = logp.detach() - 0.1
    adv, mask = torch.tensor([2.0]), torch.ones(1, 3)
    weights = torch.tensor([[0.5, 1.0, 2.0]])
    out = LOSSES.get("grpo")(logp, logp.detach(), ref, adv, mask, cfg, is_weights=weights)
    kl = math.exp(-0.1) - (-0.1) - 1  # k3 per token at log(pi_ref / pi) = -0.1
    # ratio 1 everywhere: per-token policy loss -A * w, then + beta * kl
    assert out.loss.item() == pytest.approx((-2.0 * (0.5 + 1.0 + 2.0) + 3 * 0.5 * kl) / 3, rel=1e-5)


def test_clip_fractions_split_by_side():
    cfg = LossConfig(name="grpo", beta=0.0, agg="token-mean", clip_low=0.2, clip_high=0.2)
    old = torch.zeros(2, 4)
    # row 0 (A > 0): ratio 1.5 clips high, 0.5 does not; row 1 (A < 0): 0.5 clips low, 1.5 does not
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.0, 1.0], [0.5, 1.5, 1.0, 1.0]]))
    out = LOSSES.get("grpo")(logp, old, None, torch.tensor([1.0, -1.0]), torch.ones(2, 4), cfg)
    assert out.metrics["loss/clip_frac_high"].item() == pytest.approx(1 / 8)
    assert out.metrics["loss/clip_frac_low"].item() == pytest.approx(1 / 8)
    assert out.metrics["loss/clip_frac"].item() == pytest.approx(2 / 8)


# -- the sampling distribution the trainer scores tokens under -----------------------------------


class FixedLogits:
    """A stand-in model whose logits are given: [N, L, V] for inputs of width L."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits

    def __call__(self, input_ids, attention_mask, logits_to_keep):
        return SimpleNamespace(logits=self.logits[:, -logits_to_keep:])


def _batch(targets: torch.Tensor) -> PolicyBatch:  # targets [N, T] -> inputs [N, T + 1], start 0
    n, t = targets.shape
    ids = torch.cat([torch.zeros(n, 1, dtype=torch.long), targets], dim=1)
    zeros = torch.zeros(n, t)
    prompt_lengths = torch.ones(n, dtype=torch.long)
    return PolicyBatch(ids, torch.ones_like(ids), 0, zeros, torch.ones(n, t), torch.zeros(n), prompt_lengths)


@pytest.mark.parametrize(("top_p", "top_k"), [(0.8, 0), (1.0, 7), (0.7, 12)])
def test_sampling_distribution_is_hf_generates_temperature_top_k_top_p(top_p, top_k):
    torch.manual_seed(0)
    logits = 3 * torch.randn(2, 6, 40)  # [N, L, V]
    hf = LogitsProcessorList([TemperatureLogitsWarper(0.7)])
    if top_k:
        hf.append(TopKLogitsWarper(top_k))
    if top_p < 1:
        hf.append(TopPLogitsWarper(top_p))
    scores = hf(None, logits[:, :-1].reshape(-1, 40)).reshape(2, 5, 40)  # [N, T, V] what generate samples from
    expected = torch.log_softmax(scores, dim=-1)
    batch = _batch(scores.argmax(dim=-1))  # sampled tokens inside the kept set
    sampling = SamplingParams(1, 0.7, top_p, top_k)
    dist = sampling.logprobs(action_logits(FixedLogits(logits), batch), kept=targets(batch))
    assert torch.equal(dist.isinf(), expected.isinf()) and expected.isinf().any()
    assert torch.allclose(dist, expected, atol=1e-6)
    # what the trainer scores the sampled tokens with, without making the log-softmax: the same numbers
    scored = token_logprobs(FixedLogits(logits), batch, sampling)
    assert torch.allclose(scored, expected.gather(-1, targets(batch)[..., None])[..., 0], atol=1e-6)

    # a target outside the kept set (a rounding difference at its edge) stays in with a finite log-prob
    outside = token_logprobs(FixedLogits(logits), _batch(scores.argmin(dim=-1)), sampling)
    assert torch.isfinite(outside).all()


def test_no_filter_is_the_plain_tempered_softmax():
    logits = torch.randn(1, 4, 10)
    batch = _batch(torch.zeros(1, 3, dtype=torch.long))
    dist = SamplingParams(1, 0.5).logprobs(action_logits(FixedLogits(logits), batch))
    assert torch.equal(dist, torch.log_softmax(logits[:, :-1].float() / 0.5, dim=-1))


@pytest.mark.parametrize(("temperature", "top_p", "top_k"), [(1.0, 1.0, 0), (0.7, 0.8, 5), (0.0, 1.0, 0)])
def test_entropy_in_chunks_is_the_masked_entropy_of_the_sampling_distribution(temperature, top_p, top_k, monkeypatch):
    torch.manual_seed(0)
    logits, tokens = 3 * torch.randn(5, 4, 30), torch.randint(0, 30, (5, 4))
    mask = (torch.rand(5, 4) > 0.3).float()
    sampling = SamplingParams(1, temperature, top_p, top_k)
    probs = sampling.logprobs(logits, kept=tokens).exp()
    expected = (-(probs * probs.log()).nan_to_num().sum(-1) * mask).sum()  # 0 log 0 = 0
    monkeypatch.setattr("minirl.inference.sampling.ENTROPY_ELEMENTS", 4 * 30 * 2)  # 2 rows at a time
    assert torch.allclose(sampling.entropy(logits, tokens, mask), expected, atol=1e-5)


# -- mini-batches --------------------------------------------------------------------------------


def test_mini_batch_plan_covers_every_row_once_per_epoch_in_a_fresh_order():
    plan = mini_batch_plan(7, epochs=3, mini_batches=3, generator=torch.Generator().manual_seed(0))
    assert len(plan) == 3
    for epoch in plan:
        assert [len(rows) for rows in epoch] == [3, 2, 2]
        assert sorted(torch.cat(epoch).tolist()) == list(range(7))
    assert torch.cat(plan[0]).tolist() != torch.cat(plan[1]).tolist()
    again = mini_batch_plan(7, epochs=3, mini_batches=3, generator=torch.Generator().manual_seed(0))
    assert all(torch.equal(a, b) for e, f in zip(plan, again) for a, b in zip(e, f))  # the seed fixes it
    [[whole]] = mini_batch_plan(5, epochs=1, mini_batches=1, generator=torch.Generator())
    assert whole.tolist() == [0, 1, 2, 3, 4]  # one mini-batch keeps the rollout order
    assert len(mini_batch_plan(2, epochs=1, mini_batches=4, generator=torch.Generator())[0]) == 2


# -- DAPO ----------------------------------------------------------------------------------------


def test_tied_groups_are_the_ones_with_all_equal_rewards():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, -1.0, -1.0 + 1e-6])
    assert tied_groups(rewards, 2).tolist() == [True, False, True, False]
    with pytest.raises(ValueError, match="groups of 3"):
        tied_groups(rewards, 3)


def _trajectory(prompt: int, turns: list[int], observation: int, reason: TrajectoryEnd) -> Trajectory:
    """`turns` sampled tokens per turn, each followed (but the last) by `observation` framework tokens."""
    task = Task(id="t", messages=[{"role": "user", "content": "?"}], tools=[], gt=[])
    traj = Trajectory(task, 0, [7] * prompt)
    for i, length in enumerate(turns):
        traj.response_ids += [5] * length
        traj.action_mask += [1] * length
        if i < len(turns) - 1:
            traj.response_ids += [9] * observation
            traj.action_mask += [0] * observation
    traj.sampler_logprobs = [0.0] * len(traj.response_ids)
    traj.finish_reason = reason
    return traj


def test_tokens_to_limit_is_the_room_before_the_nearer_limit():
    # longest turn 20 of 24 per turn: 4 left; 10 + 5 + 6 + 20 = 41 of 100 in all: 59 left
    assert tokens_to_limit(_trajectory(10, [5, 20], 6, TrajectoryEnd.ANSWER), 24, 100) == 4
    # the conversation is at its budget although no turn is: 0 left
    assert tokens_to_limit(_trajectory(50, [10, 10, 10], 10, TrajectoryEnd.TOKEN_BUDGET), 24, 100) == 0
    assert truncated(_trajectory(1, [24], 0, TrajectoryEnd.TURN_TOKENS))
    assert truncated(_trajectory(1, [3], 0, TrajectoryEnd.TOKEN_BUDGET))
    assert not truncated(_trajectory(1, [3], 0, TrajectoryEnd.MAX_TURNS))


def test_overlong_penalty_is_dapos_soft_punishment():
    # L_cache = 16: nothing while 16 or more tokens remain, then linear down to -scale at the limit
    room = torch.tensor([40, 16, 12, 8, 0, -3])
    penalty = overlong_penalty(room, buffer=16, scale=0.5)
    assert penalty.tolist() == pytest.approx([0.0, 0.0, -0.125, -0.25, -0.5, -0.5])
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty(room, buffer=0, scale=1.0)


# -- configuration -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algo.rollout_is=token"], "algo.rollout_is: token needs the trainer's old log-probs"),
        (["algo.old_logprobs=recompute", "algo.rollout_is_threshold=0.5"], "algo.rollout_is_threshold"),
        (
            ["algo.dynamic_sampling=false", "algo.max_resample_rounds=2"],
            "algo.max_resample_rounds: .* set algo.dynamic_sampling=true",
        ),
        (["algo.overlong=penalty", "algo.overlong_buffer=96"], "algo.overlong_buffer: must be < rollout.max_new"),
        (["algo.overlong_penalty=-1"], "algo.overlong_penalty"),
        (["algo.guide_solved_share=1.0"], r"algo.guide_solved_share: must be in \[0, 1\)"),
        (["loss.reference_nll=-1"], "loss.reference_nll: must be >= 0, got -1"),
        (["trainer.mini_batches=0"], "trainer.mini_batches: must be > 0"),
        (["trainer.mini_batches=113"], "trainer.mini_batches: must be <= 112"),  # 14 prompts x 8 samples
    ],
)
def test_bad_off_policy_settings_name_the_key(overrides, message):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        composed = compose("config", overrides=overrides)
        with pytest.raises(ConfigError, match=message):
            to_config(composed)
        assert to_config(compose("config", overrides=["algo.old_logprobs=recompute", "algo.rollout_is=sequence"]))
