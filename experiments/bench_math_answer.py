"""Latency of `equivalent` over the answer-pair suite and on hostile input, and agreement with math-verify.

    python experiments/bench_math_answer.py [--repeats 5]

The suite is tests/data/math_pairs.jsonl (docs/math_answers.md). Each pair's check is timed
`--repeats` times and its fastest run kept; median, p99 and mean are over pairs, in microseconds.
Hostile inputs are timed the same way and their slowest is reported. If math_verify is importable
(`pip install "math-verify[antlr4_9_3]"`), it is run on the same pairs, gold `$reference$` and
prediction `$answer$` (or the whole solution text), with its signal timeouts off (they need the main
thread), to report how often our verdicts and the fixed verdicts agree with it, and its latency.
The hostile pairs are left out of math-verify's run: without its timeouts nothing bounds it.
Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from minirl.rewards.math_answer import equivalent, last_boxed

PAIRS_FILE = Path(__file__).resolve().parent.parent / "tests" / "data" / "math_pairs.jsonl"
HOSTILE = {
    "9^{9^{9^9}}": "9^{9^{9^9}}",
    "10^{10^{10}}": "10^{10^{10}}",
    "1000!": "1000!",
    "200!^{200!}": "200!^{200!}",
    "\\sin(10^{300})": "0",
    "x^{x^{x^{x^{x^{x}}}}}": "x^{x^{x^{x^{x^{x}}}}}",
    "a 10,000-character box": "7" * 10_000,
    "9,999 nested braces": "{" * 4_999 + "1" + "}" * 4_999,
    "1,400 nested roots": "\\sqrt{" * 1_400 + "2" + "}" * 1_400,
    "5,000 unclosed \\text{": "\\text{" * 1_666,
    "a 32-element set of roots": "\\{" + ", ".join(f"\\sqrt{{{i}}}" for i in range(32)) + "\\}",
    "a 400-character sum": "+".join(["\\sqrt{2}"] * 44),
}


def our_verdict(pair: dict) -> bool:
    answer = last_boxed(pair["answer"]) if pair["solution"] else pair["answer"]
    return answer is not None and equivalent(answer, pair["reference"])


def fastest_us(check: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        check()
        best = min(best, time.perf_counter() - started)
    return best * 1e6


def summary(micros: list[float]) -> str:
    ordered = sorted(micros)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"{statistics.median(ordered):.0f} | {p99:.0f} | {statistics.fmean(ordered):.0f}"


def math_verify_checker() -> Callable[[dict], bool] | None:
    try:
        from math_verify import parse, verify
    except ImportError:
        return None
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns once that the timeouts are off

    def check(pair: dict) -> bool:
        gold = parse(f"${pair['reference']}$", parsing_timeout=None)
        prediction = parse(pair["answer"] if pair["solution"] else f"${pair['answer']}$", parsing_timeout=None)
        return bool(verify(gold, prediction, timeout_seconds=None))

    return check


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per check; the fastest counts")
    args = parser.parse_args()
    pairs = [json.loads(line) for line in PAIRS_FILE.read_text(encoding="utf-8").splitlines()]
    ours = [our_verdict(pair) for pair in pairs]
    right = sum(verdict is pair["expected"] for verdict, pair in zip(ours, pairs))
    print(f"{len(pairs)} pairs; our verdict is the fixed one on {right} ({right / len(pairs):.1%})\n")

    suite_us = [fastest_us(lambda pair=pair: our_verdict(pair), args.repeats) for pair in pairs]
    hostile_us = {name: fastest_us(lambda t=text: equivalent(t, t), args.repeats) for name, text in HOSTILE.items()}
    slowest = max(hostile_us, key=hostile_us.get)
    print("| checker | median µs | p99 µs | mean µs |\n| --- | --- | --- | --- |")
    print(f"| minirl `equivalent` | {summary(suite_us)} |")

    math_verify = math_verify_checker()
    if math_verify is None:
        print("\nmath_verify is not installed: no agreement or math-verify latency.")
    else:
        checked = [(pair, verdict) for pair, verdict in zip(pairs, ours) if pair["category"] != "hostile"]
        theirs = [math_verify(pair) for pair, _ in checked]
        mv_us = [fastest_us(lambda pair=pair: math_verify(pair), args.repeats) for pair, _ in checked]
        print(f"| math-verify `parse` + `verify` | {summary(mv_us)} |")
        ours_agree = sum(verdict == mv for (_, verdict), mv in zip(checked, theirs))
        fixed_agree = sum(pair["expected"] == mv for (pair, _), mv in zip(checked, theirs))
        stale = sum(pair["math_verify"] != mv for (pair, _), mv in zip(checked, theirs))
        print(f"\nAgreement with math-verify over the {len(checked)} pairs that are not hostile:\n")
        print("| verdicts | agree | share |\n| --- | --- | --- |")
        print(f"| ours | {ours_agree} | {ours_agree / len(checked):.1%} |")
        print(f"| fixed | {fixed_agree} | {fixed_agree / len(checked):.1%} |")
        print(f"\nmath-verify verdicts that differ from those recorded in the suite: {stale}")

    print("\n| hostile input | µs |\n| --- | --- |")
    for name, micros in hostile_us.items():
        print(f"| {name} | {micros:.0f} |")
    print(f"\nslowest hostile check: {slowest}, {hostile_us[slowest] / 1000:.1f} ms")


if __name__ == "__main__":
    main()
