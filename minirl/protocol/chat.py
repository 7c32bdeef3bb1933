"""Render messages + tools to token ids through the tokenizer's own chat template, and build
the next prompt token-in / token-out.

Sampled tokens are never decoded and re-encoded: the next prompt is

    P_next = P + C + E[overlap:] + O

P the previous prompt, C the sampled completion, E the template's assistant-closing tokens
(only the part the sampler did not already produce) and O the observation delta (tool
messages plus the next assistant header). E and O come from renders with a placeholder assistant
message, by one of three constructions (`Construction`), chosen per template on first use
(`construction_of`):

- prefix: render the real history with the placeholder and then with the tool messages, and take
  what each render adds to the one before. It needs a prefix-preserving template (a longer
  conversation's render starts with the shorter one's), and checks that it is.
- delta: render only the appended messages, against a fixed base conversation (a user message and
  the placeholder assistant), and take what follows the placeholder's content: the delta render of
  verl and TRL. For templates that re-render earlier turns once more follow (Qwen3 and Qwen3.5 show
  an assistant turn's <think> block only when it is the last one). Its first turns on each template
  are checked against the full render of the real history, whose tail must be E + O.
- calls: as prefix, the placeholder carrying the turn's own calls, for templates that render a tool
  message only after a call (gpt-oss's harmony names the tool from it); E is the special token the
  template ends a call message with.

A template that no construction fits fails loudly (TemplateError), never silently misaligning
tokens; so does a trajectory of more tool rounds than a delta-built template builds in a row
(`require_tool_rounds`, a ConfigError: DeepSeek-V3's renders its second round unlike its first), before
it samples. `model.chat_template_kwargs` (e.g. enable_thinking) reaches every render: they ride on the
tokenizer (`set_template_kwargs`), and a call may add its own.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import jinja2

from minirl.errors import ConfigError

PLACEHOLDER = "x"
TEMPLATE_KWARGS = "minirl_chat_template_kwargs"  # the tokenizer attribute holding model.chat_template_kwargs
CHECKED_TURNS = 8  # delta-built turns per template checked against the full render
log = logging.getLogger(__name__)


class TemplateError(ValueError):
    """The chat template breaks the prefix property token-in/token-out relies on."""


def _as_id_list(rendered: Any) -> list[int]:
    """Normalise what tokenizers return (list, nested list, tensor, BatchEncoding) to list[int]."""
    if isinstance(rendered, Mapping):
        rendered = rendered["input_ids"]
    if hasattr(rendered, "tolist"):
        rendered = rendered.tolist()
    if rendered and isinstance(rendered[0], list):
        rendered = rendered[0]
    return [int(t) for t in rendered]


def set_template_kwargs(tokenizer, kwargs: Mapping[str, Any]) -> None:
    """Make every render with this tokenizer pass `kwargs` to its chat template (model.chat_template_kwargs)."""
    setattr(tokenizer, TEMPLATE_KWARGS, dict(kwargs))


def template_kwargs(tokenizer, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The tokenizer's chat template kwargs (set_template_kwargs), with `extra` (a request's) over them."""
    return {**getattr(tokenizer, TEMPLATE_KWARGS, {}), **(extra or {})}


def with_template_kwargs(tokenizer, **kwargs: Any):
    """A shallow copy of `tokenizer` whose renders pass `kwargs` over its own template kwargs; the vocabulary and
    the tokenizer backend are shared, not copied."""
    view = copy.copy(tokenizer)
    set_template_kwargs(view, template_kwargs(tokenizer, kwargs))
    return view


def thinking_views(tokenizer) -> dict[bool, Any]:
    """{True: `tokenizer` rendering with enable_thinking=true, False: with false}. Raises ConfigError when the
    template has no such switch: both render the same generation prompt."""
    views = {on: with_template_kwargs(tokenizer, enable_thinking=on) for on in (True, False)}
    probe = [{"role": "user", "content": PLACEHOLDER}]
    prompts = [render(view, probe, None, add_generation_prompt=True) for view in views.values()]
    if prompts[0] == prompts[1]:
        raise ConfigError(
            "rollout.thinking_ratio: the chat template renders the same prompt with enable_thinking true and false, "
            "so it has no thinking switch to draw; leave rollout.thinking_ratio at null"
        )
    return views


def render(
    tokenizer,
    messages: Sequence[dict],
    tools: Sequence[dict] | None,
    add_generation_prompt: bool,
    extra_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """Token ids of `messages` (+ tool schemas) through the tokenizer's chat template, with its template
    kwargs (template_kwargs) and `extra_kwargs` over them."""
    rendered = tokenizer.apply_chat_template(
        list(messages),
        tools=list(tools) if tools else None,
        tokenize=True,
        return_dict=False,
        add_generation_prompt=add_generation_prompt,
        **template_kwargs(tokenizer, extra_kwargs),
    )
    return _as_id_list(rendered)


def render_text(tokenizer, messages: Sequence[dict], tools: Sequence[dict] | None, add_generation_prompt: bool) -> str:
    """The text `render` tokenizes."""
    return tokenizer.apply_chat_template(
        list(messages),
        tools=list(tools) if tools else None,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        **template_kwargs(tokenizer),
    )


def _encode_text(tokenizer, text: str) -> list[int]:
    return _as_id_list(tokenizer.encode(text, add_special_tokens=False))


def suffix_prefix_overlap(completion: Sequence[int], closing: Sequence[int]) -> int:
    """Length of the longest suffix of `completion` that is a prefix of `closing`."""
    for n in range(min(len(completion), len(closing)), 0, -1):
        if list(completion[-n:]) == list(closing[:n]):
            return n
    return 0


def _strip_prefix(full: list[int], prefix: list[int], what: str) -> list[int]:
    if full[: len(prefix)] != prefix:
        raise TemplateError(
            f"chat template rewrites history ({what}): the rendering of a longer conversation does not "
            "start with the rendering of the shorter one, so sampled tokens cannot be kept as they are"
        )
    return full[len(prefix) :]


class TurnDeltas:
    """E and O for one round, derived from the canonical history and placeholder renders."""

    def __init__(self, closing: list[int], observation: list[int]) -> None:
        self.closing = closing  # tokens the template puts after an assistant message's content
        self.observation = observation  # tool messages + the next assistant generation header


class Construction(str, Enum):
    """How E and O are built (module docstring)."""

    PREFIX = "prefix"  # renders of the real history, each a prefix of the next
    DELTA = "delta"  # the appended messages rendered against a fixed base
    CALLS = "calls"  # renders of the real history, the placeholder assistant carrying the turn's own calls


def _prefix_deltas(tokenizer, history: Sequence[dict], tools: Sequence[dict] | None, tool_messages) -> TurnDeltas:
    placeholder: dict[str, Any] = {"role": "assistant", "content": PLACEHOLDER}
    canonical_prompt = render(tokenizer, history, tools, add_generation_prompt=True)
    with_placeholder = [*history, placeholder]
    assistant_end = render(tokenizer, with_placeholder, tools, add_generation_prompt=False)
    action = [*canonical_prompt, *_encode_text(tokenizer, PLACEHOLDER)]
    closing = _strip_prefix(assistant_end, action, "assistant message")
    next_prompt = render(tokenizer, [*with_placeholder, *tool_messages], tools, add_generation_prompt=True)
    observation = _strip_prefix(next_prompt, assistant_end, "tool messages")
    return TurnDeltas(closing, observation)


def _calls_deltas(
    tokenizer, history: Sequence[dict], tools: Sequence[dict] | None, tool_messages, calls: Sequence[dict]
) -> TurnDeltas:
    """E and O with the turn's own calls in the placeholder assistant (its content empty): E is the special token
    the template ends a call message with (harmony's <|call|>, which the model samples as its stop token), O what
    the tool messages add to the render of the history and that message. Each render must start with the one
    before."""
    if not calls:
        raise TemplateError("this chat template renders tool messages only after a call: the turn has none")
    canonical_prompt = render(tokenizer, history, tools, add_generation_prompt=True)
    with_calls = [*history, {"role": "assistant", "content": "", "tool_calls": list(calls)}]
    assistant_end = render(tokenizer, with_calls, tools, add_generation_prompt=False)
    _strip_prefix(assistant_end, canonical_prompt, "assistant message with calls")
    if assistant_end[-1] not in tokenizer.all_special_ids:
        raise TemplateError("chat template does not end an assistant message with calls by a special token")
    next_prompt = render(tokenizer, [*with_calls, *tool_messages], tools, add_generation_prompt=True)
    return TurnDeltas(assistant_end[-1:], _strip_prefix(next_prompt, assistant_end, "tool messages after calls"))


def _after_placeholder(rendered: list[int], start: int, placeholder: list[int], what: str) -> list[int]:
    """The tokens after the first occurrence of `placeholder` at or past `start`."""
    for i in range(start, len(rendered) - len(placeholder) + 1):
        if rendered[i : i + len(placeholder)] == placeholder:
            return rendered[i + len(placeholder) :]
    raise TemplateError(f"chat template does not render the assistant's content as it is ({what})")


def _delta_deltas(tokenizer, tools: Sequence[dict] | None, tool_messages: Sequence[dict]) -> TurnDeltas:
    """E and O from the base [user, placeholder assistant]: what the template puts after the placeholder's
    content when the assistant message ends the conversation (E), and when the tool messages follow it
    (E + O). The user message's render must be a prefix of both (the assistant header may differ: Qwen3
    without thinking puts an empty <think> block in the last one only)."""
    base = [{"role": "user", "content": PLACEHOLDER}]
    assistant = {"role": "assistant", "content": PLACEHOLDER}
    user = render(tokenizer, base, tools, add_generation_prompt=False)
    placeholder = _encode_text(tokenizer, PLACEHOLDER)
    ended = render(tokenizer, [*base, assistant], tools, add_generation_prompt=False)
    followed = render(tokenizer, [*base, assistant, *tool_messages], tools, add_generation_prompt=True)
    for rendered, what in ((ended, "assistant message"), (followed, "tool messages")):
        _strip_prefix(rendered, user, what)
    closing = _after_placeholder(ended, len(user), placeholder, "assistant message")
    rest = _after_placeholder(followed, len(user), placeholder, "tool messages")
    observation = _strip_prefix(rest, closing, "closing of an assistant message followed by tool messages")
    return TurnDeltas(closing, observation)


def _checked_delta_deltas(
    tokenizer, history: Sequence[dict], tools: Sequence[dict] | None, tool_messages: Sequence[dict]
) -> TurnDeltas:
    """_delta_deltas, checked against the full render of the real history: its tail must be E + O."""
    deltas = _delta_deltas(tokenizer, tools, tool_messages)
    placeholder = {"role": "assistant", "content": PLACEHOLDER}
    full = render(tokenizer, [*history, placeholder, *tool_messages], tools, add_generation_prompt=True)
    tail = [*deltas.closing, *deltas.observation]
    if full[len(full) - len(tail) :] != tail:
        raise TemplateError(
            "the delta-rendered closing and observation tokens are not what the template renders after "
            "this assistant turn in the real conversation"
        )
    return deltas


@dataclass(frozen=True)
class TemplateFit:
    """How next prompts are built for a template, and how many tool rounds in a row it builds them for (None:
    any number; DeepSeek-V3's renders a second round differently from the first, so 1)."""

    construction: Construction
    tool_rounds: int | None


_FITS: dict[tuple, TemplateFit] = {}
_CHECKED: dict[tuple, int] = {}


def _template_key(tokenizer) -> tuple:
    return tokenizer.chat_template, tuple(sorted(template_kwargs(tokenizer).items()))


PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "probe",
        "description": "A tool.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    },
}
PROBE_CALL = {"type": "function", "function": {"name": "probe", "arguments": {"q": "a"}}}
# two tool rounds, the first with reasoning: what a template that re-renders earlier turns re-renders
PROBE = [
    {"role": "user", "content": "Question?"},
    {"role": "assistant", "content": "", "reasoning_content": "Think.", "tool_calls": [PROBE_CALL]},
    {"role": "tool", "name": "probe", "content": "1"},
    {"role": "assistant", "content": "", "tool_calls": [PROBE_CALL]},
    {"role": "tool", "name": "probe", "content": "2"},
]
PROBE_CALL_AS_TEXT = {"type": "function", "function": {"name": "probe", "arguments": json.dumps({"q": "a"})}}
PROBE_ARGUMENTS_AS_TEXT = [
    {**message, "tool_calls": [PROBE_CALL_AS_TEXT]} if "tool_calls" in message else message for message in PROBE
]


def _fit(tokenizer) -> TemplateFit:
    """Prefix when the template builds the probe conversation's turns that way; else delta when it builds the
    first round (and maybe not the second: then the template builds one tool round); else calls."""
    tools = [PROBE_TOOL]
    try:
        for end in (1, 3):
            _prefix_deltas(tokenizer, PROBE[:end], tools, [PROBE[end + 1]])
        return TemplateFit(Construction.PREFIX, None)
    except (TemplateError, jinja2.TemplateError) as err:
        prefix_err = err
    try:
        _checked_delta_deltas(tokenizer, PROBE[:1], tools, [PROBE[2]])
    except (TemplateError, jinja2.TemplateError) as err:
        delta_err = err
    else:
        return _delta_fit(tokenizer, prefix_err)
    try:
        for end in (1, 3):
            _calls_deltas(tokenizer, PROBE[:end], tools, [PROBE[end + 1]], PROBE[end]["tool_calls"])
        return TemplateFit(Construction.CALLS, None)
    except (TemplateError, jinja2.TemplateError) as calls_err:
        raise TemplateError(
            f"no next-prompt construction fits this chat template: prefix: {prefix_err}; delta: {delta_err}; "
            f"calls: {calls_err}"
        ) from None


def _delta_fit(tokenizer, prefix_err: Exception) -> TemplateFit:
    """The delta construction's fit, its first probe round built: how many rounds in a row it builds."""
    tools = [PROBE_TOOL]
    log.debug("chat template is not prefix-preserving (%s): next prompts by delta render", prefix_err)
    for probe in (PROBE, PROBE_ARGUMENTS_AS_TEXT):
        try:
            _checked_delta_deltas(tokenizer, probe[:3], tools, [probe[4]])
            return TemplateFit(Construction.DELTA, None)
        except TypeError:  # a template that joins call arguments as text (DeepSeek-V3's): the other probe
            continue
        except (TemplateError, jinja2.TemplateError):
            break
    return TemplateFit(Construction.DELTA, 1)


def template_fit(tokenizer) -> TemplateFit:
    """The construction and tool rounds of this tokenizer's template (and template kwargs), found once per
    template (_fit)."""
    key = _template_key(tokenizer)
    if key not in _FITS:
        _FITS[key] = _fit(tokenizer)
    return _FITS[key]


def construction_of(tokenizer) -> Construction:
    """The construction this tokenizer's template needs (template_fit)."""
    return template_fit(tokenizer).construction


def require_tool_rounds(tokenizer, rounds: int) -> None:
    """Raise ConfigError when the template cannot build `rounds` tool rounds in a row (a config value asks for
    them: rollout.max_turns)."""
    most = template_fit(tokenizer).tool_rounds
    if most is not None and rounds > most:
        raise ConfigError(
            f"this chat template builds next prompts token-in/token-out for {most} tool round(s) in a row: it renders "
            f"a later round differently from the first (DeepSeek-V3's marks its first tool output only), so a "
            f"trajectory of {rounds} rounds cannot keep its sampled tokens; set rollout.max_turns <= {most + 1}"
        )


def turn_deltas(
    tokenizer,
    messages_before_assistant: Sequence[dict],
    tools: Sequence[dict] | None,
    tool_messages: Sequence[dict],
    calls: Sequence[dict] = (),
) -> TurnDeltas:
    """Closing and observation tokens for one assistant turn followed by `tool_messages`, by the template's
    construction (construction_of). `messages_before_assistant` is the real history up to the turn; `calls` the
    turn's calls as an assistant message's `tool_calls` (the calls construction renders them).

    The placeholder assistant content stands in for the sampled text, which the template may
    strip or restructure; only the structural tokens around it are taken from the render.
    """
    construction = construction_of(tokenizer)
    if construction is Construction.PREFIX:
        return _prefix_deltas(tokenizer, messages_before_assistant, tools, tool_messages)
    if construction is Construction.CALLS:
        return _calls_deltas(tokenizer, messages_before_assistant, tools, tool_messages, calls)
    require_tool_rounds(tokenizer, 1 + sum(bool(m.get("tool_calls")) for m in messages_before_assistant))
    key = _template_key(tokenizer)
    if _CHECKED.get(key, 0) < CHECKED_TURNS:  # the first turns: against the full render of the real history
        _CHECKED[key] = _CHECKED.get(key, 0) + 1
        return _checked_delta_deltas(tokenizer, messages_before_assistant, tools, tool_messages)
    return _delta_deltas(tokenizer, tools, tool_messages)


def next_prompt(
    previous_prompt: Sequence[int], completion: Sequence[int], deltas: TurnDeltas
) -> tuple[list[int], list[int]]:
    """P_next and the framework-added tokens (E[overlap:] + O, all mask 0) that follow P + C."""
    overlap = suffix_prefix_overlap(completion, deltas.closing)
    added = [*deltas.closing[overlap:], *deltas.observation]
    return [*previous_prompt, *completion, *added], added


def assistant_turn(tokenizer, messages: Sequence[dict], tools: Sequence[dict] | None) -> tuple[int, list[int]]:
    """For `messages` ending with an assistant message: (where its tokens start, after the tokens of the generation
    prompt the model answers, the tokens a model writes for it). Those are what the template renders after the
    generation prompt, up to and including the end-of-turn token; what follows that token (a newline) is the
    template's, not the model's. The split is made in the rendered text and each side tokenized on its own, as at
    inference: the model sees the prompt's tokens, then writes its own (where the template puts "<think>\n" in the
    generation prompt, Qwen3.5's, the rendered text after it may start with "\n", which one tokenization of the
    whole would merge into the prompt's last token)."""
    prompt_text = render_text(tokenizer, messages[:-1], tools, add_generation_prompt=True)
    rendered_text = render_text(tokenizer, messages, tools, add_generation_prompt=False)
    if not rendered_text.startswith(prompt_text):
        raise TemplateError(
            "chat template rewrites history (assistant message): the rendering of the conversation does not start "
            "with its generation prompt, so the tokens the model writes for the last assistant message are unknown"
        )
    span = _encode_text(tokenizer, rendered_text[len(prompt_text) :])
    eos = tokenizer.eos_token_id
    return len(_encode_text(tokenizer, prompt_text)), span[: len(span) - span[::-1].index(eos)] if eos in span else span
