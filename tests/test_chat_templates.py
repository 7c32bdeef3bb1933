"""The next-prompt builder (minirl/protocol/chat.py) on every third-party chat template in the fixtures, each
under a tokenizer that has the template's special tokens as single tokens (support.template_tokenizer), with
Qwen3's and Qwen3.5's thinking on and off (model.chat_template_kwargs).

Per template: which construction it needs (prefix, delta or calls) and for how many tool rounds in a row, the
tool turns of a conversation built token-in/token-out (two rounds and the answer; one round where the template
builds one), the model's turns being what the template itself renders for them, the same turns through the real
agent loop with the real calculator, read by the template's call format, and the calls the template renders read
back. Without the fixtures (a user's clone) every test here skips, saying so.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from support import CALC_TOOL, ScriptedEngine, template_tokenizer

from minirl.config import CallPolicy, ProtocolConfig
from minirl.data.task import Task
from minirl.errors import ConfigError
from minirl.protocol import chat
from minirl.protocol.chat import Construction, TemplateError, next_prompt, render, turn_deltas
from minirl.protocol.parsing import TurnKind, parse_turn
from minirl.rollout.agent_loop import AgentLimits, run_agent
from minirl.rollout.engine import SamplingParams
from minirl.rollout.trajectory import TrajectoryEnd
from minirl.tools import ToolExecutor, build_tools
from minirl.training.sft import tokenize_conversation

THINK_ON, THINK_OFF = {"enable_thinking": True}, {"enable_thinking": False}
OPENED_THINK = "<think>\n"
ROUNDS = 2  # the tool rounds of a case's conversation: three assistant turns
# (fixture, chat_template_kwargs, the construction it needs, the call format minirl reads it with, the tool
# rounds in a row it builds next prompts for: None for any number)
CASES = {
    "qwen2_5": ("qwen2_5.jinja", {}, Construction.PREFIX, "hermes", None),
    "qwen3-think": ("qwen3.jinja", THINK_ON, Construction.DELTA, "hermes", None),
    "qwen3-no-think": ("qwen3.jinja", THINK_OFF, Construction.DELTA, "hermes", None),
    "qwen3_instruct_2507": ("qwen3_instruct_2507.jinja", {}, Construction.PREFIX, "hermes", None),
    "qwen3_5-think": ("qwen3_5_think.jinja", THINK_ON, Construction.DELTA, "qwen3_coder", None),
    "qwen3_5-no-think": ("qwen3_5_think.jinja", THINK_OFF, Construction.PREFIX, "qwen3_coder", None),
    "qwen3_coder": ("qwen3_coder.jinja", {}, Construction.PREFIX, "qwen3_coder", None),
    "llama3_1": ("llama3_1.jinja", {}, Construction.PREFIX, "llama3_json", None),
    "llama3_2": ("llama3_2.jinja", {}, Construction.PREFIX, "llama3_json", None),
    # marks only its first tool output as the first (is_output_first is never reset) and renders a second call
    # round without the <｜tool▁outputs▁end｜> its prompt had: one round in a row; its conversation has one
    "deepseekv3": ("deepseekv3.jinja", {}, Construction.DELTA, "deepseek_v3", 1),
    # names a tool message after the call before it: the placeholder carries the turn's calls
    "gptoss": ("gptoss.jinja", {}, Construction.CALLS, "harmony", None),
}
# templates whose turns end at more tokens than eos: harmony ends a call message with <|call|>, the answer <|return|>
MORE_END_TOKENS = {"gptoss": ("<|call|>",)}


def call(expression: str, as_text: bool) -> dict:
    arguments = {"expression": expression}
    arguments = json.dumps(arguments) if as_text else arguments
    return {"type": "function", "function": {"name": "calculate_math", "arguments": arguments}}


def conversation(thinking: bool, arguments_as_text: bool = False, rounds: int = ROUNDS) -> list[dict]:
    """Tool rounds then the answer: with two rounds, two calls (the first after reasoning when thinking is on);
    with one, a single call. `arguments_as_text`: the calls' arguments as JSON text, as DeepSeek-V3's template
    concatenates them. Either way the answer is 9480."""
    reasoning = {"reasoning_content": "Multiply first."} if thinking else {}
    opening = [{"role": "system", "content": "You are a helpful assistant with tools."}]
    if rounds == 1:
        return [
            *opening,
            {"role": "user", "content": "What is 256 * 37 + 8?"},
            {"role": "assistant", "content": "", **reasoning, "tool_calls": [call("256 * 37 + 8", arguments_as_text)]},
            {"role": "tool", "name": "calculate_math", "content": '{"result": "9480"}'},
            {"role": "assistant", "content": "256 * 37 + 8 = 9480."},
        ]
    return [
        *opening,
        {"role": "user", "content": "What is 256 * 37, and that plus 8?"},
        {"role": "assistant", "content": "", **reasoning, "tool_calls": [call("256 * 37", arguments_as_text)]},
        {"role": "tool", "name": "calculate_math", "content": '{"result": "9472"}'},
        {"role": "assistant", "content": "", "tool_calls": [call("9472 + 8", arguments_as_text)]},
        {"role": "tool", "name": "calculate_math", "content": '{"result": "9480"}'},
        {"role": "assistant", "content": "256 * 37 = 9472, and 9472 + 8 = 9480."},
    ]


@pytest.fixture(params=list(CASES))
def case(request):
    """The case's key, tokenizer (under the template and its kwargs), conversation (of as many tool rounds as the
    template builds, up to ROUNDS), the construction it needs, its call format and tool rounds."""
    name, kwargs, construction, call_format, tool_rounds = CASES[request.param]
    tokenizer = template_tokenizer(name)
    chat.set_template_kwargs(tokenizer, kwargs)
    thinking, as_text = kwargs.get("enable_thinking", False), name.startswith("deepseek")
    messages = conversation(thinking, as_text, rounds=min(tool_rounds or ROUNDS, ROUNDS))
    return SimpleNamespace(
        key=request.param,
        ends=MORE_END_TOKENS.get(request.param, ()),
        name=name,
        tokenizer=tokenizer,
        messages=messages,
        construction=construction,
        call_format=call_format,
        tool_rounds=tool_rounds,
        thinking=thinking,
    )


def model_turns(tokenizer, messages: list[dict], more_ends: tuple[str, ...] = ()) -> list[list[int]]:
    """The tokens a model trained on the template writes for each assistant turn: the text the template renders
    after the generation prompt (less the <think> block DeepSeek-V3's opens, which its assistant turns do not
    render), up to its end-of-turn token, encoded on its own, then that token. (Encoded as
    text, not cut from the token render: after Qwen3.5's "<think>\n" prompt the render merges "\n\n", which a
    model sampling after the prompt's "\n" cannot.)"""
    kwargs = chat.template_kwargs(tokenizer)
    ends = [tokenizer.eos_token, *more_ends]
    turns = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = tokenizer.apply_chat_template(
            messages[:i], tools=[CALC_TOOL], tokenize=False, add_generation_prompt=True, **kwargs
        )
        full = tokenizer.apply_chat_template(messages[: i + 1], tools=[CALC_TOOL], tokenize=False, **kwargs)
        prompt = prompt if full.startswith(prompt) else prompt.removesuffix(OPENED_THINK)
        assert full.startswith(prompt)
        turn = full[len(prompt) :]
        end = min((turn.find(token), token) for token in ends if token in turn)[1]
        text = turn[: turn.find(end)]
        turns.append([*tokenizer.encode(text, add_special_tokens=False), tokenizer.convert_tokens_to_ids(end)])
    return turns


def test_each_template_gets_the_construction_it_needs(case):
    fit = chat.template_fit(case.tokenizer)
    assert (fit.construction, fit.tool_rounds) == (case.construction, case.tool_rounds)


def call_positions(messages: list[dict]) -> list[int]:
    return [i for i, m in enumerate(messages) if m["role"] == "assistant" and m.get("tool_calls")]


def test_tool_turns_keep_every_sampled_token_and_end_as_the_template_renders(case):
    """P_next = P + C + E[overlap:] + O over the tool rounds; each later prompt continues the earlier one token
    for token, and what the framework appended (E + O) is exactly what the template renders after that turn in
    the real conversation: the full render's tail. A prefix template's whole prompt is its full render."""
    tokenizer, messages, tools = case.tokenizer, case.messages, [CALC_TOOL]
    turns = model_turns(tokenizer, messages, case.ends)
    prompt = render(tokenizer, messages[:2], tools, add_generation_prompt=True)
    history = messages[:2]
    positions = call_positions(messages)
    assert len(positions) == min(case.tool_rounds or ROUNDS, ROUNDS)
    for completion, position in zip(turns, positions):
        observations = [messages[position + 1]]
        deltas = turn_deltas(tokenizer, history, tools, observations, messages[position]["tool_calls"])
        following, added = next_prompt(prompt, completion, deltas)
        assert following[: len(prompt) + len(completion)] == [*prompt, *completion]
        history = [*history, messages[position], *observations]
        full = render(tokenizer, history, tools, add_generation_prompt=True)
        assert full[len(full) - len(added) :] == added
        assert json.loads(observations[0]["content"])["result"] in tokenizer.decode(added)
        if case.construction is Construction.PREFIX:
            assert following == full
        prompt = following


def scripted_run(case, max_turns: int):
    """The agent loop on the case's template and conversation: the model's turns scripted, the calls run by the
    real calculator."""
    tokenizer, eos = case.tokenizer, case.tokenizer.eos_token_id
    script = [
        tokenizer.decode(t[:-1] if t[-1] == eos else t, skip_special_tokens=False)
        for t in model_turns(tokenizer, case.messages, case.ends)
    ]
    engine = ScriptedEngine(tokenizer, script, end_tokens=case.ends)
    task = Task(id="template", messages=case.messages[:2], tools=[CALC_TOOL], gt=["9480"])
    executor = ToolExecutor(build_tools(["calculate_math"]), timeout_s=2.0, max_output_chars=256)
    protocol = ProtocolConfig(format=case.call_format, call_policy=CallPolicy.multi)
    limits = AgentLimits(max_turns=max_turns, max_new_tokens=256, max_total_tokens=4096, max_tool_calls=8)
    sampling = SamplingParams(max_new_tokens=256)
    return engine, run_agent(engine, tokenizer, executor, [task], 1, limits, sampling, protocol)


def test_tool_turns_through_the_agent_loop_with_real_tools(case):
    """The agent loop on the template: the calls run by the real tool, then the answer; sampled tokens have
    mask 1, the framework's closing and observation tokens mask 0, and the observations hold the results."""
    rounds = len(call_positions(case.messages))
    engine, [traj] = scripted_run(case, max_turns=rounds + 1)
    assert traj.finish_reason is TrajectoryEnd.ANSWER and len(traj.turns) == rounds + 1
    assert [r.status for turn in traj.turns for r in turn.tool_results] == ["ok"] * rounds
    sampled = [tok for tok, m in zip(traj.response_ids, traj.action_mask) if m]
    assert sampled == [tok for ids in engine_turns(engine) for tok in ids]
    observed = case.tokenizer.decode([tok for tok, m in zip(traj.response_ids, traj.action_mask) if not m])
    assert all(json.loads(case.messages[i + 1]["content"])["result"] in observed for i in call_positions(case.messages))
    assert "9480" in traj.final_text


def test_a_template_of_one_tool_round_refuses_more_before_sampling(case):
    """DeepSeek-V3's: a rollout allowing a second tool round fails at its start with what to set, and samples
    nothing; the rest build any number of rounds."""
    if case.tool_rounds is None:
        assert chat.require_tool_rounds(case.tokenizer, 100) is None
        return
    with pytest.raises(ConfigError, match=rf"set rollout.max_turns <= {case.tool_rounds + 1}"):
        scripted_run(case, max_turns=case.tool_rounds + 2)
    with pytest.raises(ConfigError, match="tool round"):  # a history of that many rounds, mid-rollout, too
        turn_deltas(case.tokenizer, conversation(case.thinking, True, rounds=2)[:6], [CALC_TOOL], [PROBE_TOOL_MESSAGE])


PROBE_TOOL_MESSAGE = {"role": "tool", "name": "calculate_math", "content": "1"}


def engine_turns(engine: ScriptedEngine) -> list[list[int]]:
    """The tokens the scripted engine returned per turn (its text, then its end-of-turn token)."""
    return [engine.turn_ids(text) for text in engine.script]


def arguments_of(call: dict) -> dict:
    arguments = call["function"]["arguments"]
    return json.loads(arguments) if isinstance(arguments, str) else arguments


def test_the_calls_the_template_renders_read_back(case):
    tokenizer, messages = case.tokenizer, case.messages
    turns = model_turns(tokenizer, messages, case.ends)
    for tokens, message in zip(turns, [m for m in messages if m["role"] == "assistant"]):
        text = tokenizer.decode(tokens[:-1], skip_special_tokens=False)  # less its end-of-turn token
        parsed = parse_turn(text, case.call_format, tools=[CALC_TOOL])
        expected = [(c["function"]["name"], arguments_of(c)) for c in message.get("tool_calls", [])]
        assert [(c.name, c.arguments) for c in parsed.tool_calls] == expected
        assert parsed.kind is (TurnKind.TOOL if expected else TurnKind.ANSWER)


def test_sft_tokenizes_a_conversation_as_its_rollout_holds_it(case):
    """The SFT example of the case's conversation (minirl/training/sft.py) is the token sequence a rollout of
    its turns holds: the first prompt, the model's turns (mask 1, exactly those tokens) and what the framework
    appends after each (mask 0). A prefix template's example is its full render, which may go on after the last
    turn's end-of-turn token (mask 0); Qwen3.5's with thinking has "\\n" after its "<think>\\n" prompt, which the
    render's own tokens merge. DeepSeek-V3's is refused, naming why: its generation prompt opens a <think> block
    that its render of an assistant message does not have, so what a model writes after it is unknown."""
    tokenizer, messages, tools = case.tokenizer, case.messages, [CALC_TOOL]
    if case.key == "deepseekv3":
        with pytest.raises(TemplateError, match="does not start with its generation prompt"):
            tokenize_conversation(tokenizer, messages, tools)
        return
    turns = model_turns(tokenizer, messages, case.ends)
    prompt = render(tokenizer, messages[:2], tools, add_generation_prompt=True)
    ids, mask, history = list(prompt), [0] * len(prompt), messages[:2]
    for completion, position in zip(turns, call_positions(messages)):
        observations = [messages[position + 1]]
        deltas = turn_deltas(tokenizer, history, tools, observations, messages[position]["tool_calls"])
        _, added = next_prompt(ids, completion, deltas)
        ids, mask = [*ids, *completion, *added], [*mask, *[1] * len(completion), *[0] * len(added)]
        history = [*history, messages[position], *observations]
    ids, mask = [*ids, *turns[-1]], [*mask, *[1] * len(turns[-1])]
    example = tokenize_conversation(tokenizer, messages, tools)
    assert (example.input_ids[: len(ids)], example.loss_mask[: len(ids)]) == (ids, mask)
    rest = example.input_ids[len(ids) :]
    assert not any(example.loss_mask[len(ids) :])
    if case.construction is Construction.PREFIX:
        assert example.input_ids == render(tokenizer, messages, tools, add_generation_prompt=False)
    else:
        assert rest == []
