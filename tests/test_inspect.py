"""Trajectory inspection on real trajectories: the memorised tool model sampled by the HF engine with the
real tools, scored by the default reward, written to trajectories.jsonl, read back, and shown as a table,
in the console, by `python -m minirl.inspect` and as the HTML report."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from itertools import groupby

import pytest
import torch
from hydra import compose, initialize_config_dir
from rich.console import Console
from support import CALC_TOOL, CONVERSATION, GREETING

from minirl.algos.advantages import ADV_ESTIMATORS
from minirl.config import register_configs, to_config
from minirl.data.task import Task
from minirl.entry import CONF_DIR
from minirl.inspection import (
    METRICS_FILE,
    TRAJECTORIES_FILE,
    RunFileError,
    read_trajectories,
    render_report,
    token_view,
    trajectory_panel,
    trajectory_record,
    trajectory_table,
    write_trajectories,
)
from minirl.inspection.plots import Series, line_plot, nice_ticks
from minirl.inspection.record import outcome_fields
from minirl.inspection.terminal import LOSS_STYLE, MASKED_STYLE
from minirl.models.loading import load_model, load_tokenizer
from minirl.rewards import SUCCESS_CRITERIA, score_all
from minirl.rollout.agent_loop import AgentLimits, run_agent
from minirl.rollout.engine import ENGINES, Completion, SamplingParams
from minirl.tools import ToolExecutor, build_tools
from minirl.tracking import Tracker

HOSTILE_ANSWER = '<script>alert("pwned")</script> & [bold red]not markup[/]'
GROUP_SIZE = 2


class FixedAnswer:
    """An engine that answers every prompt with one text: model text is hostile input to every viewer."""

    def __init__(self, tokenizer, text: str) -> None:
        self.ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        self.end_ids = frozenset({tokenizer.eos_token_id})

    def generate(self, prompts, params):
        return [Completion(list(self.ids), [-0.5] * len(self.ids), True) for _ in prompts]


@pytest.fixture(scope="module")
def cfg():
    """The default config, composed as `python -m minirl.train logger=none` composes it."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return to_config(compose("config", overrides=["logger=none"]))


@pytest.fixture(scope="module")
def rollout(tool_model_dir, cfg):
    """(tokenizer, trajectories, advantages): the calculator and greeting tasks greedily, GROUP_SIZE each,
    then one group answered with HOSTILE_ANSWER; scored and given advantages as the trainer does."""
    tokenizer = load_tokenizer(str(tool_model_dir), cfg)
    model = load_model(str(tool_model_dir), cfg, torch.device("cpu"), trainable=False)
    engine = ENGINES.get("hf")(model, tokenizer, torch.device("cpu"))
    executor = ToolExecutor(build_tools(cfg.tools.names, cfg.tools), cfg.tools.timeout_s, cfg.tools.max_output_chars)
    r = cfg.rollout
    limits = AgentLimits(r.max_turns, r.max_new_tokens, r.max_total_tokens, r.max_tool_calls)
    greedy = SamplingParams(r.max_new_tokens, temperature=0.0)
    tasks = [
        Task("calc", CONVERSATION[:2], [CALC_TOOL], ["9472", "42"], CONVERSATION[2:], kind="double"),
        Task("hello", GREETING[:2], [], [], GREETING[2:], kind="no_tool"),
    ]
    trajs = run_agent(engine, tokenizer, executor, tasks, GROUP_SIZE, limits, greedy, cfg.protocol)
    follow_up = [*CONVERSATION[:5], {"role": "user", "content": "<b>hi</b>"}]  # the prompt holds earlier calls
    hostile = Task("<img src=x onerror=alert(1)>", follow_up, [CALC_TOOL], ["<i>"])
    hostile_trajs = run_agent(
        FixedAnswer(tokenizer, HOSTILE_ANSWER), tokenizer, executor, [hostile], GROUP_SIZE, limits, greedy, cfg.protocol
    )
    for traj in hostile_trajs:
        traj.group_index = len(tasks)
    trajs += hostile_trajs
    score_all(trajs, cfg.reward)
    rewards = torch.tensor([t.reward for t in trajs])
    advantages = ADV_ESTIMATORS.get(cfg.algo.adv_estimator)(rewards, GROUP_SIZE, cfg.algo.adv_eps)
    return tokenizer, trajs, advantages.tolist()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, rollout, cfg):
    """A run directory as the trainer leaves it: metrics.jsonl by the Tracker, trajectories at steps 10 and 20."""
    tokenizer, trajs, advantages = rollout
    path = tmp_path_factory.mktemp("run")
    tracker = Tracker(cfg, path, Console(quiet=True))
    for step in range(0, 21):
        tracker.log(step, {"reward/mean": -1 + step * 0.1, "rollout/success_rate": step / 40, "time/step_s": 2.0})
        if step % 10 == 0:
            tracker.log(step, {"eval/success_rate": 0.3 + step / 100, "eval/success_rate/double": step / 50})
        if step in (10, 20):  # what the trainer logs after step 0's evaluation
            tracker.log(step, {"eval/tasks_gained": step / 2, "eval/tasks_lost": 1.0, "eval/sign_test_p": 0.039})
    tracker.close()
    solved = SUCCESS_CRITERIA.get(cfg.reward.success)
    for step in (10, 20):
        write_trajectories(path / TRAJECTORIES_FILE, step, trajs, advantages, tokenizer, solved=solved)
    return path


def inspect(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "120"}
    return subprocess.run(
        [sys.executable, "-m", "minirl.inspect", *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_the_memorised_calculator_conversation_calls_two_tools_then_answers(rollout):
    _, trajs, _ = rollout
    calc = trajs[0]
    assert [t.parsed.kind.value for t in calc.turns] == ["tool", "answer"]
    assert [r.status for r in calc.turns[0].tool_results] == ["ok", "ok"]
    assert calc.reward > 0 and calc.final_text == "256 * 37 = 9472 and 12 + 30 = 42."


def test_records_hold_the_conversation_reward_and_loss_mask(rollout, run_dir):
    tokenizer, trajs, advantages = rollout
    records = list(read_trajectories(run_dir / TRAJECTORIES_FILE))
    assert [r["step"] for r in records] == [10] * len(trajs) + [20] * len(trajs)
    for record, traj, advantage in zip(records, trajs, advantages):
        assert json.loads(json.dumps(record)) == record
        runs = record["response"]
        # the runs are the response exactly, split where the mask changes value
        assert "".join(text for text, _ in runs) == tokenizer.decode(traj.response_ids, skip_special_tokens=False)
        assert [mask for _, mask in runs] == [value for value, _ in groupby(traj.action_mask)]
        assert all(a[1] != b[1] for a, b in zip(runs, runs[1:]))
        loss_text = "".join(text for text, mask in runs if mask)
        assert all(turn.text in loss_text for turn in traj.turns)
        tokens = record["tokens"]
        assert tokens["prompt"] == len(traj.prompt_ids)
        assert tokens["sampled"] == sum(traj.action_mask)
        assert tokens["sampled"] + tokens["observation"] == tokens["response"] == len(traj.response_ids)
        assert record["reward"] == traj.reward and record["reward_terms"] == traj.reward_terms
        assert set(record["reward_terms"]) >= {"gt_hit", "tool_alignment", "boxed_answer"}  # weight 0 included
        assert record["advantage"] == advantage
        assert record["finish_reason"] == traj.finish_reason.value
        assert record["task"] == {"id": traj.task.id, "kind": traj.task.kind, "gt": traj.task.gt}
        prompt = record["messages"][: len(traj.task.messages)]
        assert [(m["role"], m["content"]) for m in prompt] == [(m["role"], m["content"]) for m in traj.task.messages]
    calc = records[0]
    assert calc["success"] is True and records[-1]["success"] is False
    turn, *results, answer = calc["messages"][2:]
    assert turn["kind"] == "tool" and answer["kind"] == "answer"
    assert [c["arguments"] for c in turn["tool_calls"]] == [{"expression": "256 * 37"}, {"expression": "12 + 30"}]
    assert [(m["tool_call_id"], m["status"]) for m in results] == [("call_0_0", "ok"), ("call_0_1", "ok")]
    assert records[-1]["messages"][2]["tool_calls"][1] == turn["tool_calls"][1] | {"id": "call_1"}
    observation = "".join(text for text, mask in calc["response"] if not mask)
    assert '"9472"' in results[0]["content"] and results[0]["content"] in observation
    assert "<tool_response>" in observation and "<tool_call>" not in observation


def test_a_replayed_reference_answer_is_labelled_as_the_tasks_in_its_record(rollout):
    tokenizer, trajs, advantages = rollout
    sampled = trajectory_record(trajs[0], 1, advantages[0], tokenizer)
    replayed = trajectory_record(dataclasses.replace(trajs[0], off_policy=True), 1, advantages[0], tokenizer)
    assert sampled["off_policy"] is False and replayed["off_policy"] is True
    assert dict(outcome_fields(sampled))["from"] == "the policy"
    assert dict(outcome_fields(replayed))["from"] == "the task's reference answer (algo.guide)"


def test_limit_keeps_the_first_trajectories(rollout, tmp_path):
    tokenizer, trajs, advantages = rollout
    written = write_trajectories(tmp_path / TRAJECTORIES_FILE, 1, trajs, advantages, tokenizer, limit=3)
    assert list(read_trajectories(tmp_path / TRAJECTORIES_FILE)) == written
    assert [r["group"] for r in written] == [0, 0, 1]
    with pytest.raises(ValueError, match="one per trajectory"):
        write_trajectories(tmp_path / TRAJECTORIES_FILE, 1, trajs, advantages[:-1], tokenizer)


def test_a_partial_last_line_is_skipped_and_cut_before_the_next_write(rollout, tmp_path):
    tokenizer, trajs, advantages = rollout
    path = tmp_path / TRAJECTORIES_FILE
    write_trajectories(path, 1, trajs[:2], advantages[:2], tokenizer)
    complete = path.read_bytes()
    path.write_bytes(complete + complete.splitlines(keepends=True)[0][:-40])  # a crash mid-write
    assert [r["step"] for r in read_trajectories(path)] == [1, 1]
    write_trajectories(path, 2, trajs[:1], advantages[:1], tokenizer)  # e.g. a resumed run
    assert [r["step"] for r in read_trajectories(path)] == [1, 1, 2]
    path.write_bytes(complete + b"{not json\n" + complete)
    with pytest.raises(RunFileError, match=rf"{TRAJECTORIES_FILE}:3: not JSON"):
        list(read_trajectories(path))


def test_table_rows_are_plain_values_wandb_takes(run_dir):
    import wandb

    records = list(read_trajectories(run_dir / TRAJECTORIES_FILE))
    columns, rows = trajectory_table(records)
    assert wandb.Table(columns=columns, data=rows).columns == columns
    assert columns[:3] == ["step", "group", "task"] and len(rows) == len(records)
    assert all(len(row) == len(columns) for row in rows)
    assert all(v is None or isinstance(v, (str, int, float, bool)) for row in rows for v in row)
    calc = dict(zip(columns, rows[0]))
    assert calc["turns"] == 2 and calc["success"] is True and calc["finish_reason"] == "answer"
    assert 'calculate_math({"expression": "256 * 37"}) [call_0_0]' in calc["conversation"]
    assert "[tool calculate_math: ok]" in calc["conversation"]


def test_console_panel_highlights_exactly_the_loss_carrying_text(run_dir):
    records = list(read_trajectories(run_dir / TRAJECTORIES_FILE))
    calc, hostile = records[0], records[-1]
    view = token_view(calc)
    styles = {LOSS_STYLE: 1, MASKED_STYLE: 0}
    assert [[view.plain[s.start : s.end], styles[s.style]] for s in view.spans] == calc["response"]
    console = Console(record=True, width=120, force_terminal=True, color_system="truecolor")
    console.print(trajectory_panel(calc), trajectory_panel(hostile))
    shown = console.export_text()
    for needed in ("step 10 · group 0 · task calc (double)", "assistant (tool)", "tool calculate_math: ok",
                   "-> calculate_math", "end answer", "gt_hit +1.00", "loss: sampled by the policy"):  # fmt: skip
        assert needed in shown
    assert "[bold red]not markup[/]" in shown  # model text is never read as markup


def test_cli_prints_the_latest_step(run_dir):
    done = inspect(str(run_dir), "--limit", "3")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("step 20 · group") == 3 and "step 10" not in done.stdout
    assert "calculate_math" in done.stdout and "loss: sampled by the policy (mask 1)" in done.stdout
    done = inspect(str(run_dir), "--step", "10", "--limit", "1")
    assert done.returncode == 0 and done.stdout.count("step 10 · group") == 1


def test_cli_writes_the_html_report(run_dir, tmp_path):
    done = inspect(str(run_dir), "--html")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(run_dir / "report.html")
    page = (run_dir / "report.html").read_text()
    assert page.count("<svg") == 2 and "eval/success_rate" in page and "rollout/success_rate" in page
    assert "30.0% at step 0 -&gt; 50.0% at step 20 (+20.0 points)" in page
    assert "10 gained, 1 lost at step 20 (sign test p 0.039)" in page
    # per-step metrics: the means of the first and the last fifth of the 21 logged steps
    assert "-0.850 over steps 0-3 -&gt; +0.850 over steps 17-20" in page
    assert page.count('<section class="traj">') == 6  # every trajectory of step 20, under the limit
    assert '<span class="loss">' in page and '<span class="masked">' in page
    out = tmp_path / "elsewhere.html"
    done = inspect(str(run_dir), "--html", str(out), "--step", "10", "--limit", "2")
    assert done.stdout.strip() == str(out) and out.read_text().count('<section class="traj">') == 2


def test_html_escapes_model_text(run_dir):
    records = list(read_trajectories(run_dir / TRAJECTORIES_FILE))
    page = render_report("<run>", [], records, records[-GROUP_SIZE:])
    assert "<script" not in page and "<img" not in page and "<b>hi" not in page and "<run>" not in page
    assert "&lt;script&gt;alert(&quot;pwned&quot;)&lt;/script&gt; &amp;" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert page.count("<svg") == 2 and "no data" in page


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{missing}"], "no run directory at"),
        (["{empty}"], f"has no {TRAJECTORIES_FILE}"),
        (["{empty}", "--html"], f"{METRICS_FILE} does not exist"),
        (["{run}", "--step", "7"], "no trajectories at step 7; recorded steps: 10, 20"),
        (["{run}", "--html", "{unwritable}"], "cannot write the report to"),
    ],
    ids=["missing", "no_trajectories", "no_metrics", "unrecorded_step", "unwritable_report"],
)
def test_cli_errors_are_one_line_and_exit_2(run_dir, tmp_path, args, message):
    (tmp_path / "a_file").write_text("")
    dirs = {
        "missing": tmp_path / "nope",
        "empty": tmp_path,
        "run": run_dir,
        "unwritable": tmp_path / "a_file" / "r.html",
    }
    done = inspect(*(a.format(**dirs) for a in args))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and message in done.stderr


@pytest.mark.fast
def test_plots_are_well_formed_svg_with_round_ticks():
    assert nice_ticks(0, 60, integer=True) == [0, 10, 20, 30, 40, 50, 60]
    assert nice_ticks(0, 3, integer=True) == [0, 1, 2, 3]
    assert nice_ticks(-0.23, 0.91) == [-0.4, -0.2, 0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(10, 10, integer=True) == [9, 10, 11]
    svg = line_plot([Series("a & <b>", [(0, 0.1), (5, 0.4)]), Series("empty", [])], "T", "step", "y", percent=True)
    root = ET.fromstring(svg)
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "a & <b>" in texts and "empty" not in texts and "40%" in texts
