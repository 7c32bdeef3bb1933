"""The multi-turn agent loop with the real tokenizer, real tools and a scripted engine, and the
HF engine's log-probs against the trainer's."""

from __future__ import annotations

import json

import pytest
import torch

from minirl.data.synthetic_tools import train_heldout_split
from minirl.protocol.chat import render
from minirl.rollout.agent_loop import AgentLimits, run_agent
from minirl.rollout.engine import Completion, SamplingParams
from minirl.rollout.trajectory import FinishReason
from minirl.tools import ToolExecutor, build_tools
from minirl.tools.minimind import MINIMIND_TOOL_NAMES

SAMPLING = SamplingParams(max_new_tokens=64)


class ScriptedEngine:
    """Answers turn k of every prompt with script[k]; log-probs are distinct per token so that
    misalignment shows. `stop=False` drops the end-of-turn token, as some samplers do."""

    def __init__(self, tokenizer, script: list[str], stop: bool = True) -> None:
        self.tokenizer, self.script, self.stop = tokenizer, script, stop
        self.calls = 0
        self.prompts: list[list[list[int]]] = []

    def generate(self, prompts, params):
        self.prompts.append([list(p) for p in prompts])
        text = self.script[self.calls]
        self.calls += 1
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if self.stop:
            ids = ids + [self.tokenizer.eos_token_id]
        out = []
        for row in range(len(prompts)):
            ids = ids[: params.max_new_tokens]
            logprobs = [-(row + 1) * 0.001 - i * 0.01 for i in range(len(ids))]
            out.append(Completion(list(ids), logprobs, stopped=self.stop and len(ids) <= params.max_new_tokens))
        return out

    def sync_weights(self, model) -> None:
        pass


def weather_call(city: str) -> str:
    return f"<tool_call>\n{json.dumps({'name': 'get_current_weather', 'arguments': {'city': city}})}\n</tool_call>"


@pytest.fixture
def tasks():
    _, heldout = train_heldout_split(50, 12, seed=3)
    return heldout[:3]


@pytest.fixture
def executor():
    return ToolExecutor(build_tools(MINIMIND_TOOL_NAMES), timeout_s=2.0, max_output_chars=512)


def run(tokenizer, executor, tasks, script, group_size=2, max_turns=3, stop=True, max_total=1024):
    engine = ScriptedEngine(tokenizer, script, stop=stop)
    limits = AgentLimits(max_turns=max_turns, max_new_tokens=64, max_total_tokens=max_total, max_calls_per_turn=4)
    return run_agent(engine, tokenizer, executor, tasks, group_size, limits, SAMPLING), engine


def test_three_turns_keep_sampled_tokens_mask_and_logprobs(tokenizer, executor, tasks):
    script = [weather_call("Paris"), weather_call("Tokyo"), "It is sunny."]
    trajs, engine = run(tokenizer, executor, tasks, script)
    assert engine.calls == 3
    for t in trajs:
        assert t.finish_reason is FinishReason.ANSWER and len(t.turns) == 3
        assert len(t.response_ids) == len(t.action_mask) == len(t.sampler_logprobs)
        full = t.prompt_ids + t.response_ids
        # each turn's prompt was exactly the conversation so far: token in, token out
        for k in range(3):
            prompt = next(p for p in engine.prompts[k] if p[: len(t.prompt_ids)] == t.prompt_ids)
            assert full[: len(prompt)] == prompt
        # masked-in tokens are exactly the sampled ones, with their own log-probs, in order
        sampled = [tok for tok, m in zip(t.response_ids, t.action_mask) if m]
        expected = []
        for text in script:
            expected += tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        assert sampled == expected
        row_logprobs = [lp for lp, m in zip(t.sampler_logprobs, t.action_mask) if m]
        assert all(lp < 0 for lp in row_logprobs)
        # observation tokens: mask 0, log-prob 0.0, and they hold the tool's real result
        observed = [tok for tok, m in zip(t.response_ids, t.action_mask) if not m]
        assert all(lp == 0.0 for lp, m in zip(t.sampler_logprobs, t.action_mask) if not m)
        text = tokenizer.decode(observed)
        results = [r for turn in t.turns[:2] for r in turn.tool_results]
        assert len(results) == 2 and text.count("<tool_response>") == 2
        assert all(r.content in text for r in results)


def test_groups_are_contiguous(tokenizer, executor, tasks):
    trajs, _ = run(tokenizer, executor, tasks, ["Paris."], group_size=4)
    assert [t.group_index for t in trajs] == [0] * 4 + [1] * 4 + [2] * 4
    assert all(t.task is tasks[t.group_index] for t in trajs)
    assert all(t.prompt_ids == render(tokenizer, t.task.messages, t.task.tools, True) for t in trajs)


def test_sampler_without_end_of_turn_token_ends_the_turn_by_token_limit(tokenizer, executor, tasks):
    trajs, _ = run(tokenizer, executor, tasks, ["no end token here"], stop=False)
    assert {t.finish_reason for t in trajs} == {FinishReason.TURN_TOKENS}


def test_tool_call_on_the_last_turn_is_unfinished(tokenizer, executor, tasks):
    trajs, engine = run(tokenizer, executor, tasks, [weather_call("Paris")] * 2, max_turns=2)
    assert engine.calls == 2
    assert {t.finish_reason for t in trajs} == {FinishReason.MAX_TURNS}
    assert all(len(t.turns) == 2 and t.turns[-1].tool_results for t in trajs)


def test_malformed_call_is_invalid_and_runs_no_tool(tokenizer, executor, tasks):
    trajs, engine = run(tokenizer, executor, tasks, ["<tool_call>\n{broken\n</tool_call>"])
    assert engine.calls == 1
    assert {t.finish_reason for t in trajs} == {FinishReason.INVALID}
    assert all(not t.turns[0].tool_results for t in trajs)


def test_token_budget_ends_the_trajectory(tokenizer, executor, tasks):
    prompt = len(render(tokenizer, tasks[0].messages, tasks[0].tools, True))
    trajs, _ = run(tokenizer, executor, tasks[:1], [weather_call("Paris")] * 3, max_total=prompt + 5)
    assert {t.finish_reason for t in trajs} == {FinishReason.TOKEN_BUDGET}
    assert all(len(t.response_ids) == 5 and sum(t.action_mask) == 5 for t in trajs)


def test_unknown_tool_becomes_an_error_observation_and_the_run_goes_on(tokenizer, executor, tasks):
    bad = '<tool_call>\n{"name": "launch_rockets", "arguments": {}}\n</tool_call>'
    trajs, _ = run(tokenizer, executor, tasks, [bad, "Sorry."])
    for t in trajs:
        assert t.finish_reason is FinishReason.ANSWER
        result = t.turns[0].tool_results[0]
        assert result.status == "unknown_tool" and "launch_rockets" in result.content


def test_hf_engine_logprobs_match_the_trainer(tiny_policy):
    """Sampler log-probs (HF generate scores) and the trainer's recomputation agree to ~1e-5."""
    from minirl.rollout.hf_engine import HFEngine
    from minirl.trainer import collate, token_logprobs

    model, tokenizer, tasks = tiny_policy
    engine = HFEngine(model, tokenizer, torch.device("cpu"))
    executor = ToolExecutor(build_tools(MINIMIND_TOOL_NAMES), timeout_s=2.0, max_output_chars=512)
    limits = AgentLimits(max_turns=2, max_new_tokens=24, max_total_tokens=1024, max_calls_per_turn=4)
    for temperature in (1.0, 0.7):
        torch.manual_seed(0)
        trajs = run_agent(engine, tokenizer, executor, tasks[:4], 2, limits, SamplingParams(24, temperature))
        batch = collate(trajs, torch.zeros(len(trajs)), tokenizer.pad_token_id)
        with torch.no_grad():
            logp = token_logprobs(model, batch, temperature)
        gap = ((logp - batch.old_logp).abs() * batch.mask).max().item()
        assert batch.mask.sum() > 0
        assert gap < 1e-4, gap
