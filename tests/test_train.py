"""End-to-end runs of the real trainer on CPU with the debug preset (a very small tiny model)."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import torch
from rich.console import Console
from support import SHAPED_REWARD, debug_config
from transformers import AutoModelForCausalLM

from minirl.bootstrap import model_path
from minirl.config import register_configs
from minirl.data.task import Task
from minirl.inference.decoding import prompt_shared_logits
from minirl.metrics import group_metrics
from minirl.rollout.trajectory import Trajectory, TrajectoryEnd
from minirl.stats import sign_test_p
from minirl.trainer import Trainer, train
from minirl.training.batch import collate, micro_batches, token_logprobs
from minirl.training.shaping import kl_shaped, punish_overlong, replayed
from minirl.training.update import prepare_batch

register_configs()


def trainer_for(cfg, console=None) -> Trainer:
    """A trainer on the config's model (the tiny one built into the test cache)."""
    return Trainer(cfg, model_path(cfg, Console(quiet=True)), console)


def learn(trainer: Trainer, trajs: list[Trajectory]) -> dict[str, float]:
    """The update half of train_step on these trajectories: advantage, loss and optimizer steps."""
    batch, shaping = trainer.advantages(trajs)
    return {**shaping, **trainer.update(batch, trajs)}


def replayed_in_slot(trainer: Trainer, task, group_index: int):
    """The task's reference answer replayed in group slot `group_index` (training/shaping.py)."""
    slot = Trajectory(task, group_index, [], response_ids=[], action_mask=[], sampler_logprobs=[])
    return replayed(slot, trainer.tokenizer, trainer.sampler.executor, trainer.sampler.limits, trainer.cfg)


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def step_rows(run_dir: Path) -> list[dict]:
    return [r for r in read_metrics(run_dir) if "reward/mean" in r and "eval/success_rate" not in r]


def test_train_runs_end_to_end_and_logs_every_metric(cache_dir, tmp_path):
    cfg = debug_config(cache_dir, tmp_path, "logger.backend=wandb", "logger.mode=offline", "trainer.ppo_epochs=2")
    result = train(cfg)
    assert [step for step, _ in result.eval_history] == [0, 1, 2]
    rows = read_metrics(tmp_path)
    evals = [r for r in rows if "eval/success_rate" in r]
    assert [r["step"] for r in evals] == [0, 1, 2]
    assert all(0.0 <= r["eval/success_rate"] <= 1.0 for r in evals)
    # after step 0, each evaluation pairs its tasks with step 0's: gained - lost is the change in solved tasks
    assert "eval/tasks_gained" not in evals[0] and len(result.solved_at_start) == cfg.data.heldout_size
    for r in evals[1:]:
        gained, lost = int(r["eval/tasks_gained"]), int(r["eval/tasks_lost"])
        change = (r["eval/success_rate"] - evals[0]["eval/success_rate"]) * cfg.data.heldout_size
        assert gained - lost == round(change) and r["eval/sign_test_p"] == sign_test_p(gained, lost)
    steps = [r for r in rows if "reward/mean" in r and "eval/success_rate" not in r]
    assert [r["step"] for r in steps] == [1, 2]
    expected = {
        "reward/mean", "reward/std", "reward/gt_hit", "reward/tool_alignment", "reward/think_count",
        "loss/policy", "loss/kl", "loss/clip_frac", "loss/ratio_mean", "adv/mean", "adv/std", "adv/min", "adv/max",
        "rollout/response_tokens_mean", "rollout/turns", "tools/valid_frac", "tools/calls_per_traj",
        "rollout/finish_answer", "grad_norm", "lr", "time/rollout_s", "time/update_s",
        "loss/clip_frac_low", "loss/clip_frac_high", "entropy", "reward/zero_std_frac", "algo/groups_kept",
        "algo/groups_sampled", "rollout/response_tokens_max", "rollout/response_clipped_frac",
    }  # fmt: skip
    assert expected <= set(steps[0])
    # the final policy loads back like any checkpoint, and W&B wrote an offline run
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoint") is not None
    assert list((tmp_path / "wandb").glob("offline-run-*"))


def test_beta_zero_loads_no_reference_model(cache_dir, tmp_path):
    trainer = trainer_for(debug_config(cache_dir, tmp_path, "loss.beta=0"))
    assert trainer.reference is None
    assert trainer_for(debug_config(cache_dir, tmp_path)).reference is not None
    # KL in the reward needs the reference even with no KL term in the loss
    in_reward = trainer_for(debug_config(cache_dir, tmp_path, "loss.beta=0", "algo.kl_in_reward=true"))
    assert in_reward.reference is not None


def test_multirun_sweeps_two_losses(cache_dir, tmp_path):
    cmd = [
        sys.executable, "-m", "minirl.train", "-m", "loss=grpo,cispo", "debug=cpu", "trainer.steps=1",
        f"model.cache_dir={cache_dir}", f"hydra.sweep.dir={tmp_path}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    runs = sorted(p.parent for p in tmp_path.glob("*/metrics.jsonl"))
    assert len(runs) == 2
    for run in runs:
        assert any("eval/success_rate" in r and r["step"] == 1 for r in read_metrics(run))


def test_retool_recipe_runs_end_to_end_with_the_sandbox(cache_dir, tmp_path):
    cfg = debug_config(cache_dir, tmp_path, "experiment=retool", "rollout.max_new_tokens=48")
    assert cfg.tools.names == ["code_interpreter"] and cfg.reward.success == "boxed_answer"
    train(cfg)
    steps = [r for r in read_metrics(tmp_path) if "reward/mean" in r and "eval/success_rate" not in r]
    assert len(steps) == 2
    for row in steps:
        assert -1.0 <= row["reward/mean"] <= 1.0  # ReTool's reward is exactly +-1 per trajectory
        shares = [row[f"tools/{s}_frac"] for s in ("ok", "error", "timeout", "bad_arguments", "unknown_tool")]
        assert row["tools/calls_per_traj"] == 0 or sum(shares) + row["tools/over_budget_frac"] == pytest.approx(1.0)
        assert 0.0 <= row["tools/used_frac"] <= 1.0 and row["tools/latency_max_s"] >= 0.0


# -- multiple updates per batch, old log-probs, mismatch correction, DAPO -------------------------------------


def record_loss_calls(trainer: Trainer) -> list[dict[str, torch.Tensor]]:
    """Wrap the trainer's loss so every call's inputs are kept (detached copies; keyword inputs left None are not)."""
    calls, loss_fn = [], trainer.learner.loss_fn

    def recording(logp, old_logp, ref_logp, advantages, mask, cfg, **kwargs):
        seen = {"logp": logp, "old_logp": old_logp, "mask": mask, **{k: v for k, v in kwargs.items() if v is not None}}
        calls.append({k: v.detach().clone() for k, v in seen.items()})
        return loss_fn(logp, old_logp, ref_logp, advantages, mask, cfg, **kwargs)

    trainer.learner.loss_fn = recording
    return calls


def shift_sampler_logprobs(trajs: list[Trajectory], shifts: list[float]) -> None:
    """Lower each trajectory's sampler log-probs of sampled tokens by its shift (a mismatch made by hand)."""
    for traj, shift in zip(trajs, shifts):
        traj.sampler_logprobs = [lp - shift * m for lp, m in zip(traj.sampler_logprobs, traj.action_mask)]


def test_mini_batches_take_one_optimizer_step_each_and_recompute_starts_at_ratio_one(cache_dir, tmp_path):
    overrides = ["trainer.ppo_epochs=2", "trainer.mini_batches=2", "trainer.micro_batch_size=1", SHAPED_REWARD]
    trainer = trainer_for(debug_config(cache_dir, tmp_path, *overrides, "algo.old_logprobs=recompute"))
    calls = record_loss_calls(trainer)
    _, trajs = trainer.sampler.groups()
    assert len(trajs) == 4
    learn(trainer, trajs)
    steps = {int(state["step"]) for state in trainer.learner.optimizer.state.values()}
    assert steps == {4}  # 2 epochs x 2 mini-batches
    assert len(calls) == 8  # one trajectory per micro-batch, every trajectory once per epoch
    for call in calls[:2]:  # the first mini-batch runs on the weights the trainer's old log-probs came from
        assert torch.equal(call["logp"], call["old_logp"])
    assert not all(torch.equal(call["logp"], call["old_logp"]) for call in calls[2:])  # later ones after a step


def test_trainer_micro_batches_give_the_mini_batch_gradient(cache_dir, tmp_path):
    cfg = debug_config(cache_dir, tmp_path, "loss.beta=0", "loss.agg=token-mean", "trainer.max_grad_norm=1e9")
    trainer = trainer_for(cfg)
    _, trajs = trainer.sampler.groups()
    batch = collate(trajs, torch.tensor([1.0, -1.0, 0.5, -0.5]), trainer.tokenizer.pad_token_id)
    batch.is_weights = 0.5 + torch.rand(batch.mask.shape)
    rows = torch.tensor([3, 0, 2])  # one mini-batch of three trajectories
    trainer.policy.train()
    mini = batch.rows(rows)  # as one big batch
    logp = token_logprobs(trainer.policy, mini, trainer.learner.sampling)
    out = trainer.learner.loss_fn(
        logp, mini.old_logp, None, mini.advantages, mini.mask, cfg.loss, is_weights=mini.is_weights
    )
    out.loss.backward()
    whole = [p.grad.clone() for p in trainer.policy.parameters()]
    trainer.learner.optimizer.zero_grad(set_to_none=True)

    accumulated = []
    trainer.learner.optimizer.register_step_pre_hook(
        lambda *_: accumulated.append([p.grad.clone() for p in trainer.policy.parameters()])
    )
    trainer.learner.step(batch, rows, poisoned=False)  # micro-batches of 2 (debug config): [3, 0], [2]
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(accumulated[0], whole))
    assert any(a.abs().max() > 1e-4 for a in whole)


def test_narrowed_micro_batches_score_every_action_token_as_the_whole_batch_does(cache_dir, tmp_path):
    trainer = trainer_for(debug_config(cache_dir, tmp_path, "loss.beta=0", "rollout.group_size=4"))
    trajs = trainer.sampler.rollout(trainer.sampler.tasks.tasks[:3], 4, 1.0)  # 12 trajectories of three prompts
    batch = collate(trajs, torch.zeros(len(trajs)), trainer.tokenizer.pad_token_id)
    whole = token_logprobs(trainer.policy, batch, trainer.learner.sampling).detach()  # [12, T]
    micros = micro_batches(batch, torch.arange(len(trajs)), 4)
    assert sorted(int(r) for rows, _, _ in micros for r in rows) == list(range(12))
    assert all(len({trajs[int(r)].group_index for r in rows}) == 1 for rows, _, _ in micros)  # a prompt's rows together
    assert sum(micro.input_ids.numel() for _, micro, _ in micros) < batch.input_ids.numel()  # padding cut
    for rows, micro, first in micros:
        logp = token_logprobs(trainer.policy, micro, trainer.learner.sampling).detach()
        kept = slice(first, first + logp.shape[1])
        assert torch.equal(micro.mask, batch.mask[rows, kept]) and micro.mask.sum() == batch.mask[rows].sum()
        assert torch.allclose(logp[micro.mask > 0], whole[rows, kept][micro.mask > 0], atol=1e-5)


def test_prompt_shared_forward_gives_the_plain_forwards_logits_and_gradients(cache_dir, tmp_path):
    """Three prompts of different lengths, four rows each: every prompt is encoded once, and every logit a
    caller reads (from the last prompt token on) and every gradient equal the plain forward's."""
    trainer = trainer_for(debug_config(cache_dir, tmp_path, "loss.beta=0", "rollout.group_size=4"))
    trajs = trainer.sampler.rollout(trainer.sampler.tasks.tasks[:3], 4, 1.0)  # 12 trajectories of three prompts
    batch = collate(trajs, torch.zeros(len(trajs)), trainer.tokenizer.pad_token_id)
    assert len(set(batch.prompt_lengths.tolist())) > 1
    keep = batch.input_ids.shape[1] - batch.start
    weights = torch.randn(
        len(trajs), keep, trainer.policy.config.vocab_size, generator=torch.Generator().manual_seed(0)
    )
    columns = torch.arange(batch.input_ids.shape[1] - keep, batch.input_ids.shape[1])  # [keep]
    read = (columns >= batch.prompt_lengths[:, None] - 1) & (batch.attention_mask[:, -keep:] > 0)  # [12, keep]
    ids, attention = batch.input_ids, batch.attention_mask
    results = []
    for forward in (plain_logits, partial(prompt_shared_logits, prefix_lengths=batch.prompt_lengths - 1)):
        trainer.policy.zero_grad()
        logits = forward(trainer.policy, ids, attention, keep=keep)  # [12, keep, V]
        (logits * weights * read[..., None]).sum().backward()
        results.append((logits.detach(), [p.grad.clone() for p in trainer.policy.parameters()]))
    (plain, plain_grads), (ours, our_grads) = results
    assert torch.allclose(ours[read], plain[read], atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5, rtol=1e-4) for a, b in zip(our_grads, plain_grads))
    shifted = prompt_shared_logits(trainer.policy, ids, attention, batch.prompt_lengths, keep)
    assert not torch.allclose(shifted.detach()[read], plain[read], atol=1e-3)  # a wrong prefix length shows


def test_shared_prompt_gradients_are_the_same_on_every_pass(cache_dir, tmp_path):
    """trainer.deterministic (the default): the gradient a shared prompt gathers from its rows adds up in a fixed
    order. CPU threads otherwise add the rows' parts of it in whatever order they run, and the sums differ."""
    if torch.get_num_threads() < 2:
        pytest.skip("a single CPU thread adds in a fixed order anyway")
    trainer = trainer_for(debug_config(cache_dir, tmp_path, "loss.beta=0"))
    rows, prompt, suffix = 32, 100, 20  # enough keys and values for the CPU kernels to split across threads
    g, vocab = torch.Generator().manual_seed(0), trainer.policy.config.vocab_size
    shared = torch.randint(vocab, (prompt,), generator=g).expand(rows, -1)
    ids = torch.cat([shared, torch.randint(vocab, (rows, suffix), generator=g)], dim=1)  # [32, 120]

    def gradients() -> list[torch.Tensor]:
        trainer.policy.zero_grad()
        logits = prompt_shared_logits(trainer.policy, ids, torch.ones_like(ids), torch.full((rows,), prompt), suffix)
        logits.float().log_softmax(dim=-1).mean().backward()
        return [p.grad.clone() for p in trainer.policy.parameters()]

    first = gradients()
    for _ in range(3):
        assert all(torch.equal(a, b) for a, b in zip(first, gradients()))


def plain_logits(model, input_ids, attention_mask, keep):
    return model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep).logits


def test_entropy_is_the_policys_mean_over_action_tokens(cache_dir, tmp_path):
    trainer = trainer_for(debug_config(cache_dir, tmp_path, "loss.beta=0", "rollout.temperature=0.8"))
    _, trajs = trainer.sampler.groups()
    batch = collate(trajs, torch.zeros(len(trajs)), trainer.tokenizer.pad_token_id)
    trainer.policy.train()
    with torch.no_grad():
        logits = trainer.policy(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        probs = torch.softmax(logits[:, batch.start : -1] / 0.8, dim=-1)  # [N, T, V]
    entropy = -torch.special.xlogy(probs, probs).sum(dim=-1)  # [N, T]
    expected = ((entropy * batch.mask).sum() / batch.mask.sum()).item()
    step = trainer.learner.step(batch, torch.arange(len(trajs)), poisoned=False)
    assert step["entropy"] == pytest.approx(expected, rel=1e-4)


def test_token_rollout_is_weights_reach_the_loss_capped(cache_dir, tmp_path):
    overrides = ["loss.beta=0", "trainer.micro_batch_size=4", "algo.old_logprobs=recompute", "algo.rollout_is=token"]
    overrides.append("algo.guide=false")  # four sampled trajectories, no replayed reference among them
    trainer = trainer_for(debug_config(cache_dir, tmp_path, *overrides, "algo.rollout_is_threshold=1.5"))
    calls = record_loss_calls(trainer)
    _, trajs = trainer.sampler.groups()
    shift_sampler_logprobs(trajs, [1.0, -0.2, 0.0, 0.0])  # ratios about e (capped at 1.5), e^-0.2, 1, 1
    sampler_logp = collate(trajs, torch.zeros(4), trainer.tokenizer.pad_token_id).old_logp
    metrics = learn(trainer, trajs)
    [call] = calls  # one mini-batch, one micro-batch, in rollout order
    keep = call["mask"] > 0
    expected = torch.exp(call["old_logp"] - sampler_logp).clamp(max=1.5)  # min(pi_old / pi_sampler, C)
    assert torch.allclose(call["is_weights"][keep], expected[keep])
    assert (call["is_weights"][0][keep[0]] == 1.5).all()
    assert torch.allclose(call["is_weights"][1][keep[1]], torch.tensor(math.exp(-0.2)), atol=1e-3)
    assert torch.allclose(call["is_weights"][2:][keep[2:]], torch.tensor(1.0), atol=1e-3)
    assert (call["is_weights"][~keep] == 1).all()
    assert metrics["rollout_is/weight_max"] == pytest.approx(math.e, rel=1e-3)


def test_sequence_rollout_is_masks_exactly_the_out_of_range_trajectories(cache_dir, tmp_path):
    overrides = ["loss.beta=0", "trainer.micro_batch_size=4", "algo.old_logprobs=recompute", "algo.rollout_is=sequence"]
    overrides.append("algo.guide=false")  # four sampled trajectories, no replayed reference among them
    trainer = trainer_for(debug_config(cache_dir, tmp_path, *overrides))  # threshold 2: keep [0.5, 2]
    calls = record_loss_calls(trainer)
    _, trajs = trainer.sampler.groups()
    for traj, shift in zip(trajs, [0.8, -0.6, 0.6, -0.8]):  # sequence ratios about e^0.8, e^-0.6, e^0.6, e^-0.8
        first = traj.action_mask.index(1)
        traj.sampler_logprobs[first] -= shift
    action = collate(trajs, torch.zeros(4), trainer.tokenizer.pad_token_id).mask
    metrics = learn(trainer, trajs)
    [call] = calls
    assert call["mask"].sum(dim=1).tolist() == [0.0, action[1].sum().item(), action[2].sum().item(), 0.0]
    assert "is_weights" not in call
    assert metrics["rollout_is/masked_frac"] == 0.5


def scripted_rewards(monkeypatch, rounds: list[list[float]]) -> None:
    """Replace the trainer's scoring: the k-th call gives its trajectories the k-th list of rewards. (A trainer
    under algo.guide also scores the references it replays.)"""
    queue = list(rounds)

    def score_all(trajs, cfg):
        for traj, reward in zip(trajs, queue.pop(0), strict=True):
            traj.reward = reward

    monkeypatch.setattr("minirl.training.shaping.score_all", score_all)


def test_dynamic_sampling_drops_tied_groups_counts_them_and_refills(cache_dir, tmp_path, monkeypatch):
    overrides = ("algo.dynamic_sampling=true", "algo.max_resample_rounds=2", "loss.beta=0", "algo.guide=false")
    trainer = trainer_for(debug_config(cache_dir, tmp_path, *overrides))
    # two groups of two per round: (tied, differs), (tied, tied), (differs, tied)
    scripted_rewards(monkeypatch, [[1, 1, 0, 1], [0, 0, 2, 2], [0.5, 1, 3, 3]])
    sampled, kept = trainer.sampler.groups()
    assert len(sampled) == 12
    assert [id(t) for t in kept] == [id(t) for t in sampled[2:4] + sampled[8:10]]
    assert group_metrics(sampled, kept, 2) == {
        "reward/zero_std_frac": 4 / 6, "algo/groups_sampled": 6.0, "algo/groups_kept": 2.0,
        "algo/groups_guided": 0.0,
    }  # fmt: skip

    trainer.cfg.algo.max_resample_rounds = 0  # drop only: the batch ends short
    scripted_rewards(monkeypatch, [[1, 1, 0, 1]])
    sampled, kept = trainer.sampler.groups()
    assert [id(t) for t in kept] == [id(t) for t in sampled[2:4]]


GUIDED = ("algo.guide=true", "algo.dynamic_sampling=true", "rollout.max_new_tokens=96")  # turns fit every reference


def test_guidance_replaces_one_member_of_each_group_that_failed_and_starts_it_at_ratio_one(cache_dir, tmp_path):
    cfg = debug_config(cache_dir, tmp_path, *GUIDED, "loss.beta=0")
    trainer = trainer_for(cfg)
    size = cfg.rollout.group_size
    sampled, kept = trainer.sampler.groups()
    # the untrained debug model solves nothing: every group ties at 0, and a reference that states the gt earns 1
    assert not any(t.off_policy or t.reward for t in sampled)
    groups = [sampled[start : start + size] for start in range(0, len(sampled), size)]
    failed = [group for group in groups if group[0].task.gt]  # a greeting has no gt: its reference earns 0 too
    assert failed and len(kept) == len(failed) * size
    assert group_metrics(sampled, kept, size)["algo/groups_guided"] == len(failed)
    for start, group in zip(range(0, len(kept), size), failed):
        members = kept[start : start + size]
        assert [id(t) for t in members[:-1]] == [id(t) for t in group[:-1]]
        guide = members[-1]
        assert guide.off_policy and guide.reward == 1.0
        assert guide.task is group[0].task and guide.group_index == group[0].group_index
    metrics = learn(trainer, kept)
    # pi_old of a replayed answer is the policy itself, so its ratios start at 1 as the samples' do
    assert metrics["loss/ratio_mean"] == pytest.approx(1.0, abs=1e-4) and metrics["adv/max"] > 0


def test_reference_nll_is_the_replayed_answers_likelihood_and_moves_the_update(cache_dir, tmp_path):
    one_step = (*GUIDED, "loss.beta=0", "trainer.ppo_epochs=1", "trainer.mini_batches=1")
    trainer = trainer_for(debug_config(cache_dir, tmp_path, *one_step, "loss.reference_nll=2.0"))
    _, kept = trainer.sampler.groups()
    replayed_rows = torch.tensor([t.off_policy for t in kept])  # [N]
    assert 0 < replayed_rows.sum() < len(kept)
    batch, _ = trainer.advantages(kept)
    policy = trainer.learner.policy.eval()
    logp = trainer.learner.logprobs(policy, batch, [torch.arange(len(kept))])  # [N, T], before the update
    per_row = -(logp * batch.mask).sum(dim=1) / batch.mask.sum(dim=1)  # [N] token-mean NLL
    expected = per_row[replayed_rows].sum() / (batch.mask.sum(dim=1) > 0).sum()  # seq-mean-token-mean
    metrics = trainer.update(batch, kept)
    assert metrics["loss/reference_nll"] == pytest.approx(expected.item(), rel=1e-4)
    moved = [p.detach().clone() for p in policy.parameters()]

    # the same batch from the same weights without the term: another update, and no such metric
    plain = trainer_for(debug_config(cache_dir, tmp_path, *one_step))
    batch, _ = plain.advantages(kept)
    assert "loss/reference_nll" not in plain.update(batch, kept)
    assert any(not torch.equal(a, b) for a, b in zip(moved, plain.learner.policy.parameters()))


def test_guidance_leaves_a_group_whose_rewards_differ_as_it_was(cache_dir, tmp_path, monkeypatch):
    trainer = trainer_for(debug_config(cache_dir, tmp_path, *GUIDED, "loss.beta=0"))
    scripted_rewards(monkeypatch, [[0, 1, 0, 0], [1]])  # (differs, tied), then the reference of the tied group
    sampled, kept = trainer.sampler.groups()
    assert [id(t) for t in kept[:3]] == [id(t) for t in sampled[:3]] and kept[3].off_policy


# a quarter of group 0 solves its task, three quarters of group 1: under 0.75 group 1 stays as it is all the same,
# since its one failure replaced by the reference would leave a group that ties
@pytest.mark.parametrize(("share", "guided"), [(0.2, False), (0.25, True), (0.75, True)])
def test_guidance_reaches_a_group_that_rarely_solves_its_task_under_guide_solved_share(
    cache_dir, tmp_path, monkeypatch, share, guided
):
    overrides = (*GUIDED, "loss.beta=0", "rollout.group_size=4", f"algo.guide_solved_share={share}")
    trainer = trainer_for(debug_config(cache_dir, tmp_path, *overrides))
    scripted_rewards(monkeypatch, [[1, 0, 0, 0, 1, 1, 1, 0], [1], [1]])  # the round, then each group's reference
    sampled, kept = trainer.sampler.groups()
    assert [t.off_policy for t in kept] == [False] * 3 + [guided] + [False] * 4
    assert all(k is s for k, s in zip(kept, sampled) if not k.off_policy)


def reference_task(trainer: Trainer, **changes) -> Task:
    """A training task with a tool call in its reference, with `changes` applied to a copy."""
    task = next(t for t in trainer.sampler.tasks.tasks if t.expected_tool_calls == 1)
    return dataclasses.replace(task, **changes)


@pytest.mark.parametrize("guide", [True, False])
def test_the_console_says_how_many_groups_a_step_learned_from_and_how_many_were_guided(cache_dir, tmp_path, guide):
    console = Console(record=True, width=200)
    cfg = debug_config(
        cache_dir, tmp_path, *GUIDED, f"algo.guide={guide}", "trainer.steps=1", "trainer.save_final=false"
    )
    trainer_for(cfg, console).fit()
    [line] = [line for line in console.export_text().splitlines() if line.startswith("step    1/1")]
    row = step_rows(tmp_path)[0]
    kept, guided = int(row["algo/groups_kept"]), int(row["algo/groups_guided"])
    assert f"groups {kept} ({guided} guided)" in line if guide else f"groups {kept}  " in line
    assert guided > 0 if guide else "guided" not in line


def test_only_a_reference_that_replays_as_written_guides(cache_dir, tmp_path):
    trainer = trainer_for(debug_config(cache_dir, tmp_path, *GUIDED))
    task = reference_task(trainer)
    guide = replayed_in_slot(trainer, task, 3)
    assert guide.off_policy and guide.group_index == 3 and guide.reward == 1.0
    # a call the tool rejects: the reference's answer no longer follows from what the context shows
    call, *_ = task.reference[0]["tool_calls"]
    rejected = {**call, "function": {**call["function"], "arguments": {"no_such_argument": 1}}}
    broken = [{**task.reference[0], "tool_calls": [rejected]}, *task.reference[1:]]
    assert replayed_in_slot(trainer, reference_task(trainer, reference=broken), 3) is None
    # a reference that runs past a turn limit, and none at all
    trainer.sampler.limits.max_new_tokens = 4
    assert replayed_in_slot(trainer, task, 3) is None
    trainer.sampler.limits.max_new_tokens = 96
    assert replayed_in_slot(trainer, reference_task(trainer, reference=[]), 3) is None
    # an answer that starts with a line break: the render merges it with the generation prompt's, but the tokens a
    # model writes after that prompt are split from the text (assistant_turn), so it replays as written
    leading_newline = [*task.reference[:-1], {**task.reference[-1], "content": "\n" + task.reference[-1]["content"]}]
    guide = replayed_in_slot(trainer, reference_task(trainer, reference=leading_newline), 3)
    assert guide.reward == 1.0 and guide.turns[-1].text == leading_newline[-1]["content"]


def test_a_replayed_reference_pays_no_kl_in_the_reward_and_no_sampler_correction(cache_dir, tmp_path):
    overrides = ("algo.kl_in_reward=true", "algo.kl_coef=1.0", "algo.old_logprobs=recompute", "algo.rollout_is=token")
    trainer = trainer_for(debug_config(cache_dir, tmp_path, *GUIDED, *overrides))
    _, kept = trainer.sampler.groups()
    replayed = [t.off_policy for t in kept]
    assert any(replayed) and not all(replayed)
    batch = collate(kept, torch.zeros(len(kept)), trainer.tokenizer.pad_token_id)
    batch.ref_logp = batch.old_logp - 1.0  # every sampled token 1 nat likelier than under the reference
    rewards, _ = kl_shaped(kept, batch, trainer.cfg.algo)
    assert [r == t.reward for r, t in zip(rewards.tolist(), kept)] == replayed
    batch.old_logp += 0.5 * batch.mask  # a sampler/trainer gap on every row: the sampler's log-probs 0.5 higher
    prepared, _ = prepare_batch(batch, kept, [torch.arange(len(kept))], trainer.learner, trainer.cfg.algo)
    for row, traj in enumerate(kept):
        weights = prepared.is_weights[row][prepared.mask[row] > 0]
        if traj.off_policy:  # no sampler drew it: there is no gap to weigh
            assert (weights == 1.0).all()
        else:
            assert torch.allclose(weights, torch.tensor(math.exp(-0.5)), atol=1e-3)


def test_a_round_larger_than_the_batch_keeps_the_first_groups_that_differ(cache_dir, tmp_path, monkeypatch):
    overrides = ("algo.dynamic_sampling=true", "algo.prompts_per_round=3", "algo.max_resample_rounds=1", "loss.beta=0")
    overrides += ("algo.guide=false",)
    trainer = trainer_for(debug_config(cache_dir, tmp_path, *overrides))
    # one round of three groups of two: (differs, tied, differs); two groups kept, so no second round
    scripted_rewards(monkeypatch, [[0, 1, 1, 1, 1, 0]])
    sampled, kept = trainer.sampler.groups()
    assert len(sampled) == 6
    assert [id(t) for t in kept] == [id(t) for t in sampled[0:2] + sampled[4:6]]
    assert len({t.task.id for t in sampled}) == 3  # three different tasks in the round


def test_a_step_whose_groups_all_tie_makes_no_update(cache_dir, tmp_path, monkeypatch):
    cfg = debug_config(cache_dir, tmp_path, "algo.dynamic_sampling=true", "trainer.steps=1", "trainer.save_final=false")
    monkeypatch.setattr("minirl.training.shaping.score_all", lambda trajs, cfg: None)  # every reward stays 0.0
    trainer = trainer_for(cfg)
    trainer.fit()
    [row] = step_rows(tmp_path)
    assert row["algo/groups_kept"] == 0 and row["algo/groups_sampled"] == 2 and row["reward/zero_std_frac"] == 1.0
    assert "loss/policy" not in row and not trainer.learner.optimizer.state


def test_overlong_mask_takes_truncated_trajectories_out_of_the_loss(cache_dir, tmp_path):
    trainer = trainer_for(debug_config(cache_dir, tmp_path, "algo.overlong=mask", "loss.beta=0"))
    _, trajs = trainer.sampler.groups()
    reasons = [TrajectoryEnd.TURN_TOKENS, TrajectoryEnd.ANSWER, TrajectoryEnd.TOKEN_BUDGET, TrajectoryEnd.MAX_TURNS]
    for traj, reason in zip(trajs, reasons):
        traj.finish_reason = reason
    batch = collate(trajs, torch.zeros(4), trainer.tokenizer.pad_token_id)
    prepared, metrics = prepare_batch(batch, trajs, [torch.arange(4)], trainer.learner, trainer.cfg.algo)
    assert prepared.mask.sum(dim=1).tolist() == [0.0, batch.mask[1].sum().item(), 0.0, batch.mask[3].sum().item()]
    assert metrics == {} and batch.mask[0].sum() > 0


def test_overlong_penalty_is_added_to_the_reward(cache_dir, tmp_path):
    overrides = ["algo.overlong=penalty", "algo.overlong_buffer=8", "algo.overlong_penalty=0.5", "loss.beta=0"]
    trainer = trainer_for(debug_config(cache_dir, tmp_path, *overrides))
    task = Task(id="t", messages=[{"role": "user", "content": "?"}], tools=[], gt=[])
    long_turn = Trajectory(task, 0, [1] * 10, response_ids=[5] * 20, action_mask=[1] * 20, sampler_logprobs=[0.0] * 20)
    short_turn = Trajectory(task, 0, [1] * 10, response_ids=[5] * 9, action_mask=[1] * 9, sampler_logprobs=[0.0] * 9)
    long_turn.reward = short_turn.reward = 1.0
    punish_overlong([long_turn, short_turn], trainer.cfg.rollout, trainer.cfg.algo)
    # rollout.max_new_tokens is 24 (debug): 4 tokens were left, 4 of the 8-token buffer used: 0.5 * 4 / 8
    assert long_turn.reward == pytest.approx(0.75) and long_turn.reward_terms == {"overlong_penalty": -0.25}
    assert short_turn.reward == 1.0  # 15 tokens left, outside the buffer


def test_train_with_the_off_policy_options_logs_their_metrics(cache_dir, tmp_path):
    cfg = debug_config(
        cache_dir, tmp_path, "trainer.ppo_epochs=2", "trainer.mini_batches=2", "algo.old_logprobs=recompute",
        "algo.rollout_is=sequence", "algo.overlong=penalty", "algo.overlong_buffer=8", "trainer.save_final=false",
    )  # fmt: skip
    trainer = trainer_for(cfg)
    trainer.fit()
    vocab = trainer.policy.get_output_embeddings().weight.shape[0]
    rows = step_rows(tmp_path)
    assert len(rows) == 2
    for row in rows:
        assert {"rollout_is/logp_gap_abs_mean", "rollout_is/weight_max", "rollout_is/masked_frac"} <= set(row)
        assert row["rollout_is/logp_gap_abs_mean"] < 1e-3  # the HF engine and the trainer agree on CPU
        assert row["reward/overlong_penalty"] <= 0.0 and 0.0 < row["entropy"] <= math.log(vocab)
        assert 0.0 <= row["loss/clip_frac_low"] + row["loss/clip_frac_high"] == pytest.approx(row["loss/clip_frac"])


MINIMIND_ROWS = Path(__file__).parent / "data" / "minimind_agent_rl.jsonl"


def test_rows_written_for_minimind_train_as_they_are(cache_dir, tmp_path):
    """Rows in MiniMind's agent-RL format (its TOOLS verbatim; `location`, no time zone, its unit names and
    calculator rewrites in the reference calls) train 3 steps through data=jsonl on the debug model, loaded by
    path so that no other model is built. The untrained model solves nothing, so each group with a gt learns
    from its reference answer, which guides only when it replays as written through our tools."""
    built = model_path(debug_config(cache_dir, tmp_path / "build"), Console(quiet=True))
    run = tmp_path / "run"
    cfg = debug_config(
        cache_dir, run, "data=jsonl", f"data.path={MINIMIND_ROWS}", f"model.name_or_path={built}", "trainer.steps=3",
        "algo.guide=true", "rollout.max_new_tokens=128", "rollout.max_total_tokens=1536",  # every reference fits
    )  # fmt: skip
    result = train(cfg)
    rows = step_rows(run)
    assert [r["step"] for r in rows] == [1, 2, 3] and [step for step, _ in result.eval_history] == [0, 1, 2, 3]
    assert all(r["algo/groups_guided"] >= 1 for r in rows)
