"""The next-prompt builder (minirl/protocol/chat.py) on every third-party chat template in the fixtures, each
under a tokenizer that has the template's special tokens as single tokens (support.template_tokenizer), with
Qwen3's and Qwen3.5's thinking on and off (model.chat_template_kwargs).

Per template: which construction it needs (prefix or delta), three tool turns built token-in/token-out (the
model's turns are what the template itself renders for them), the same three turns through the real agent loop
with real tools where minirl reads the template's call format, and the calls the template renders read back.
Without the fixtures (a user's clone) every test here skips, saying so.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
from support import CALC_TOOL, ScriptedEngine, template_tokenizer

from minirl.config import CallPolicy, ProtocolConfig
from minirl.data.task import Task
from minirl.protocol import chat
from minirl.protocol.chat import Construction, TemplateError, next_prompt, render, turn_deltas
from minirl.protocol.parsing import TurnKind, parse_turn
from minirl.rollout.agent_loop import AgentLimits, run_agent
from minirl.rollout.engine import SamplingParams
from minirl.rollout.trajectory import TrajectoryEnd
from minirl.tools import ToolExecutor, build_tools

THINK_ON, THINK_OFF = {"enable_thinking": True}, {"enable_thinking": False}
# (fixture, chat_template_kwargs, the construction it needs, the call format minirl reads it with or None)
CASES = {
    "qwen2_5": ("qwen2_5.jinja", {}, Construction.PREFIX, "hermes"),
    "qwen3-think": ("qwen3.jinja", THINK_ON, Construction.DELTA, "hermes"),
    "qwen3-no-think": ("qwen3.jinja", THINK_OFF, Construction.DELTA, "hermes"),
    "qwen3_instruct_2507": ("qwen3_instruct_2507.jinja", {}, Construction.PREFIX, "hermes"),
    "qwen3_5-think": ("qwen3_5_think.jinja", THINK_ON, Construction.DELTA, "qwen3_coder"),
    "qwen3_5-no-think": ("qwen3_5_think.jinja", THINK_OFF, Construction.PREFIX, "qwen3_coder"),
    "qwen3_coder": ("qwen3_coder.jinja", {}, Construction.PREFIX, "qwen3_coder"),
    "llama3_1": ("llama3_1.jinja", {}, Construction.PREFIX, None),
    "llama3_2": ("llama3_2.jinja", {}, Construction.PREFIX, None),
    "deepseekv3": ("deepseekv3.jinja", {}, Construction.DELTA, None),
}
# DeepSeek-V3 renders a tool message by whether the assistant before it made calls, which the placeholder
# assistant does not: the delta check refuses its second tool round (a placeholder with the turn's own calls
# would fit it, and gpt-oss)
REFUSED_AT_ROUND_TWO = "deepseekv3"
NO_FORMAT = "minirl has no reader for this template's call format yet (Llama 3 JSON, DeepSeek-V3)"


def call(expression: str, as_text: bool) -> dict:
    arguments = {"expression": expression}
    arguments = json.dumps(arguments) if as_text else arguments
    return {"type": "function", "function": {"name": "calculate_math", "arguments": arguments}}


def conversation(thinking: bool, arguments_as_text: bool = False) -> list[dict]:
    """Three assistant turns: two calls (the first after reasoning when thinking is on), then the answer.
    `arguments_as_text`: the calls' arguments as JSON text, as DeepSeek-V3's template concatenates them."""
    reasoning = {"reasoning_content": "Multiply first."} if thinking else {}
    return [
        {"role": "system", "content": "You are a helpful assistant with tools."},
        {"role": "user", "content": "What is 256 * 37, and that plus 8?"},
        {"role": "assistant", "content": "", **reasoning, "tool_calls": [call("256 * 37", arguments_as_text)]},
        {"role": "tool", "name": "calculate_math", "content": '{"result": "9472"}'},
        {"role": "assistant", "content": "", "tool_calls": [call("9472 + 8", arguments_as_text)]},
        {"role": "tool", "name": "calculate_math", "content": '{"result": "9480"}'},
        {"role": "assistant", "content": "256 * 37 = 9472, and 9472 + 8 = 9480."},
    ]


@pytest.fixture(params=list(CASES))
def case(request):
    """The case's key, tokenizer (under the template and its kwargs), conversation, the construction it needs and
    its call format."""
    name, kwargs, construction, call_format = CASES[request.param]
    tokenizer = template_tokenizer(name)
    chat.set_template_kwargs(tokenizer, kwargs)
    messages = conversation(kwargs.get("enable_thinking", False), arguments_as_text=name.startswith("deepseek"))
    return SimpleNamespace(
        key=request.param, tokenizer=tokenizer, messages=messages, construction=construction, call_format=call_format
    )


def model_turns(tokenizer, messages: list[dict]) -> list[list[int]]:
    """The tokens a model trained on the template writes for each assistant turn: the text the template renders
    after the generation prompt (after what the two share, for DeepSeek-V3's, which opens a <think> block that its
    assistant turns do not render), up to its end-of-turn token, encoded on its own, then that token. (Encoded as
    text, not cut from the token render: after Qwen3.5's "<think>\n" prompt the render merges "\n\n", which a
    model sampling after the prompt's "\n" cannot.)"""
    kwargs = chat.template_kwargs(tokenizer)
    eos = tokenizer.eos_token
    turns = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = tokenizer.apply_chat_template(
            messages[:i], tools=[CALC_TOOL], tokenize=False, add_generation_prompt=True, **kwargs
        )
        full = tokenizer.apply_chat_template(messages[: i + 1], tools=[CALC_TOOL], tokenize=False, **kwargs)
        text = full[len(os.path.commonprefix([prompt, full])) :].split(eos)[0]
        turns.append([*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id])
    return turns


def test_each_template_gets_the_construction_it_needs(case):
    assert chat.construction_of(case.tokenizer) is case.construction


def test_three_tool_turns_keep_every_sampled_token_and_end_as_the_template_renders(case):
    """P_next = P + C + E[overlap:] + O over the three turns; each later prompt continues the earlier one token
    for token, and what the framework appended (E + O) is exactly what the template renders after that turn in
    the real conversation: the full render's tail. A prefix template's whole prompt is its full render."""
    if case.key == REFUSED_AT_ROUND_TWO:
        with pytest.raises(TemplateError, match="not what the template renders after this assistant turn"):
            build_three_turns(case.tokenizer, case.messages, case.construction)
        return
    build_three_turns(case.tokenizer, case.messages, case.construction)


def build_three_turns(tokenizer, messages: list[dict], construction: Construction) -> None:
    tools = [CALC_TOOL]
    turns = model_turns(tokenizer, messages)
    prompt = render(tokenizer, messages[:2], tools, add_generation_prompt=True)
    history = messages[:2]
    for completion, position in zip(turns[:2], (2, 4)):
        observations = [messages[position + 1]]
        deltas = turn_deltas(tokenizer, history, tools, observations)
        following, added = next_prompt(prompt, completion, deltas)
        assert following[: len(prompt) + len(completion)] == [*prompt, *completion]
        history = [*history, messages[position], *observations]
        full = render(tokenizer, history, tools, add_generation_prompt=True)
        assert full[len(full) - len(added) :] == added
        assert json.loads(observations[0]["content"])["result"] in tokenizer.decode(added)
        if construction is Construction.PREFIX:
            assert following == full
        prompt = following


def test_three_tool_turns_through_the_agent_loop_with_real_tools(case):
    """The agent loop on the template: two calls run by the real tool, then the answer; sampled tokens have
    mask 1, the framework's closing and observation tokens mask 0, and the observations hold the results."""
    tokenizer, messages, call_format = case.tokenizer, case.messages, case.call_format
    if call_format is None:
        pytest.skip(NO_FORMAT)
    eos = tokenizer.eos_token_id
    script = [
        tokenizer.decode(t[:-1] if t[-1] == eos else t, skip_special_tokens=False)
        for t in model_turns(tokenizer, messages)
    ]
    engine = ScriptedEngine(tokenizer, script)
    task = Task(id="template", messages=messages[:2], tools=[CALC_TOOL], gt=["9480"])
    executor = ToolExecutor(build_tools(["calculate_math"]), timeout_s=2.0, max_output_chars=256)
    protocol = ProtocolConfig(format=call_format, call_policy=CallPolicy.multi)
    limits = AgentLimits(max_turns=3, max_new_tokens=256, max_total_tokens=4096, max_tool_calls=8)
    [traj] = run_agent(engine, tokenizer, executor, [task], 1, limits, SamplingParams(max_new_tokens=256), protocol)
    assert traj.finish_reason is TrajectoryEnd.ANSWER and len(traj.turns) == 3
    assert [r.status for turn in traj.turns for r in turn.tool_results] == ["ok", "ok"]
    sampled = [tok for tok, m in zip(traj.response_ids, traj.action_mask) if m]
    assert sampled == [tok for ids in engine_turns(engine) for tok in ids]
    observed = tokenizer.decode([tok for tok, m in zip(traj.response_ids, traj.action_mask) if not m])
    assert "9472" in observed and "9480" in observed
    assert "9480" in traj.final_text


def engine_turns(engine: ScriptedEngine) -> list[list[int]]:
    """The tokens the scripted engine returned per turn (its text, then its end-of-turn token)."""
    return [
        [*engine.tokenizer.encode(text, add_special_tokens=False), engine.tokenizer.eos_token_id]
        for text in engine.script
    ]


def test_the_calls_the_template_renders_read_back(case):
    tokenizer, messages, call_format = case.tokenizer, case.messages, case.call_format
    if call_format is None:
        pytest.skip(NO_FORMAT)
    eos = tokenizer.eos_token_id
    for tokens, message in zip(model_turns(tokenizer, messages), [m for m in messages if m["role"] == "assistant"]):
        text = tokenizer.decode(tokens[:-1] if tokens[-1] == eos else tokens, skip_special_tokens=False)
        parsed = parse_turn(text, call_format, tools=[CALC_TOOL])
        expected = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
        assert [(c.name, c.arguments) for c in parsed.tool_calls] == expected
        assert parsed.kind is (TurnKind.TOOL if expected else TurnKind.ANSWER)


def test_gpt_oss_is_refused_loudly():
    """harmony renders a tool message only after an assistant message with a tool call, which neither
    construction's placeholder has: a TemplateError, never a misaligned prompt."""
    tokenizer = template_tokenizer("gptoss.jinja")
    with pytest.raises(TemplateError):
        chat.construction_of(tokenizer)
