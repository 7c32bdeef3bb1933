"""`python -m minirl.eval`: the real saved tool model, the real tools, a small JSONL dataset in MiniMind's format.

The model (the `tool_model_dir` fixture) has memorised two conversations: greedy decoding answers the
CONVERSATION task with two calculate_math calls and then the right answer, greets on the GREETING task, and
fails the third task, which it never saw.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
from functools import partial
from pathlib import Path
from statistics import fmean
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir
from openai.types.chat import ChatCompletion
from support import CALC_TOOL, CONVERSATION, GREETING

from minirl.config import CallPolicy, Config, ProtocolConfig, register_configs, to_config
from minirl.data.jsonl import write_jsonl
from minirl.data.task import Task
from minirl.entry import CONF_DIR
from minirl.errors import ConfigError
from minirl.evaluation.chat_loop import run_chat_agent
from minirl.evaluation.compare import paired_rows
from minirl.evaluation.evaluator import evaluate
from minirl.evaluation.report import EvalReport, ReportError
from minirl.protocol.formats import CALL_FORMATS
from minirl.protocol.parsing import TurnKind, parse_message, parse_turn
from minirl.rollout.agent_loop import AgentLimits
from minirl.rollout.engine import SamplingParams
from minirl.serving.openai_api import Choice, ChoiceDelta, ResponseHeader
from minirl.serving.turn_splitter import TurnSplitter
from minirl.stats import sign_test_p
from minirl.tools import ToolExecutor, build_tools

register_configs()

UNSEEN = [
    {"role": "system", "content": "You are a helpful assistant with tools."},
    {"role": "user", "content": "What is 9 * 9?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"name": "calculate_math", "arguments": {"expression": "9 * 9"}}],
    },
    {"role": "tool", "content": '{"result": "81"}'},
    {"role": "assistant", "content": "9 * 9 = 81."},
]
SAMPLED = ("eval.samples=2", "eval.temperature=1.0", "eval.seed=1")  # pass@2 at temperature 1
ANSWER = "256 * 37 = 9472 and 12 + 30 = 42."
CALLS = [{"expression": "256 * 37"}, {"expression": "12 + 30"}]


def row(conversation: list[dict], gt: list[str], kind: str, tools: list[dict] | None = None) -> dict:
    """A row in MiniMind's agent-RL format: tools on the system message."""
    system, *rest = conversation
    return {"conversations": [{**system, **({"tools": tools} if tools else {})}, *rest], "gt": gt, "kind": kind}


@pytest.fixture(scope="module")
def tasks_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "tasks.jsonl"
    write_jsonl(
        path,
        [
            row(CONVERSATION, ["9472", "42"], "double", [CALC_TOOL]),
            row(GREETING, [], "no_tool"),
            row(UNSEEN, ["81"], "single", [CALC_TOOL]),
        ],
    )
    return path


def eval_config(model_dir: Path | str, tasks_file: Path, run_dir: Path, *overrides: str) -> Config:
    data = ["data=jsonl", f"data.path={tasks_file}", f"data.heldout_path={tasks_file}"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        dict_cfg = compose("config", overrides=[f"model.name_or_path={model_dir}", *data, "logger=none", *overrides])
    cfg = to_config(dict_cfg)
    cfg.output_dir = str(run_dir)
    return cfg


def run_eval(tmp_path_factory, model_dir, tasks_file, *overrides: str) -> tuple[EvalReport, Path]:
    """The report evaluate() returns and the file it wrote."""
    run_dir = tmp_path_factory.mktemp("run")
    report = evaluate(eval_config(model_dir, tasks_file, run_dir, *overrides))
    return report, run_dir / "eval.json"


@pytest.fixture(scope="module")
def greedy(tool_model_dir, tasks_file, tmp_path_factory) -> tuple[EvalReport, Path]:
    return run_eval(tmp_path_factory, tool_model_dir, tasks_file, "eval.samples=2")


@pytest.fixture(scope="module")
def sampled(tool_model_dir, tasks_file, tmp_path_factory) -> tuple[EvalReport, Path]:
    return run_eval(tmp_path_factory, tool_model_dir, tasks_file, *SAMPLED)


def outcomes(report: EvalReport) -> list[list[bool]]:
    return [[sample.success for sample in task.samples] for task in report.tasks]


# -- the local backend ------------------------------------------------------------------------------------------


def test_local_backend_greedy_metrics_match_hand_counts(greedy, tool_model_dir):
    report, _ = greedy
    m = report.metrics
    assert outcomes(report) == [[True, True], [True, True], [False, False]]
    conversation, greeting, unseen = report.tasks
    assert [s.final_answer for s in conversation.samples] == [ANSWER, ANSWER]
    assert [[c["arguments"] for c in s.tool_calls] for s in conversation.samples] == [CALLS, CALLS]
    assert [s.final_answer for s in greeting.samples] == ["Hello! How can I help?"] * 2
    assert [s.finish_reason for s in unseen.samples] == ["invalid", "invalid"]  # it never learned this one
    # 6 samples: 4 successes, and every task solved by one of its samples is solved by both (greedy)
    assert m["success_rate"] == pytest.approx(4 / 6) and m["pass_at_n"] == pytest.approx(2 / 3)
    assert (m["success_rate/double"], m["success_rate/no_tool"], m["success_rate/single"]) == (1.0, 1.0, 0.0)
    # 4 calls ran ok; the 2 turns that did not parse count as one failed call each
    assert m["tools/call_ok_frac"] == pytest.approx(4 / 6) and m["tools/valid_frac"] == 1.0
    assert m["tools/calls_per_traj"] == pytest.approx(4 / 6) and m["rollout/turns"] == pytest.approx(8 / 6)
    assert m["rollout/finish_answer"] == pytest.approx(4 / 6) and m["rollout/finish_invalid"] == pytest.approx(2 / 6)
    assert m["rollout/finish_max_turns"] == m["rollout/finish_error"] == 0.0
    assert m["reward/mean"] == pytest.approx(sum(s.reward for t in report.tasks for s in t.samples) / 6)
    # calculate_math: the reference of 2 tasks calls it; solved in 2 of their 4 samples; 4 calls, all ran ok
    tool = report.per_tool["calculate_math"]
    assert (tool.reference_tasks, tool.success_rate, tool.calls, tool.ok_frac) == (2, 0.5, 4, 1.0)
    assert list(report.per_tool) == ["calculate_math"]
    run = report.run
    assert (run.backend, run.model, run.dataset, run.samples, run.temperature, run.seed, run.tasks) == (
        "local", str(tool_model_dir), "jsonl", 2, 0.0, 0, 3,
    )  # fmt: skip
    assert run.wall_s > 0


def test_pass_at_n_counts_tasks_with_a_success_among_their_samples(sampled, tool_model_dir, tasks_file, tmp_path):
    report, _ = sampled
    for task in report.tasks:  # the success criterion (gt_in_answer), checked by hand on each sample
        for sample in task.samples:
            expected = sample.finish_reason == "answer" and all(g in sample.final_answer for g in task.gt)
            assert sample.success == expected
    successes = outcomes(report)
    assert report.metrics["success_rate"] == pytest.approx(sum(map(sum, successes)) / 6)
    assert report.metrics["pass_at_n"] == pytest.approx(sum(map(any, successes)) / 3)
    assert successes[2] == [False, False]  # sampling does not solve the unseen task
    needing = successes[0] + successes[2]  # the two tasks whose reference calls calculate_math
    assert report.per_tool["calculate_math"].success_rate == pytest.approx(sum(needing) / 4)
    calls = [c for t in report.tasks for s in t.samples for c in s.tool_calls]
    assert report.per_tool["calculate_math"].calls == len(calls)
    # the same seed samples the same trajectories
    again = evaluate(eval_config(tool_model_dir, tasks_file, tmp_path, *SAMPLED))
    assert again.tasks == report.tasks


def test_report_json_round_trip(greedy, tmp_path):
    report, path = greedy
    assert EvalReport.load(path) == report
    saved = json.loads(path.read_text())
    assert saved["tasks"][0]["prompt"] == "What is 256 * 37 and 12 + 30?"
    assert [s["success"] for s in saved["tasks"][2]["samples"]] == [False, False]
    for text, fragment in [("not json", "not valid JSON"), ('{"run": {}}', "not an evaluation report")]:
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(ReportError, match=fragment):
            EvalReport.load(bad)


def test_unknown_backend_fails_before_any_model_loads(tasks_file, tmp_path):
    cfg = eval_config(tmp_path / "no-such-model", tasks_file, tmp_path, "eval.backend=nope")
    with pytest.raises(ConfigError, match="^unknown eval backend 'nope'; known: local, openai$"):
        evaluate(cfg)


# -- the openai backend -----------------------------------------------------------------------------------------


def test_openai_backend_needs_an_endpoint(tasks_file, tmp_path):
    with pytest.raises(ConfigError, match="eval.base_url"):
        evaluate(eval_config("any", tasks_file, tmp_path, "eval.backend=openai"))


def test_an_unreachable_endpoint_records_failed_trajectories(tasks_file, tmp_path):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    overrides = ["eval.backend=openai", f"eval.base_url=http://127.0.0.1:{port}/v1", "eval.model_id=m"]
    report = evaluate(eval_config("any", tasks_file, tmp_path, *overrides, "eval.max_tasks=1"))
    (sample,) = report.tasks[0].samples
    assert sample.finish_reason == "error" and "APIConnectionError" in sample.error and not sample.success
    assert report.metrics["rollout/finish_error"] == 1.0 and report.metrics["success_rate"] == 0.0


@pytest.mark.fast
def test_structured_calls_follow_the_turn_rules():
    def parse(content, calls, policy=CallPolicy.multi):
        return parse_message(content, calls, "hermes", policy, max_calls=2, tools=[CALC_TOOL])

    ok = parse("", [("id0", "calculate_math", '{"expression": "1 + 1"}'), ("id1", "calculate_math", "")])
    assert ok.kind is TurnKind.TOOL and [(c.id, c.arguments) for c in ok.tool_calls] == [
        ("id0", {"expression": "1 + 1"}),
        ("id1", {}),
    ]
    invalid = {
        "not JSON": parse("", [("a", "calculate_math", '{"expression": ')]),
        "must be an object": parse("", [("a", "calculate_math", "[1]")]),
        "no string 'name'": parse("", [("a", None, "{}")]),
        "3 tool calls in one turn (max 2)": parse("", [("a", "calculate_math", "{}")] * 3),
        "not in its tool_calls": parse('<tool_call>\n{"name": "calculate_math"}\n</tool_call>', []),
        "is not closed": parse("<tool_call>", []),
        "is empty": parse("", [("a", "calculate_math", '{"expression": " "}')], CallPolicy.strict_single),
    }
    for reason, turn in invalid.items():
        assert turn.kind is TurnKind.INVALID and reason in turn.reason, (reason, turn)
    assert parse("<think>x</think>Hi!", []).content == "Hi!"


CALC = '<tool_call>\n{"name": "calculate_math", "arguments": {"expression": "6 * 7"}}\n</tool_call>'
SERVED_TURNS = {  # turns whose reasoning holds call markup; training reads none of it as calls
    "call in reasoning": f"<think>Or {CALC}?</think>It is 42.",
    "calls after reasoning": f"<think>One product. {CALC[:20]}</think>Computing.\n{CALC}",
    "reasoning never closed": f"<think>Maybe {CALC}",
}


class ServedResponses:
    """An OpenAI client whose endpoint answers every request with `completion` (a minirl server response)."""

    def __init__(self, completion) -> None:
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=lambda **request: completion))


@pytest.mark.parametrize("turn", SERVED_TURNS)
def test_the_evaluator_reads_a_served_turn_as_training_does(turn):
    """The same text, split and answered by the server's TurnSplitter and response objects and read back by
    the evaluator's chat loop, gives the turn training's parse_turn gives."""
    text, protocol = SERVED_TURNS[turn], ProtocolConfig()
    read_calls = partial(parse_turn, call_format=protocol.format, tools=[CALC_TOOL])
    splitter, choice = TurnSplitter(read_calls, CALL_FORMATS.get(protocol.format).markup), Choice(0)
    pieces = splitter.feed(text)
    tail, calls = splitter.finish()
    for piece in [*pieces, *tail]:
        choice.add(ChoiceDelta(0, **{piece.channel.value: piece.text}))
    choice.add(ChoiceDelta(0, tool_calls=calls, finish_reason="tool_calls" if calls else "stop"))
    completion = ChatCompletion.model_validate(ResponseHeader("chatcmpl-0", 0, "m").completion([choice], 1))
    executor = ToolExecutor(build_tools(["calculate_math"]), timeout_s=2.0, max_output_chars=256)
    task = Task("t", [{"role": "user", "content": "6 * 7?"}], [CALC_TOOL], ["42"])
    limits, sampling = AgentLimits(1, 64, 4096, 4), SamplingParams(max_new_tokens=64)
    [traj] = run_chat_agent(ServedResponses(completion), "m", executor, [task], 1, limits, sampling, protocol, 1)
    served, trained = traj.turns[0].parsed, read_calls(text)
    assert (served.kind, served.content) == (trained.kind, trained.content)
    assert [(c.name, c.arguments) for c in served.tool_calls] == [(c.name, c.arguments) for c in trained.tool_calls]


# -- the command line -------------------------------------------------------------------------------------------


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "minirl.eval", *args], capture_output=True, text=True, timeout=300, cwd=cwd
    )


def test_cli_end_to_end(greedy, tool_model_dir, tasks_file, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(
        f"model.name_or_path={tool_model_dir}", "data=jsonl", f"data.path={tasks_file}",
        f"data.heldout_path={tasks_file}", "eval.max_tasks=2", "logger=none", f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"wrote {run_dir / 'eval.json'}" in proc.stdout and "pass_at_n" in proc.stdout
    report = EvalReport.load(run_dir / "eval.json")
    assert report.run.tasks == 2 and report.run.samples == 1
    assert outcomes(report) == [[True], [True]]
    assert report.tasks[0].samples[0] == greedy[0].tasks[0].samples[0]


def test_compare_prints_both_reports_and_the_difference(greedy, sampled, tmp_path):
    (a, path_a), (b, path_b) = greedy, sampled
    proc = run_cli("--compare", str(path_a), str(path_b), "--markdown", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"| key | {path_a} | {path_b} | B - A |"
    cells = [[cell.strip() for cell in line.split("|")[1:-1]] for line in lines[2:]]
    rows = {key: values for key, *values in cells}
    delta = b.metrics["success_rate"] - a.metrics["success_rate"]
    assert rows["success_rate"] == ["0.667", f"{b.metrics['success_rate']:.3f}", f"{delta:+.3f}"]
    assert rows["run/temperature"] == ["0.000", "1.000", "+1.000"] and rows["run/backend"] == ["local", "local", ""]
    paired = {"paired/tasks", "paired/tasks_solved_more_often", "paired/sign_test_p"}
    assert set(rows) == set(a.values()) | set(b.values()) | paired
    a_rates, b_rates = ([fmean(s) for s in outcomes(report)] for report in (a, b))
    a_better = sum(x > y for x, y in zip(a_rates, b_rates))
    b_better = sum(y > x for x, y in zip(a_rates, b_rates))
    assert rows["paired/tasks"] == ["3", "3", ""]
    assert rows["paired/tasks_solved_more_often"] == [str(a_better), str(b_better), f"{b_better - a_better:+d}"]
    assert rows["paired/sign_test_p"] == ["", "", f"{sign_test_p(a_better, b_better):.3f}"]
    assert "tool/calculate_math/calls" in rows and "rollout/finish_invalid" in rows
    table = run_cli("--compare", str(path_a), str(path_b), cwd=tmp_path)
    assert table.returncode == 0 and "B - A" in table.stdout and "pass_at_n" in table.stdout


@pytest.mark.fast
@pytest.mark.parametrize(
    ("wins", "losses", "p"),
    [(0, 0, 1.0), (5, 5, 1.0), (0, 6, 2 / 64), (9, 2, 2 * (1 + 11 + 55) / 2048), (2, 9, 2 * (1 + 11 + 55) / 2048)],
)
def test_sign_test_p_is_the_two_sided_binomial_tail(wins, losses, p):
    assert sign_test_p(wins, losses) == pytest.approx(p)


def test_paired_rows_pair_tasks_by_id_and_prompt_only(greedy):
    report = greedy[0]
    flipped = [
        dataclasses.replace(task, samples=[dataclasses.replace(s, success=not s.success) for s in task.samples])
        for task in report.tasks
    ]
    other = dataclasses.replace(report, tasks=[*flipped[:2], dataclasses.replace(flipped[2], prompt="another")])
    rows = {key: values for key, *values in paired_rows(report, other)}
    solved_first_two = sum(task.samples[0].success for task in report.tasks[:2])
    assert rows["paired/tasks"] == ["2", "2", ""]  # the third task's prompt differs: not the same task
    assert rows["paired/tasks_solved_more_often"][:2] == [str(solved_first_two), str(2 - solved_first_two)]
    assert paired_rows(report, dataclasses.replace(report, tasks=[])) == []


@pytest.mark.parametrize("content", [None, "[1, 2]"])
def test_compare_rejects_a_missing_or_malformed_file_with_one_line(greedy, tmp_path, content):
    other = tmp_path / "other.json"
    if content is not None:
        other.write_text(content)
    proc = run_cli("--compare", str(greedy[1]), str(other), cwd=tmp_path)
    assert proc.returncode == 2 and not proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(other) in lines[0], lines


# -- the round trip through the server ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [(), ("rollout.max_new_tokens=8",), ("rollout.max_turns=1",), ("rollout.max_total_tokens=300",)],
    ids=["greedy", "turn_tokens", "max_turns", "token_budget"],
)
def test_openai_backend_through_the_server_matches_the_local_backend(
    openai_server, tool_model_dir, tasks_file, tmp_path_factory, overrides
):
    """The same checkpoint, greedy, the same seed: in process and through `python -m minirl.serve`, every sample
    ends the same way, with the same calls and final answer, whichever budget ends it first: a turn cut by
    max_new_tokens, a call on the last turn, the conversation's token budget. Without a budget in the way the
    rewards agree too (a cut turn's raw text, which some reward terms read, is not returned verbatim)."""
    local, _ = run_eval(tmp_path_factory, tool_model_dir, tasks_file, "eval.samples=2", *overrides)
    remote, _ = run_eval(
        tmp_path_factory, tool_model_dir, tasks_file, "eval.samples=2", *overrides,
        "eval.backend=openai", f"eval.base_url={openai_server.base_url}", "eval.concurrency=4",
    )  # fmt: skip
    assert (remote.run.backend, remote.run.model) == ("openai", openai_server.model_id)  # the endpoint's first model
    for here, there in zip(local.tasks, remote.tasks, strict=True):
        for mine, theirs in zip(here.samples, there.samples, strict=True):
            assert (theirs.success, theirs.finish_reason, theirs.final_answer, theirs.turns) == (
                mine.success, mine.finish_reason, mine.final_answer, mine.turns,
            )  # fmt: skip
            assert theirs.tool_calls == mine.tool_calls and not theirs.error
    for key in ("success_rate", "pass_at_n", "tools/call_ok_frac", "rollout/turns", "rollout/finish_answer"):
        assert remote.metrics[key] == local.metrics[key], key
    if overrides:  # the budget ends the tool-calling conversation, in both
        ended = {"rollout.max_new_tokens=8": "turn_tokens", "rollout.max_turns=1": "max_turns"}
        assert local.tasks[0].samples[0].finish_reason == ended.get(overrides[0], "token_budget")
    else:
        assert outcomes(remote) == [[True, True], [True, True], [False, False]]
        assert [s.reward for t in remote.tasks for s in t.samples] == [s.reward for t in local.tasks for s in t.samples]
