"""`python -m minirl.serve`: the OpenAI-compatible server, driven with the official openai client.

Most tests talk to one real server process (conftest's `openai_server`) serving the memorised tool model:
greedy decoding greets on GREETING (after a <think> block) and answers CONVERSATION with two calculate_math
calls, then with the sum. Queue-full, batching and internal-error tests run the app in-process over a
scripted decoder that a test can hold; the turn splitter and the decoder are also tested on their own.
The API-key tests share a second server, given its key as $MINIRL_API_KEY; one more binds 0.0.0.0.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial

import httpx
import openai
import pytest
import torch
import uvicorn
from rich.console import Console
from support import CALC_TOOL, CONVERSATION, GREETING, WAIT_S, ScriptedDecoder, start_server, third_party_template
from transformers import AutoModelForCausalLM, AutoTokenizer

from minirl.config import Config, EvalConfig, ProtocolConfig, ServeConfig
from minirl.errors import ConfigError
from minirl.evaluation.backends import OpenAIBackend
from minirl.inference.loop import StopReason
from minirl.inference.sampling import SamplingParams
from minirl.protocol.chat import render
from minirl.protocol.formats import CALL_FORMATS, TOOL_CALL
from minirl.protocol.parsing import TurnKind, parse_turn
from minirl.serving.app import ServedModel, create_app
from minirl.serving.auth import API_KEY_ENV, is_loopback, resolve_api_key
from minirl.serving.decoder import Decoder, DecodeRow, RowResult
from minirl.serving.scheduler import Scheduler
from minirl.serving.turn_splitter import Channel, TurnSplitter
from minirl.tools import ToolExecutor, build_tools
from minirl.tools.base import ToolCall

GREETING_PROMPT = GREETING[:2]
QUESTION = CONVERSATION[:2]  # system + user: the model answers with two calls
ANSWER = CONVERSATION[-1]["content"]
CALLS = [("calculate_math", {"expression": "256 * 37"}), ("calculate_math", {"expression": "12 + 30"})]

# -- the turn splitter --------------------------------------------------------------------------

CALLS_TEXT = "\n".join(
    f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'
    for name, arguments in CALLS
)
INVALID_CALL = 'Let me see <tool_call>{"name": oops}</tool_call>'
TURNS = {  # id: (text, content, reasoning, calls)
    "greeting": (GREETING[2]["content"], "Hello! How can I help?", "A greeting.", []),
    "calls": (CALLS_TEXT, "", "", CALLS),
    "text around calls": (
        f"<think>Two sums.</think> Let me compute. {CALLS_TEXT} Done soon.\n",
        "Let me compute. \n Done soon.",  # what is left between and around the blocks
        "Two sums.",
        CALLS,
    ),
    "invalid call": (INVALID_CALL, INVALID_CALL, "", []),  # sent as written, markup and all
    "whitespace": ("  <think> hm </think>\n\nHi there \n", "Hi there", "hm", []),
    "unclosed think": ("<think>still thinking", "", "still thinking", []),
    "call in reasoning": (f"<think>Or {CALLS_TEXT}?</think>It is 42.", "It is 42.", f"Or {CALLS_TEXT}?", []),
    "reasoning after calls": (f"{CALLS_TEXT}<think>a <tool_call></think> ok", "ok", "a <tool_call>", CALLS),
    "reasoning never closed": (f"<think>So {CALLS_TEXT}", "", f"So {CALLS_TEXT}", []),
}
read_hermes_calls = partial(parse_turn, call_format="hermes", tools=[CALC_TOOL])


def split(
    chunks: list[str], read_calls=read_hermes_calls, markup=TOOL_CALL
) -> tuple[str, str, list[tuple[str, dict]], list]:
    """(content, reasoning, calls, pieces) from feeding `chunks` to a TurnSplitter."""
    splitter = TurnSplitter(read_calls, markup)
    pieces = [piece for chunk in chunks for piece in splitter.feed(chunk)]
    tail, calls = splitter.finish()
    pieces += tail
    content = "".join(p.text for p in pieces if p.channel is Channel.content)
    reasoning = "".join(p.text for p in pieces if p.channel is Channel.reasoning)
    return content, reasoning, [(c.name, c.arguments) for c in calls], pieces


@pytest.mark.parametrize("turn", TURNS)
def test_splitter_gives_the_same_split_whatever_the_chunks(turn):
    text, *expected = TURNS[turn]
    assert list(split([text])[:3]) == expected
    for i in range(len(text) + 1):  # every two- and three-chunk split: tags cut at every position
        for j in range(i, len(text) + 1):
            content, reasoning, calls, pieces = split([text[:i], text[i:j], text[j:]])
            assert [content, reasoning, calls] == expected, (i, j)


@pytest.mark.parametrize("turn", [turn for turn in TURNS if turn != "invalid call"])
def test_splitter_reads_a_turn_as_training_does(turn):
    """The server's split and training's parse_turn agree on the calls and the content of the same text."""
    text = TURNS[turn][0]
    content, _, calls, _ = split([text])
    parsed = read_hermes_calls(text)
    assert (content, calls) == (parsed.content, [(c.name, c.arguments) for c in parsed.tool_calls])


@pytest.mark.parametrize("turn", ["greeting", "calls", "text around calls"])
def test_splitter_never_sends_markup_of_a_valid_turn(turn, tokenizer):
    """Token by token, as the decoder sends text: no piece holds a tag or a part of one."""
    text, *expected = TURNS[turn]
    ids = tokenizer.encode(text, add_special_tokens=False)
    texts = [tokenizer.decode(ids[:k]) for k in range(len(ids) + 1)]
    deltas = [after[len(before) :] for before, after in zip(texts, texts[1:])]
    content, reasoning, calls, pieces = split(deltas)
    assert [content, reasoning, calls] == expected
    assert not any("<" in p.text or ">" in p.text for p in pieces)


def test_splitter_streams_content_before_the_turn_ends():
    splitter = TurnSplitter(read_hermes_calls, TOOL_CALL)
    assert splitter.feed("<thi") == []  # may be a tag: held
    assert [(p.channel, p.text) for p in splitter.feed("nk>Hm.</think>Hi <")] == [
        (Channel.reasoning, "Hm."),
        (Channel.content, "Hi"),
    ]
    assert [p.text for p in splitter.feed("3 you")] == [" <3 you"]


LLAMA_CALL = '{"name": "calculate_math", "parameters": {"expression": "2+2"}}'
DEEPSEEK_CALL = (
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calculate_math\n```json\n"
    '{"expression": "2+2"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
)
SUM = [("calculate_math", {"expression": "2+2"})]
OTHER_FORMAT_TURNS = {  # id: (format, text, content, reasoning, calls)
    "llama call": ("llama3_json", f"  {LLAMA_CALL}", "", "", SUM),
    "llama call after python_tag": ("llama3_json", f"<|python_tag|>{LLAMA_CALL}", "", "", SUM),
    "llama call after reasoning": ("llama3_json", f"<think>Add.</think>\n{LLAMA_CALL}", "", "Add.", SUM),
    "llama answer with braces": ("llama3_json", "It is {4}, see {x}.", "It is {4}, see {x}.", "", []),
    "llama broken call": ("llama3_json", '{"name": "calculate_math"', '{"name": "calculate_math"', "", []),
    "deepseek call": ("deepseek_v3", f"Adding.{DEEPSEEK_CALL}", "Adding.", "", SUM),
    "deepseek answer": ("deepseek_v3", "It is 4.", "It is 4.", "", []),
    "harmony call": (
        "harmony",
        "<|channel|>analysis<|message|>Add.<|end|><|start|>assistant to=functions.calculate_math<|channel|>"
        'commentary json<|message|>{"expression": "2+2"}',
        "",
        "Add.",
        SUM,
    ),
    "harmony answer": (
        "harmony",
        "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is 4.",
        "It is 4.",
        "Easy.",
        [],
    ),
}


@pytest.mark.parametrize("turn", OTHER_FORMAT_TURNS)
def test_splitter_reads_the_other_formats_as_training_does_whatever_the_chunks(turn):
    """Llama 3's bare JSON (a call only when the content starts with one), DeepSeek-V3's tags and harmony's
    channels (held to the end of the turn): every two-chunk split gives the same content, reasoning and calls,
    and those of parse_turn on a valid turn."""
    call_format, text, *expected = OTHER_FORMAT_TURNS[turn]
    read_calls = partial(parse_turn, call_format=call_format, tools=[CALC_TOOL])
    markup = CALL_FORMATS.get(call_format).markup
    for i in range(len(text) + 1):
        content, reasoning, calls, _ = split([text[:i], text[i:]], read_calls, markup)
        assert [content, reasoning, calls] == expected, i
    parsed = read_calls(text)
    if parsed.kind is not TurnKind.INVALID:
        assert (parsed.content, [(c.name, c.arguments) for c in parsed.tool_calls]) == (expected[0], expected[2])


def test_splitter_without_call_reading_keeps_tool_call_markup_as_content():
    content, reasoning, calls, _ = split([CALLS_TEXT[:30], CALLS_TEXT[30:]], read_calls=None)
    assert (content, reasoning, calls) == (CALLS_TEXT, "", [])


# -- the decoder --------------------------------------------------------------------------------


class RecordingSink:
    """Keeps what a row streamed; cancels the row after `cancel_after` text deltas."""

    def __init__(self, cancel_after: int | None = None) -> None:
        self.deltas: list[str] = []
        self.result: RowResult | None = None
        self.cancel_after = cancel_after

    def cancelled(self) -> bool:
        return self.cancel_after is not None and len(self.deltas) >= self.cancel_after

    def text(self, delta: str) -> None:
        self.deltas.append(delta)

    def done(self, result: RowResult) -> None:
        assert self.result is None, "a row finishes once"
        self.result = result


@pytest.fixture(scope="module")
def tool_model(tool_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tool_model_dir).eval()
    return model, AutoTokenizer.from_pretrained(tool_model_dir)


def decode(tool_model, rows: list[tuple[list[dict], SamplingParams]], sinks=None) -> list[RecordingSink]:
    model, tokenizer = tool_model
    sinks = sinks or [RecordingSink() for _ in rows]
    prompts = [render(tokenizer, messages, [CALC_TOOL] if messages is QUESTION else None, True) for messages, _ in rows]
    Decoder(model, tokenizer).decode([DecodeRow(p, spec, sink) for p, (_, spec), sink in zip(prompts, rows, sinks)])
    for sink in sinks:
        assert "".join(sink.deltas) == sink.result.text  # streamed text adds up to the result
    return sinks


def test_batched_kv_cache_decoding_matches_generate(tool_model):
    model, tokenizer = tool_model
    rows = [(GREETING_PROMPT, SamplingParams(64, temperature=0)), (QUESTION, SamplingParams(64, temperature=0))]
    sinks = decode(tool_model, rows)  # prompts of different lengths: left padding must not matter
    for (messages, _), sink in zip(rows, sinks):
        prompt = render(tokenizer, messages, [CALC_TOOL] if messages is QUESTION else None, True)
        out = model.generate(torch.tensor([prompt]), max_new_tokens=64, do_sample=False)[0, len(prompt) :].tolist()
        assert out[-1] == tokenizer.eos_token_id
        assert sink.result == RowResult(tokenizer.decode(out[:-1]), StopReason.stop, len(out))
    assert sinks[0].result.text == GREETING[2]["content"]


def test_rows_stop_at_their_own_stop_strings_and_max_tokens(tool_model):
    greedy = partial(SamplingParams, temperature=0)
    rows = [
        (GREETING_PROMPT, greedy(64, stop=("How", "xyz"))),
        (GREETING_PROMPT, greedy(3)),
        (GREETING_PROMPT, greedy(64)),
    ]
    stopped, cut, full = (sink.result for sink in decode(tool_model, rows))
    assert stopped.text == "<think>A greeting.</think>Hello! " and stopped.finish_reason is StopReason.stop
    assert cut.finish_reason is StopReason.length and cut.completion_tokens == 3
    assert full.text == GREETING[2]["content"] and full.completion_tokens > stopped.completion_tokens


def test_a_seeded_row_samples_the_same_tokens_whatever_its_batch(tool_model):
    seeded = (GREETING_PROMPT, SamplingParams(64, temperature=1.5, seed=7))
    alone = decode(tool_model, [seeded])[0].result
    others = [(QUESTION, SamplingParams(64, temperature=1.5)), (GREETING_PROMPT, SamplingParams(5, temperature=1.0))]
    batched = decode(tool_model, [others[0], seeded, others[1]])[1].result
    assert batched == alone


def test_a_row_ends_on_every_end_of_turn_token_of_the_generation_config(tool_model):
    """The decoder ends a turn as the rollout engines do (`end_of_turn_ids`): on a token the generation config
    lists next to the tokenizer's EOS (here the greeting's fourth token), which stays out of the text."""
    model, tokenizer = tool_model
    prompt = render(tokenizer, GREETING_PROMPT, None, True)
    full = model.generate(torch.tensor([prompt]), max_new_tokens=64, do_sample=False)[0, len(prompt) :].tolist()
    assert full[3] not in full[:3]
    listed = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, full[3]]
    try:
        decoder = Decoder(model, tokenizer)
    finally:
        model.generation_config.eos_token_id = listed
    sink = RecordingSink()
    decoder.decode([DecodeRow(prompt, SamplingParams(64, temperature=0), sink)])
    assert sink.result == RowResult(tokenizer.decode(full[:3]), StopReason.stop, 4)


def test_a_cancelled_row_stops_and_the_others_go_on(tool_model):
    sinks = [RecordingSink(cancel_after=2), RecordingSink()]
    rows = [(QUESTION, SamplingParams(64, temperature=0)), (GREETING_PROMPT, SamplingParams(64, temperature=0))]
    cancelled, finished = (sink.result for sink in decode(tool_model, rows, sinks))
    assert cancelled.finish_reason is StopReason.cancelled and cancelled.completion_tokens < 10
    assert finished.text == GREETING[2]["content"]


# -- the app in-process, over a scripted decoder ------------------------------------------------


class EndlessDecoder(ScriptedDecoder):
    """Streams "x" on every row of a batch until the row is cancelled; counts the cancelled rows."""

    def __init__(self) -> None:
        super().__init__()
        self.cancelled = 0

    def decode(self, rows: list[DecodeRow]) -> None:
        self.batches.append(len(rows))
        live = list(rows)
        while live:
            going = []
            for row in live:  # read each row's cancellation once: it may arrive at any moment
                row.sink.text("x")
                if row.sink.cancelled():
                    row.sink.done(RowResult("x", StopReason.cancelled, 1))
                    self.cancelled += 1
                else:
                    going.append(row)
            live = going
            time.sleep(0.001)


class BrokenResultDecoder(ScriptedDecoder):
    """Answers every row with a result whose finish reason is no StopReason: a bug inside the server."""

    def decode(self, rows: list[DecodeRow]) -> None:
        for row in rows:
            row.sink.text("ok")
            row.sink.done(RowResult("ok", "not a finish reason", 1))


class ExplodingTokenizer:
    """The real tokenizer, except that a message saying "explode" breaks the chat template unexpectedly."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def apply_chat_template(self, messages, **kwargs):
        if any(message["content"] == "explode" for message in messages):
            raise RuntimeError("unexpected")
        return self.tokenizer.apply_chat_template(messages, **kwargs)


@contextmanager
def app_server(decoder, tokenizer, max_batch_size: int = 4, max_queue: int = 8) -> Iterator[str]:
    """The app on a free loopback port in this process; yields its base URL."""
    serve = ServeConfig(max_batch_size=max_batch_size, max_queue=max_queue)
    scheduler = Scheduler(decoder, max_batch_size, max_queue)
    app = create_app(scheduler, ServedModel("scripted", tokenizer, 2048), serve, ProtocolConfig())
    config = uvicorn.Config(app, "127.0.0.1", 0, log_level="warning")
    sock = config.bind_socket()
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for(lambda: server.started)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    finally:
        decoder.permits.release(100)  # nothing may stay held at shutdown
        server.should_exit = True
        thread.join(WAIT_S)


def wait_for(condition: Callable[[], bool]) -> None:
    """Poll until `condition()` holds; WAIT_S only guards against a hang."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "the server never reached the expected state"
        time.sleep(0.01)


def health(base_url: str) -> dict:
    return httpx.get(base_url.removesuffix("/v1") + "/health").json()


def ask(base_url: str, model: str = "scripted", **kwargs):
    client = openai.OpenAI(base_url=base_url, api_key="EMPTY", max_retries=0)
    return client.chat.completions.create(model=model, messages=GREETING_PROMPT, **kwargs)


def test_a_full_queue_answers_429_and_the_queued_requests_still_run(tokenizer):
    decoder = ScriptedDecoder()
    with app_server(decoder, tokenizer, max_batch_size=1, max_queue=1) as url, ThreadPoolExecutor(2) as pool:
        running = pool.submit(ask, url)
        wait_for(lambda: health(url)["running_rows"] == 1)  # the worker holds this one
        queued = pool.submit(ask, url)
        wait_for(lambda: health(url)["waiting"] == 1)
        with pytest.raises(openai.RateLimitError) as refused:
            ask(url)
        assert refused.value.status_code == 429 and refused.value.code == "queue_full"
        decoder.permits.release(2)
        assert [f.result().choices[0].message.content for f in (running, queued)] == ["ok", "ok"]
    assert decoder.batches == [1, 1]


def test_a_batch_takes_the_waiting_requests_in_order_while_their_rows_fit(tokenizer):
    decoder = ScriptedDecoder()
    with app_server(decoder, tokenizer, max_batch_size=4) as url, ThreadPoolExecutor(4) as pool:
        first = pool.submit(ask, url)
        wait_for(lambda: health(url)["running_rows"] == 1)
        later = []
        for queued, n in enumerate((2, 1, 2), start=1):  # rows: 2 + 1 fit a batch of 4, the next 2 do not
            later.append(pool.submit(ask, url, n=n))
            wait_for(lambda queued=queued: health(url)["waiting"] == queued)
        decoder.permits.release(3)
        responses = [f.result() for f in (first, *later)]
    assert decoder.batches == [1, 3, 2]
    assert [len(r.choices) for r in responses] == [1, 2, 1, 2]
    assert all(choice.message.content == "ok" for r in responses for choice in r.choices)


def test_a_client_that_leaves_a_stream_cancels_its_rows(tokenizer):
    decoder = EndlessDecoder()
    with app_server(decoder, tokenizer) as url:
        body = {"model": "scripted", "messages": GREETING_PROMPT, "stream": True, "n": 2}
        with httpx.stream("POST", f"{url}/chat/completions", json=body, timeout=WAIT_S) as response:
            lines = (json.loads(line.removeprefix("data: ")) for line in response.iter_lines() if line)
            assert any(chunk["choices"][0]["delta"].get("content") == "x" for chunk in lines)
        wait_for(lambda: decoder.cancelled == 2)  # the endless rows end only when cancelled
        wait_for(lambda: health(url)["running_rows"] == 0)


def test_a_client_that_gives_up_on_a_whole_response_cancels_its_rows(tokenizer):
    decoder = EndlessDecoder()
    with app_server(decoder, tokenizer) as url:
        body = {"model": "scripted", "messages": GREETING_PROMPT}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/chat/completions", json=body, timeout=0.5)
        wait_for(lambda: decoder.cancelled == 1)  # the endless row ends only when cancelled
        wait_for(lambda: health(url)["running_rows"] == 0)


def test_an_unexpected_error_mid_stream_ends_the_stream_with_an_error_event(tokenizer):
    with app_server(BrokenResultDecoder(), tokenizer) as url:
        body = {"model": "scripted", "messages": GREETING_PROMPT, "stream": True}
        with httpx.stream("POST", f"{url}/chat/completions", json=body, timeout=WAIT_S) as response:
            events = [line.removeprefix("data: ") for line in response.iter_lines() if line]
        assert json.loads(events[-1])["error"]["type"] == "server_error"
        assert "AttributeError" in json.loads(events[-1])["error"]["message"]
        assert health(url)["status"] == "ok"


def test_a_failed_batch_answers_500_and_the_server_goes_on(tokenizer):
    decoder = ScriptedDecoder()
    decoder.permits.release(100)
    with app_server(decoder, tokenizer) as url:
        decoder.fail_next = True
        with pytest.raises(openai.InternalServerError) as failed:
            ask(url)
        assert "scripted failure" in failed.value.message
        decoder.fail_next = True
        with pytest.raises(openai.APIError, match="scripted failure"):
            list(ask(url, stream=True))
        assert ask(url).choices[0].message.content == "ok"


def test_an_unexpected_error_is_a_json_500_and_the_server_goes_on(tokenizer):
    decoder = ScriptedDecoder()
    decoder.permits.release(100)
    with app_server(decoder, ExplodingTokenizer(tokenizer)) as url:
        body = {"model": "scripted", "messages": [{"role": "user", "content": "explode"}]}
        response = httpx.post(f"{url}/chat/completions", json=body)
        assert response.status_code == 500
        assert response.json()["error"]["type"] == "server_error"
        assert ask(url).choices[0].message.content == "ok"


# -- the real server ----------------------------------------------------------------------------

FOLLOW_UP = [  # CONVERSATION up to its final answer, tool-call arguments as the JSON strings clients send
    *QUESTION,
    {
        **CONVERSATION[2],
        "tool_calls": [
            {**call, "function": {**call["function"], "arguments": json.dumps(call["function"]["arguments"])}}
            for call in CONVERSATION[2]["tool_calls"]
        ],
    },
    *CONVERSATION[3:5],
]
PROMPTS = {"greeting": (GREETING_PROMPT, {}), "calls": (QUESTION, {"tools": [CALC_TOOL]})}
PROMPTS["answer"] = (FOLLOW_UP, {"tools": [CALC_TOOL]})


@pytest.fixture(scope="module")
def client(openai_server):
    return openai.OpenAI(base_url=openai_server.base_url, api_key="EMPTY", max_retries=0)


@pytest.fixture(scope="module")
def chat(client, openai_server):
    """chat(messages, **request): a chat completion (or a stream), greedy unless the request says otherwise."""

    def create(messages, **request):
        request = {"temperature": 0, **request}
        return client.chat.completions.create(model=openai_server.model_id, messages=messages, **request)

    return create


def summary(choice) -> tuple:
    """(content, reasoning, [(name, arguments)], finish_reason) of a non-streamed choice."""
    message = choice.message
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]
    return message.content or "", message.reasoning_content or "", calls, choice.finish_reason


class JoinedChoice:
    """One choice of a stream, put back together from its deltas."""

    def __init__(self) -> None:
        self.role: str | None = None
        self.content_deltas: list[str] = []
        self.reasoning = ""
        self.calls: dict[int, list[str]] = {}  # index -> [name, arguments]
        self.finish_reason: str | None = None

    def add(self, choice) -> None:
        delta = choice.delta
        if self.role is None:  # the first delta of a choice names the role
            assert delta.role == "assistant"
            self.role = delta.role
        assert self.finish_reason is None, "nothing follows a choice's finish"
        self.content_deltas.append(delta.content or "")
        self.reasoning += getattr(delta, "reasoning_content", None) or ""  # not OpenAI's: present when sent
        for call in delta.tool_calls or []:
            joined = self.calls.setdefault(call.index, ["", ""])
            joined[0] += call.function.name or ""
            joined[1] += call.function.arguments or ""
            assert call.id is None or call.id.startswith("call_")
        self.finish_reason = choice.finish_reason

    def summary(self) -> tuple:
        calls = [(name, json.loads(arguments)) for name, arguments in self.calls.values()]
        return "".join(self.content_deltas), self.reasoning, calls, self.finish_reason


def join_stream(stream) -> tuple[dict[int, JoinedChoice], object]:
    """Choices by index and the usage of a stream, read to its end ([DONE])."""
    choices: dict[int, JoinedChoice] = {}
    usage = None
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        usage = chunk.usage or usage
        for choice in chunk.choices:
            choices.setdefault(choice.index, JoinedChoice()).add(choice)
    return choices, usage


@pytest.fixture(scope="module")
def qwen3_server(tool_model_dir, tmp_path_factory):
    """The tool model under Qwen3's own chat template, served with model.chat_template_kwargs
    {enable_thinking: false}: (server, its tokenizer)."""
    path = tmp_path_factory.mktemp("qwen3_model")
    AutoModelForCausalLM.from_pretrained(tool_model_dir).save_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(tool_model_dir)
    tokenizer.chat_template = third_party_template("qwen3.jinja")
    tokenizer.save_pretrained(path)
    run_dir = tmp_path_factory.mktemp("serve_qwen3")
    server = start_server(run_dir, f"model.name_or_path={path}", "+model.chat_template_kwargs.enable_thinking=false")
    yield server, tokenizer
    server.stop()


@pytest.mark.parametrize("thinking", [None, True, False], ids=["server-default", "request-on", "request-off"])
def test_a_requests_chat_template_kwargs_go_over_the_servers(qwen3_server, thinking):
    """Qwen3 without thinking opens an empty <think> block in the generation prompt: the prompt the server
    rendered (usage.prompt_tokens) is the one for the request's enable_thinking, else the server's (false)."""
    server, tokenizer = qwen3_server
    client = openai.OpenAI(base_url=server.base_url, api_key="EMPTY", max_retries=0)
    extra = {} if thinking is None else {"chat_template_kwargs": {"enable_thinking": thinking}}
    response = client.chat.completions.create(
        model=server.model_id, messages=GREETING_PROMPT, max_tokens=2, temperature=0, extra_body=extra
    )
    on, off = (len(render(tokenizer, GREETING_PROMPT, None, True, {"enable_thinking": t})) for t in (True, False))
    assert off > on
    assert response.usage.prompt_tokens == (on if thinking else off)


def test_models_lists_the_served_model(client, openai_server):
    assert [model.id for model in client.models.list()] == [openai_server.model_id]
    assert httpx.get(openai_server.base_url.removesuffix("/v1") + "/health").json()["status"] == "ok"


def test_a_plain_chat_separates_reasoning_from_content(chat, tool_model_dir):
    response = chat(GREETING_PROMPT)
    assert response.object == "chat.completion" and response.id.startswith("chatcmpl-")
    assert summary(response.choices[0]) == ("Hello! How can I help?", "A greeting.", [], "stop")
    assert response.choices[0].message.role == "assistant" and response.choices[0].message.tool_calls is None
    tokenizer = AutoTokenizer.from_pretrained(tool_model_dir)
    usage = response.usage
    assert usage.prompt_tokens == len(render(tokenizer, GREETING_PROMPT, None, True))
    assert usage.completion_tokens > 0 and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_a_tool_calling_conversation_over_two_turns(chat):
    first = chat(QUESTION, tools=[CALC_TOOL]).choices[0]
    assert first.finish_reason == "tool_calls" and first.message.content is None
    calls = first.message.tool_calls
    assert [(c.type, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("function", name, arguments) for name, arguments in CALLS
    ]
    assert all(c.id.startswith("call_") for c in calls) and len({c.id for c in calls}) == len(calls)
    executor = ToolExecutor(build_tools(["calculate_math"]), timeout_s=10.0, max_output_chars=1000)
    results = [executor.execute(ToolCall(c.id, c.function.name, json.loads(c.function.arguments))) for c in calls]
    assert [r.content for r in results] == [m["content"] for m in CONVERSATION[3:5]]
    messages = [*QUESTION, first.message.model_dump(exclude_none=True), *(r.to_message() for r in results)]
    assert summary(chat(messages, tools=[CALC_TOOL]).choices[0]) == (ANSWER, "", [], "stop")


@pytest.mark.parametrize("prompt", PROMPTS)
def test_a_stream_adds_up_to_the_non_streamed_response(chat, prompt):
    messages, request = PROMPTS[prompt]
    whole = chat(messages, **request)
    choices, usage = join_stream(chat(messages, stream=True, stream_options={"include_usage": True}, **request))
    assert list(choices) == [0]
    assert choices[0].summary() == summary(whole.choices[0])
    assert not any(
        tag in delta for delta in choices[0].content_deltas for tag in ("<", ">")
    )  # no markup, whole or part
    assert usage == whole.usage


def test_the_event_stream_on_the_wire_ends_with_done(openai_server):
    body = {"model": openai_server.model_id, "messages": GREETING_PROMPT, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{openai_server.base_url}/chat/completions", json=body, timeout=WAIT_S) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert all("usage" not in chunk for chunk in chunks)


def test_with_include_usage_every_chunk_says_usage_and_only_the_last_has_it(openai_server):
    body = {"model": openai_server.model_id, "messages": GREETING_PROMPT, "temperature": 0, "stream": True}
    body["stream_options"] = {"include_usage": True}
    with httpx.stream("POST", f"{openai_server.base_url}/chat/completions", json=body, timeout=WAIT_S) as response:
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert all(chunk["usage"] is None for chunk in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0


def test_tool_choice_none_renders_no_tools_and_reads_no_calls(chat):
    auto = chat(QUESTION, tools=[CALC_TOOL], tool_choice="auto")
    assert summary(auto.choices[0]) == summary(chat(QUESTION, tools=[CALC_TOOL]).choices[0])
    none = chat(QUESTION, tools=[CALC_TOOL], tool_choice="none")
    assert none.usage.prompt_tokens < auto.usage.prompt_tokens  # no tool schemas in the prompt
    assert none.choices[0].message.tool_calls is None and none.choices[0].finish_reason != "tool_calls"


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_end_the_reply_before_them(chat, stream):
    for stop, content in ((["How", "xyz"], "Hello!"), (" can", "Hello! How")):
        response = chat(GREETING_PROMPT, stop=stop, stream=stream)
        choice = join_stream(response)[0][0] if stream else response.choices[0]
        assert (choice.summary() if stream else summary(choice)) == (content, "A greeting.", [], "stop")


def test_max_tokens_ends_the_reply_with_finish_reason_length(chat):
    for request in ({"max_tokens": 3}, {"max_completion_tokens": 3}):
        response = chat(GREETING_PROMPT, **request)
        assert response.choices[0].finish_reason == "length" and response.usage.completion_tokens == 3


def test_a_temperature_below_1e_5_is_greedy(chat):
    for prompt, request in PROMPTS.values():
        assert summary(chat(prompt, temperature=1e-50, **request).choices[0]) == summary(
            chat(prompt, **request).choices[0]
        )


def test_a_seed_repeats_a_sampled_reply(chat):
    first, second = (chat(QUESTION, tools=[CALC_TOOL], temperature=1.0, seed=11) for _ in range(2))
    assert summary(first.choices[0]) == summary(second.choices[0])


@pytest.mark.parametrize("stream", [False, True])
def test_n_choices(chat, stream):
    one = chat(GREETING_PROMPT)
    response = chat(
        GREETING_PROMPT, n=2, stream=stream, **({"stream_options": {"include_usage": True}} if stream else {})
    )
    if stream:
        choices, usage = join_stream(response)
        summaries = {index: choice.summary() for index, choice in choices.items()}
    else:
        summaries, usage = {choice.index: summary(choice) for choice in response.choices}, response.usage
    assert summaries == {0: summary(one.choices[0]), 1: summary(one.choices[0])}
    assert usage.prompt_tokens == one.usage.prompt_tokens
    assert usage.completion_tokens == 2 * one.usage.completion_tokens


def test_concurrent_requests_all_get_their_own_answer(chat):
    names = ["greeting", "calls", "answer"] * 4
    expected = {name: summary(chat(PROMPTS[name][0], **PROMPTS[name][1]).choices[0]) for name in PROMPTS}
    with ThreadPoolExecutor(len(names)) as pool:
        responses = list(pool.map(lambda name: chat(PROMPTS[name][0], **PROMPTS[name][1]), names))
    assert [summary(r.choices[0]) for r in responses] == [expected[name] for name in names]


def test_a_client_that_leaves_mid_stream_does_not_disturb_the_server(chat, openai_server):
    body = {"model": openai_server.model_id, "messages": QUESTION, "tools": [CALC_TOOL], "stream": True}
    with httpx.stream("POST", f"{openai_server.base_url}/chat/completions", json=body, timeout=WAIT_S) as response:
        assert next(response.iter_lines()).startswith("data: ")
    assert summary(chat(GREETING_PROMPT).choices[0])[0] == "Hello! How can I help?"


def test_text_parts_the_developer_role_and_unknown_fields_read_like_a_plain_request(chat):
    messages = [
        {"role": "developer", "content": GREETING_PROMPT[0]["content"]},
        {"role": "user", "content": [{"type": "text", "text": GREETING_PROMPT[1]["content"]}]},
    ]
    unknown = {"frobnicate": True, "metadata": {"run": 1}}  # ignored, as OpenAI ignores what it does not know
    assert summary(chat(messages, extra_body=unknown).choices[0]) == summary(chat(GREETING_PROMPT).choices[0])


BAD_ARGUMENTS = [
    {**FOLLOW_UP[2], "tool_calls": [{**FOLLOW_UP[2]["tool_calls"][0], "function": {"name": "f", "arguments": "{oops"}}]}
]
BAD_REQUESTS = {  # id: (request fields over GREETING_PROMPT's, the param the error names)
    "no messages": ({"messages": []}, "messages"),
    "unknown role": ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    "mistyped content": ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    "missing content": ({"messages": [{"role": "user"}]}, "messages[0].content"),
    "tool without a function": ({"tools": [{"type": "function"}]}, "tools[0].function"),
    "tool of another type": ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools[0].type"),
    "arguments that are not JSON": (
        {"messages": [*QUESTION, *BAD_ARGUMENTS]},
        "messages[2].tool_calls[0].function.arguments",
    ),
    "n below 1": ({"n": 0}, "n"),
    "n above the batch": ({"n": 1000}, "n"),
    "temperature above 2": ({"temperature": 2.5}, "temperature"),
    "negative temperature": ({"temperature": -0.5}, "temperature"),
    "top_p 0": ({"top_p": 0}, "top_p"),
    "top_p above 1": ({"top_p": 1.5}, "top_p"),
    "max_tokens 0": ({"max_tokens": 0}, "max_tokens"),
    "empty stop string": ({"stop": [""]}, "stop"),
    "five stop strings": ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    "logprobs": ({"logprobs": True}, "logprobs"),
    "tool properties that are not an object": (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"properties": ["x"]}}}]},
        "tools[0].function.parameters",
    ),
    "tool_choice required": ({"tools": [CALC_TOOL], "tool_choice": "required"}, "tool_choice"),
    "a template kwarg the renderer sets": (
        {"extra_body": {"chat_template_kwargs": {"add_generation_prompt": False}}},
        "chat_template_kwargs",
    ),
    "a template kwarg that is no name": ({"extra_body": {"chat_template_kwargs": {"a-b": 1}}}, "chat_template_kwargs"),
    "named tool_choice": (
        {"tools": [CALC_TOOL], "tool_choice": {"type": "function", "function": {"name": "calculate_math"}}},
        "tool_choice",
    ),
}


@pytest.mark.parametrize("case", BAD_REQUESTS)
def test_a_malformed_request_is_a_400_naming_the_param(client, openai_server, case):
    fields, param = BAD_REQUESTS[case]
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(**{"model": openai_server.model_id, "messages": GREETING_PROMPT, **fields})
    assert error.value.status_code == 400
    assert error.value.type == "invalid_request_error" and error.value.param == param


@pytest.mark.parametrize(
    "fields",
    [{"max_tokens": 5000}, {"messages": [{"role": "user", "content": "word " * 3000}]}],
    ids=["max_tokens", "prompt"],
)
def test_a_request_beyond_the_context_is_a_400_context_length_exceeded(client, openai_server, fields):
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(**{"model": openai_server.model_id, "messages": GREETING_PROMPT, **fields})
    assert error.value.code == "context_length_exceeded" and "2048" in error.value.message


def test_an_unknown_model_is_a_404_model_not_found(client):
    with pytest.raises(openai.NotFoundError) as error:
        client.chat.completions.create(model="gpt-nothing", messages=GREETING_PROMPT)
    assert error.value.status_code == 404 and error.value.code == "model_not_found"


@pytest.mark.parametrize(
    ("method", "path", "content", "status"),
    [
        ("POST", "/chat/completions", b'{"model": "x", "messages": [', 400),  # invalid JSON
        ("POST", "/chat/completions", b'{"messages": []}', 400),  # no model
        ("POST", "/chat/completions", b"[1, 2]", 400),  # not an object
        ("GET", "/chat/completions", None, 405),
        ("GET", "/no/such/path", None, 404),
    ],
)
def test_raw_http_errors_are_openai_error_objects(openai_server, method, path, content, status):
    headers = {"content-type": "application/json"}
    response = httpx.request(method, openai_server.base_url + path, content=content, headers=headers, timeout=WAIT_S)
    assert response.status_code == status
    error = response.json()["error"]
    assert (
        error["type"] == "invalid_request_error"
        and error["message"]
        and set(error) == {"message", "type", "param", "code"}
    )


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ('"messages": [{"role": "user", "content": "hi \\ud800"}]', "messages[0].content"),
        (
            '"messages": [{"role": "user", "content": "hi"}], '
            '"tools": [{"type": "function", "function": {"name": "f", "description": "\\udc00"}}]',
            "tools[0].function.description",
        ),
    ],
)
def test_a_lone_surrogate_is_a_400_naming_where_it_is(openai_server, fields, param):
    # JSON can escape a lone surrogate, but no tokenizer can encode it (the openai client cannot send one)
    body = f'{{"model": "{openai_server.model_id}", {fields}}}'.encode()
    response = httpx.post(
        openai_server.base_url + "/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param and "lone surrogate" in response.json()["error"]["message"]


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_a_served_model_id_and_a_clean_exit_on_a_signal(tool_model_dir, tmp_path, signal_name):
    server = start_server(tmp_path, f"model.name_or_path={tool_model_dir}", "serve.model_id=my-model")
    try:
        client = openai.OpenAI(base_url=server.base_url, api_key="EMPTY", max_retries=0)
        assert server.model_id == "my-model" and [m.id for m in client.models.list()] == ["my-model"]
        reply = client.chat.completions.create(model="my-model", messages=GREETING_PROMPT, temperature=0)
        assert reply.choices[0].message.content == "Hello! How can I help?"
    finally:
        exit_code = server.stop(getattr(signal, signal_name))
    assert exit_code == 0


# -- the API key ----------------------------------------------------------------------------------

API_KEY = "sk-minirl-test-5b1f0c7e9a"  # distinctive: finding it in a file means it leaked


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("localhost", True),
        ("LocalHost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.20", False),
        ("fe80::1", False),
        ("myhost.example", False),  # a name may resolve to anything
    ],
)
def test_only_127_0_0_0_8_and_1_and_localhost_are_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_the_key_is_serve_api_key_else_the_environment_and_never_shown():
    assert resolve_api_key(ServeConfig(api_key="from-config"), {API_KEY_ENV: "from-env"}) == "from-config"
    assert resolve_api_key(ServeConfig(), {API_KEY_ENV: "from-env"}) == "from-env"
    assert resolve_api_key(ServeConfig(), {API_KEY_ENV: ""}) is None  # empty = unset, as vLLM reads VLLM_API_KEY
    assert resolve_api_key(ServeConfig(host="0.0.0.0"), {API_KEY_ENV: "k"}) == "k"
    assert resolve_api_key(ServeConfig(host="0.0.0.0", allow_unauthenticated=True), {}) is None
    with pytest.raises(ConfigError, match=f"^{API_KEY_ENV}: the API key must be printable ASCII") as bad:
        resolve_api_key(ServeConfig(), {API_KEY_ENV: "two words"})
    assert "two words" not in str(bad.value)
    assert API_KEY not in repr(ServeConfig(api_key=API_KEY))


@pytest.fixture(scope="module")
def keyed_server(tool_model_dir, tmp_path_factory):
    """The tool model served on loopback with API_KEY given as $MINIRL_API_KEY: the server and its run dir."""
    run_dir = tmp_path_factory.mktemp("keyed")
    server = start_server(run_dir, f"model.name_or_path={tool_model_dir}", api_key=API_KEY)
    yield server, run_dir
    server.stop()


def test_with_the_key_requests_are_served_and_health_is_open_without_it(keyed_server):
    server, _ = keyed_server
    client = openai.OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0)
    assert [model.id for model in client.models.list()] == [server.model_id]
    reply = client.chat.completions.with_raw_response.create(
        model=server.model_id, messages=GREETING_PROMPT, temperature=0
    )
    assert reply.status_code == 200 and reply.parse().choices[0].message.content == "Hello! How can I help?"
    stream = client.chat.completions.create(model=server.model_id, messages=GREETING_PROMPT, temperature=0, stream=True)
    assert join_stream(stream)[0][0].summary()[0] == "Hello! How can I help?"
    lower_case = httpx.get(f"{server.base_url}/models", headers={"authorization": f"bearer {API_KEY}"})
    assert lower_case.status_code == 200  # the scheme is case-insensitive (RFC 9110)
    assert httpx.get(server.base_url.removesuffix("/v1") + "/health").json()["status"] == "ok"


@pytest.mark.parametrize("api_key", ["EMPTY", API_KEY[:-1], API_KEY + "0"], ids=["none", "prefix", "longer"])
def test_the_openai_client_without_the_key_gets_401_invalid_api_key(keyed_server, api_key):
    server, _ = keyed_server
    client = openai.OpenAI(base_url=server.base_url, api_key=api_key, max_retries=0)
    chat = partial(client.chat.completions.create, model=server.model_id, messages=GREETING_PROMPT)
    for call in (client.models.list, chat, partial(chat, stream=True)):
        with pytest.raises(openai.AuthenticationError) as refused:
            call()
        assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
        assert refused.value.type == "invalid_request_error"


@pytest.mark.parametrize(
    "headers",
    [{}, {"authorization": f"Basic {API_KEY}"}, {"authorization": API_KEY}, {"authorization": f"Bearer {API_KEY}x"}],
    ids=["no header", "basic scheme", "no scheme", "wrong key"],
)
@pytest.mark.parametrize(
    ("method", "path", "content"),
    [
        ("GET", "/v1/models", None),
        ("POST", "/v1/chat/completions", b'{"model": '),  # the key is checked before the body is read
        ("GET", "/v1/no/such/path", None),
        ("GET", "/docs", None),
    ],
)
def test_every_path_but_health_answers_401_before_anything_else(keyed_server, headers, method, path, content):
    root = keyed_server[0].base_url.removesuffix("/v1")
    response = httpx.request(method, root + path, content=content, headers=headers, timeout=WAIT_S)
    assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and API_KEY not in error["message"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_api_key")


def test_the_openai_eval_backend_sends_eval_api_key(keyed_server):
    server, _ = keyed_server
    cfg = Config(eval=EvalConfig(backend="openai", base_url=server.base_url, api_key=API_KEY))
    assert OpenAIBackend(cfg, Console()).model == server.model_id  # the first model /v1/models lists
    cfg.eval.api_key = "EMPTY"
    with pytest.raises(ConfigError, match=r"^eval\.api_key: .* refuses it \(401\)"):
        OpenAIBackend(cfg, Console())


def test_the_key_is_in_no_log_and_no_hydra_file(keyed_server):
    _, run_dir = keyed_server  # after the tests above sent it, right and wrong
    files = {path.relative_to(run_dir).as_posix(): path.read_text() for path in run_dir.rglob("*") if path.is_file()}
    assert {"server.log", "server.out", ".hydra/config.yaml", ".hydra/overrides.yaml"} <= set(files)
    assert [name for name, text in files.items() if API_KEY in text] == []
    assert "api_key: null" in files[".hydra/config.yaml"]  # it came from the environment


def serve_command(run_dir, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "minirl.serve", f"hydra.run.dir={run_dir}", "logger=none", *overrides]


def test_a_host_beyond_loopback_needs_a_key_or_allow_unauthenticated(tool_model_dir, tmp_path):
    env = {name: value for name, value in os.environ.items() if name != API_KEY_ENV}
    missing = tmp_path / "no-model"  # loading it would fail with another message: the check comes first
    public = ["serve.host=0.0.0.0", "serve.port=0"]
    refused = subprocess.run(
        serve_command(tmp_path / "refused", *public, f"model.name_or_path={missing}"),
        capture_output=True, text=True, env=env, timeout=WAIT_S,
    )  # fmt: skip
    assert refused.returncode == 2
    assert refused.stdout.strip().splitlines() == [
        "config error: serve.host=0.0.0.0 is not a loopback address and no API key is set: set "
        "MINIRL_API_KEY=<key> (or serve.api_key=<key>), serve on serve.host=127.0.0.1, or pass "
        "serve.allow_unauthenticated=true to serve without a key"
    ]
    server = start_server(
        tmp_path / "allowed", f"model.name_or_path={tool_model_dir}", *public, "serve.allow_unauthenticated=true"
    )
    try:
        assert server.base_url.startswith("http://0.0.0.0:")
        loopback = server.base_url.replace("0.0.0.0", "127.0.0.1", 1)  # connect only to this machine
        client = openai.OpenAI(base_url=loopback, api_key="EMPTY", max_retries=0)
        assert [model.id for model in client.models.list()] == [server.model_id]
    finally:
        assert server.stop() == 0
