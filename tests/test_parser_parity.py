"""Parity with vLLM's tool-parser tests: each case of vLLM's hermes, qwen3_coder, llama3_json and deepseek_v3
parser tests, written here as data (model output + tools -> calls and content), read by minirl's parse_turn and,
for the streamed ones, by the server's TurnSplitter. A case either agrees with vLLM (same call names, same
arguments as values, the same content up to minirl's stripping of whitespace) or says in `differs` how and why
minirl reads it its own way; docs/tool_calls.md lists every case, and a test here keeps that table and its counts
honest.

Sources, in vllm-project/vllm: tests/tool_parsers/test_hermes_tool_parser.py (H), test_qwen3coder_tool_parser.py
(Q), test_qwen3_xml_coder_shared.py (S; its tests that repeat a Q test with the same text are not repeated),
test_llama3_json_tool_parser.py (L) and test_deepseekv3_tool_parser.py (D: the shared tests of common_tests.py
on its model outputs).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from minirl.protocol.formats import CALL_FORMATS
from minirl.protocol.parsing import TurnKind, parse_turn
from minirl.serving.turn_splitter import Channel, TurnSplitter

pytestmark = pytest.mark.fast

DOC = Path(__file__).resolve().parents[1] / "docs" / "tool_calls.md"

ANSWER, TOOL, INVALID = TurnKind.ANSWER, TurnKind.TOOL, TurnKind.INVALID


def function(name: str, properties: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": properties}}}


WEATHER = function(
    "get_current_weather",
    {
        "city": {"type": "string"},
        "state": {"type": "string"},
        "unit": {"type": "string", "enum": ["fahrenheit", "celsius"]},
    },
)
AREA = function(
    "calculate_area", {"shape": {"type": "string"}, "dimensions": {"type": "object"}, "precision": {"type": "integer"}}
)
SAMPLE_TOOLS = (WEATHER, AREA)
TYPES = function(
    "test_types",
    {
        "int_param": {"type": "integer"},
        "float_param": {"type": "float"},
        "bool_param": {"type": "boolean"},
        "str_param": {"type": "string"},
        "obj_param": {"type": "object"},
    },
)
NULLABLE = {"anyOf": [{"type": "integer"}, {"type": "null"}]}
ANYOF = function(
    "test_anyof",
    {
        "anyof_int": {**NULLABLE, "default": 5},
        "anyof_str": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "anyof_array": {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]},
        "anyof_obj": {"anyOf": [{"type": "object"}, {"type": "null"}]},
        "type_as_array": {"type": ["integer", "null"]},
        "multi_non_null": {"anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]},
    },
)
SEARCH_WEB = function(
    "search_web",
    {
        "query": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "count": {**NULLABLE, "default": 5},
        "verbose": {"anyOf": [{"type": "boolean"}, {"type": "null"}]},
    },
)
UPDATE_RECORD = function("update_record", {"data": {"anyOf": [{"type": "object"}, {"type": "null"}]}})
GREET = function("greet", {"message": {"type": "string"}})
WRITE_FILE = function("write_file", {"path": {"type": "string"}, "content": {"type": "string"}})
PROCESS = function("process", {"name": {"type": "string"}, "data": {"type": "object"}})
PICK = function("pick", {"items": {"type": "array"}})
GET_WEATHER = function("get_weather", {"city": {"type": "string"}})


def xml(name: str, *params: tuple[str, str], framed: bool = True) -> str:
    """One Qwen3-Coder call; `framed` puts the template's newlines around each value."""
    nl = "\n" if framed else ""
    body = "".join(f"<parameter={key}>{nl}{value}{nl}</parameter>\n" for key, value in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


DALLAS = ("get_current_weather", {"city": "Dallas", "state": "TX", "unit": "fahrenheit"})
DALLAS_XML = xml("get_current_weather", ("city", "Dallas"), ("state", "TX"), ("unit", "fahrenheit"))
ORLANDO_XML = xml("get_current_weather", ("city", "Orlando"), ("state", "FL"), ("unit", "fahrenheit"))
ORLANDO_C_XML = xml("get_current_weather", ("city", "Orlando"), ("state", "FL"), ("unit", "celsius"))
RECTANGLE_XML = xml(
    "calculate_area", ("shape", "rectangle"), ("dimensions", '{"width": 10, \n "height": 20}'), ("precision", "2")
)
RECTANGLE = ("calculate_area", {"shape": "rectangle", "dimensions": {"width": 10, "height": 20}, "precision": 2})
CIRCLE_XML = xml("calculate_area", ("shape", "circle"), ("dimensions", '{"radius": 15.5}'), ("precision", "3"))
CIRCLE = ("calculate_area", {"shape": "circle", "dimensions": {"radius": 15.5}, "precision": 3})
MISSING_CLOSE = (
    "Let me check the weather for you:\n<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas\n"
    "<parameter=state>\nTX\n</parameter>\n<parameter=unit>\nfahrenheit\n</parameter>\n</function>\n</tool_call>"
)
NO_GT = "<tool_call>\n<function=get_current_weather\n<parameter=city>Dallas</parameter>\n</function>\n</tool_call>"
BAD_THEN_GOOD = (
    "<tool_call>\n<function=bad_func_no_gt\n</function>\n</tool_call>\n<tool_call>\n<function=get_current_weather>\n"
    "<parameter=city>Dallas</parameter>\n<parameter=state>TX</parameter>\n</function>\n</tool_call>"
)
TWO_WEATHER = xml("get_weather", ("city", "Paris")).replace("\n</tool_call>", "\n</tool_call>\n") + xml(
    "get_weather", ("city", "London")
)
TAGS_IN_VALUE = (
    'char_deltas = [\n    "<tool_call>\\n",\n    "<parameter=query>\\n",\n    "\\n</parameter>\\n",\n'
    '    "</function>\\n",\n]\n'
)
PARAM_LIKE_LINES = (
    'TOOL_CALL_TEMPLATE = """\n</parameter>\n<parameter=new_string>\n#!/usr/bin/env python3\n</parameter>\n"""\n'
)
REAL_PARAM_LITERAL = 'doc = """\n<parameter=path>\nliteral/value\n</parameter>\n"""\n'
FULL_NESTED = (
    'doc = """\n<tool_call>\n<function=write_file>\n<parameter=path>\nliteral/value.txt\n</parameter>\n'
    '<parameter=content>\nhello\n</parameter>\n</function>\n</tool_call>\n"""\n'
)
OUT_OF_SCHEMA = (
    'template = """\n<tool_call>\n<function=foo>\n<parameter=bar>baz</parameter>\n</function>\n</tool_call>\n"""\n'
)


def write_file_call(path: str, content: str) -> str:
    return (
        f"<tool_call>\n<function=write_file>\n<parameter=path>\n{path}\n</parameter>\n"
        f"<parameter=content>\n{content}</parameter>\n</function>\n</tool_call>"
    )


@dataclass
class Case:
    vllm_test: str  # file key (H, Q, S) :: the vLLM test, with its parameter in brackets
    checks: str  # what vLLM's test checks, in a few words
    call_format: str
    text: str  # the model output
    kind: TurnKind  # minirl's reading
    calls: tuple[tuple[str, dict], ...] = ()
    content: str = ""  # of an answer or a call turn (an invalid turn's leftover text is not checked)
    tools: tuple[dict, ...] = ()
    reason: str = ""  # part of minirl's reason for an invalid turn
    differs: str = ""  # how vLLM reads it and why minirl does not; empty when they agree
    chunk_sizes: tuple[int, ...] = ()  # streamed cases: characters per delta fed to the TurnSplitter
    deltas: tuple[str, ...] = ()  # streamed cases whose vLLM test gives the deltas themselves


NOT_CLOSED = (
    "vLLM reads a call whose </tool_call> never comes; minirl's turn is invalid ('<tool_call> "
    "is not closed'): a turn cut short must not run a half-written call"
)
STRING_ARGS = (
    "vLLM passes a string `arguments` on as the call's JSON string; minirl's turn is invalid: "
    "arguments are an object, or a JSON string holding one"
)
NO_TOOL_CALL_TAG = (
    "vLLM reads <function=...> without its <tool_call> block; minirl reads only calls in "
    "<tool_call> blocks (the text is an answer, or invalid for a stray </tool_call>)"
)
RECOVERY = (
    "vLLM recovers the arguments around a missing </parameter>; minirl's turn is invalid "
    "('nested tool-call markup in argument 'city''): malformed markup is not guessed at"
)
MARKUP_IN_VALUE = (
    "vLLM tells a value's literal call markup from the real tags by schema and lookahead; "
    "minirl's turn is invalid: markup inside a value is ambiguous, and a strict reader does "
    "not guess"
)
PYTHON_LITERAL = (
    "vLLM reads a Python literal (single quotes) with ast.literal_eval; minirl reads JSON "
    "only, so the value stays text and the tool's schema check rejects it"
)
ONE_BAD_BLOCK = (
    "vLLM drops the malformed block and keeps the good one; minirl's turn is invalid: one "
    "broken call makes the turn invalid rather than partly run"
)

PROSE_AROUND_JSON = (
    "vLLM finds JSON calls anywhere in the text and drops the prose around them (content None); minirl reads "
    "calls only when they start the turn, so this turn is an answer with the JSON as text: an RL policy is "
    "never paid for a call buried in prose"
)
TEXT_AFTER_JSON = (
    "vLLM keeps the call and drops the prose after it; minirl's turn is invalid ('text after a JSON tool "
    "call'): a Llama 3 turn is its calls or content, never both"
)
NOT_A_CALL = (
    "vLLM returns the text as content with no call; minirl's turn is invalid: a turn that starts with { is its "
    "calls, and a call that does not read is counted, not taken for an answer"
)

H, Q, S, L, D = "H::", "Q::", "S::", "L::", "D::"
PLAIN_H = "This is some prior text that has nothing to do with tool calling."
TRIGGER = '<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}}\n</tool_call>'
TEMPERATURE = (
    '<tool_call>{"name": "get_current_temperature","arguments": {"location":"San Francisco, California, '
    'United States", "unit": "celsius"}}</tool_call>'
)
DB_CONFIG = '<tool_call>\n{"name": "get_db_config", "arguments": "{\\"param\\": \\"max_connections\\"}"}\n</tool_call>'


def string_arguments(value: str) -> str:
    return "<tool_call>" + json.dumps({"name": "f", "arguments": value}) + "</tool_call>"


SEARCH_1 = '{"name": "searchTool", "parameters": {"query": "test1"}}'
INCIDENTS = '{"name": "getOpenIncidentsTool", "parameters": {}}'
SEARCH_2 = '{"name": "searchTool", "parameters": {"query": "test2"}}'
SEARCH_TEST = '{"name": "searchTool", "parameters": {"query": "test"}}'
THREE_CALLS = (("searchTool", {"query": "test1"}), ("getOpenIncidentsTool", {}), ("searchTool", {"query": "test2"}))


def deepseek(*calls: tuple[str, str]) -> str:
    """A DeepSeek-V3 turn's calls, each (name, its arguments as JSON text)."""
    body = "".join(
        f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{arguments}\n```<｜tool▁call▁end｜>"
        for name, arguments in calls
    )
    return f"<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>"


TOKYO = deepseek(("get_weather", '{"city": "Tokyo", "unit": "celsius"}'))
TOKYO_HOTELS = deepseek(
    ("get_weather", '{"city": "Tokyo", "unit": "celsius"}'),
    ("search_hotels", '{"location": "Tokyo", "check_in": "2025-01-15"}'),
)
TOKYO_CALLS = (
    ("get_weather", {"city": "Tokyo", "unit": "celsius"}),
    ("search_hotels", {"location": "Tokyo", "check_in": "2025-01-15"}),
)
DATA_TYPES = (
    '{"string_field": "hello", "int_field": 42, "float_field": 3.14, "bool_field": true, "null_field": null, '
    '"array_field": ["a", "b", "c"], "object_field": {"nested": "value"}, "empty_array": [], "empty_object": {}}'
)
NO_CALL_BEGIN = (
    deepseek(("get_weather", '{"city": "Tokyo"}'))
    .replace("<｜tool▁call▁begin｜>", "")
    .replace("<｜tool▁call▁end｜>", "")
)


CASES = [
    # -- hermes -------------------------------------------------------------------------------------------------
    Case(
        H + "test_hermes_parser_streaming_just_forward_text",
        "plain text streams as content",
        "hermes",
        PLAIN_H,
        ANSWER,
        content=PLAIN_H,
        chunk_sizes=(1,),
    ),
    Case(
        H + "test_hermes_parser_streaming_failure_case_bug_19056",
        "a boolean argument streams whole",
        "hermes",
        TRIGGER,
        TOOL,
        (("final_answer", {"trigger": True}),),
        chunk_sizes=(1,),
    ),
    Case(
        H + "test_hermes_parser_streaming",
        "a call streams to its name and arguments",
        "hermes",
        TEMPERATURE,
        TOOL,
        (("get_current_temperature", {"location": "San Francisco, California, United States", "unit": "celsius"}),),
        chunk_sizes=(1,),
    ),
    Case(
        H + "test_hermes_streaming_tool_call_with_stream_interval[2,3,5,8]",
        "the same at several delta sizes",
        "hermes",
        (
            '<tool_call>{"name": "get_current_temperature", "arguments": {"location": "San Francisco", '
            '"unit": "celsius"}}</tool_call>'
        ),
        TOOL,
        (("get_current_temperature", {"location": "San Francisco", "unit": "celsius"}),),
        chunk_sizes=(2, 3, 5, 8),
    ),
    Case(
        H + "test_hermes_streaming_content_then_tool_call_with_stream_interval[2,3,5,8]",
        "content before a call, then the call",
        "hermes",
        'Sure, let me check the weather.<tool_call>{"name": "get_weather", "arguments": {"city": "NYC"}}</tool_call>',
        TOOL,
        (("get_weather", {"city": "NYC"}),),
        "Sure, let me check the weather.",
        chunk_sizes=(2, 3, 5, 8),
    ),
    Case(
        H + "test_hermes_streaming_multiple_tool_calls_with_stream_interval[1,2,4]",
        "two calls in a row",
        "hermes",
        (
            '<tool_call>{"name": "search", "arguments": {"q": "cats"}}</tool_call><tool_call>{"name": '
            '"search", "arguments": {"q": "dogs"}}</tool_call>'
        ),
        TOOL,
        (("search", {"q": "cats"}), ("search", {"q": "dogs"})),
        chunk_sizes=(1, 2, 4),
    ),
    Case(
        H + "test_hermes_streaming_boolean_args_with_stream_interval[2,5]",
        "bug 19056 at larger deltas",
        "hermes",
        TRIGGER,
        TOOL,
        (("final_answer", {"trigger": True}),),
        chunk_sizes=(2, 5),
    ),
    Case(
        H + "test_hermes_streaming_just_forward_text_with_stream_interval[2,3,5]",
        "plain text at larger deltas",
        "hermes",
        "This is plain text with no tool calling involved.",
        ANSWER,
        content="This is plain text with no tool calling involved.",
        chunk_sizes=(2, 3, 5),
    ),
    Case(
        H + "test_hermes_parser_non_streaming_no_tool_call",
        "no call in plain text",
        "hermes",
        "This is not a tool call.",
        ANSWER,
        content="This is not a tool call.",
    ),
    Case(
        H + "test_hermes_parser_non_streaming_tool_call_between_tags",
        "one call between the tags",
        "hermes",
        TRIGGER,
        TOOL,
        (("final_answer", {"trigger": True}),),
    ),
    Case(
        H + "test_hermes_parser_non_streaming_tool_call_until_eos",
        "a call with no </tool_call> still counts",
        "hermes",
        TRIGGER[: -len("\n</tool_call>")],
        INVALID,
        reason="<tool_call> is not closed",
        differs=NOT_CLOSED,
    ),
    Case(
        H + "test_hermes_parser_non_streaming_tool_call_invalid_json",
        "broken JSON is no call",
        "hermes",
        '<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}',
        INVALID,
        reason="<tool_call> is not closed",
        differs=(
            "vLLM returns the text as content with no call; minirl's turn is invalid ('<tool_call> is "
            "not closed'): no call either way, and minirl counts the broken markup"
        ),
    ),
    Case(
        H + "test_hermes_parser_non_streaming_serialized_arguments",
        "arguments as a JSON string are decoded once",
        "hermes",
        DB_CONFIG,
        TOOL,
        (("get_db_config", {"param": "max_connections"}),),
    ),
    Case(
        H + "test_hermes_parser_non_streaming_bare_string_arguments",
        "a plain-string argument stays a string",
        "hermes",
        '<tool_call>\n{"name": "do_thing", "arguments": "hello"}\n</tool_call>',
        INVALID,
        reason="a string that is not JSON",
        differs=STRING_ARGS,
    ),
    Case(
        H + "test_hermes_streaming_serialized_arguments_with_stream_interval[1,2,3,5]",
        "serialized arguments, streamed",
        "hermes",
        '<tool_call>{"name": "get_db_config", "arguments": "{\\"param\\": \\"max_connections\\"}"}</tool_call>',
        TOOL,
        (("get_db_config", {"param": "max_connections"}),),
        chunk_sizes=(1, 2, 3, 5),
    ),
    Case(
        H + "test_hermes_streaming_bare_string_arguments_with_stream_interval[1,3]",
        "a plain-string argument, streamed",
        "hermes",
        '<tool_call>{"name": "do_thing", "arguments": "hello"}</tool_call>',
        INVALID,
        reason="a string that is not JSON",
        differs=STRING_ARGS,
        chunk_sizes=(1, 3),
    ),
    *(
        Case(
            H + f"test_hermes_streaming_string_arguments_match_non_streaming[{value}]",
            "streamed and whole readings agree",
            "hermes",
            string_arguments(value),
            kind,
            calls,
            reason="" if kind is TOOL else "a string that is not JSON",
            differs="" if kind is TOOL else STRING_ARGS + "; streamed and whole readings agree, as vLLM's test asks",
            chunk_sizes=(1, 3),
        )
        for value, kind, calls in [
            ('{"param": "max_connections"}', TOOL, (("f", {"param": "max_connections"}),)),
            ("hello", INVALID, ()),
            ("{hello world}", INVALID, ()),
            ("[oops", INVALID, ()),
            ('{"a": 1} tail text', INVALID, ()),
        ]
    ),
    Case(
        H + "test_hermes_streaming_content_and_tool_call_in_single_chunk",
        "content and a call in one delta",
        "hermes",
        'Hi!<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>',
        TOOL,
        (("f", {"x": 1}),),
        "Hi!",
        chunk_sizes=(9999,),
    ),
    # -- qwen3_coder --------------------------------------------------------------------------------------------
    Case(
        Q + "test_extract_tool_calls_no_tools",
        "no call in plain text",
        "qwen3_coder",
        "This is a test response without any tool calls",
        ANSWER,
        content="This is a test response without any tool calls",
        tools=SAMPLE_TOOLS,
    ),
    Case(
        Q + "test_extract_tool_calls[single_tool]",
        "one call, string values",
        "qwen3_coder",
        DALLAS_XML,
        TOOL,
        (DALLAS,),
        tools=SAMPLE_TOOLS,
    ),
    Case(
        Q + "test_extract_tool_calls[single_tool_with_content]",
        "content before a call",
        "qwen3_coder",
        "Sure! Let me check the weather for you." + DALLAS_XML,
        TOOL,
        (DALLAS,),
        "Sure! Let me check the weather for you.",
        tools=SAMPLE_TOOLS,
    ),
    Case(
        Q + "test_extract_tool_calls[single_tool_multiline_param]",
        "a multi-line object value, an integer",
        "qwen3_coder",
        RECTANGLE_XML,
        TOOL,
        (RECTANGLE,),
        tools=SAMPLE_TOOLS,
    ),
    Case(
        Q + "test_extract_tool_calls[parallel_tools]",
        "two calls",
        "qwen3_coder",
        DALLAS_XML + "\n" + ORLANDO_XML,
        TOOL,
        (DALLAS, ("get_current_weather", {"city": "Orlando", "state": "FL", "unit": "fahrenheit"})),
        tools=SAMPLE_TOOLS,
    ),
    Case(
        Q + "test_extract_tool_calls[tool_with_typed_params]",
        "typed values after content",
        "qwen3_coder",
        "Let me calculate that area for you." + CIRCLE_XML,
        TOOL,
        (CIRCLE,),
        "Let me calculate that area for you.",
        tools=SAMPLE_TOOLS,
    ),
    Case(
        Q + "test_extract_tool_calls_fallback_no_tags",
        "a call without <tool_call> tags",
        "qwen3_coder",
        (
            "<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n"
            "<parameter=state>\nTX\n</parameter>\n</function>"
        ),
        ANSWER,
        content=(
            "<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n"
            "<parameter=state>\nTX\n</parameter>\n</function>"
        ),
        tools=SAMPLE_TOOLS,
        differs=NO_TOOL_CALL_TAG,
    ),
    Case(
        Q + "test_extract_tool_calls_type_conversion",
        "integer, float, boolean, string, object values",
        "qwen3_coder",
        xml(
            "test_types",
            ("int_param", "42"),
            ("float_param", "3.14"),
            ("bool_param", "true"),
            ("str_param", "hello world"),
            ("obj_param", '{"key": "value"}'),
        ),
        TOOL,
        (
            (
                "test_types",
                {
                    "int_param": 42,
                    "float_param": 3.14,
                    "bool_param": True,
                    "str_param": "hello world",
                    "obj_param": {"key": "value"},
                },
            ),
        ),
        tools=(TYPES,),
    ),
    Case(
        Q + "test_extract_tool_calls_anyof_type_conversion",
        "anyOf / type-list values take their non-null type",
        "qwen3_coder",
        xml(
            "test_anyof",
            ("anyof_int", "5"),
            ("anyof_str", "hello"),
            ("anyof_array", '["a", "b", "c"]'),
            ("anyof_obj", '{"key": "value"}'),
            ("type_as_array", "42"),
            ("multi_non_null", "some text"),
        ),
        TOOL,
        (
            (
                "test_anyof",
                {
                    "anyof_int": 5,
                    "anyof_str": "hello",
                    "anyof_array": ["a", "b", "c"],
                    "anyof_obj": {"key": "value"},
                    "type_as_array": 42,
                    "multi_non_null": "some text",
                },
            ),
        ),
        tools=(ANYOF,),
    ),
    Case(
        Q + "test_extract_tool_calls_anyof_type_conversion_streaming",
        "the same, streamed",
        "qwen3_coder",
        xml("search_web", ("query", "vllm tool parser"), ("count", "10"), ("verbose", "true")),
        TOOL,
        (("search_web", {"query": "vllm tool parser", "count": 10, "verbose": True}),),
        tools=(SEARCH_WEB,),
        chunk_sizes=(1,),
    ),
    Case(
        Q + "test_extract_tool_calls_streaming[no_tools]",
        "plain text streams as content",
        "qwen3_coder",
        "This is a test without tools",
        ANSWER,
        content="This is a test without tools",
        tools=SAMPLE_TOOLS,
        chunk_sizes=(1,),
    ),
    Case(
        Q + "test_extract_tool_calls_streaming[single_tool]",
        "one call, streamed",
        "qwen3_coder",
        DALLAS_XML,
        TOOL,
        (DALLAS,),
        tools=SAMPLE_TOOLS,
        chunk_sizes=(1,),
    ),
    Case(
        Q + "test_extract_tool_calls_streaming[single_tool_with_content]",
        "content then a call, streamed",
        "qwen3_coder",
        "Sure! Let me check the weather for you." + DALLAS_XML,
        TOOL,
        (DALLAS,),
        "Sure! Let me check the weather for you.",
        tools=SAMPLE_TOOLS,
        chunk_sizes=(1,),
    ),
    Case(
        Q + "test_extract_tool_calls_streaming[single_tool_multiline_param]",
        "a multi-line value, streamed",
        "qwen3_coder",
        RECTANGLE_XML,
        TOOL,
        (RECTANGLE,),
        tools=SAMPLE_TOOLS,
        chunk_sizes=(1,),
    ),
    Case(
        Q + "test_extract_tool_calls_streaming[parallel_tools]",
        "two calls, streamed",
        "qwen3_coder",
        DALLAS_XML + "\n" + ORLANDO_C_XML,
        TOOL,
        (DALLAS, ("get_current_weather", {"city": "Orlando", "state": "FL", "unit": "celsius"})),
        tools=SAMPLE_TOOLS,
        chunk_sizes=(1,),
    ),
    Case(
        Q + "test_extract_tool_calls_streaming[tool_with_typed_params]",
        "typed values, streamed",
        "qwen3_coder",
        "Let me calculate that area for you." + CIRCLE_XML,
        TOOL,
        (CIRCLE,),
        "Let me calculate that area for you.",
        tools=SAMPLE_TOOLS,
        chunk_sizes=(1,),
    ),
    Case(
        Q + "test_extract_tool_calls_missing_closing_parameter_tag",
        "arguments recovered around a missing </parameter>",
        "qwen3_coder",
        MISSING_CLOSE,
        INVALID,
        reason="nested tool-call markup in argument 'city'",
        tools=SAMPLE_TOOLS,
        differs=RECOVERY,
    ),
    Case(
        Q + "test_extract_tool_calls_streaming_missing_closing_tag",
        "the same, streamed",
        "qwen3_coder",
        MISSING_CLOSE,
        INVALID,
        reason="nested tool-call markup in argument 'city'",
        tools=SAMPLE_TOOLS,
        differs=RECOVERY,
        chunk_sizes=(1,),
    ),
    Case(
        Q + "test_extract_tool_calls_streaming_incremental",
        "content streams first, then the call (vLLM: its arguments in parts; minirl: whole, at the turn's end)",
        "qwen3_coder",
        "I'll check the weather." + xml("get_current_weather", ("city", "Dallas"), ("state", "TX")),
        TOOL,
        (("get_current_weather", {"city": "Dallas", "state": "TX"}),),
        "I'll check the weather.",
        tools=SAMPLE_TOOLS,
        chunk_sizes=(1,),
    ),
    Case(
        Q + "test_extract_tool_calls_streaming_missing_opening_tag",
        "a call with </tool_call> but no <tool_call>",
        "qwen3_coder",
        "I'll check the weather for you.\n\n" + DALLAS_XML[len("<tool_call>\n") :],
        INVALID,
        reason="</tool_call> without a <tool_call> before it",
        tools=SAMPLE_TOOLS,
        differs=NO_TOOL_CALL_TAG,
        chunk_sizes=(1,),
    ),
    Case(
        Q + "test_malformed_xml_no_gt_delimiter",
        "no crash, no None call on a function tag without '>'",
        "qwen3_coder",
        NO_GT,
        INVALID,
        reason="no valid function name",
        tools=SAMPLE_TOOLS,
    ),
    Case(
        Q + "test_none_tool_calls_filtered",
        "a malformed block is dropped, the good one kept",
        "qwen3_coder",
        BAD_THEN_GOOD,
        INVALID,
        reason="no valid function name",
        tools=SAMPLE_TOOLS,
        differs=ONE_BAD_BLOCK,
    ),
    Case(
        Q + "test_anyof_parameter_not_double_encoded",
        "an anyOf object value is an object",
        "qwen3_coder",
        xml("update_record", ("data", '{"key": "value", "count": 42}'), framed=False),
        TOOL,
        (("update_record", {"data": {"key": "value", "count": 42}}),),
        tools=(UPDATE_RECORD,),
    ),
    Case(
        Q + "test_streaming_multi_param_single_chunk",
        "three parameters in one delta",
        "qwen3_coder",
        DALLAS_XML,
        TOOL,
        (DALLAS,),
        tools=SAMPLE_TOOLS,
        deltas=(
            "<tool_call>",
            "\n<function=get_current_weather>",
            "\n",
            (
                "<parameter=city>\nDallas\n</parameter>\n<parameter=state>\nTX\n</parameter>\n"
                "<parameter=unit>\nfahrenheit\n</parameter>"
            ),
            "\n</function>",
            "\n</tool_call>",
        ),
    ),
    Case(
        Q + "test_no_double_serialization_string_args",
        "a string value is not encoded twice",
        "qwen3_coder",
        xml("greet", ("message", "hello world"), framed=False),
        TOOL,
        (("greet", {"message": "hello world"}),),
        tools=(GREET,),
    ),
    # -- test_qwen3_xml_coder_shared.py, the cases test_qwen3coder_tool_parser.py does not have ------------------
    Case(
        S + "test_extract_tool_calls_complex_type_with_single_quote",
        "a Python-literal object is read",
        "qwen3_coder",
        xml("test_types", ("obj_param", "{'key': 'value'}")),
        TOOL,
        (("test_types", {"obj_param": "{'key': 'value'}"}),),
        tools=(TYPES,),
        differs=PYTHON_LITERAL,
    ),
    Case(
        S + "test_extract_tool_calls_streaming_speculative_decode_loss",
        "parameters and the call's end in one delta",
        "qwen3_coder",
        "<tool_call>\n<function=test>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
        TOOL,
        (("test", {"city": "Paris"}),),
        deltas=("<tool_call>\n<function=test>\n", "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"),
    ),
    Case(
        S + "test_string_null_value_preserved",
        "a string parameter keeps the text null",
        "qwen3_coder",
        xml("search", ("query", "null"), framed=False),
        TOOL,
        (("search", {"query": "null"}),),
        tools=(function("search", {"query": {"type": "string"}}),),
    ),
    Case(
        S + "test_anyof_string_null_keeps_value_as_string",
        "anyOf string or null keeps 42 as text",
        "qwen3_coder",
        xml("set_code", ("code", "42"), framed=False),
        TOOL,
        (("set_code", {"code": "42"}),),
        tools=(function("set_code", {"code": {"anyOf": [{"type": "string"}, {"type": "null"}]}}),),
    ),
    Case(
        S + "test_anyof_integer_null_parses_as_int",
        "anyOf integer or null reads 42 as an integer",
        "qwen3_coder",
        xml("set_count", ("count", "42"), framed=False),
        TOOL,
        (("set_count", {"count": 42}),),
        tools=(function("set_count", {"count": NULLABLE}),),
    ),
    Case(
        S + "test_anyof_object_param_not_double_encoded_streaming",
        "an anyOf object value, streamed",
        "qwen3_coder",
        xml("update_record", ("data", '{"key": "value", "count": 42}'), framed=False),
        TOOL,
        (("update_record", {"data": {"key": "value", "count": 42}}),),
        tools=(UPDATE_RECORD,),
        deltas=(
            "<tool_call>",
            "\n<function=update_record>",
            '\n<parameter=data>{"key": "value", "count": 42}</parameter>',
            "\n</function>",
            "\n</tool_call>",
        ),
    ),
    *(
        Case(
            S + f"test_double_encoded_object_param_{mode}",
            "an object written as a JSON string of a Python literal is read",
            "qwen3_coder",
            xml("process", ("name", "hello"), ("data", "\"{'key': 'value', 'n': 1}\"")) + "\n",
            TOOL,
            (("process", {"name": "hello", "data": "\"{'key': 'value', 'n': 1}\""}),),
            tools=(PROCESS,),
            differs=PYTHON_LITERAL,
            chunk_sizes=sizes,
        )
        for mode, sizes in [("nonstreaming", ()), ("streaming", (1,))]
    ),
    *(
        Case(
            S + f"test_{name}_{mode}",
            checks,
            "qwen3_coder",
            text,
            INVALID,
            tools=(WRITE_FILE,),
            reason=reason,
            differs=MARKUP_IN_VALUE,
            chunk_sizes=sizes,
        )
        for name, checks, text, reason in [
            (
                "content_with_xml_structural_tags",
                "call tags inside a string value stay in it",
                write_file_call("test.py", TAGS_IN_VALUE) + "\n",
                "nested <tool_call> tags",
            ),
            (
                "content_with_param_like_lines",
                "</parameter> and <parameter=...> lines inside a value",
                write_file_call("test_template.py", PARAM_LIKE_LINES) + "\n",
                "unexpected text in <function=write_file>",
            ),
            (
                "content_with_real_param_name_literal",
                "a literal <parameter=path> inside the content value",
                write_file_call("fixture.py", REAL_PARAM_LITERAL),
                "nested tool-call markup in argument 'content'",
            ),
            (
                "content_with_full_nested_tool_call",
                "a whole literal call inside a value",
                write_file_call("fixture.py", FULL_NESTED),
                "nested <tool_call> tags",
            ),
            (
                "two_tools_second_with_out_of_schema_nested_literal",
                "two calls, the second holding a literal call",
                xml("foo", ("bar", "baz"), framed=False) + "\n\n" + write_file_call("fixture.py", OUT_OF_SCHEMA),
                "nested <tool_call> tags",
            ),
        ]
        for mode, sizes in [("nonstreaming", ()), ("streaming", (1,))]
    ),
    Case(
        S + "test_array_with_json_bool",
        "an array with JSON true is a list",
        "qwen3_coder",
        xml("pick", ("items", '["a", "b", 1, true]')),
        TOOL,
        (("pick", {"items": ["a", "b", 1, True]}),),
        tools=(PICK,),
    ),
    Case(
        S + "test_two_tool_calls_in_one_streaming_chunk",
        "two whole calls in one delta",
        "qwen3_coder",
        TWO_WEATHER,
        TOOL,
        (("get_weather", {"city": "Paris"}), ("get_weather", {"city": "London"})),
        tools=(GET_WEATHER,),
        deltas=(TWO_WEATHER,),
    ),
    Case(
        S + "test_python_none_value_for_nullable_int",
        "None for a nullable integer is null",
        "qwen3_coder",
        xml("set_count", ("count", "None"), framed=False),
        TOOL,
        (("set_count", {"count": None}),),
        tools=(function("set_count", {"count": NULLABLE}),),
    ),
    Case(
        S + "test_streaming_two_tool_calls_plus_trailing_text_one_delta",
        "text after two calls in the same delta",
        "qwen3_coder",
        TWO_WEATHER + "\nAll done!",
        TOOL,
        (("get_weather", {"city": "Paris"}), ("get_weather", {"city": "London"})),
        "All done!",
        tools=(GET_WEATHER,),
        deltas=(TWO_WEATHER + "\nAll done!",),
    ),
    Case(
        S + "test_streaming_trailing_text_with_final_close_in_same_delta",
        "text in the delta that closes the call",
        "qwen3_coder",
        (
            "<tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n</function>\n"
            "</tool_call>\nI hope this helps!"
        ),
        TOOL,
        (("get_weather", {"city": "Paris"}),),
        "I hope this helps!",
        tools=(GET_WEATHER,),
        deltas=(
            "<tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n</function>",
            "\n</tool_call>\nI hope this helps!",
        ),
    ),
    Case(
        S + "test_jinja_template_phantom_tool_call_is_rejected_nonstreaming",
        "a <function={{ tc.name }}> block is dropped, the real call kept",
        "qwen3_coder",
        (
            "<tool_call>\n<function={{ tc.name }}>\n<parameter={{ k }}>\n{{ v }}\n</parameter>\n"
            "</function>\n</tool_call>\n\n"
        )
        + xml("write_file", ("path", "out.txt"), ("content", "hello")),
        INVALID,
        reason="no valid function name",
        tools=(WRITE_FILE,),
        differs=ONE_BAD_BLOCK + " ('no valid function name')",
    ),
    Case(
        S + "test_inline_empty_tool_call_preserves_content_before_real_call",
        "a <tool_call>example</tool_call> mention keeps the text around it",
        "qwen3_coder",
        "I'll show: <tool_call>example</tool_call>. Now real:\n" + xml("log", ("msg", "hi")),
        INVALID,
        reason="does not start with <function=",
        tools=(function("log", {"msg": {"type": "string"}}),),
        differs=(
            "vLLM reads the block without <function=...> as text and keeps the real call; minirl's "
            "turn is invalid: every <tool_call> block is a call, and this one does not start with "
            "<function="
        ),
    ),
    *(
        Case(
            S + f"test_anyof_string_null_with_null_literal_returns_none[{literal}]",
            "null and None for a nullable string are null",
            "qwen3_coder",
            xml("set_value", ("optional", literal), framed=False),
            TOOL,
            (("set_value", {"optional": None}),),
            tools=(function("set_value", {"optional": {"anyOf": [{"type": "string"}, {"type": "null"}]}}),),
        )
        for literal in ["null", "None"]
    ),
    # -- llama3_json --------------------------------------------------------------------------------------------
    Case(
        L + "test_extract_tool_calls_simple",
        "a call inside prose is read, the prose dropped",
        "llama3_json",
        'Here is the result: {"name": "getOpenIncidentsTool", "parameters": {}} Would you like to know more?',
        ANSWER,
        content='Here is the result: {"name": "getOpenIncidentsTool", "parameters": {}} Would you like to know more?',
        differs=PROSE_AROUND_JSON,
    ),
    Case(
        L + "test_extract_tool_calls_with_arguments",
        "a string and an integer argument",
        "llama3_json",
        '{"name": "searchTool", "parameters": {"query": "test query", "limit": 10}}',
        TOOL,
        (("searchTool", {"query": "test query", "limit": 10}),),
    ),
    Case(
        L + "test_extract_tool_calls_no_json",
        "no call in plain text",
        "llama3_json",
        "This is just some text without any tool calls",
        ANSWER,
        content="This is just some text without any tool calls",
    ),
    Case(
        L + "test_extract_tool_calls_invalid_json",
        "broken JSON is no call",
        "llama3_json",
        '{"name": "invalidTool", "parameters": {invalid json}',
        INVALID,
        reason="tool call is not valid JSON",
        differs=NOT_A_CALL + " ('tool call is not valid JSON')",
    ),
    Case(
        L + "test_extract_tool_calls_with_arguments_key",
        "arguments under 'arguments' instead of 'parameters'",
        "llama3_json",
        '{"name": "searchTool", "arguments": {"query": "test"}}',
        TOOL,
        (("searchTool", {"query": "test"}),),
    ),
    Case(
        L + "test_extract_tool_calls_multiple_json",
        "three calls separated by '; '",
        "llama3_json",
        f"{SEARCH_1}; {INCIDENTS}; {SEARCH_2}",
        TOOL,
        THREE_CALLS,
    ),
    Case(
        L + "test_extract_tool_calls_multiple_json_with_whitespace",
        "three calls separated by ' ; '",
        "llama3_json",
        f"{SEARCH_1} ; {INCIDENTS} ; {SEARCH_2}",
        TOOL,
        THREE_CALLS,
    ),
    Case(
        L + "test_extract_tool_calls_multiple_json_with_surrounding_text",
        "three calls inside prose are read",
        "llama3_json",
        f"Here are the results: {SEARCH_1}; {INCIDENTS}; {SEARCH_2} Would you like to know more?",
        ANSWER,
        content=f"Here are the results: {SEARCH_1}; {INCIDENTS}; {SEARCH_2} Would you like to know more?",
        differs=PROSE_AROUND_JSON,
    ),
    Case(
        L + "test_extract_tool_calls_deeply_nested_json",
        "arguments nested five levels deep",
        "llama3_json",
        '{"name": "complexTool", "parameters": {"level1": {"level2": {"level3": {"level4": {"value": "deep"}}}}}}',
        TOOL,
        (("complexTool", {"level1": {"level2": {"level3": {"level4": {"value": "deep"}}}}}),),
    ),
    Case(
        L + "test_extract_tool_calls_multiple_with_deep_nesting",
        "two calls, the second deeply nested",
        "llama3_json",
        (
            '{"name": "simpleTool", "parameters": {"value": "test"}}; {"name": "complexTool", "parameters": '
            '{"config": {"database": {"connection": {"pool": {"size": 10}}}}}}'
        ),
        TOOL,
        (
            ("simpleTool", {"value": "test"}),
            ("complexTool", {"config": {"database": {"connection": {"pool": {"size": 10}}}}}),
        ),
    ),
    Case(
        L + "test_extract_tool_calls_with_quotes_and_brackets_in_string",
        "braces and brackets inside string values",
        "llama3_json",
        (
            '{"name": "searchTool", "parameters": {"query": "test {value} [complex]",'
            '"nested": {"inner": "more {brackets}"}}}'
        ),
        TOOL,
        (("searchTool", {"query": "test {value} [complex]", "nested": {"inner": "more {brackets}"}}),),
    ),
    Case(
        L + "test_extract_tool_calls_with_escaped_quotes_in_nested_json",
        "escaped quotes around braces in a string value",
        "llama3_json",
        '{"name": "parserTool", "parameters": {"text": "He said \\"Hello {world}\\""}}',
        TOOL,
        (("parserTool", {"text": 'He said "Hello {world}"'}),),
    ),
    Case(
        L + "test_extract_tool_calls_missing_name_key",
        "JSON without 'name' is content",
        "llama3_json",
        '{"parameters": {}}',
        INVALID,
        reason="tool call has no string 'name'",
        differs=NOT_A_CALL + " ('tool call has no string 'name'')",
    ),
    Case(
        L + "test_extract_tool_calls_missing_parameters_and_arguments_key",
        "JSON with 'name' but neither 'parameters' nor 'arguments' is content",
        "llama3_json",
        '{"name": "toolWithoutParams"}',
        TOOL,
        (("toolWithoutParams", {}),),
        differs=(
            "vLLM needs 'parameters' or 'arguments' and returns the text as content; minirl reads a call with no "
            "arguments, as it reads a Hermes call without 'arguments', and the tool's schema check then judges it"
        ),
    ),
    Case(
        L + "test_extract_tool_calls_brace_in_trailing_text",
        "a brace in prose after the call does not discard the call",
        "llama3_json",
        SEARCH_TEST + " I used {searchTool} for this.",
        INVALID,
        reason="text after a JSON tool call",
        differs=TEXT_AFTER_JSON,
    ),
    Case(
        L + "test_extract_tool_calls_json_fragment_in_trailing_text",
        "a JSON object without 'name' in prose after the call does not discard the call",
        "llama3_json",
        SEARCH_TEST + ' The arguments I passed were {"query": "test"}',
        INVALID,
        reason="text after a JSON tool call",
        differs=TEXT_AFTER_JSON,
    ),
    *(
        Case(
            L + f"test_extract_tool_calls_streaming_parallel_separators[{label}]",
            "two calls stream whole, whatever separates them",
            "llama3_json",
            SEARCH_1 + separator + INCIDENTS,
            TOOL,
            (("searchTool", {"query": "test1"}), ("getOpenIncidentsTool", {})),
            chunk_sizes=(7,),
        )
        for label, separator in [("; ", "; "), (";", ";"), (";\\n", ";\n"), ("\\n", "\n")]
    ),
    # -- deepseek_v3: common_tests.py's tests on the outputs of test_deepseekv3_tool_parser.py ----------------------
    Case(
        D + "test_no_tool_calls[True,False]",
        "plain text is content",
        "deepseek_v3",
        "How can I help you today? I can check weather for you.",
        ANSWER,
        content="How can I help you today? I can check weather for you.",
        chunk_sizes=(1,),
    ),
    Case(
        D + "test_single_tool_call_simple_args[True,False]",
        "one call, string values",
        "deepseek_v3",
        TOKYO,
        TOOL,
        (("get_weather", {"city": "Tokyo", "unit": "celsius"}),),
        chunk_sizes=(1,),
    ),
    Case(
        D + "test_parallel_tool_calls[True,False]",
        "two calls, in order",
        "deepseek_v3",
        TOKYO_HOTELS,
        TOOL,
        TOKYO_CALLS,
        chunk_sizes=(1,),
    ),
    Case(
        D + "test_various_data_types[True,False]",
        "every JSON type keeps its type",
        "deepseek_v3",
        deepseek(("test_function", DATA_TYPES)),
        TOOL,
        (
            (
                "test_function",
                {
                    "string_field": "hello",
                    "int_field": 42,
                    "float_field": 3.14,
                    "bool_field": True,
                    "null_field": None,
                    "array_field": ["a", "b", "c"],
                    "object_field": {"nested": "value"},
                    "empty_array": [],
                    "empty_object": {},
                },
            ),
        ),
        chunk_sizes=(1,),
    ),
    Case(
        D + "test_empty_arguments[True,False]",
        "a call with {} arguments",
        "deepseek_v3",
        deepseek(("get_current_time", "{}")),
        TOOL,
        (("get_current_time", {}),),
        chunk_sizes=(1,),
    ),
    Case(
        D + "test_surrounding_text[True,False]",
        "content before the calls, then a call",
        "deepseek_v3",
        "Let me check the weather for you." + deepseek(("get_weather", '{"city": "Paris"}')),
        TOOL,
        (("get_weather", {"city": "Paris"}),),
        "Let me check the weather for you.",
        chunk_sizes=(1,),
    ),
    Case(
        D + "test_escaped_strings[True,False]",
        "escaped quotes, backslashes and newlines in values",
        "deepseek_v3",
        deepseek(
            (
                "send_message",
                '{"text": "He said \\"hello\\"", "path": "C:\\\\Users\\\\file", "newline": "line1\\nline2"}',
            )
        ),
        TOOL,
        (("send_message", {"text": 'He said "hello"', "path": "C:\\Users\\file", "newline": "line1\nline2"}),),
        chunk_sizes=(1,),
    ),
    Case(
        D + "test_malformed_input[True,False] (arguments not closed)",
        "no crash on arguments whose JSON is not closed",
        "deepseek_v3",
        deepseek(("get_weather", '{"city": "Tokyo"')),
        INVALID,
        reason="arguments of 'get_weather' are not valid JSON",
        differs=(
            'vLLM returns a call whose arguments are the unparsed text {"city": "Tokyo" (not JSON); minirl\'s '
            "turn is invalid ('arguments of 'get_weather' are not valid JSON'): a call whose arguments do not read "
            "is not run"
        ),
        chunk_sizes=(1,),
    ),
    Case(
        D + "test_malformed_input[True,False] (no tool▁call▁begin)",
        "no crash on a call without its <｜tool▁call▁begin｜> and <｜tool▁call▁end｜>",
        "deepseek_v3",
        NO_CALL_BEGIN,
        ANSWER,
        content='functionget_weather\n```json\n{"city": "Tokyo"}\n```',
        differs=(
            "vLLM's whole-text reading sets tools_called with no call and drops the text (content None; its test "
            "marks this xfail); its streamed reading, like minirl's, has no call and the text as content, where "
            "minirl also drops the stray <｜tool▁sep｜>: no call markup is content"
        ),
        chunk_sizes=(1,),
    ),
    Case(
        D + "test_streaming_reconstruction",
        "streamed and whole readings of one call agree",
        "deepseek_v3",
        TOKYO,
        TOOL,
        (("get_weather", {"city": "Tokyo", "unit": "celsius"}),),
        chunk_sizes=(1,),
    ),
    *(
        Case(
            D + f"test_streaming_split_invariance[{label}]",
            "the streamed calls do not depend on how the deltas are cut",
            "deepseek_v3",
            text,
            TOOL,
            calls,
            chunk_sizes=(1, 2, 3, 5, 8, 13, 9999),
        )
        for label, text, calls in [
            ("single", TOKYO, (("get_weather", {"city": "Tokyo", "unit": "celsius"}),)),
            ("parallel", TOKYO_HOTELS, TOKYO_CALLS),
        ]
    ),
]


def typed(calls) -> list:
    """Calls with each argument's type beside its value: 42 and 42.0, 1 and True are not the same reading."""
    return [(name, {key: (type(value).__name__, value) for key, value in args.items()}) for name, args in calls]


def case_id(case: Case) -> str:
    return case.vllm_test


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_parse_turn_reads_each_vllm_case(case):
    parsed = parse_turn(case.text, case.call_format, tools=case.tools)
    assert parsed.kind is case.kind, parsed.reason
    assert typed([(c.name, c.arguments) for c in parsed.tool_calls]) == typed(case.calls)
    if case.kind is INVALID:
        assert case.reason and case.reason in parsed.reason, parsed.reason
    else:
        assert parsed.content == case.content


STREAMED = [case for case in CASES if case.chunk_sizes or case.deltas]


def chunkings(case: Case) -> list[list[str]]:
    text = case.text
    sized = [[text[i : i + size] for i in range(0, len(text), size)] for size in case.chunk_sizes]
    return sized + ([list(case.deltas)] if case.deltas else [])


@pytest.mark.parametrize("case", STREAMED, ids=case_id)
def test_the_server_splits_each_streamed_case_as_parse_turn_reads_it(case):
    """vLLM streams a call's arguments as they arrive; minirl's TurnSplitter holds a call until the turn ends
    and sends it whole, so a streamed case maps to: the deltas, fed to the splitter, give parse_turn's calls
    and content (for an invalid turn: no calls, and its text as written)."""
    content = case.text.strip() if case.kind is INVALID else case.content
    for deltas in chunkings(case):
        assert "".join(deltas) == case.text
        read_calls = partial(parse_turn, call_format=case.call_format, tools=case.tools)
        splitter = TurnSplitter(read_calls, CALL_FORMATS.get(case.call_format).markup)
        pieces = [piece for delta in deltas for piece in splitter.feed(delta)]
        tail, calls = splitter.finish()
        assert "".join(p.text for p in [*pieces, *tail] if p.channel is Channel.content) == content
        assert [(c.name, c.arguments) for c in calls] == list(case.calls)


def test_the_table_in_docs_lists_every_case_with_its_counts():
    doc = DOC.read_text()
    rows = {row.split("|")[1].strip().strip("`") for row in doc.splitlines() if row.startswith("| `")}
    assert rows == {case.vllm_test for case in CASES}
    agree = sum(not case.differs for case in CASES)
    counts = re.search(r"(\d+) cases: (\d+) agree, (\d+) differ", doc)
    assert counts and tuple(map(int, counts.groups())) == (len(CASES), agree, len(CASES) - agree)
    for case in CASES:
        row = next(row for row in doc.splitlines() if row.startswith(f"| `{case.vllm_test}`"))
        assert ("| agrees |" in row) is not bool(case.differs), case.vllm_test
