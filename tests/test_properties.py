"""Property-based tests: the tool-call parsers on arbitrary and on well-formed text, the
token-in/token-out prompt builder with the real tokenizer, and the reward terms on arbitrary
answers and gt lists; the tool executor on hostile arguments."""

from __future__ import annotations

import json
import math
import re
import unicodedata
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from support import CALC_TOOL, CONVERSATION, third_party_template

from minirl.config import CallPolicy, RewardConfig
from minirl.data.task import Task
from minirl.protocol.chat import next_prompt, render, suffix_prefix_overlap, turn_deltas
from minirl.protocol.formats import CALL_FORMATS
from minirl.protocol.parsing import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, TurnKind, parse_turn
from minirl.rewards import REWARD_TERMS, contains_value, score, term_values
from minirl.rollout.trajectory import Trajectory, TrajectoryEnd, Turn
from minirl.tools import MINIMIND_TOOL_NAMES, ToolExecutor, build_tools
from minirl.tools.base import ToolCall, ToolResult

PROPERTY = settings(max_examples=200, deadline=None)
# the tokenizer and chat template make these examples slower: fewer of them
TOKENIZER_PROPERTY = settings(PROPERTY, max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])

# -- the tool-call parsers -------------------------------------------------------------------

HARMONY_TAGS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>", "<|return|>"]
DEEPSEEK_TAGS = [
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁calls▁end｜>",
]
MARKUP = [
    TOOL_CALL_OPEN, TOOL_CALL_CLOSE, "<function=", "</function>", "<parameter=", "</parameter>", "<think>",
    "</think>", "<tool_response>", ">", "=", "\n", " ", '{"name": "f"', '"arguments": ', '"parameters": ', "{", "}",
    "[", "]", '"', ",", ":", ";", "null", "1", "f", "code", "<|python_tag|>", *DEEPSEEK_TAGS, "function", "```json\n",
    "\n```", *HARMONY_TAGS, "<|start|>assistant", " to=functions.f", "analysis", "final", " json",
]  # fmt: skip
# text a model could write: arbitrary unicode, markup soup with unicode between, and deep nesting
model_text = st.one_of(
    st.text(),
    st.lists(st.one_of(st.sampled_from(MARKUP), st.text(max_size=5)), max_size=40).map("".join),
    st.builds(
        lambda piece, count: TOOL_CALL_OPEN + piece * count + TOOL_CALL_CLOSE,
        st.sampled_from(["[", "{", '{"a":', "<tool_call>", "<think>"]),
        st.integers(1, 20_000),
    ),
)
FORMATS_AND_POLICIES = [(f, p) for f in CALL_FORMATS.names() for p in CallPolicy]
MAX_CALLS = 3
TYPED_TOOL = {
    "type": "function",
    "function": {
        "name": "f",
        "parameters": {"type": "object", "properties": {"1": {"type": "integer"}, "code": {"type": "object"}}},
    },
}


@pytest.mark.parametrize(("call_format", "policy"), FORMATS_AND_POLICIES)
@PROPERTY
@given(text=model_text)
def test_parsing_any_text_never_raises_and_classifies_it(call_format, policy, text):
    parsed = parse_turn(text, call_format, policy, max_calls=MAX_CALLS, tools=[TYPED_TOOL])
    assert parsed.kind in (TurnKind.ANSWER, TurnKind.TOOL, TurnKind.INVALID)
    assert (parsed.kind is TurnKind.INVALID) == bool(parsed.reason)
    if parsed.kind is TurnKind.ANSWER:
        assert not parsed.tool_calls
    if parsed.kind is TurnKind.TOOL:
        assert 1 <= len(parsed.tool_calls) <= (1 if policy is CallPolicy.strict_single else MAX_CALLS)
        assert all(isinstance(c.name, str) and c.name and isinstance(c.arguments, dict) for c in parsed.tool_calls)
    assert not any(tag in parsed.content for tag in CALL_FORMATS.get(call_format).markup.tags)


@pytest.mark.parametrize("call_format", CALL_FORMATS.names())
@PROPERTY
@given(body=model_text)
def test_format_readers_return_a_call_or_a_reason(call_format, body):
    read = CALL_FORMATS.get(call_format).read(body, [TYPED_TOOL])
    if isinstance(read, str):
        assert read
    else:
        name, arguments = read
        assert isinstance(name, str) and name and isinstance(arguments, dict)


# markup that ends a call or an argument early: a value holding it is malformed by design; and the
# end-of-turn marker, where a turn ends (the sampler stops at its token; rendered_turn cuts the text there)
CALL_MARKUP = (
    TOOL_CALL_OPEN,
    TOOL_CALL_CLOSE,
    "<function=",
    "</function>",
    "<parameter=",
    "</parameter>",
    *DEEPSEEK_TAGS,
    *HARMONY_TAGS,
    "<|im_end|>",
    "<|eot_id|>",
    "<｜end▁of▁sentence｜>",
)
names = st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True)
keys = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True)
plain_text = st.text().filter(lambda s: not any(tag in s for tag in CALL_MARKUP))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | plain_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(plain_text, inner, max_size=3),
    max_leaves=8,
)
# what the Qwen3-Coder template writes back as it was given: text, and numbers or JSON containers
# under a schema that declares them (it writes True as "True", which is not JSON)
XML_TYPES = {
    "string": plain_text,
    "integer": st.integers(),
    "number": st.floats(allow_nan=False, allow_infinity=False),
    "array": st.lists(json_values, max_size=3),
    "object": st.dictionaries(plain_text, json_values, max_size=3),
}
typed_argument = st.sampled_from(sorted(XML_TYPES)).flatmap(lambda t: st.tuples(st.just(t), XML_TYPES[t]))
JSON_ARGUMENTS = st.dictionaries(keys, json_values, max_size=4).map(lambda args: (args, {}))
CALL_ARGUMENTS = {
    "hermes": JSON_ARGUMENTS,
    "llama3_json": JSON_ARGUMENTS,
    "deepseek_v3": JSON_ARGUMENTS,
    "harmony": JSON_ARGUMENTS,
    "qwen3_coder": st.dictionaries(keys, typed_argument, max_size=4).map(
        lambda typed: ({k: value for k, (_, value) in typed.items()}, {k: t for k, (t, _) in typed.items()})
    ),
}
# format: (the template that writes it, None for our own; the end of its assistant turn)
TEMPLATE_OF_FORMAT = {
    "hermes": (None, "<|im_end|>"),
    "qwen3_coder": ("qwen3_coder.jinja", "<|im_end|>"),
    "llama3_json": ("llama3_2.jinja", "<|eot_id|>"),
    "deepseek_v3": ("deepseekv3.jinja", "<｜end▁of▁sentence｜>"),
    "harmony": ("gptoss.jinja", "<|call|>"),
}
# their template renders one call per turn, and no content beside it (gpt-oss's: as the call's analysis message)
SINGLE_CALL_TEMPLATES = {"llama3_json", "harmony"}
ARGUMENTS_AS_TEXT = {"deepseek_v3"}  # its template concatenates the arguments: it needs them as JSON text
OPENED_THINK = "<think>\n"  # DeepSeek-V3's generation prompt opens a think block that its turns do not render


def calls_of(call_format: str, max_calls: int):
    """Lists of (name, arguments, declared argument types)."""
    call = st.tuples(names, CALL_ARGUMENTS[call_format]).map(lambda c: (c[0], *c[1]))
    max_calls = 1 if call_format in SINGLE_CALL_TEMPLATES else max_calls
    return st.lists(call, min_size=1, max_size=max_calls, unique_by=lambda c: c[0])  # one schema per name


def rendered_turn(tokenizer, call_format: str, content: str, calls) -> tuple[str, list[dict]]:
    """The assistant turn the format's chat template writes for `calls`, and the tool schemas it offered."""
    template, end_of_turn = TEMPLATE_OF_FORMAT[call_format]
    chat_template = third_party_template(template) if template else tokenizer.chat_template
    tools = [
        {"type": "function", "function": {"name": name, "description": "A tool.", "parameters": {
            "type": "object", "properties": {key: {"type": declared} for key, declared in types.items()}
        }}}
        for name, _, types in calls
    ]  # fmt: skip
    as_text = call_format in ARGUMENTS_AS_TEXT
    tool_calls = [
        {"type": "function", "function": {"name": n, "arguments": json.dumps(a) if as_text else a}} for n, a, _ in calls
    ]
    assistant = {"role": "assistant", "content": content, "tool_calls": tool_calls}
    prompt = [{"role": "user", "content": "hi"}]
    kwargs = {"tools": tools, "tokenize": False, "chat_template": chat_template}
    before = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, **kwargs)
    after = tokenizer.apply_chat_template([*prompt, assistant], **kwargs)
    before = before if after.startswith(before) else before.removesuffix(OPENED_THINK)
    assert after.startswith(before)
    return after[len(before) :].split(end_of_turn)[0], tools


@pytest.mark.parametrize("call_format", CALL_FORMATS.names())
@TOKENIZER_PROPERTY
@given(data=st.data(), content=st.text(alphabet=st.characters(blacklist_characters="<"), max_size=30))
def test_a_rendered_call_parses_back_to_exactly_the_calls(tokenizer, call_format, data, content):
    calls = data.draw(calls_of(call_format, MAX_CALLS))
    text, tools = rendered_turn(tokenizer, call_format, content, calls)
    parsed = parse_turn(text, call_format, CallPolicy.multi, max_calls=MAX_CALLS, tools=tools)
    assert parsed.kind is TurnKind.TOOL, parsed.reason
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [(name, arguments) for name, arguments, _ in calls]
    assert parsed.content == ("" if call_format in SINGLE_CALL_TEMPLATES else content.strip())


@pytest.mark.parametrize("call_format", CALL_FORMATS.names())
@TOKENIZER_PROPERTY
@given(data=st.data())
def test_a_rendered_single_call_passes_the_strict_policy(tokenizer, call_format, data):
    [call] = data.draw(calls_of(call_format, 1))
    assume(not any(isinstance(value, str) and not value.strip() for value in call[1].values()))
    text, tools = rendered_turn(tokenizer, call_format, "", [call])
    parsed = parse_turn(text, call_format, CallPolicy.strict_single, max_calls=1, tools=tools)
    assert parsed.kind is TurnKind.TOOL, parsed.reason
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [call[:2]]


# -- the token-in/token-out builder ----------------------------------------------------------

PROMPT = CONVERSATION[:2]


def longest_overlap(completion: list[int], closing: list[int]) -> int:
    """The definition: the largest n such that the last n completion tokens are the first n closing ones."""
    sizes = range(min(len(completion), len(closing)) + 1)
    return max(n for n in sizes if completion[len(completion) - n :] == closing[:n])


@PROPERTY
@given(st.lists(st.integers(0, 3), max_size=12), st.lists(st.integers(0, 3), max_size=12))
def test_suffix_prefix_overlap_is_the_longest_overlap(completion, closing):
    assert suffix_prefix_overlap(completion, closing) == longest_overlap(completion, closing)


@TOKENIZER_PROPERTY
@given(data=st.data(), observations=st.lists(st.text(max_size=60), min_size=1, max_size=3))
def test_next_prompt_keeps_every_sampled_token_and_appends_exactly_the_deltas(tokenizer, data, observations):
    tool_messages = [
        {"role": "tool", "tool_call_id": f"call_0_{i}", "name": "calculate_math", "content": content}
        for i, content in enumerate(observations)
    ]
    deltas = turn_deltas(tokenizer, PROMPT, [CALC_TOOL], tool_messages)
    previous = render(tokenizer, PROMPT, [CALC_TOOL], add_generation_prompt=True)
    # any sampled tokens, often ending in part of the template's closing tokens (the end-of-turn token)
    sampled = data.draw(st.lists(st.integers(0, len(tokenizer) - 1), max_size=20))
    closing_part = deltas.closing[: data.draw(st.integers(0, len(deltas.closing)))]
    completion = sampled + closing_part
    prompt, added = next_prompt(previous, completion, deltas)
    assert prompt[: len(previous) + len(completion)] == previous + completion
    assert prompt[len(previous) + len(completion) :] == added
    overlap = longest_overlap(completion, deltas.closing)
    assert added == deltas.closing[overlap:] + deltas.observation
    observation_text = tokenizer.decode(deltas.observation)  # the tokenizer NFC-normalises what it encodes
    assert all(unicodedata.normalize("NFC", content) in observation_text for content in observations)


# -- the reward terms ------------------------------------------------------------------------

answer_text = st.one_of(st.text(), st.lists(st.sampled_from(MARKUP + ["42", "4.2", " ", "23°C", "x"])).map("".join))
gt_value = st.one_of(st.text(min_size=1).filter(str.strip), st.integers().map(str), st.floats(-1e6, 1e6).map(str))
REFERENCES = [
    [],
    [{"role": "assistant", "content": "ok"}],
    [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_0", "type": "function",
                                                              "function": {"name": "f", "arguments": {}}}]},
        {"role": "tool", "tool_call_id": "call_0", "name": "f", "content": "{}"},
        {"role": "assistant", "content": "ok"},
    ],
]  # fmt: skip
RESULT_STATUSES = ["ok", "unknown_tool", "bad_arguments", "error", "timeout", "over_budget"]


@st.composite
def trajectories(draw) -> Trajectory:
    """A trajectory of one to three parsed turns (each turn's calls answered) ending for any reason."""
    task = Task(
        id="t",
        messages=[{"role": "user", "content": draw(st.text(max_size=40))}],
        tools=[],
        gt=draw(st.lists(gt_value, max_size=4)),
        reference=draw(st.sampled_from(REFERENCES)),
    )
    turns = []
    for text in draw(st.lists(answer_text, min_size=1, max_size=3)):
        parsed = parse_turn(text)
        statuses = draw(st.lists(st.sampled_from(RESULT_STATUSES), min_size=len(parsed.tool_calls)))
        results = [ToolResult(c.id, c.name, "{}", s, 0.0) for c, s in zip(parsed.tool_calls, statuses, strict=False)]
        turns.append(Turn(text, parsed, results))
    finish = TrajectoryEnd.ANSWER if turns[-1].parsed.kind is TurnKind.ANSWER else draw(st.sampled_from(TrajectoryEnd))
    return Trajectory(task=task, group_index=0, prompt_ids=[1], turns=turns, finish_reason=finish)


weights = st.fixed_dictionaries({name: st.floats(-5, 5) for name in REWARD_TERMS.names()})
caps = st.dictionaries(st.sampled_from(REWARD_TERMS.names()), st.floats(0.01, 5))


@PROPERTY
@given(traj=trajectories(), weights=weights, clip=st.floats(0.1, 10), caps=caps)
def test_every_term_is_finite_and_the_score_stays_within_the_clip(traj, weights, clip, caps):
    assert all(math.isfinite(value) for value in term_values(traj).values())
    total, weighted = score(traj, RewardConfig(weights=weights, clip=clip, caps=caps))
    assert -clip <= total <= clip
    assert set(weighted) == set(REWARD_TERMS.names()) and all(math.isfinite(v) for v in weighted.values())
    assert all(abs(weighted[name]) <= abs(weights[name]) * cap for name, cap in caps.items())


digits = st.text(alphabet="0123456789", min_size=1, max_size=4)


@PROPERTY
@given(
    value=st.one_of(st.integers(0, 10**6).map(str), st.decimals(0, 1000, places=2).map(str)),
    before=st.one_of(digits, digits.map(lambda d: d + "."), st.just("")),
    after=st.one_of(digits, digits.map(lambda d: "." + d), st.just("")),
    context=st.sampled_from(["", "The answer is ", "= ", "温度", "("]),
)
def test_a_gt_value_inside_a_longer_number_never_hits(value, before, after, context):
    longer = before + value + after
    assume(re.fullmatch(r"\d+(\.\d+)?", longer) and longer != value)  # one longer number, not "1.5.2"
    # "0.50" + "0" is the same number; a zero-padded one ("023") is a code, never a number
    assume(re.match(r"0\d", longer) or Decimal(longer) != Decimal(value))
    text = f"{context}{before}{value}{after} today"
    assert not contains_value(text, value)
    answer = parse_turn(text)
    task = Task(id="t", messages=[{"role": "user", "content": "?"}], tools=[], gt=[value])
    traj = Trajectory(task, 0, [1], turns=[Turn(text, answer)], finish_reason=TrajectoryEnd.ANSWER)
    assert REWARD_TERMS.get("gt_hit")(traj) == 0.0


# -- the tool executor ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def executor() -> ToolExecutor:
    return ToolExecutor(build_tools(MINIMIND_TOOL_NAMES), timeout_s=2.0, max_output_chars=2048)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(
    name=st.sampled_from([*MINIMIND_TOOL_NAMES, "missing"]),
    arguments=st.dictionaries(
        st.sampled_from(["expression", "value", "from_unit", "to_unit", "city", "timezone", "text", "x"]),
        json_values,
        max_size=4,
    ),
)
def test_executor_never_raises_on_hostile_arguments(executor, name, arguments):
    result = executor.execute(ToolCall("c", name, arguments))
    assert result.status in ("ok", "unknown_tool", "bad_arguments", "error")
    assert len(result.content) <= executor.max_output_chars
