"""The FastAPI app: `POST /v1/chat/completions`, `GET /v1/models`, `GET /health`.

A chat request is checked and rendered to a prompt on the event loop (the chat template runs in a
thread), queued as a `Job`, and answered from the job's events: streamed as server-sent events or
gathered into one response. Every error, a validation failure or an internal one, is an OpenAI error
object (`{"error": {"message", "type", "param", "code"}}`) with a 4xx or 5xx status. With an API key,
every request but `GET /health` needs it (auth.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from jinja2 import TemplateError
from starlette.exceptions import HTTPException

from minirl.config import ProtocolConfig, ServeConfig
from minirl.inference.loop import StopReason
from minirl.inference.sampling import SamplingParams
from minirl.protocol.chat import render
from minirl.protocol.formats import CALL_FORMATS
from minirl.protocol.parsing import ParsedTurn, parse_turn
from minirl.serving.auth import BearerAuth
from minirl.serving.openai_api import (
    APIError,
    ChatCompletionRequest,
    Choice,
    ChoiceDelta,
    ResponseHeader,
    error_body,
    template_messages,
    template_tools,
)
from minirl.serving.scheduler import DoneEvent, Job, JobFailed, QueueFull, Scheduler
from minirl.serving.turn_splitter import TurnSplitter

logger = logging.getLogger(__name__)


@dataclass
class ServedModel:
    """What the app knows about the model the scheduler decodes with."""

    model_id: str  # the name requests must use
    tokenizer: Any
    context_length: int  # prompt + completion tokens, at most


def create_app(
    scheduler: Scheduler,
    served: ServedModel,
    serve: ServeConfig,
    protocol: ProtocolConfig,
    api_key: str | None = None,
) -> FastAPI:
    """The app; it starts `scheduler`'s worker on startup and stops it on shutdown. With `api_key` (see
    auth.resolve_api_key) requests must send it as a bearer token; without one anyone may call it."""

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        scheduler.start()
        yield
        scheduler.close()

    app = FastAPI(title="minirl", lifespan=lifespan)
    started = int(time.time())
    _add_error_handlers(app)
    if api_key is not None:
        app.add_middleware(BearerAuth, api_key=api_key)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "waiting": scheduler.waiting, "running_rows": scheduler.running_rows}

    @app.get("/v1/models")
    async def models() -> dict:
        card = {"id": served.model_id, "object": "model", "created": started, "owned_by": "minirl"}
        return {"object": "list", "data": [{**card, "max_model_len": served.context_length}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        if body.model != served.model_id:
            message = f"the model '{body.model}' does not exist; this server serves '{served.model_id}'"
            raise APIError(404, message, "model", "model_not_found")
        if body.n > serve.max_batch_size:
            raise APIError(400, f"n must be <= {serve.max_batch_size} (serve.max_batch_size), got {body.n}", "n")
        body.check_supported()
        calls = body.calls_enabled()
        tools = template_tools(body.tools) if calls else None
        messages = template_messages(body.messages)
        try:
            prompt = await asyncio.to_thread(render, served.tokenizer, messages, tools, True, body.chat_template_kwargs)
        except TemplateError as err:
            raise APIError(400, f"the chat template rejects these messages: {err}", "messages") from None
        max_tokens = _max_tokens(body, len(prompt), served.context_length, serve.max_tokens)
        job = Job(prompt, _sampling(body, max_tokens))
        _submit(scheduler, job)
        read_calls = _call_reader(protocol, tools) if calls else None
        splitters = [TurnSplitter(read_calls, CALL_FORMATS.get(protocol.format).markup) for _ in range(body.n)]
        header = ResponseHeader(f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), served.model_id)
        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            chunks = _stream(job, splitters, header, len(prompt), include_usage)
            return StreamingResponse(chunks, media_type="text/event-stream")
        return await _gather(job, splitters, header, len(prompt), request)

    return app


def _max_tokens(body: ChatCompletionRequest, prompt_tokens: int, context_length: int, default: int) -> int:
    """The completion budget: what the request asks for (else `default`), if the context has room."""
    room = context_length - prompt_tokens
    if room < 1:
        message = f"the messages take {prompt_tokens} tokens, the model's maximum context length is {context_length}"
        raise APIError(400, message, "messages", "context_length_exceeded")
    asked = body.requested_max_tokens()
    if asked is None:
        return min(default, room)
    if asked > room:
        message = (
            f"the messages take {prompt_tokens} tokens and max_tokens is {asked}: {prompt_tokens + asked} "
            f"exceeds the model's maximum context length of {context_length}"
        )
        raise APIError(400, message, "max_tokens", "context_length_exceeded")
    return asked


def _sampling(body: ChatCompletionRequest, max_tokens: int) -> list[SamplingParams]:
    """One SamplingParams per choice; the n choices of a seeded request get seeds seed, seed + 1, ... so they
    differ."""
    return [
        SamplingParams(
            max_new_tokens=max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=max(body.top_k, 0),
            seed=None if body.seed is None else body.seed + i,
            stop=body.stop_strings(),
        )
        for i in range(body.n)
    ]


def _submit(scheduler: Scheduler, job: Job) -> None:
    try:
        scheduler.submit(job)
    except QueueFull as err:
        message = f"the server is busy: {err}; retry later"
        raise APIError(429, message, code="queue_full", error_type="rate_limit_error") from None
    except JobFailed as err:
        raise APIError(503, str(err), error_type="server_error") from None


def _call_reader(protocol: ProtocolConfig, tools: list[dict]) -> Callable[[str], ParsedTurn]:
    """parse_turn under the protocol's format and call policy; `tools` let a format read typed values. Calls the
    lenient policy drops are logged, with why."""
    read = partial(
        parse_turn,
        call_format=protocol.format,
        policy=protocol.call_policy,
        max_calls=protocol.max_calls_per_turn,
        tools=tools,
    )

    def read_and_log(text: str) -> ParsedTurn:
        parsed = read(text)
        if parsed.dropped:
            logger.warning("dropped %d tool calls that could not be read: %s", len(parsed.dropped), parsed.dropped)
        return parsed

    return read_and_log


async def _choice_deltas(job: Job, splitters: Sequence[TurnSplitter]) -> AsyncIterator[ChoiceDelta]:
    """The job's rows as OpenAI choices: text split into content and reasoning as it arrives, then each
    choice's calls and its finish reason. Raises JobFailed."""
    async for event in job.events():
        splitter = splitters[event.index]
        if not isinstance(event, DoneEvent):
            pieces, calls = splitter.feed(event.text), []
        elif event.result.finish_reason is StopReason.cancelled:
            raise JobFailed("the request was cancelled before it finished")
        else:
            pieces, calls = splitter.finish()
        for piece in pieces:
            yield ChoiceDelta(event.index, **{piece.channel.value: piece.text})
        if calls:
            yield ChoiceDelta(event.index, tool_calls=calls)
        if isinstance(event, DoneEvent):
            finish = "tool_calls" if calls else event.result.finish_reason.value
            yield ChoiceDelta(event.index, finish_reason=finish, completion_tokens=event.result.completion_tokens)


async def _gather(
    job: Job, splitters: Sequence[TurnSplitter], header: ResponseHeader, prompt_tokens: int, request: Request
) -> dict:
    """The whole response at once. A client that disconnects first cancels the job's rows."""
    choices = [Choice(index) for index in range(len(splitters))]
    watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
    try:
        async for delta in _choice_deltas(job, splitters):
            choices[delta.index].add(delta)
    except JobFailed as err:
        raise APIError(500, str(err), error_type="server_error") from None
    finally:
        watcher.cancel()
        job.cancel()  # a handler that stops early (shutdown) frees the rows; no effect once done
    return header.completion(choices, prompt_tokens)


async def _cancel_on_disconnect(request: Request, job: Job, poll_s: float = 0.2) -> None:
    """Cancel `job` once `request`'s client has gone (it gave up waiting: nothing is sent before the end)."""
    while not await request.is_disconnected():
        await asyncio.sleep(poll_s)
    job.cancel()


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _stream(
    job: Job, splitters: Sequence[TurnSplitter], header: ResponseHeader, prompt_tokens: int, include_usage: bool
) -> AsyncIterator[str]:
    """Server-sent events: each choice's role, its deltas and its finish, [usage], then [DONE]. A client
    that disconnects cancels the generator and with it the job's rows."""
    try:
        for index in range(len(splitters)):
            yield _sse(header.chunk(index, {"role": "assistant", "content": ""}, usage_follows=include_usage))
        completion_tokens = 0
        async for delta in _choice_deltas(job, splitters):
            completion_tokens += delta.completion_tokens
            yield _sse(header.chunk(delta.index, delta.delta_json(), delta.finish_reason, include_usage))
        if include_usage:
            yield _sse(header.usage_chunk(prompt_tokens, completion_tokens))
        yield "data: [DONE]\n\n"
    except JobFailed as err:
        yield _sse(error_body(str(err), "server_error"))
    except Exception as err:  # the status line went out already: the error can only be an event
        logger.exception("streaming a response failed")
        yield _sse(error_body(f"internal error: {type(err).__name__}: {err}", "server_error"))
    finally:
        job.cancel()


# -- errors -------------------------------------------------------------------------------------


def _param(loc: Sequence[Any]) -> str | None:
    """('body', 'messages', 0, 'role') -> 'messages[0].role'."""
    path = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path or None


def _validation_error(errors: Sequence[dict]) -> dict:
    first = errors[0]
    if first["type"] == "json_invalid":
        return error_body(
            f"the request body is not valid JSON ({first.get('ctx', {}).get('error', '')})", "invalid_request_error"
        )
    problems = [f"{_param(error['loc']) or 'request body'}: {error['msg']}" for error in errors[:4]]
    return error_body("; ".join(problems), "invalid_request_error", _param(first["loc"]))


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(_: Request, err: APIError) -> JSONResponse:
        return JSONResponse(err.body, err.status)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, err: RequestValidationError) -> JSONResponse:
        return JSONResponse(_validation_error(err.errors()), 400)  # FastAPI says 422; OpenAI says 400

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException) -> JSONResponse:
        code = "not_found" if err.status_code == 404 else None
        message = f"{err.detail}: {request.method} {request.url.path}"
        return JSONResponse(error_body(message, "invalid_request_error", code=code), err.status_code)

    @app.exception_handler(Exception)
    async def internal_error(_: Request, err: Exception) -> JSONResponse:
        return JSONResponse(error_body(f"internal error: {type(err).__name__}: {err}", "server_error"), 500)
