"""Seeded synthetic tasks over MiniMind's six tools, as rows in the agent-RL format.

Three families (the row's "kind"):
- single:  one call, its tool message, an answer holding its value;
- double:  two calls in ONE assistant turn (two tools, or one tool twice), two tool messages,
           an answer holding both values;
- no_tool: capital-city questions answered from memory (gt = the city or the country) and
           greetings (gt = []).

Reference tool messages hold exactly what `ToolExecutor` returns for the reference calls, and
gt holds the values the reference answer contains verbatim. Every question has "core" and
"extra" phrasings: the SFT warm start sees only core ones, RL sees both. The system message
offers the needed tools plus up to _MAX_DISTRACTORS others, shuffled (0 by default: each schema
costs about 60 prompt tokens, which the CPU budget of the default run cannot spare). All
randomness comes from `random.Random(seed)`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from minirl.data.generation import Phrasings, RowGenerator
from minirl.data.task import Task
from minirl.tools import MINIMIND_TOOL_NAMES, ToolExecutor, build_tools
from minirl.tools.base import ToolCall
from minirl.tools.minimind import LANGUAGES, PHRASES, TIMEZONE_OFFSETS, USD_RATES

SYSTEM_PROMPT = (
    "You are a helpful assistant. Call a tool when it helps answer the question, then answer in one short sentence."
)

_TOOLS = build_tools(MINIMIND_TOOL_NAMES)
_EXECUTOR = ToolExecutor(_TOOLS, timeout_s=10.0, max_output_chars=4096)

_SFT_MIX = {"single": 0.55, "double": 0.25, "no_tool": 0.20}
_RL_MIX = {"single": 0.45, "double": 0.35, "no_tool": 0.20}
_SAME_TOOL_TWICE = 0.3  # share of double tasks that call one tool twice
_GREETING_SHARE = 0.1  # share of no-tool tasks that are greetings
_MAX_DISTRACTORS = 0


@dataclass(frozen=True)
class _ToolTopic:
    """How to ask for one tool, call it, and report its value."""

    sample: Callable[[random.Random], dict[str, Any]]  # template fields, the tool's arguments among them
    question: Phrasings  # a single-call user message
    clause: Phrasings  # this call's part of a double-call user message
    answers: tuple[str, ...]  # answer sentences over the fields and the tool's result
    gt_key: str  # the result value the answer must contain


@dataclass(frozen=True)
class _RecallTopic:
    """A question answered from memory about one (country, capital) pair."""

    question: Phrasings
    answer: str
    gt_key: str


@dataclass
class _Episode:
    user: str
    needed: list[str]  # tools the reference calls, in order of first use
    reference: list[dict]
    gt: list[str]


# -- what the questions are about ----------------------------------------------------------------

_MATH_PATTERNS = (
    "{a} + {b}",
    "{a} - {b}",
    "{a} * {b}",
    "{a} / {c}",
    "({a} + {b}) * {c}",
    "{a} * {b} - {c}",
    "{c} ** 2 + {b}",
    "{a} % {c}",
    "{a} // {c}",
)
_CONVERSIONS = (
    ("km", "mile"),
    ("mile", "km"),
    ("m", "ft"),
    ("ft", "m"),
    ("inch", "cm"),
    ("cm", "inch"),
    ("km", "m"),
    ("m", "cm"),
    ("mm", "inch"),
    ("kg", "lb"),
    ("lb", "kg"),
    ("g", "oz"),
    ("oz", "g"),
    ("kg", "g"),
    ("C", "F"),
    ("F", "C"),
    ("C", "K"),
    ("K", "C"),
)
_UNIT_NAMES = {
    "m": "meters",
    "km": "kilometers",
    "cm": "centimeters",
    "mm": "millimeters",
    "mile": "miles",
    "ft": "feet",
    "inch": "inches",
    "kg": "kilograms",
    "g": "grams",
    "lb": "pounds",
    "oz": "ounces",
    "C": "degrees Celsius",
    "F": "degrees Fahrenheit",
    "K": "kelvin",
}
_CITIES = (
    "Paris", "London", "Tokyo", "New York", "Berlin", "Madrid", "Rome", "Sydney", "Toronto", "Mumbai",
    "Beijing", "Cairo", "Moscow", "Seoul", "Bangkok", "Lima", "Nairobi", "Oslo", "Dublin", "Vienna",
    "Prague", "Lisbon", "Athens", "Istanbul", "Dubai", "Singapore", "Chicago", "Boston", "Seattle", "Denver",
    "Mexico City", "Buenos Aires", "Cape Town", "Auckland", "Helsinki", "Warsaw", "Zurich", "Amsterdam",
    "Stockholm", "Hanoi",
)  # fmt: skip
_CAPITALS = (
    ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Portugal", "Lisbon"),
    ("Ireland", "Dublin"), ("Belgium", "Brussels"), ("Austria", "Vienna"), ("Switzerland", "Bern"),
    ("Poland", "Warsaw"), ("Sweden", "Stockholm"), ("Norway", "Oslo"), ("Denmark", "Copenhagen"),
    ("Finland", "Helsinki"), ("Greece", "Athens"), ("Hungary", "Budapest"), ("Russia", "Moscow"),
    ("Turkey", "Ankara"), ("Egypt", "Cairo"), ("Kenya", "Nairobi"), ("Nigeria", "Abuja"), ("Morocco", "Rabat"),
    ("Japan", "Tokyo"), ("China", "Beijing"), ("South Korea", "Seoul"), ("India", "New Delhi"),
    ("Thailand", "Bangkok"), ("Vietnam", "Hanoi"), ("Indonesia", "Jakarta"), ("Australia", "Canberra"),
    ("New Zealand", "Wellington"), ("Canada", "Ottawa"), ("Mexico", "Mexico City"), ("Brazil", "Brasília"),
    ("Argentina", "Buenos Aires"), ("Peru", "Lima"), ("Chile", "Santiago"), ("Colombia", "Bogotá"),
)  # fmt: skip
_GREETINGS = (
    ("Hello!", "Hello! How can I help you today?"),
    ("Hi there!", "Hi! What can I do for you?"),
    ("Good morning!", "Good morning! How can I help?"),
    ("How are you?", "I'm doing well, thank you. How can I help you?"),
    ("Thank you for your help!", "You're welcome! Happy to help."),
    ("Thanks a lot!", "You're welcome!"),
    ("Who are you?", "I'm a helpful assistant that can use tools to answer questions."),
    ("Goodbye!", "Goodbye! Have a great day."),
    ("What can you do?", "I can do math, convert units, and look up weather, time, exchange rates and translations."),
)


def _math_fields(rng: random.Random) -> dict[str, Any]:
    a, b, c = rng.randint(2, 999), rng.randint(2, 99), rng.randint(2, 20)
    return {"expression": rng.choice(_MATH_PATTERNS).format(a=a, b=b, c=c)}


def _unit_fields(rng: random.Random) -> dict[str, Any]:
    from_unit, to_unit = rng.choice(_CONVERSIONS)
    return {
        "value": rng.randint(2, 250),
        "from_unit": from_unit,
        "to_unit": to_unit,
        "from_name": _UNIT_NAMES[from_unit],
        "to_name": _UNIT_NAMES[to_unit],
    }


def _time_fields(rng: random.Random) -> dict[str, Any]:
    timezone = rng.choice(list(TIMEZONE_OFFSETS))
    return {"timezone": timezone, "place": timezone.rsplit("/", 1)[-1].replace("_", " ")}


def _rate_fields(rng: random.Random) -> dict[str, Any]:
    from_currency, to_currency = rng.sample(list(USD_RATES), 2)
    return {"from_currency": from_currency, "to_currency": to_currency}


def _translate_fields(rng: random.Random) -> dict[str, Any]:
    return {"text": rng.choice(list(PHRASES)), "target_language": rng.choice(LANGUAGES)}


_TOPICS: dict[str, _ToolTopic] = {
    "calculate_math": _ToolTopic(
        sample=_math_fields,
        question=Phrasings(
            core=("What is {expression}?", "Calculate {expression}.", "Compute {expression}, please."),
            extra=("Can you work out {expression} for me?", "I need the value of {expression}."),
        ),
        clause=Phrasings(
            core=("what {expression} equals", "the value of {expression}"), extra=("the result of {expression}",)
        ),
        answers=("{expression} = {result}.", "The result of {expression} is {result}."),
        gt_key="result",
    ),
    "unit_converter": _ToolTopic(
        sample=_unit_fields,
        question=Phrasings(
            core=(
                "Convert {value} {from_name} to {to_name}.",
                "How many {to_name} is {value} {from_name}?",
                "What is {value} {from_name} in {to_name}?",
            ),
            extra=(
                "I have {value} {from_name}; how much is that in {to_name}?",
                "Please express {value} {from_name} in {to_name}.",
            ),
        ),
        clause=Phrasings(
            core=("what {value} {from_name} is in {to_name}", "{value} {from_name} converted to {to_name}"),
            extra=("how many {to_name} make {value} {from_name}",),
        ),
        answers=("{value} {from_name} is {result} {to_name}.", "{value} {from_name} equals {result} {to_name}."),
        gt_key="result",
    ),
    "get_current_weather": _ToolTopic(
        sample=lambda rng: {"city": rng.choice(_CITIES)},
        question=Phrasings(
            core=(
                "What's the weather like in {city}?",
                "How is the weather in {city} today?",
                "Tell me the current weather in {city}.",
            ),
            extra=("Is it warm in {city} right now?", "What is the temperature in {city} at the moment?"),
        ),
        clause=Phrasings(
            core=("the weather in {city}", "the current weather in {city}"), extra=("how warm it is in {city}",)
        ),
        answers=(
            "It is {temperature}°C and {condition} in {city}.",
            "In {city} it is {condition} with {temperature}°C.",
        ),
        gt_key="temperature",
    ),
    "get_current_time": _ToolTopic(
        sample=_time_fields,
        question=Phrasings(
            core=(
                "What time is it in {place}?",
                "What is the current time in {timezone}?",
                "Tell me the local time in {place}.",
            ),
            extra=(
                "Could you check the clock in {place} for me?",
                "I'm calling someone in {place}; what time is it there now?",
            ),
        ),
        clause=Phrasings(
            core=("the time in {place}", "the current time in {timezone}"), extra=("what time it is in {place}",)
        ),
        answers=("It is {time} in {place}.", "The local time in {place} is {time}."),
        gt_key="time",
    ),
    "get_exchange_rate": _ToolTopic(
        sample=_rate_fields,
        question=Phrasings(
            core=(
                "What is the exchange rate from {from_currency} to {to_currency}?",
                "How many {to_currency} do I get for one {from_currency}?",
                "Give me the {from_currency} to {to_currency} exchange rate.",
            ),
            extra=(
                "What's one {from_currency} worth in {to_currency}?",
                "If I change 1 {from_currency}, how much {to_currency} is that?",
            ),
        ),
        clause=Phrasings(
            core=(
                "the exchange rate from {from_currency} to {to_currency}",
                "the {from_currency} to {to_currency} rate",
            ),
            extra=("how many {to_currency} one {from_currency} buys",),
        ),
        answers=("1 {from_currency} = {rate} {to_currency}.", "One {from_currency} is worth {rate} {to_currency}."),
        gt_key="rate",
    ),
    "translate_text": _ToolTopic(
        sample=_translate_fields,
        question=Phrasings(
            core=(
                'How do you say "{text}" in {target_language}?',
                'Translate "{text}" into {target_language}.',
                'What is "{text}" in {target_language}?',
            ),
            extra=('Give me the {target_language} for "{text}".', 'I want to say "{text}" in {target_language}. How?'),
        ),
        clause=Phrasings(
            core=('how to say "{text}" in {target_language}', 'the {target_language} for "{text}"'),
            extra=('"{text}" translated into {target_language}',),
        ),
        answers=(
            '"{text}" in {target_language} is "{translation}".',
            'In {target_language}, "{text}" is "{translation}".',
        ),
        gt_key="translation",
    ),
}

_CONNECTORS = Phrasings(
    core=(
        "Please tell me {first} and {second}.",
        "Can you find {first}, and also {second}?",
        "I need two things: {first}, and {second}.",
    ),
    extra=("Could you look up {first} as well as {second}?", "Two questions: {first}; and {second}."),
)

_RECALL_TOPICS = (
    _RecallTopic(
        question=Phrasings(
            core=(
                "What is the capital of {country}?",
                "Which city is the capital of {country}?",
                "Name the capital of {country}.",
            ),
            extra=("What's {country}'s capital city?", "I forgot the capital of {country}. What is it?"),
        ),
        answer="The capital of {country} is {capital}.",
        gt_key="capital",
    ),
    _RecallTopic(
        question=Phrasings(
            core=(
                "{capital} is the capital of which country?",
                "Which country has {capital} as its capital?",
                "Of which country is {capital} the capital?",
            ),
            extra=("Tell me which country's capital is {capital}.", "Whose capital city is {capital}?"),
        ),
        answer="{capital} is the capital of {country}.",
        gt_key="country",
    ),
)


# -- families -------------------------------------------------------------------------------------


def _tool_episode(rng: random.Random, user: str, calls: list[tuple[str, dict[str, Any]]]) -> _Episode:
    """Run the reference calls through the executor; the answer states every value."""
    tool_calls = [
        {"name": name, "arguments": {key: fields[key] for key in _TOOLS[name].parameters["properties"]}}
        for name, fields in calls
    ]
    results = _EXECUTOR.execute_many(
        [ToolCall(f"call_{i}", call["name"], call["arguments"]) for i, call in enumerate(tool_calls)]
    )
    failed = [result.content for result in results if result.status != "ok"]
    if failed:
        raise RuntimeError(f"a synthetic reference call failed: {failed}")
    values = [{**fields, **json.loads(result.content)} for (_, fields), result in zip(calls, results, strict=True)]
    answer = " ".join(rng.choice(_TOPICS[name].answers).format(**v) for (name, _), v in zip(calls, values, strict=True))
    return _Episode(
        user=user,
        needed=list(dict.fromkeys(name for name, _ in calls)),
        reference=[
            {"role": "assistant", "content": "", "tool_calls": tool_calls},
            *({"role": "tool", "content": result.content} for result in results),
            {"role": "assistant", "content": answer},
        ],
        gt=[v[_TOPICS[name].gt_key] for (name, _), v in zip(calls, values, strict=True)],
    )


def _single(rng: random.Random, phrasings: str) -> _Episode:
    name = rng.choice(MINIMIND_TOOL_NAMES)
    fields = _TOPICS[name].sample(rng)
    return _tool_episode(rng, _TOPICS[name].question.pick(rng, phrasings).format(**fields), [(name, fields)])


def _double(rng: random.Random, phrasings: str) -> _Episode:
    first = rng.choice(MINIMIND_TOOL_NAMES)
    others = [name for name in MINIMIND_TOOL_NAMES if name != first]
    second = first if rng.random() < _SAME_TOOL_TWICE else rng.choice(others)
    first_fields = _TOPICS[first].sample(rng)
    second_fields = _TOPICS[second].sample(rng)
    while second_fields == first_fields:  # one tool twice asks about two different things
        second_fields = _TOPICS[second].sample(rng)
    calls = [(first, first_fields), (second, second_fields)]
    first_clause, second_clause = (_TOPICS[name].clause.pick(rng, phrasings).format(**f) for name, f in calls)
    user = _CONNECTORS.pick(rng, phrasings).format(first=first_clause, second=second_clause)
    return _tool_episode(rng, user, calls)


def _no_tool(rng: random.Random, phrasings: str) -> _Episode:
    if rng.random() < _GREETING_SHARE:
        user, answer = rng.choice(_GREETINGS)
        gt = []
    else:
        topic = rng.choice(_RECALL_TOPICS)
        country, capital = rng.choice(_CAPITALS)
        fields = {"country": country, "capital": capital}
        user, answer = topic.question.pick(rng, phrasings).format(**fields), topic.answer.format(**fields)
        gt = [fields[topic.gt_key]]
    return _Episode(user=user, needed=[], reference=[{"role": "assistant", "content": answer}], gt=gt)


_FAMILIES: dict[str, Callable[[random.Random, bool], _Episode]] = {
    "single": _single,
    "double": _double,
    "no_tool": _no_tool,
}


def _row(rng: random.Random, kind: str, episode: _Episode) -> dict:
    """The row: system message with the needed tools plus distractors, the question, the reference."""
    spare = [name for name in MINIMIND_TOOL_NAMES if name not in episode.needed]
    offered = episode.needed + rng.sample(spare, rng.randint(0, min(_MAX_DISTRACTORS, len(spare))))
    rng.shuffle(offered)
    system = {"role": "system", "content": SYSTEM_PROMPT, "tools": [_TOOLS[name].schema() for name in offered]}
    return {
        "conversations": [system, {"role": "user", "content": episode.user}, *episode.reference],
        "gt": episode.gt,
        "kind": kind,
    }


GENERATOR = RowGenerator("synthetic_tools", _FAMILIES, _row, _SFT_MIX, _RL_MIX)


def sft_rows(n: int, seed: int, exclude_prompts: Collection[str]) -> list[dict]:
    """Warm-start rows: core phrasings only, about 55% single, 25% double, 20% no-tool, with full
    reference conversations. No prompt is in `exclude_prompts`; prompts may repeat, since the
    no-tool space is smaller than its share of a few thousand rows."""
    return GENERATOR.sft_rows(n, seed, exclude_prompts)


def rl_rows(n: int, seed: int, exclude_prompts: Collection[str] = frozenset()) -> list[dict]:
    """RL rows: all phrasings, about 45% single, 35% double, 20% no-tool (a family whose prompts
    run out is drawn less), distinct prompts none of which is in `exclude_prompts`."""
    return GENERATOR.rl_rows(n, seed, exclude_prompts)


def train_heldout_split(train_size: int, heldout_size: int, seed: int) -> tuple[list[Task], list[Task]]:
    """(train, held-out) RL tasks; held-out uses seed + 1 and no train prompt equals a held-out one."""
    return GENERATOR.train_heldout_split(train_size, heldout_size, seed)
