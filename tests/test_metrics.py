"""Per-step rollout statistics, from trajectories whose tool results came from the real sandbox."""

from __future__ import annotations

import pytest

from minirl.config import CallPolicy, SandboxConfig, ToolsConfig
from minirl.data.task import Task
from minirl.metrics import rollout_metrics
from minirl.protocol.parsing import ParsedTurn, TurnKind, parse_turn
from minirl.rewards.success import gt_in_answer
from minirl.rollout.trajectory import Trajectory, TrajectoryEnd, Turn
from minirl.tools import ToolExecutor, build_tools
from minirl.tools.base import ToolCall


def test_tool_outcome_shares_latency_and_use_are_per_batch():
    cfg = ToolsConfig(names=["code_interpreter"], timeout_s=2.0, sandbox=SandboxConfig(cpu_s=1, memory_mb=256))
    executor = ToolExecutor(build_tools(cfg.names, cfg), cfg.timeout_s, cfg.max_output_chars)
    codes = ["print(6 * 7)", "print(1 / 0)", "while True:\n    pass", "print(2)"]
    calls = [ToolCall(f"call_0_{i}", "code_interpreter", {"code": code}) for i, code in enumerate(codes)]
    results = executor.execute_many(calls, budget=3)
    assert [r.status for r in results] == ["ok", "error", "timeout", "over_budget"]
    task = Task(id="t", messages=[{"role": "user", "content": "?"}], tools=[], gt=["42"])
    called = Trajectory(task, 0, [1], response_ids=[2], action_mask=[1], sampler_logprobs=[-0.1])
    called.turns = [
        Turn("", ParsedTurn(TurnKind.TOOL, "", calls), results),
        Turn("42", ParsedTurn(TurnKind.ANSWER, "42")),
    ]
    called.finish_reason = TrajectoryEnd.ANSWER
    answered = Trajectory(task, 0, [1], response_ids=[2], action_mask=[1], sampler_logprobs=[-0.1])
    answered.turns = [Turn("7", ParsedTurn(TurnKind.ANSWER, "7"))]
    answered.finish_reason = TrajectoryEnd.ANSWER
    out = rollout_metrics([called, answered], gt_in_answer)
    assert out["tools/calls_per_traj"] == 2.0 and out["tools/used_frac"] == 0.5
    for status in ("ok", "error", "timeout", "over_budget"):
        assert out[f"tools/{status}_frac"] == pytest.approx(0.25)
        assert out[f"tools/{status}_count"] == 1.0
    assert out["tools/bad_arguments_frac"] == 0.0
    assert out["tools/latency_max_s"] >= 0.9  # the killed loop ran until its CPU limit
    assert out["rollout/success_rate"] == 0.5 and out["rollout/finish_answer"] == 1.0


def test_calls_the_lenient_policy_drops_are_counted_per_batch():
    task = Task(id="t", messages=[{"role": "user", "content": "?"}], tools=[], gt=[])
    text = '<tool_call>{"name": "f"}</tool_call><tool_call>{oops}</tool_call></tool_call>'
    trajs = []
    for policy in (CallPolicy.lenient, CallPolicy.lenient, CallPolicy.multi):
        traj = Trajectory(task, 0, [1], response_ids=[2], action_mask=[1], sampler_logprobs=[-0.1])
        traj.turns = [Turn(text, parse_turn(text, policy=policy))]
        traj.finish_reason = TrajectoryEnd.MAX_TURNS
        trajs.append(traj)
    assert rollout_metrics(trajs, gt_in_answer)["tools/dropped_count"] == 4.0  # 2 a turn; multi drops none
    assert rollout_metrics(trajs[2:], gt_in_answer)["tools/dropped_count"] == 0.0
