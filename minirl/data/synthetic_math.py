"""Seeded math tasks that are much easier with code than without (ReTool), as rows in the agent-RL format.

Six families (the row's "kind"):
- product:         a * b, each operand of 5 to 8 digits;
- sum:             three or four numbers of 6 to 8 digits;
- mod_pow:         b^e mod m, with e up to a million (Python's three-argument pow);
- count_multiples: how many integers in 1..N are divisible by p or q;
- count_primes:    how many primes there are in 1..N;
- power_digit_sum: the digit sum of b^e, a number of up to 600 digits.

Each row offers only `code_interpreter`. Its reference is one call whose short Python prints the
answer, the tool message the real executor returns for that call, and "The answer is \\boxed{...}.";
gt holds the answer. The tool message is written from the tool's output format (`{"output":
what the code printed}`, JSON-encoded) and the answer computed here, since running the sandbox
for every row would cost about 65 ms each; a test checks it against the real tool. Every family
has "core" and "extra" phrasings: the SFT warm start sees core ones (and extra ones in
sft.extra_wording_share of its rows), RL sees both. `NO_TOOL_GENERATOR` asks the same questions
with no tool offered and answers them at once: the ablation that shows what the tool is worth.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from minirl.data.generation import Phrasings, RowGenerator
from minirl.tools import TOOLS

SYSTEM_PROMPT = (
    "Solve the problem. You can run Python with the code_interpreter tool, one call per turn. "
    "Each call starts a fresh interpreter: nothing is kept between calls, so define what you use and print the result. "
    "Give the final answer on the last line as \\boxed{ANSWER}."
)

NO_TOOL_SYSTEM_PROMPT = "Solve the problem. Give the final answer on the last line as \\boxed{ANSWER}."

_CODE_INTERPRETER = TOOLS.get("code_interpreter")
_MAX_PRIME_LIMIT = 20_000  # count_primes' N: the reference trial division stays well under a second


@dataclass
class _Problem:
    user: str
    code: str  # reference Python that prints the answer
    answer: str


@dataclass(frozen=True)
class _Family:
    """How to draw, ask, code and answer one kind of problem."""

    sample: Callable[[random.Random], dict[str, Any]]  # template fields
    question: Phrasings  # the user message over the fields
    code: str  # reference Python over the fields
    answer: Callable[[dict[str, Any]], int]  # what the code prints, computed here

    def draw(self, rng: random.Random, phrasings: str) -> _Problem:
        fields = self.sample(rng)
        question = self.question.pick(rng, phrasings).format(**fields)
        return _Problem(user=question, code=self.code.format(**fields), answer=str(self.answer(fields)))


def _number(rng: random.Random, min_digits: int, max_digits: int) -> int:
    """A number whose digit count is uniform in [min_digits, max_digits]."""
    digits = rng.randint(min_digits, max_digits)
    return rng.randint(10 ** (digits - 1), 10**digits - 1)


def _sum_fields(rng: random.Random) -> dict[str, Any]:
    numbers = [_number(rng, 6, 8) for _ in range(rng.randint(3, 4))]
    return {
        "numbers": numbers,
        "terms": " + ".join(map(str, numbers)),
        "listing": ", ".join(map(str, numbers[:-1])) + f" and {numbers[-1]}",
    }


def _multiples_fields(rng: random.Random) -> dict[str, Any]:
    p, q = rng.sample(range(3, 30), 2)
    return {"p": p, "q": q, "limit": rng.randint(10_000, 200_000)}


def _prime_counts(limit: int) -> list[int]:
    """counts[n] = how many primes are <= n, for n up to `limit` (sieve of Eratosthenes)."""
    is_prime = [False, False] + [True] * (limit - 1)
    for p in range(2, math.isqrt(limit) + 1):
        if is_prime[p]:
            is_prime[p * p :: p] = [False] * len(range(p * p, limit + 1, p))
    return list(accumulate(is_prime))


_PRIME_COUNTS = _prime_counts(_MAX_PRIME_LIMIT)

_FAMILIES: dict[str, _Family] = {
    "product": _Family(
        sample=lambda rng: {"a": _number(rng, 5, 8), "b": _number(rng, 5, 8)},
        question=Phrasings(
            core=("What is {a} * {b}?", "Compute the product of {a} and {b}.", "Multiply {a} by {b}."),
            extra=("Find {a} times {b}.", "What do you get when you multiply {a} and {b}?"),
        ),
        code="print({a} * {b})",
        answer=lambda f: f["a"] * f["b"],
    ),
    "sum": _Family(
        sample=_sum_fields,
        question=Phrasings(
            core=("What is {terms}?", "Add up {listing}.", "Compute the sum of {listing}."),
            extra=("Find the total of {listing}.", "What do {listing} add up to?"),
        ),
        code="print({terms})",
        answer=lambda f: sum(f["numbers"]),
    ),
    "mod_pow": _Family(
        sample=lambda rng: {
            "b": rng.randint(2, 99_999),
            "e": rng.randint(1_000, 999_999),
            "m": rng.randint(1_000, 999_999),
        },
        question=Phrasings(
            core=(
                "What is {b}^{e} mod {m}?",
                "Compute {b}^{e} modulo {m}.",
                "What is the remainder of {b}^{e} divided by {m}?",
            ),
            extra=("Find {b} to the power {e}, modulo {m}.", "What remainder does {b}^{e} leave when divided by {m}?"),
        ),
        code="print(pow({b}, {e}, {m}))",
        answer=lambda f: pow(f["b"], f["e"], f["m"]),
    ),
    "count_multiples": _Family(
        sample=_multiples_fields,
        question=Phrasings(
            core=(
                "How many integers from 1 to {limit} are divisible by {p} or {q}?",
                "Count the numbers between 1 and {limit} that are multiples of {p} or of {q}.",
            ),
            extra=(
                "Among 1, 2, ..., {limit}, how many numbers are divisible by {p} or by {q}?",
                "How many multiples of {p} or {q} are there in 1..{limit}?",
            ),
        ),
        code="print(sum(1 for k in range(1, {limit} + 1) if k % {p} == 0 or k % {q} == 0))",
        answer=lambda f: f["limit"] // f["p"] + f["limit"] // f["q"] - f["limit"] // math.lcm(f["p"], f["q"]),
    ),
    "count_primes": _Family(
        sample=lambda rng: {"limit": rng.randint(1_000, _MAX_PRIME_LIMIT)},
        question=Phrasings(
            core=("How many primes are there between 1 and {limit}?", "Count the prime numbers up to {limit}."),
            extra=("How many prime numbers are less than or equal to {limit}?", "How many primes are in 1..{limit}?"),
        ),
        code="print(sum(all(k % d for d in range(2, int(k**0.5) + 1)) for k in range(2, {limit} + 1)))",
        answer=lambda f: _PRIME_COUNTS[f["limit"]],
    ),
    "power_digit_sum": _Family(
        sample=lambda rng: {"b": rng.randint(2, 99), "e": rng.randint(20, 300)},
        question=Phrasings(
            core=("What is the sum of the digits of {b}^{e}?", "Compute the digit sum of {b}^{e}."),
            extra=(
                "Add up all the digits of {b} to the power {e}.",
                "If you write out {b}^{e}, what do its digits sum to?",
            ),
        ),
        code="print(sum(int(c) for c in str({b}**{e})))",
        answer=lambda f: sum(map(int, str(f["b"] ** f["e"]))),
    ),
}
_MIX = dict.fromkeys(_FAMILIES, 1.0)  # every family equally often, in the warm start and in RL


def code_interpreter_message(printed: str) -> str:
    """The tool message ToolExecutor returns for a code_interpreter run that finished having
    printed `printed` (which holds no chat-template control token and fits the output caps)."""
    return json.dumps({"output": printed}, ensure_ascii=False)


def _answer(problem: _Problem) -> dict:
    return {"role": "assistant", "content": f"The answer is \\boxed{{{problem.answer}}}."}


def _row(rng: random.Random, kind: str, problem: _Problem) -> dict:
    """The row: system message with the rules and the code tool, the question, the reference."""
    call = {"name": _CODE_INTERPRETER.name, "arguments": {"code": problem.code}}
    return {
        "conversations": [
            {"role": "system", "content": SYSTEM_PROMPT, "tools": [_CODE_INTERPRETER.schema()]},
            {"role": "user", "content": problem.user},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": code_interpreter_message(problem.answer + "\n")},
            _answer(problem),
        ],
        "gt": [problem.answer],
        "kind": kind,
    }


def _row_without_tool(rng: random.Random, kind: str, problem: _Problem) -> dict:
    """The same question with no tool offered, its reference the answer alone (the recipe's tool-off ablation)."""
    return {
        "conversations": [
            {"role": "system", "content": NO_TOOL_SYSTEM_PROMPT},
            {"role": "user", "content": problem.user},
            _answer(problem),
        ],
        "gt": [problem.answer],
        "kind": kind,
    }


_DRAWS = {kind: family.draw for kind, family in _FAMILIES.items()}
GENERATOR = RowGenerator("synthetic_math", _DRAWS, _row, _MIX, _MIX)
# the same questions, seed for seed, in the same order
NO_TOOL_GENERATOR = RowGenerator("synthetic_math", _DRAWS, _row_without_tool, _MIX, _MIX)
