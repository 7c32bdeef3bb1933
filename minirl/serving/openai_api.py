"""The OpenAI chat-completions wire format: request models, messages for the chat template, and the
response, chunk and error objects.

Requests are read the way OpenAI reads them: unknown fields are ignored, a null counts as "not
given", `content` may be a string, null or a list of text parts, and an assistant's
`tool_calls[].function.arguments` arrives as a JSON string (parsed to an object for the chat
template, as vLLM does). `top_k` is not OpenAI's; it is accepted as vLLM accepts it.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from minirl.protocol.formats import lone_surrogate_at, read_name_and_arguments
from minirl.tools.base import ToolCall

MAX_STOP_STRINGS = 4


class APIError(Exception):
    """An error the client gets as `{"error": {...}}` with HTTP `status`."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        error_type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = error_body(message, error_type, param, code)


def error_body(message: str, error_type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class FunctionCall(_Lenient):
    name: str
    arguments: Any = "{}"  # a JSON string (OpenAI) or an object; checked by `template_messages`


class MessageToolCall(_Lenient):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Any = None  # a string, null or a list of text parts; checked by `template_messages`
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None


class FunctionSpec(_Lenient):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict | None = None  # JSON schema of an object

    @field_validator("parameters")
    @classmethod
    def _properties_are_an_object(cls, parameters: dict | None) -> dict | None:
        if parameters is not None and not isinstance(parameters.get("properties", {}), dict):
            raise ValueError("properties must be an object mapping each parameter name to its schema")
        return parameters


class ToolSpec(_Lenient):
    type: Literal["function"]
    function: FunctionSpec


class StreamOptions(_Lenient):
    include_usage: bool = False


# what apply_chat_template takes or sets itself, which a request's chat_template_kwargs may not replace
TEMPLATE_RESERVED = frozenset(
    {
        "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
        "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors",
        "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs", "processor_kwargs",
        "bos_token", "eos_token", "pad_token", "unk_token", "raise_exception", "strftime_now",
    }
)  # fmt: skip


class ChatCompletionRequest(_Lenient):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolSpec] | None = None
    tool_choice: Any = None  # auto | none; checked by `calls_enabled`
    temperature: float = Field(1.0, ge=0, le=2)  # 0 = greedy
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=-1)  # 0 or -1 (vLLM's spelling) = off
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # OpenAI's newer name; wins over max_tokens
    stop: Any = None  # a string or a list of them; checked by `stop_strings`
    seed: int | None = None
    n: int = Field(1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool = False  # not served: true is a 400 rather than a reply without them
    # vLLM's extension: passed to the chat template over the server's model.chat_template_kwargs (e.g.
    # {"enable_thinking": false}); names the renderer itself sets are refused (TEMPLATE_RESERVED)
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _null_is_not_given(cls, data: Any) -> Any:
        return {key: value for key, value in data.items() if value is not None} if isinstance(data, dict) else data

    def check_supported(self) -> None:
        """A 400 for what the request asks that this server does not do: logprobs, and text no tokenizer can
        encode (a lone surrogate such as "\\ud800" in the messages or tools, which JSON can carry)."""
        if self.logprobs:
            raise APIError(400, "logprobs are not supported by this server", "logprobs")
        where = lone_surrogate_at(self.model_dump(include={"messages", "tools"}, exclude_none=True))
        if where is not None:
            raise APIError(400, f"{where} is not valid Unicode text (it holds a lone surrogate)", where)
        for name in self.chat_template_kwargs:
            if not name.isidentifier() or name in TEMPLATE_RESERVED:
                reason = "is set by the renderer" if name in TEMPLATE_RESERVED else "is not a template variable name"
                raise APIError(400, f"chat_template_kwargs: {name!r} {reason}", "chat_template_kwargs")

    def calls_enabled(self) -> bool:
        """Whether tools go into the prompt and calls are read from the reply; 400 for other choices."""
        if self.tool_choice in (None, "auto"):
            return bool(self.tools)
        if self.tool_choice == "none":
            return False
        shown = json.dumps(self.tool_choice) if isinstance(self.tool_choice, dict) else repr(self.tool_choice)
        raise APIError(
            400, f"tool_choice {shown} is not supported; use 'auto' (the model decides) or 'none'", "tool_choice"
        )

    def stop_strings(self) -> tuple[str, ...]:
        """Up to MAX_STOP_STRINGS, as OpenAI allows: each one is searched for after every token."""
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        if not isinstance(stops, list) or not all(isinstance(stop, str) and stop for stop in stops):
            raise APIError(400, "stop must be a non-empty string or a list of them", "stop")
        if len(stops) > MAX_STOP_STRINGS:
            raise APIError(400, f"stop takes at most {MAX_STOP_STRINGS} strings, got {len(stops)}", "stop")
        return tuple(stops)

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def _text(content: Any, where: str) -> str | None:
    """A message's content as text; text parts are joined by newlines."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str) for part in content
    ):
        return "\n".join(part["text"] for part in content)
    raise APIError(400, f'{where} must be a string, null or a list of {{"type": "text", "text": ...}} parts', where)


def _arguments(call: MessageToolCall, where: str) -> dict:
    """The call's arguments as an object, read as the Hermes format reads them (an object, or a JSON string
    holding one); a 400 naming `where` otherwise."""
    read = read_name_and_arguments(call.function.name, call.function.arguments)
    if isinstance(read, str):
        raise APIError(400, f"{where}: {read}", where)
    return read[1]


def template_messages(messages: list[ChatMessage]) -> list[dict]:
    """Messages as chat templates expect them: text content, tool-call arguments as objects,
    `developer` as `system`."""
    converted = []
    for i, message in enumerate(messages):
        where = f"messages[{i}].content"
        text = _text(message.content, where)
        if text is None and not (message.role == "assistant" and message.tool_calls):
            raise APIError(400, f"{where} is required in a {message.role} message", where)
        out: dict[str, Any] = {"role": "system" if message.role == "developer" else message.role, "content": text or ""}
        if message.tool_calls:
            if message.role != "assistant":
                raise APIError(400, f"messages[{i}]: only assistant messages carry tool_calls", f"messages[{i}]")
            out["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.function.name,
                        "arguments": _arguments(call, f"messages[{i}].tool_calls[{j}].function.arguments"),
                    },
                }
                for j, call in enumerate(message.tool_calls)
            ]
        for key in ("name", "tool_call_id"):
            if getattr(message, key) is not None:
                out[key] = getattr(message, key)
        converted.append(out)
    return converted


def template_tools(tools: list[ToolSpec]) -> list[dict]:
    return [tool.model_dump(exclude_none=True) for tool in tools]


# -- responses ----------------------------------------------------------------------------------


def tool_call_json(call: ToolCall) -> dict:
    """A call as OpenAI sends it: a fresh id, arguments as a JSON string."""
    arguments = json.dumps(call.arguments, ensure_ascii=False)
    return {
        "id": f"call_{secrets.token_hex(12)}",
        "type": "function",
        "function": {"name": call.name, "arguments": arguments},
    }


@dataclass
class ChoiceDelta:
    """What one choice gained: text on either channel, its calls, or its end."""

    index: int
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int = 0

    def delta_json(self) -> dict:
        delta: dict[str, Any] = {}
        if self.content:
            delta["content"] = self.content
        if self.reasoning:
            delta["reasoning_content"] = self.reasoning
        if self.tool_calls:
            delta["tool_calls"] = [{"index": k, **tool_call_json(call)} for k, call in enumerate(self.tool_calls)]
        return delta


@dataclass
class Choice:
    """One choice of a non-streamed response, added up from its deltas."""

    index: int
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = "stop"
    completion_tokens: int = 0

    def add(self, delta: ChoiceDelta) -> None:
        self.content += delta.content
        self.reasoning += delta.reasoning
        self.tool_calls += delta.tool_calls
        self.finish_reason = delta.finish_reason or self.finish_reason
        self.completion_tokens += delta.completion_tokens

    def to_json(self) -> dict:
        message = {
            "role": "assistant",
            "content": None if not self.content and self.tool_calls else self.content,
            "reasoning_content": self.reasoning or None,
            "tool_calls": [tool_call_json(call) for call in self.tool_calls] or None,
        }
        return {"index": self.index, "message": message, "logprobs": None, "finish_reason": self.finish_reason}


def usage_json(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


@dataclass
class ResponseHeader:
    """What every object of one response shares."""

    id: str
    created: int
    model: str

    def completion(self, choices: list[Choice], prompt_tokens: int) -> dict:
        completion_tokens = sum(choice.completion_tokens for choice in choices)
        return {
            **self._fields("chat.completion"),
            "choices": [choice.to_json() for choice in choices],
            "usage": usage_json(prompt_tokens, completion_tokens),
        }

    def chunk(self, index: int, delta: dict, finish_reason: str | None = None, usage_follows: bool = False) -> dict:
        """One choice's delta; with usage_follows (stream_options.include_usage) it says `"usage": null`, as
        OpenAI's chunks do before the last one carries the usage."""
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        chunk = {**self._fields("chat.completion.chunk"), "choices": [choice]}
        return {**chunk, "usage": None} if usage_follows else chunk

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict:
        return {
            **self._fields("chat.completion.chunk"),
            "choices": [],
            "usage": usage_json(prompt_tokens, completion_tokens),
        }

    def _fields(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}
