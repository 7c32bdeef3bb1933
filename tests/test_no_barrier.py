"""The agent loop without a round barrier (rollout.barrier=false, the torch engine's session): a finished turn's
calls run while the other rows decode, its next turn joins the running batch, and what every trajectory samples
is what the barrier's schedule gives (greedy), repeats whatever the tool wall-clock (sampled, each trajectory on
its own generator), and keeps its sampler log-probs equal to the trainer's."""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch
from support import CALC_TOOL, CONVERSATION, GREETING, Staggered, trajectory_view
from transformers import AutoModelForCausalLM, AutoTokenizer

from minirl.config import ProtocolConfig
from minirl.data.task import Task
from minirl.inference.loop import DecodeLoop
from minirl.rollout import agent_loop
from minirl.rollout.agent_loop import AgentLimits, RolloutCancelled, run_agent
from minirl.rollout.engine import ENGINES, SamplingParams
from minirl.tools import ToolExecutor
from minirl.training.batch import collate, token_logprobs

LIMITS = AgentLimits(max_turns=3, max_new_tokens=64, max_total_tokens=1024, max_tool_calls=8)
TASKS = [
    Task("calc", CONVERSATION[:2], [CALC_TOOL], ["9472", "42"]),
    Task("hello", GREETING[:2], [], []),
]


@pytest.fixture(scope="module")
def policy(tool_model_dir):
    return AutoModelForCausalLM.from_pretrained(tool_model_dir).eval(), AutoTokenizer.from_pretrained(tool_model_dir)


def rollout(policy, tool, sampling, barrier, group_size=4, seed=0, cancel=None):
    model, tokenizer = policy
    engine = ENGINES.get("torch")(model, tokenizer, torch.device("cpu"))
    executor = ToolExecutor({"calculate_math": tool}, timeout_s=5.0, max_output_chars=512, max_concurrent=4)
    torch.manual_seed(seed)
    return run_agent(
        engine,
        tokenizer,
        executor,
        TASKS,
        group_size,
        LIMITS,
        sampling,
        ProtocolConfig(),
        barrier=barrier,
        cancel=cancel,
    )


def test_greedy_trajectories_are_the_barriers_token_for_token(policy):
    greedy = SamplingParams(64, temperature=0.0)
    staggered = Staggered(lambda i: 0.02 * (i % 5))
    with_barrier = rollout(policy, staggered, greedy, barrier=True)
    without = rollout(policy, Staggered(lambda i: 0.02 * (i % 5)), greedy, barrier=False)
    assert trajectory_view(without) == trajectory_view(with_barrier)
    assert sum(len(u.tool_results) for t in without for u in t.turns) == 8  # four trajectories of two calls
    for a, b in zip(without, with_barrier):
        assert max((abs(x - y) for x, y in zip(a.sampler_logprobs, b.sampler_logprobs)), default=0.0) < 1e-5


def test_sampled_trajectories_repeat_whatever_the_tool_wall_clock(policy):
    """Each trajectory draws from its own generator: two runs whose calls take random, different times (so
    rows join the batch in different orders and steps) sample the same tokens; the sampler log-probs are the
    trainer's."""
    model, tokenizer = policy
    sampling = SamplingParams(64, temperature=1.0)
    wall_clock = random.Random()  # unseeded on purpose: the two runs' timings differ
    first = rollout(policy, Staggered(lambda i: wall_clock.uniform(0, 0.05)), sampling, barrier=False, group_size=6)
    second = rollout(policy, Staggered(lambda i: wall_clock.uniform(0, 0.05)), sampling, barrier=False, group_size=6)
    assert trajectory_view(first) == trajectory_view(second)
    assert len({tuple(t.response_ids) for t in first}) > 2  # the samples differ from one another
    assert any(u.tool_results for t in first for u in t.turns)
    batch = collate(first, torch.zeros(len(first)), tokenizer.pad_token_id)
    with torch.no_grad():
        logp = token_logprobs(model, batch, SamplingParams(1, 1.0))
    assert batch.mask.sum() > 0
    assert ((logp - batch.old_logp).abs() * batch.mask).max().item() < 1e-4


@pytest.mark.parametrize("barrier", [True, False])
def test_rows_decode_while_other_trajectories_calls_run_only_without_a_barrier(policy, monkeypatch, barrier):
    steps = []
    original = DecodeLoop.step

    def timed_step(self):
        steps.append(time.perf_counter())
        return original(self)

    monkeypatch.setattr(DecodeLoop, "step", timed_step)
    tool = Staggered(lambda i: 0.25 * i)  # the later calls run long after the first ones came back
    trajs = rollout(policy, tool, SamplingParams(64, temperature=0.0), barrier=barrier)
    assert all(t.turns[-1].parsed.kind.name == "ANSWER" for t in trajs)
    during = sum(any(start < s < end for start, end in tool.windows) for s in steps)
    if barrier:
        assert during == 0  # every turn waits for every call of the turn before
    else:
        assert during > 10  # answers were decoded while slower calls still ran


def test_with_nothing_to_decode_the_loop_sleeps_until_a_running_call_ends(policy, monkeypatch):
    """A turn of two calls whose first comes back at once and whose second takes 0.5 s: with no row left to
    decode the loop waits on the running call, once per call at most, not in a busy loop on the finished one
    (which would hold the GIL from the tools and the trainer)."""
    waits = []
    original = agent_loop.wait

    def counted_wait(futures, **kwargs):
        waits.append(len(futures))
        return original(futures, **kwargs)

    monkeypatch.setattr(agent_loop, "wait", counted_wait)
    tool = Staggered(lambda i: 0.0 if i == 0 else 0.5)
    trajs = rollout(policy, tool, SamplingParams(64, temperature=0.0), barrier=False, group_size=1)
    calls = sum(len(u.tool_results) for t in trajs for u in t.turns)
    assert calls == 2 and all(t.turns[-1].parsed.kind.name == "ANSWER" for t in trajs)
    assert 1 <= len(waits) <= calls


@pytest.mark.parametrize("barrier", [True, False])
def test_a_cancelled_rollout_stops_before_its_next_turn(policy, barrier):
    """The cancel event set from another thread (here by the first tool call): the rollout raises RolloutCancelled
    instead of decoding the answers that follow the calls."""
    cancel = threading.Event()
    tool = Staggered(lambda i: cancel.set() or 0.0)
    with pytest.raises(RolloutCancelled):
        rollout(policy, tool, SamplingParams(64, temperature=0.0), barrier=barrier, cancel=cancel)
    assert 1 <= len(tool.windows) <= 8  # the calls of the first turn at most: four trajectories of two
