"""Render messages + tools to token ids through the tokenizer's own chat template, and build
the next prompt token-in / token-out.

Sampled tokens are never decoded and re-encoded: the next prompt is

    P_next = P + C + E[overlap:] + O

P the previous prompt, C the sampled completion, E the template's assistant-closing tokens
(only the part the sampler did not already produce) and O the observation delta (tool
messages plus the next assistant header). E and O come from rendering the canonical history
with a placeholder assistant message and checking the prefix property; a template that
rewrites history makes that check fail loudly instead of silently misaligning tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

PLACEHOLDER = "x"


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


def render(tokenizer, messages: Sequence[dict], tools: Sequence[dict] | None, add_generation_prompt: bool) -> list[int]:
    """Token ids of `messages` (+ tool schemas) through the tokenizer's chat template."""
    rendered = tokenizer.apply_chat_template(
        list(messages),
        tools=list(tools) if tools else None,
        tokenize=True,
        return_dict=False,
        add_generation_prompt=add_generation_prompt,
    )
    return _as_id_list(rendered)


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


def turn_deltas(
    tokenizer,
    messages_before_assistant: Sequence[dict],
    tools: Sequence[dict] | None,
    tool_messages: Sequence[dict],
) -> TurnDeltas:
    """Closing and observation tokens for one assistant turn followed by `tool_messages`.

    The placeholder assistant content stands in for the sampled text, which the template may
    strip or restructure; only the structural tokens around it are taken from the render.
    """
    placeholder: dict[str, Any] = {"role": "assistant", "content": PLACEHOLDER}
    canonical_prompt = render(tokenizer, messages_before_assistant, tools, add_generation_prompt=True)
    with_placeholder = [*messages_before_assistant, placeholder]
    assistant_end = render(tokenizer, with_placeholder, tools, add_generation_prompt=False)
    action = [*canonical_prompt, *_encode_text(tokenizer, PLACEHOLDER)]
    closing = _strip_prefix(assistant_end, action, "assistant message")
    next_prompt = render(tokenizer, [*with_placeholder, *tool_messages], tools, add_generation_prompt=True)
    observation = _strip_prefix(next_prompt, assistant_end, "tool messages")
    return TurnDeltas(closing, observation)


def next_prompt(
    previous_prompt: Sequence[int], completion: Sequence[int], deltas: TurnDeltas
) -> tuple[list[int], list[int]]:
    """P_next and the framework-added tokens (E[overlap:] + O, all mask 0) that follow P + C."""
    overlap = suffix_prefix_overlap(completion, deltas.closing)
    added = [*deltas.closing[overlap:], *deltas.observation]
    return [*previous_prompt, *completion, *added], added


def assistant_turn(tokenizer, messages: Sequence[dict], tools: Sequence[dict] | None) -> tuple[int, list[int]]:
    """For `messages` ending with an assistant message: (where its tokens start in the rendering of
    `messages`, the tokens a model writes for it). Those are what the template renders after the
    generation prompt, up to and including the end-of-turn token; what follows that token (a newline)
    is the template's, not the model's."""
    prompt = render(tokenizer, messages[:-1], tools, add_generation_prompt=True)
    rendered = render(tokenizer, messages, tools, add_generation_prompt=False)
    span = _strip_prefix(rendered, prompt, "assistant message")
    eos = tokenizer.eos_token_id
    return len(prompt), span[: len(span) - span[::-1].index(eos)] if eos in span else span
