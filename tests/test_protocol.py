"""Chat rendering, tool-call parsing and the token-in/token-out builder, with the real
tokenizer under our template and the two third-party templates."""

from __future__ import annotations

import json

import pytest
from conftest import CALC_TOOL, CONVERSATION, third_party_template

from minirl.protocol.chat import TemplateError, next_prompt, render, suffix_prefix_overlap, turn_deltas
from minirl.protocol.parsing import TurnKind, parse_turn

PROMPT = CONVERSATION[:2]
TOOL_MESSAGES = CONVERSATION[3:5]


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_own_template_renders_like_qwen2_5(tokenizer):
    ours = tokenizer.apply_chat_template(CONVERSATION, tools=[CALC_TOOL], tokenize=False)
    theirs = tokenizer.apply_chat_template(
        CONVERSATION, tools=[CALC_TOOL], tokenize=False, chat_template=third_party_template("qwen2_5.jinja")
    )
    assert ours == theirs
    assert "<|im_start|>user\n<tool_response>\n" in ours  # two tool messages share one user turn
    assert ours.count("<tool_response>") == 2 and ours.count("<|im_start|>user") == 2


def test_tag_tokens_are_single_tokens(tokenizer):
    for tag in ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]:
        assert len(encode(tokenizer, tag)) == 1, tag


def test_suffix_prefix_overlap():
    assert suffix_prefix_overlap([11, 12, 90], [90, 91]) == 1
    assert suffix_prefix_overlap([11, 90, 91], [90, 91]) == 2
    assert suffix_prefix_overlap([11, 12], [90, 91]) == 0
    assert suffix_prefix_overlap([], [90]) == 0


def _three_turns(tok, end_with_eos: bool):
    """Run P0 -> C1 -> O1 -> C2 -> O2 -> C3 with hand-written completions; returns the pieces."""
    eos = [tok.eos_token_id] if end_with_eos else []
    call = '<tool_call>\n{"name": "calculate_math", "arguments": {"expression": "256 * 37"}}\n</tool_call>'
    completions = [
        encode(tok, "Let me compute.\n" + call) + eos,
        encode(tok, "  trailing spaces the template would strip   \n" + call) + eos,
        encode(tok, "The answer is 9472.") + eos,
    ]
    tools = [CALC_TOOL]
    history = list(PROMPT)
    prompt = render(tok, history, tools, add_generation_prompt=True)
    prompts, added_spans = [prompt], []
    for completion in completions[:2]:
        deltas = turn_deltas(tok, history, tools, TOOL_MESSAGES)
        prompt, added = next_prompt(prompt, completion, deltas)
        prompts.append(prompt)
        added_spans.append(added)
        history += [{"role": "assistant", "content": "x"}, *TOOL_MESSAGES]
    return prompts, completions, added_spans


@pytest.mark.parametrize("end_with_eos", [True, False])
def test_token_in_token_out_keeps_every_sampled_token(any_template_tokenizer, end_with_eos):
    tok = any_template_tokenizer
    prompts, completions, added = _three_turns(tok, end_with_eos)
    full = prompts[-1] + completions[-1]
    # each prompt extends the previous one, and the sampled tokens sit exactly where they were sampled
    position = len(prompts[0])
    for k, completion in enumerate(completions):
        assert full[: len(prompts[k])] == prompts[k]
        assert full[position : position + len(completion)] == completion
        position += len(completion) + (len(added[k]) if k < len(added) else 0)
    assert position == len(full)
    # the end-of-turn token is present exactly once after each sampled tool turn
    for k in range(2):
        after = full[len(prompts[k]) : len(prompts[k + 1])]
        assert after.count(tok.eos_token_id) == 2  # closes the assistant turn, then the tool turn
    # the observation holds the tool results
    text = tok.decode(added[0])
    assert "9472" in text and "42" in text and text.count("<tool_response>") == 2


@pytest.mark.parametrize("template", ["own", "qwen2_5.jinja"])
def test_next_prompt_equals_canonical_render_when_sampler_matches_template(tokenizer, template):
    tok = tokenizer
    chat_template = tok.chat_template if template == "own" else third_party_template(template)
    original, tok.chat_template = tok.chat_template, chat_template
    try:
        tools = [CALC_TOOL]
        p0 = render(tok, PROMPT, tools, add_generation_prompt=True)
        with_assistant = render(tok, CONVERSATION[:3], tools, add_generation_prompt=False)
        sampled = with_assistant[len(p0) : with_assistant.index(tok.eos_token_id, len(p0)) + 1]
        prompt, _ = next_prompt(p0, sampled, turn_deltas(tok, PROMPT, tools, TOOL_MESSAGES))
        assert prompt == render(tok, CONVERSATION[:5], tools, add_generation_prompt=True)
    finally:
        tok.chat_template = original


HISTORY_REWRITING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and not loop.last %}[earlier reply elided]{% else %}{{ m.content }}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_template_that_rewrites_history_raises(tokenizer):
    original, tokenizer.chat_template = tokenizer.chat_template, HISTORY_REWRITING_TEMPLATE
    try:
        with pytest.raises(TemplateError, match="rewrites history"):
            turn_deltas(tokenizer, PROMPT, None, TOOL_MESSAGES)
    finally:
        tokenizer.chat_template = original


# --- parsing -------------------------------------------------------------------------------


def call(name: str, arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def test_plain_text_is_an_answer():
    parsed = parse_turn("<think>easy</think>The capital of France is Paris.")
    assert parsed.kind is TurnKind.ANSWER
    assert parsed.content == "The capital of France is Paris."


def test_calls_are_parsed_with_ids_and_dict_arguments():
    text = (
        "Checking.\n" + call("calculate_math", {"expression": "1+1"}) + call("get_current_weather", '{"city": "Paris"}')
    )
    parsed = parse_turn(text, call_id_prefix="call_2")
    assert parsed.kind is TurnKind.TOOL
    assert [(c.id, c.name, c.arguments) for c in parsed.tool_calls] == [
        ("call_2_0", "calculate_math", {"expression": "1+1"}),
        ("call_2_1", "get_current_weather", {"city": "Paris"}),
    ]
    assert parsed.content == "Checking."


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('<tool_call>\n{"name": "calculate_math", "arguments": {"expression": "1+1"}}', "unbalanced"),
        ("<tool_call>\n{not json}\n</tool_call>", "not valid JSON"),
        ('<tool_call>\n["calculate_math"]\n</tool_call>', "JSON object"),
        ('<tool_call>\n{"arguments": {}}\n</tool_call>', "no string 'name'"),
        ('<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>', "must be an object"),
        ('<tool_call>\n{"name": "f", "arguments": "{oops"}\n</tool_call>', "not JSON"),
        ("</tool_call> stray", "unbalanced"),
    ],
)
def test_malformed_calls_make_the_turn_invalid(text, reason):
    parsed = parse_turn(text)
    assert parsed.kind is TurnKind.INVALID
    assert reason in parsed.reason


def test_too_many_calls_in_one_turn_is_invalid():
    parsed = parse_turn(call("f", {}) * 3, max_calls=2)
    assert parsed.kind is TurnKind.INVALID and "3 tool calls" in parsed.reason
