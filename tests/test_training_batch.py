"""The batch maths of an update (minirl/training/batch.py) and the optimizer step (minirl/training/update.py) on a
hand-written causal LM of a few hundred weights (support.TinyCausalLM): the layout collate builds, narrowed
and micro-batched forwards scoring what the whole batch scores, mini-batch plans, gradient accumulation, and
a poisoned step that changes nothing. No model is built or loaded, so every test takes milliseconds."""

from __future__ import annotations

import copy

import pytest
import torch
from support import TinyCausalLM

from minirl.algos.losses import AGGREGATIONS, LOSSES
from minirl.config import LossConfig, TrainerConfig
from minirl.data.task import Task
from minirl.distributed.strategies import Parallel
from minirl.distributed.world import World
from minirl.inference.sampling import SamplingParams
from minirl.rollout.trajectory import Trajectory
from minirl.training.batch import (
    PolicyBatch,
    batch_logprobs,
    collate,
    micro_batches,
    mini_batch_plan,
    token_logprobs,
)
from minirl.training.update import PolicyOptimizer

pytestmark = pytest.mark.fast

PAD = 0
SAMPLING = SamplingParams(max_new_tokens=8, temperature=0.8)  # how the trajectories were "sampled"
TASK = Task(id="t", messages=[{"role": "user", "content": "?"}], tools=[], gt=[])
# (prompt, [(response, action mask)] one per group member): three prompts of different lengths, two rows each;
# the 0s in a mask are a tool observation the framework added
GROUPS = [
    ([1, 2, 3, 4, 5], [([6, 7, 8], [1, 1, 1]), ([6, 9, 2, 3, 7], [1, 1, 0, 0, 1])]),
    ([1, 2, 3], [([4, 4], [1, 1]), ([5, 6, 7, 8, 9, 10], [1, 0, 0, 1, 1, 1])]),
    ([2, 3, 5, 7], [([1], [1]), ([8, 8, 8], [1, 1, 1])]),
]


def trajectories() -> list[Trajectory]:
    """GROUPS in rollout order; each sampled token's log-prob is distinct, so a misplaced column shows (an
    observation token's is 0.0, as the agent loop records it)."""
    trajs = []
    for group, (prompt, members) in enumerate(GROUPS):
        for response, mask in members:
            logprobs = [(-0.1 * (len(trajs) + 1) - 0.01 * i) * m for i, m in enumerate(mask)]
            trajs.append(Trajectory(TASK, group, list(prompt), list(response), list(mask), logprobs))
    return trajs


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tensors this small take milliseconds on one thread and ~50x longer on a pool (on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def model() -> TinyCausalLM:
    return TinyCausalLM(vocab_size=11, hidden_size=8)


@pytest.fixture
def batch() -> PolicyBatch:
    return collate(trajectories(), torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0]), PAD)


# -- the layout ------------------------------------------------------------------------------------


def test_collate_puts_each_response_in_the_target_columns_that_score_it(batch):
    trajs = trajectories()
    widths = [len(t.prompt_ids) + len(t.response_ids) for t in trajs]
    assert batch.input_ids.shape == (6, max(widths)) and batch.start == 3 - 1  # the shortest prompt's last token
    assert batch.prompt_lengths.tolist() == [5, 5, 3, 3, 4, 4]
    assert batch.old_logp.shape == batch.mask.shape == (6, max(widths) - 1 - batch.start)
    assert batch.advantages.tolist() == [1.0, -1.0, 0.5, -0.5, 2.0, -2.0]
    for row, t in enumerate(trajs):
        ids = t.prompt_ids + t.response_ids
        assert batch.input_ids[row].tolist() == ids + [PAD] * (max(widths) - len(ids))  # right-padded
        assert batch.attention_mask[row].tolist() == [1] * len(ids) + [0] * (max(widths) - len(ids))
        first = len(t.prompt_ids) - 1 - batch.start  # the column whose logits predict the first response token
        columns = range(first, first + len(t.response_ids))
        # column c scores input_ids[start + c + 1]: the response, token for token
        assert [int(batch.input_ids[row, batch.start + c + 1]) for c in columns] == t.response_ids
        assert batch.mask[row, first : first + len(t.response_ids)].tolist() == t.action_mask
        assert batch.old_logp[row, first : first + len(t.response_ids)].tolist() == pytest.approx(t.sampler_logprobs)
        outside = torch.ones(batch.mask.shape[1], dtype=torch.bool)
        outside[first : first + len(t.response_ids)] = False
        assert not batch.mask[row, outside].any() and not batch.old_logp[row, outside].any()


def test_token_logprobs_are_the_full_forwards_at_the_target_tokens(model, batch):
    """The prompt-shared forward (each group's prompt encoded once, its cache copied to the rows) scores every
    action token as one plain forward over each row alone does."""
    logp = token_logprobs(model, batch, SAMPLING)  # [6, T]
    for row in range(6):
        length = int(batch.attention_mask[row].sum())
        logits = model(input_ids=batch.input_ids[row : row + 1, :length]).logits[0]  # [length, V]
        alone = SAMPLING.logprobs(logits[:-1].float()).gather(-1, batch.input_ids[row, 1:length, None])[:, 0]
        actions = batch.mask[row] > 0
        assert torch.allclose(logp[row, actions], alone[batch.start :][actions[: length - 1 - batch.start]], atol=1e-5)


@pytest.mark.parametrize("rows", [[0, 1], [2, 3], [4, 5], [2, 4], [3]])
def test_a_narrowed_batch_scores_its_kept_columns_as_the_whole_batch_does(model, batch, rows):
    part = batch.rows(torch.tensor(rows))
    narrow, first = part.narrowed()
    assert narrow.input_ids.shape[1] == int(part.attention_mask.sum(dim=1).max())  # inputs end at the longest row
    assert narrow.input_ids.shape[1] < batch.input_ids.shape[1] or first > 0  # something was cut
    assert narrow.start == batch.start + first and narrow.mask.sum() == part.mask.sum()  # no action lost
    whole = token_logprobs(model, batch, SAMPLING)[rows]  # [n, T]
    kept = slice(first, first + narrow.mask.shape[1])
    assert torch.equal(narrow.mask, part.mask[:, kept]) and torch.equal(narrow.old_logp, part.old_logp[:, kept])
    logp = token_logprobs(model, narrow, SAMPLING)
    actions = narrow.mask > 0
    assert torch.allclose(logp[actions], whole[:, kept][actions], atol=1e-5)


# -- micro-batches and mini-batches ----------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("order", [[0, 1, 2, 3, 4, 5], [5, 0, 3, 1, 4, 2], [4, 1, 5]])
def test_micro_batches_cover_every_row_once_and_keep_a_prompts_rows_together(batch, size, order):
    rows = torch.tensor(order)
    micros = micro_batches(batch, rows, size)
    got = [int(r) for micro_rows, _, _ in micros for r in micro_rows]
    assert sorted(got) == sorted(order) and all(len(micro_rows) <= size for micro_rows, _, _ in micros)
    prompt_of = batch.prompt_lengths.tolist()  # the three prompts differ in length
    runs = [prompt_of[r] for r in got]
    assert runs == sorted(runs)  # shortest prompt first, so a prompt's rows are adjacent
    if size % 2 == 0:  # micro-batches of whole groups: a prompt's rows are in one micro-batch
        homes = {}
        for index, (micro_rows, _, _) in enumerate(micros):
            for r in micro_rows.tolist():
                assert homes.setdefault(prompt_of[r], index) == index
    for micro_rows, micro, first in micros:
        narrow, expected_first = batch.rows(micro_rows).narrowed()
        assert first == expected_first and torch.equal(micro.input_ids, narrow.input_ids)


@pytest.mark.parametrize("n", [1, 2, 5, 6, 7])
@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_mini_batch_plan_cuts_each_epoch_into_near_equal_parts(n, count):
    plan = mini_batch_plan(n, epochs=2, mini_batches=count, generator=torch.Generator().manual_seed(0))
    assert len(plan) == 2
    for epoch in plan:
        sizes = [len(rows) for rows in epoch]
        assert len(sizes) == min(count, n) and sum(sizes) == n and max(sizes) - min(sizes) <= 1
        assert sorted(torch.cat(epoch).tolist()) == list(range(n))


@pytest.mark.parametrize("micro_size", [1, 2, 4])
@pytest.mark.parametrize("sampling", [SAMPLING, SamplingParams(8, 1.0, top_p=0.9, top_k=5)])
def test_batch_logprobs_over_mini_and_micro_batches_equal_the_whole_batchs(model, batch, micro_size, sampling):
    plan = [torch.tensor([4, 1, 0]), torch.tensor([5, 3, 2])]  # groups split across mini-batches
    logp = batch_logprobs(model, batch, plan, micro_size, torch.device("cpu"), sampling)  # [6, T]
    whole = token_logprobs(model, batch, sampling).detach()
    actions = batch.mask > 0
    assert logp.shape == whole.shape and torch.allclose(logp[actions], whole[actions], atol=1e-5)


# -- the optimizer step ----------------------------------------------------------------------------


def learner_for(model, agg: str = "token-mean", loss: str = "grpo", micro_batch_size: int = 2) -> PolicyOptimizer:
    loss_cfg = LossConfig(name=loss, beta=0.05, agg=agg, max_tokens_norm=16)
    trainer_cfg = TrainerConfig(lr=1e-2, micro_batch_size=micro_batch_size, max_grad_norm=1e9)  # no clipping
    return PolicyOptimizer.adamw(Parallel(model, World()), loss_cfg, trainer_cfg, torch.device("cpu"), SAMPLING)


def off_policy(model, batch: PolicyBatch) -> PolicyBatch:
    """The batch with pi_old, a reference and rollout IS weights near the model's own, so ratios move."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        now = token_logprobs(model, batch, SAMPLING)
    batch.old_logp = (now + 0.1 * torch.randn(now.shape, generator=g)) * batch.mask
    batch.ref_logp = (now + 0.1 * torch.randn(now.shape, generator=g)) * batch.mask
    batch.is_weights = 0.5 + torch.rand(now.shape, generator=g)
    return batch


@pytest.mark.parametrize("agg", AGGREGATIONS.names())
@pytest.mark.parametrize("loss", LOSSES.names())
def test_micro_batch_gradients_add_up_to_the_mini_batch_gradient(model, batch, agg, loss):
    learner = learner_for(model, agg, loss, micro_batch_size=2)
    batch = off_policy(model, batch)
    rows = torch.tensor([4, 0, 1, 5, 3])  # one mini-batch of five rows, two groups whole, one split
    mini = batch.rows(rows)  # as one big batch
    logp = token_logprobs(model, mini, SAMPLING)
    out = learner.loss_fn(
        logp, mini.old_logp, mini.ref_logp, mini.advantages, mini.mask, learner.loss_cfg, is_weights=mini.is_weights
    )
    out.loss.backward()
    whole = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)

    seen = []
    learner.optimizer.register_step_pre_hook(lambda *_: seen.append([p.grad.clone() for p in model.parameters()]))
    metrics = learner.step(batch, rows, poisoned=False)  # micro-batches of 2 rows: three of them
    assert len(micro_batches(batch, rows, 2)) == 3 and len(seen) == 1
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(seen[0], whole))
    assert any(g.abs().max() > 1e-4 for g in whole)
    assert metrics["faults/skipped_updates"] == 0.0 and metrics["loss/policy"] == pytest.approx(
        out.metrics["loss/policy"].item(), abs=1e-6
    )


def state_of(learner: PolicyOptimizer) -> tuple[list[torch.Tensor], dict, list[float]]:
    weights = [p.detach().clone() for p in learner.policy.parameters()]
    return weights, copy.deepcopy(learner.optimizer.state_dict()), learner.scheduler.get_last_lr()


def assert_same_state(before, after) -> None:
    (weights, optimizer, lr), (weights_now, optimizer_now, lr_now) = before, after
    assert all(torch.equal(a, b) for a, b in zip(weights, weights_now))
    assert optimizer["state"].keys() == optimizer_now["state"].keys()
    for key, state in optimizer["state"].items():
        assert all(torch.equal(state[name], optimizer_now["state"][key][name]) for name in state)
    assert lr == lr_now


@pytest.mark.parametrize("poison", ["loss", "advantages"])
def test_a_non_finite_step_leaves_weights_and_optimizer_state_as_they_were(model, batch, poison):
    """trainer.nan_loss_steps makes the loss NaN (`poisoned`); a NaN advantage makes the gradient norm NaN.
    Either way the step is skipped: weights, AdamW's moments and step count, and the schedule stay put."""
    learner, batch = learner_for(model), off_policy(model, batch)
    rows = torch.arange(6)
    assert learner.step(batch, rows, poisoned=False)["faults/skipped_updates"] == 0.0  # AdamW state to keep
    before = state_of(learner)
    if poison == "advantages":
        batch.advantages[2] = float("nan")
    metrics = learner.step(batch, rows, poisoned=poison == "loss")
    assert metrics["faults/skipped_updates"] == 1.0
    assert_same_state(before, state_of(learner))
    assert all(p.grad is None for p in model.parameters())  # nothing left over for the next step
    batch.advantages[2] = 0.5
    assert learner.step(batch, rows, poisoned=False)["faults/skipped_updates"] == 0.0  # the next one steps
    assert not all(torch.equal(a, p) for a, p in zip(before[0], model.parameters()))


def test_update_counts_every_skipped_optimizer_step(model, batch):
    learner, batch = learner_for(model), off_policy(model, batch)
    plan = mini_batch_plan(6, epochs=2, mini_batches=2, generator=torch.Generator().manual_seed(0))
    before = state_of(learner)
    metrics = learner.update(batch, plan, poisoned=True)
    assert metrics["faults/skipped_updates"] == 4  # 2 epochs x 2 mini-batches, every one of them skipped
    assert_same_state(before, state_of(learner))
    assert learner.update(batch, plan, poisoned=False)["faults/skipped_updates"] == 0
    assert {int(state["step"]) for state in learner.optimizer.state.values()} == {4}
