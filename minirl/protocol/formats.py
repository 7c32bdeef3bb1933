"""Tool-call formats: where a turn's calls are written (`CallMarkup`) and how the body of one call names a
tool and its arguments (its reader). `protocol.format` picks one by name; it must match the model's chat
template.

    hermes       (MiniMind, Qwen2.5, Qwen3)  <tool_call>
                                             {"name": "calculate_math", "arguments": {"expression": "2+2"}}
                                             </tool_call>
    qwen3_coder  (Qwen3-Coder, Qwen3.5,      <tool_call>
                  ReTool)                    <function=code_interpreter>
                                             <parameter=code>
                                             print(2 + 2)
                                             </parameter>
                                             </function>
                                             </tool_call>
    llama3_json  (Llama 3.1, 3.2)            {"name": "calculate_math", "parameters": {"expression": "2+2"}}
                                             the whole turn, after an optional <|python_tag|>; several
                                             calls are separated by ";" or a line break
    deepseek_v3  (DeepSeek-V3)               <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
                                             ```json
                                             {"expression": "2+2"}
                                             ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
    harmony      (gpt-oss)                   <|channel|>analysis<|message|>Add them.<|end|>
                                             <|start|>assistant to=functions.calculate_math<|channel|>
                                             commentary json<|message|>{"expression": "2+2"}
                                             (one message to a function; analysis is reasoning, the
                                             final channel content)

A reader takes a call's body and the task's tool schemas and returns `(name, arguments)` or a short
reason why the body is malformed. Readers and markup never raise on model text and run in time linear
in its length.

JSON values carry their types. Qwen3-Coder values are text, typed by the tool's schema
(`_typed`): a parameter's types are its `type` (one or a list), `nullable: true`, and the types of its
`anyOf` / `oneOf` alternatives, in schema order. When the schema allows null, `null` (and `None`, how the
template's `| string` writes Python's None) is null; otherwise the text becomes the first of those types
that reads it (string reads any text), and stays text when none does, for the tool's schema check
(minirl.tools.schema) to name the mismatch. Only JSON is read, never Python literals.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from minirl.registry import Registry
from minirl.tools.schema import TYPE_CHECKS, allowed_types

ReadCall = tuple[str, dict[str, Any]]  # (tool name, arguments)
CallReader = Callable[[str, Sequence[dict]], "ReadCall | str"]

LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # JSON can escape one; no text encoding can hold it


def _snippet(text: str, limit: int = 40) -> str:
    """`text` shortened for a reason string (model text can be huge)."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _load_json(text: str) -> Any:
    """json.loads that reports like any other syntax error: deep nesting (RecursionError), an integer too long
    for Python to convert (ValueError beyond sys.get_int_max_str_digits) and an escape of a lone surrogate
    ("\\ud800": no text, and no tokenizer or UTF-8 writer takes it)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text[:40], 0) from None
    except ValueError:
        raise json.JSONDecodeError("an integer with too many digits", text[:40], 0) from None
    if lone_surrogate_at(value) is not None:
        raise json.JSONDecodeError("a \\u escape of a lone surrogate", text[:40], 0)
    return value


def lone_surrogate_at(value: Any, where: str = "") -> str | None:
    """Where in `value` (JSON data, keys included) the first string holding a lone surrogate is, as a path
    under `where` (e.g. `messages[0].content`; `where` itself for the top level); None if nowhere."""
    if isinstance(value, str):
        return where if LONE_SURROGATE.search(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{where}.{key}" if where else str(key)
            found = path if LONE_SURROGATE.search(str(key)) else lone_surrogate_at(item, path)
            if found is not None:
                return found
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = lone_surrogate_at(item, f"{where}[{i}]")
            if found is not None:
                return found
    return None


def _json_object(body: str) -> dict | str:
    """`body` read as a JSON object, or why it is not one."""
    try:
        obj = _load_json(body)
    except json.JSONDecodeError as err:
        return f"tool call is not valid JSON ({err.msg})"
    return obj if isinstance(obj, dict) else "tool call must be a JSON object"


def read_hermes(body: str, tools: Sequence[dict]) -> ReadCall | str:
    """A JSON object with a string `name` and `arguments` given as an object or as a JSON string
    holding one (missing or empty = no arguments). `tools` is not needed: JSON carries types."""
    obj = _json_object(body)
    return obj if isinstance(obj, str) else read_name_and_arguments(obj.get("name"), obj.get("arguments", {}))


def read_name_and_arguments(name: Any, arguments: Any) -> ReadCall | str:
    """`(name, arguments)` from a string name and arguments given as an object or as a JSON string holding
    one (empty = no arguments), as Hermes bodies and OpenAI-style `tool_calls` carry them; else why not."""
    if not isinstance(name, str) or not name:
        return "tool call has no string 'name'"
    if isinstance(arguments, str):
        try:
            arguments = _load_json(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return f"arguments of '{name}' are a string that is not JSON"
    if not isinstance(arguments, dict):
        return f"arguments of '{name}' must be an object"
    return name, arguments


FUNCTION_OPEN, FUNCTION_CLOSE = "<function=", "</function>"
PARAMETER_OPEN, PARAMETER_CLOSE = "<parameter=", "</parameter>"
_NAME = re.compile(r"[^\s<>=/]+")
_SPACE = re.compile(r"\s*")


def _parameter_schemas(tools: Sequence[dict], name: str) -> dict[str, dict]:
    """Parameter name -> its schema for tool `name`; a schema that is not the object it should be declares
    nothing (the values stay text)."""
    for tool in tools:
        function = tool.get("function", tool)
        if isinstance(function, dict) and function.get("name") == name:
            parameters = function.get("parameters")
            properties = parameters.get("properties") if isinstance(parameters, dict) else None
            if not isinstance(properties, dict):
                return {}
            return {key: spec for key, spec in properties.items() if isinstance(spec, dict)}
    return {}


def _schema_types(schema: Any) -> list[str]:
    """The JSON types `schema` allows, in schema order: its own (`type`, one or a list, and "null" for
    `nullable: true`), then the types of each `anyOf` and `oneOf` alternative."""
    if not isinstance(schema, dict):
        return []
    types = [kind for kind in allowed_types(schema) if isinstance(kind, str)]
    for key in ("anyOf", "oneOf"):
        alternatives = schema.get(key)
        for alternative in alternatives if isinstance(alternatives, list) else []:
            types += _schema_types(alternative)
    return types


_UNREAD = object()  # what a text reader returns for text that is not a value of its type


def _json_value(text: str) -> Any:
    try:
        return _load_json(text)
    except json.JSONDecodeError:
        return _UNREAD


def _json_of(kind: str) -> Callable[[str], Any]:
    """A reader of JSON text that is a value of JSON type `kind`, by the argument check's own type test."""

    def read(text: str) -> Any:
        value = _json_value(text)
        return value if value is not _UNREAD and TYPE_CHECKS[kind](value) else _UNREAD

    return read


_SPELLINGS = {  # JSON's and the template's (`| string` on Python values)
    "null": {"null": None, "None": None},
    "boolean": {"true": True, "false": False, "True": True, "False": False},
}

_TEXT_READERS: dict[str, Callable[[str], Any]] = {  # JSON type -> text to a value of it, or _UNREAD
    "string": lambda text: text,
    "null": lambda text: _SPELLINGS["null"].get(text.strip(), _UNREAD),
    "boolean": lambda text: _SPELLINGS["boolean"].get(text.strip(), _UNREAD),
    "integer": _json_of("integer"),
    "number": _json_of("number"),
    "object": _json_of("object"),
    "array": _json_of("array"),
}


def _typed(value: str, schema: dict | None) -> Any:
    """`value` read as the first of the schema's types that reads it, null first when the schema allows it
    (module docstring). A type the table does not know (e.g. "float") reads any JSON value."""
    types = _schema_types(schema)
    for kind in (["null"] if "null" in types else []) + types:
        read = _TEXT_READERS.get(kind, _json_value)(value)
        if read is not _UNREAD:
            return read
    return value


def _unframe(value: str) -> str:
    """Drop the one newline the template writes after `<parameter=...>` and before `</parameter>`."""
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


def read_qwen3_coder(body: str, tools: Sequence[dict]) -> ReadCall | str:
    """`<function=NAME>` then `<parameter=ARG>\\nVALUE\\n</parameter>` blocks separated by
    whitespace, then `</function>`; nothing else. A value may span lines and keeps them; nested
    `<function=`/`<parameter=` markup, a repeated argument or stray text make the call malformed."""
    body = body.strip()
    if not body.startswith(FUNCTION_OPEN):
        return f"tool call does not start with {FUNCTION_OPEN}NAME>"
    head_end = body.find(">")
    name = body[len(FUNCTION_OPEN) : head_end] if head_end >= 0 else ""
    if not _NAME.fullmatch(name):
        return f"tool call has no valid function name (got {_snippet(name)})"
    if not body.endswith(FUNCTION_CLOSE):
        return f"{FUNCTION_OPEN}{name}> is not closed by {FUNCTION_CLOSE}"
    inner = body[head_end + 1 : len(body) - len(FUNCTION_CLOSE)]
    schemas = _parameter_schemas(tools, name)
    arguments: dict[str, Any] = {}
    pos = _SPACE.match(inner).end()
    while pos < len(inner):
        if not inner.startswith(PARAMETER_OPEN, pos):
            return f"unexpected text in {FUNCTION_OPEN}{name}>: {_snippet(inner[pos:])}"
        arg_end = inner.find(">", pos)
        arg = inner[pos + len(PARAMETER_OPEN) : arg_end] if arg_end >= 0 else ""
        if not _NAME.fullmatch(arg):
            return f"a parameter of '{name}' has no valid name (got {_snippet(arg)})"
        value_end = inner.find(PARAMETER_CLOSE, arg_end)
        if value_end < 0:
            return f"{PARAMETER_OPEN}{arg}> is not closed by {PARAMETER_CLOSE}"
        value = inner[arg_end + 1 : value_end]
        if any(tag in value for tag in (FUNCTION_OPEN, FUNCTION_CLOSE, PARAMETER_OPEN)):
            return f"nested tool-call markup in argument '{arg}'"
        if arg in arguments:
            return f"argument '{arg}' of '{name}' is given twice"
        arguments[arg] = _typed(_unframe(value), schemas.get(arg))
        pos = _SPACE.match(inner, value_end + len(PARAMETER_CLOSE)).end()
    return name, arguments


_SEP, _FENCE_OPEN, _FENCE_CLOSE = "<｜tool▁sep｜>", "```json\n", "\n```"


def read_deepseek_v3(body: str, tools: Sequence[dict]) -> ReadCall | str:
    """`function<｜tool▁sep｜>NAME`, a newline, then the arguments as a JSON object fenced as ```json ... ```."""
    kind, sep, rest = body.strip().partition(_SEP)
    if not sep or kind != "function":
        return f"tool call does not start with function{_SEP}NAME"
    name, newline, fenced = rest.partition("\n")
    if not newline or not _NAME.fullmatch(name):
        return f"tool call has no valid function name (got {_snippet(name)})"
    if not (fenced.startswith(_FENCE_OPEN) and fenced.endswith(_FENCE_CLOSE)):
        return f"the arguments of '{name}' are not fenced as ```json ... ```"
    try:
        arguments = _load_json(fenced[len(_FENCE_OPEN) : len(fenced) - len(_FENCE_CLOSE)])
    except json.JSONDecodeError as err:
        return f"arguments of '{name}' are not valid JSON ({err.msg})"
    return read_name_and_arguments(name, arguments)


def read_llama3_json(body: str, tools: Sequence[dict]) -> ReadCall | str:
    """A JSON object with a string `name` and its arguments as `parameters` (what the Llama 3 templates
    write) or `arguments`, an object or a JSON string holding one."""
    obj = _json_object(body)
    if isinstance(obj, str):
        return obj
    if "parameters" in obj and "arguments" in obj:
        return "tool call gives both 'parameters' and 'arguments'"
    return read_name_and_arguments(obj.get("name"), obj.get("parameters", obj.get("arguments", {})))


# -- where a turn's calls are ------------------------------------------------------------------

Spans = list[tuple[int, int]]  # (start, end) of each call body in a text
# a markup's reading of a text: the span of each call body, and what does not pair up (unpaired or nested tags,
# text after bare JSON calls), in order; a strict reader stops at the first problem, MiniMind's lenient one drops it
Scan = tuple[Spans, list[str]]


def without_tags(text: str, tags: Sequence[str]) -> str:
    """`text` minus every occurrence of `tags`, including one that removing another brings together
    ("<tool_<tool_call>call>" -> ""), in linear time. Each tag has one ">", at its end, so a tag can
    only complete at a ">": the text is rebuilt piece by piece up to each ">", checking the end."""
    if not any(tag in text for tag in tags):
        return text
    longest = max(map(len, tags))
    *pieces, rest = text.split(">")
    kept: list[str] = []
    for piece in pieces:
        kept.append(piece + ">")
        tail = "".join(kept[-longest:])[-longest:]  # every kept part has at least one character
        for tag in tags:
            if tail.endswith(tag):
                _drop_last_chars(kept, len(tag))
                break
    return "".join(kept) + rest


def _drop_last_chars(parts: list[str], n: int) -> None:
    """Remove the last `n` characters of `"".join(parts)` from `parts` (non-empty strings) in place."""
    while n:
        last = parts.pop()
        if len(last) > n:
            parts.append(last[:-n])
        n = max(0, n - len(last))


THINK_OPEN = "<think>"  # reasoning before the answer or the calls; not part of either
THINK_CLOSE = "</think>"


def think_split(text: str, call_open: str = "", call_close: str = "") -> list[tuple[bool, str]]:
    """`text` as (is_reasoning, piece) pairs in order, empty pieces left out: the inside of each <think> block
    (tags dropped) and the text around the blocks. A call block (`call_open` ... `call_close`; none without
    tags) is kept whole, its think tags being the call's text (minirl.protocol.parsing's docstring)."""
    pieces: list[tuple[bool, str]] = []
    last_call_close = text.rfind(call_close) if call_close else -1  # an open tag after it is not closed
    outside_from = pos = 0
    think = text.find(THINK_OPEN)
    while think >= 0:
        call = text.find(call_open, pos, think) if pos < last_call_close else -1
        if call >= 0:  # a call block before the next <think>: skip it whole
            pos = text.find(call_close, call + len(call_open)) + len(call_close) if call < last_call_close else think
            think = think if think >= pos else text.find(THINK_OPEN, pos)
            continue
        close = text.find(THINK_CLOSE, think + len(THINK_OPEN))
        end = close if close >= 0 else len(text)
        pieces += [(False, text[outside_from:think]), (True, text[think + len(THINK_OPEN) : end])]
        outside_from = pos = end + len(THINK_CLOSE) if close >= 0 else end
        think = text.find(THINK_OPEN, pos)
    pieces.append((False, text[outside_from:]))
    return [(reasoning, piece) for reasoning, piece in pieces if piece]


@dataclass(frozen=True)
class TaggedMarkup:
    """Each call's body between `open` and `close`, text around the calls being content; `wrappers` are tags a
    template puts around a turn's calls (DeepSeek-V3), markup with no content of their own."""

    open: str
    close: str
    wrappers: tuple[str, ...] = ()
    anchored = False  # a call may start anywhere in the turn
    streams = True  # a server can send the text before a call as it arrives

    @property
    def starts(self) -> tuple[str, ...]:
        """Tags that may begin a turn's call markup."""
        return (self.open, *self.wrappers)

    def split_turn(self, text: str) -> list[tuple[bool, str]]:
        """Reasoning and the rest (think_split), call blocks whole."""
        return think_split(text, self.open, self.close)

    def scan(self, text: str) -> Scan:
        """Each call body's span, an open tag pairing with the next close tag as MiniMind's regex pairs them, and
        each problem: a stray close tag (skipped), a block with an open tag nested in it (skipped whole, as the
        regex reads it into one body), an open tag never closed (the rest is text)."""
        spans: Spans = []
        problems: list[str] = []
        pos = 0
        while True:
            start, close = text.find(self.open, pos), text.find(self.close, pos)
            if start < 0 and close < 0:
                return spans, problems
            if start < 0 or 0 <= close < start:
                problems.append(f"{self.close} without a {self.open} before it")
            elif close < 0:
                return spans, [*problems, f"{self.open} is not closed"]
            elif text.find(self.open, start + len(self.open), close) >= 0:
                problems.append(f"nested {self.open} tags")
            else:
                spans.append((start + len(self.open), close))
            pos = close + len(self.close)

    def end_of(self, span: tuple[int, int]) -> int:
        """Where the markup of the call with body `span` ends."""
        return span[1] + len(self.close)

    def without_calls(self, text: str) -> str:
        """`text` minus its call blocks (each closed by the nearest close tag) and wrapper tags; other markup
        stays."""
        kept, pos = [], 0
        while (start := text.find(self.open, pos)) >= 0:
            end = text.find(self.close, start + len(self.open))
            if end < 0:
                break
            kept.append(text[pos:start])
            pos = end + len(self.close)
        kept.append(text[pos:])
        joined = "".join(kept)
        return without_tags(joined, self.wrappers) if self.wrappers else joined

    @property
    def tags(self) -> tuple[str, ...]:
        """Every tag of the format: visible text holds none (`without_tags`)."""
        return (self.open, self.close, *self.wrappers)


PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class BareJsonMarkup:
    """Calls as JSON objects with no tags (Llama 3): a turn whose text, stripped and after an optional
    `<|python_tag|>`, starts with "{" is its calls, separated by ";" or a line break and nothing else; any
    other turn is content. A call's span is one JSON value; text that is not JSON spans to the end, for the
    reader to name the error."""

    anchored = True  # a call only starts the turn (its text outside reasoning, as one piece)
    streams = True
    starts = (PYTHON_TAG, "{")
    tags = ()  # a turn is calls or content: nothing to remove from content

    def split_turn(self, text: str) -> list[tuple[bool, str]]:
        return think_split(text)

    def _calls_from(self, text: str) -> int | None:
        """Where the calls of `text` start, or None when it is content."""
        start = len(text) - len(text.lstrip())
        if text.startswith(PYTHON_TAG, start):
            return _SPACE.match(text, start + len(PYTHON_TAG)).end()
        return start if text.startswith("{", start) else None

    def scan(self, text: str) -> Scan:
        pos = self._calls_from(text)
        if pos is None:
            return [], []
        decoder, spans = json.JSONDecoder(), []
        while True:
            try:
                end = decoder.raw_decode(text, pos)[1]
            except (ValueError, RecursionError):
                return [*spans, (pos, len(text))], []
            spans.append((pos, end))
            pos = _SPACE.match(text, end).end()
            if pos == len(text):
                return spans, []
            if text[pos] == ";":
                pos = _SPACE.match(text, pos + 1).end()
            elif not (text[pos] == "{" and "\n" in text[end:pos]):
                return spans, [f"text after a JSON tool call: {_snippet(text[pos:])}"]

    def end_of(self, span: tuple[int, int]) -> int:
        return span[1]

    def without_calls(self, text: str) -> str:
        return text if self._calls_from(text) is None else ""


HARMONY_MESSAGE, HARMONY_START, HARMONY_END = "<|message|>", "<|start|>assistant", "<|end|>"
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>(\w+)")
FUNCTIONS = "functions."  # the namespace harmony's developer message declares a task's tools in


def _harmony_recipient(piece: str) -> str | None:
    """The recipient in the header of a harmony message (`to=functions.NAME`), or None (no header, or no
    recipient: the message is text)."""
    header, sep, _ = piece.partition(HARMONY_MESSAGE)
    found = _RECIPIENT.search(header) if sep else None
    return found.group(1) if found else None


@dataclass(frozen=True)
class HarmonyMarkup:
    """gpt-oss's harmony: a turn is messages, each a header (`<|channel|>CHANNEL`, a recipient `to=...`, a
    content type) then `<|message|>` and its text; the model opens each after the first with
    `<|start|>assistant` and ends it with `<|end|>`. The analysis channel is reasoning; a message to a recipient
    is a call, whole; any other message's text is content. Text with no header is content."""

    anchored = False
    streams = False  # a server holds a harmony turn until it ends, then splits it
    starts = ()
    tags = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>", "<|return|>")

    def split_turn(self, text: str) -> list[tuple[bool, str]]:
        pieces: list[tuple[bool, str]] = []
        for message in text.split(HARMONY_START):
            message = message.removesuffix(HARMONY_END)
            header, sep, body = message.partition(HARMONY_MESSAGE)
            if not sep or _harmony_recipient(message) is not None:
                pieces.append((False, message))
            else:
                channel = _CHANNEL.search(header)
                pieces.append((channel is not None and channel.group(1) == "analysis", body))
        return [(reasoning, piece) for reasoning, piece in pieces if piece]

    def scan(self, text: str) -> Scan:
        return ([(0, len(text))] if _harmony_recipient(text) is not None else []), []

    def end_of(self, span: tuple[int, int]) -> int:
        return span[1]

    def without_calls(self, text: str) -> str:
        return "" if _harmony_recipient(text) is not None else text


def read_harmony(body: str, tools: Sequence[dict]) -> ReadCall | str:
    """A message to `functions.NAME` whose text is the arguments as a JSON object."""
    recipient = _harmony_recipient(body) or ""
    if not recipient.startswith(FUNCTIONS):
        return f"a call to {_snippet(recipient)}, not to one of the functions"
    name = recipient[len(FUNCTIONS) :]
    if not _NAME.fullmatch(name):
        return f"tool call has no valid function name (got {_snippet(name)})"
    try:
        arguments = _load_json(body.partition(HARMONY_MESSAGE)[2])
    except json.JSONDecodeError as err:
        return f"arguments of '{name}' are not valid JSON ({err.msg})"
    return read_name_and_arguments(name, arguments)


CallMarkup = TaggedMarkup | BareJsonMarkup | HarmonyMarkup


@dataclass(frozen=True)
class CallFormat:
    """A model's way of writing tool calls: where they are in a turn, and how one call's body reads."""

    markup: CallMarkup
    read: CallReader


CALL_FORMATS: Registry[CallFormat] = Registry("tool-call format")
TOOL_CALL = TaggedMarkup("<tool_call>", "</tool_call>")
CALL_FORMATS.register("hermes")(CallFormat(TOOL_CALL, read_hermes))
CALL_FORMATS.register("qwen3_coder")(CallFormat(TOOL_CALL, read_qwen3_coder))
CALL_FORMATS.register("llama3_json")(CallFormat(BareJsonMarkup(), read_llama3_json))
DEEPSEEK_V3_CALL = TaggedMarkup(  # the separator is a call's markup too: outside a call it is none of the content
    "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", wrappers=("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", _SEP)
)
CALL_FORMATS.register("deepseek_v3")(CallFormat(DEEPSEEK_V3_CALL, read_deepseek_v3))
CALL_FORMATS.register("harmony")(CallFormat(HarmonyMarkup(), read_harmony))
