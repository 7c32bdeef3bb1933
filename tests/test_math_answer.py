r"""The last \boxed{} of a text, answer equivalence (the pair suite is tests/test_math_suite.py), ReTool's
`boxed_answer` reward term and the success criterion behind the success-rate metrics."""

from __future__ import annotations

import json
import math
import time
from fractions import Fraction

import pytest
from hydra import compose, initialize_config_dir
from hypothesis import given, settings
from hypothesis import strategies as st

from minirl.config import register_configs, to_config
from minirl.data.task import Task
from minirl.entry import CONF_DIR
from minirl.metrics import rollout_metrics, success_by_kind
from minirl.protocol.parsing import parse_turn
from minirl.rewards import REWARD_TERMS, SUCCESS_CRITERIA, equivalent, last_boxed, score, score_all
from minirl.rewards import terms as T
from minirl.rewards.math_answer import MAX_ANSWER_CHARS, MAX_ELEMENTS, MAX_EXPRESSION_CHARS, MAX_FACTORIAL
from minirl.rollout.trajectory import Trajectory, TrajectoryEnd, Turn
from minirl.tools.base import ToolResult

pytestmark = pytest.mark.fast

register_configs()

# -- last_boxed --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "content"),
    [
        (r"The answer is \boxed{42}.", "42"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{\frac{\sqrt{3}}{2}} done", r"\frac{\sqrt{3}}{2}"),
        (r"first \boxed{1}, then \boxed{2}, finally \boxed{ 3 }", "3"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # escaped braces do not count
        (r"\boxed {7}", "7"),
        (r"\boxed{}", ""),
        (r"\boxed{\boxed{5}}", "5"),  # the box that opens last
        (r"\boxed{3} and then \boxed", "3"),  # a bare \boxed is not a box
        (r"\boxed{1} \boxed{2", None),  # the last box is never closed
        (r"\boxed{1}}", "1"),
        (r"\boxed 5", None),  # only the braced form counts
        ("no box here: 5", None),
        ("", None),
    ],
)
def test_last_boxed(text, content):
    assert last_boxed(text) == content


@pytest.mark.parametrize(
    "text",
    [
        "\\boxed{" * 200_000,
        "\\boxed{" + "{" * 1_000_000,
        "\\boxed{" + "\\{" * 500_000,
        "\\boxed" + " " * 1_000_000,
        "\\boxed{" + "{" * 500_000 + "}" * 500_000,
        "x" * 1_000_000,
    ],
    ids=["many boxes", "unclosed braces", "escaped braces", "spaces", "deep but closed", "plain text"],
)
def test_last_boxed_is_linear_on_hostile_text(text):
    started = time.perf_counter()
    last_boxed(text)
    assert time.perf_counter() - started < 2.0


# -- equivalent --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "reference"),
    [
        ("42", "42"),
        ("  42 ", "42"),
        ("-7", "-7"),
        ("−7", "-7"),  # a Unicode minus
        ("４２", "42"),  # full-width digits
        ("1/2", "0.5"),
        (r"\frac{1}{2}", "0.5"),
        (r"\dfrac{2}{4}", "1/2"),
        (r"\tfrac12", "0.5"),
        (r"-\frac{3}{4}", "-0.75"),
        (r"\frac{-3}{4}", "-3/4"),
        (r"\frac{\frac{1}{2}}{2}", "0.25"),
        (".5", "0.5"),
        ("3.0", "3"),
        ("1e3", "1000"),
        ("007", "7"),
        ("1,234", "1234"),
        ("1,234,567", "1234567"),
        ("1{,}234", "1234"),
        (r"1\,234", "1234"),
        ("$42$", "42"),
        (r"\left( \frac{1}{2} \right)", "1/2"),
        (r"2^{10}", "1024"),
        (r"2 \cdot 3", "6"),
        (r"1.5 \times 10^{3}", "1500"),
        (r"6 \div 4", "3/2"),
        ("x=5", "5"),
        ("n = 5", "5"),
        ("5", "k = 5"),
        (r"10\text{ cm}", "10"),
        (r"25\%", "25"),
        (r"90^\circ", "90"),
        (r"\text{Yes}", "yes"),
        ("New   York", "new york"),
        (r"\sqrt{2}", r"\sqrt{2}"),
        (r"\sqrt{4}", "2"),  # roots, pi and powers are valued
        (r"\sqrt{117}", r"3\sqrt{13}"),
        (r"2^{1/2}", r"\sqrt2"),
        (r"\frac94\pi", r"\frac{9}{4}\pi"),
        ("2-2p", "-2p+2"),  # variables take the same sample values on both sides
        ("x=y=5", "x=y=5"),
        ("(1, 2)", "(1, 2)"),
        ("(1, 2)", "(1,2)"),  # text and structure ignore spacing
        (r"3 \sqrt{13}", r"3\sqrt{13}"),
        (r"[-1, -\tfrac12) \cup (1, \infty)", r"(1, \infty) \cup [-1, -\frac{1}{2})"),
        (r"\{1, 2\}", r"\{2, 1\}"),
        ("-2, 1", "1, -2"),
        (r"1 \pm \sqrt{19}", r"1-\sqrt{19}, 1+\sqrt{19}"),
        ("(C)", "C"),
        (r"\text{(C)}", "c"),
        (r"\$5", "5"),
        (r"\$18.90", "18.90"),
        (r"\cfrac{1}{3}", "1/3"),
        (r"125\textnormal{ miles}", "125"),
        (r"3\frac{1}{2}", "7/2"),
        ("28 percent", r"28\%"),
        (r"32,\! 349", "32349"),
        (r"10 \text{ cm}^2", "10"),
        ("5 apples", "5"),  # a plain word after a number is a unit
        (r"0.\overline{3}", "1/3"),
        (r"5 \geq x", r"x \leq 5"),
        ("x^2/4 + y^2/3 = 1", "x^2/16 + y^2/12 = 1/4"),  # equations agree up to a constant factor
    ],
)
def test_equivalent(answer, reference):
    assert equivalent(answer, reference)
    assert equivalent(reference, answer)


@pytest.mark.parametrize(
    ("answer", "reference"),
    [
        ("41", "42"),
        ("-42", "42"),
        ("0.333", "1/3"),
        ("0.5", "0.51"),
        ("1,2", "12"),  # not a thousands separator
        ("1 2", "12"),
        ("0x10", "16"),  # not read as a number, and not the same text
        ("x+y=5", "5"),
        ("f(x)=5", "5"),
        ("x=y=5", "5"),
        ("x=y=5", "z=y=5"),  # the prefix goes only when no other "=" follows
        ("5 thousand", "5"),  # a number word is not a unit
        (r"\sqrt{2}", "1.41421356"),  # an approximation is not the exact value
        (r"\pi", "3.14"),
        (r"2^\frac{1}{2}", "1"),
        ("2-2p", "2-2q"),
        ("(1, 2)", "[1, 2]"),  # brackets count
        ("(1, 2)", "(2, 1)"),  # and so does order in a tuple
        (r"\{1, 2\}", r"\{1, 2, 3\}"),
        ("32, 349", "32349"),
        ("x < 5", "x > 5"),
        ("B", "C"),
        ("yes", "no"),
        ("", ""),
        ("   ", "0"),
        ("$$", ""),
        ("1/0", "1/0"),  # division by zero equals nothing, itself included
        (r"\frac{1}{0}", "0"),
        ("0^{-1}", "0^{-1}"),
    ],
)
def test_not_equivalent(answer, reference):
    assert not equivalent(answer, reference)
    assert not equivalent(reference, answer)


@pytest.mark.parametrize(
    "answer",
    [
        "9^9^9^9",
        "9^{9^{9^{9}}}",
        "10^{10^{10}}",
        "(10^{300})^{300}",
        "2^{1001}",
        "1e999999999",
        "9" * 199,
        "(" * 99 + "1" + ")" * 99,
        "1" + "+1" * 99,
        "\\frac{" * 30 + "1" + "}{2}" * 30,
        "{" * 100_000,
        "1,2" * 300_000,
        "\\text{" * 100_000,
        "1" * 10_000,  # a 10,000-character box
        "\\sqrt{" * 1_500 + "2" + "}" * 1_500,
        "1000!",
        "200!^{200!}",
        r"\sin(10^{300})",
        r"\exp(10^{300})",
        "x^{x^{x^{x^{x^{x}}}}}",
        ",".join(["\\sqrt{2}"] * 5_000),
    ],
)
def test_huge_or_hostile_answers_are_false_quickly(answer):
    # per-check latency is measured in experiments/bench_math_answer.py; this bound is generous
    started = time.perf_counter()
    assert not equivalent(answer, "7")
    equivalent(answer, answer)  # must not hang or raise, whatever the verdict
    assert time.perf_counter() - started < 2.0


def test_the_bounds_are_structural():
    ones = (MAX_EXPRESSION_CHARS + 1) // 2  # "1+1+...+1" of at most MAX_EXPRESSION_CHARS characters
    assert equivalent("+".join(["1"] * ones), str(ones))
    assert not equivalent("+".join(["1"] * (ones + 1)), str(ones + 1))  # longer: text only
    assert equivalent("7" * MAX_ANSWER_CHARS, "7" * MAX_ANSWER_CHARS)  # as text
    assert not equivalent("7" * (MAX_ANSWER_CHARS + 1), "7" * (MAX_ANSWER_CHARS + 1))  # too long to be an answer
    assert equivalent(", ".join(["1"] * MAX_ELEMENTS), "1, 1")  # sets ignore repeats
    assert not equivalent(", ".join(["1"] * (MAX_ELEMENTS + 1)), "1, 1")  # more elements: text only
    assert equivalent(f"{MAX_FACTORIAL}!", str(math.factorial(MAX_FACTORIAL)))
    assert not equivalent(f"{MAX_FACTORIAL + 1}!", f"{MAX_FACTORIAL + 1}!")
    assert equivalent("10^{399}", "1" + "0" * 399) and not equivalent("10^{400}", "10^{400}")  # MAX_DIGITS


def test_big_values_within_the_bounds_are_exact():
    assert equivalent("2^{1000}", "2^{500} \\cdot 2^{500}")
    assert not equivalent("2^{1000}", "2^{1000} + 1")
    assert equivalent("10^{-3}", "0.001")


@settings(max_examples=60, deadline=None)
@given(st.integers(-(10**6), 10**6), st.integers(1, 10**6), st.integers(1, 50))
def test_every_spelling_of_a_fraction_agrees(p, q, k):
    value = Fraction(p, q)
    reference = f"{value.numerator}/{value.denominator}"
    assert equivalent(f"\\frac{{{p * k}}}{{{q * k}}}", reference)
    assert equivalent(f"{p * k}/{q * k}", reference)
    assert not equivalent(f"\\frac{{{p * k + 1}}}{{{q * k}}}", reference)


@settings(max_examples=60, deadline=None)
@given(st.integers(-(10**9), 10**9), st.integers(0, 6))
def test_decimals_agree_with_their_fraction(n, places):
    decimal = f"{'-' if n < 0 else ''}{abs(n) // 10**places}.{abs(n) % 10**places:0{places}d}" if places else str(n)
    assert equivalent(decimal, f"{n}/{10**places}")
    assert not equivalent(decimal, f"{n + 1}/{10**places}")


# -- the boxed_answer term and success criterion on trajectories -------------------------------

CODE = '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(1/2)"}}\n</tool_call>'


def ran() -> ToolResult:
    return ToolResult(
        call_id="call_0", name="code_interpreter", content=json.dumps({"output": "0.5\n"}), status="ok", latency_s=0.01
    )


def turn(text: str, *results: ToolResult) -> Turn:
    return Turn(text=text, parsed=parse_turn(text), tool_results=list(results))


def traj(turns: list[Turn], finish: TrajectoryEnd | None, gt: tuple[str, ...] = ("1/2",), kind: str = "") -> Trajectory:
    task = Task(id="m0", messages=[{"role": "user", "content": "What is 1/2?"}], tools=[], gt=list(gt), kind=kind)
    return Trajectory(task=task, group_index=0, prompt_ids=[1, 2, 3], turns=turns, finish_reason=finish)


def solved_with(answer: str, **kwargs) -> Trajectory:
    return traj([turn(CODE, ran()), turn(answer)], TrajectoryEnd.ANSWER, **kwargs)


@pytest.mark.parametrize(
    ("trajectory", "reward"),
    [
        (solved_with(r"The code prints 0.5, so the answer is \boxed{\frac{1}{2}}."), 1.0),
        (solved_with(r"\boxed{0.5}"), 1.0),
        (traj([turn(r"Without tools: \boxed{2/4}")], TrajectoryEnd.ANSWER), 1.0),
        (solved_with(r"<think>maybe \boxed{7}</think>It is \boxed{0.5}"), 1.0),
        (solved_with(r"It is \boxed{0.5} or rather \boxed{0.25}"), -1.0),  # the last box counts
        (solved_with(r"\boxed{0.25}"), -1.0),
        (solved_with("The answer is 1/2."), -1.0),  # no box
        (solved_with(r"The answer is \boxed{1/2"), -1.0),  # unclosed box
        (solved_with(r"<think>it is \boxed{0.5}</think>I am not sure."), -1.0),  # a box in the reasoning only
        (solved_with(r"\boxed{0.5}", gt=()), -1.0),  # nothing to check against
        (solved_with(r"\boxed{0.5}", gt=("1/2", "7")), 1.0),  # only the first gt value counts
        (traj([turn(r"\boxed{0.5} " + CODE.replace("</tool_call>", ""))], TrajectoryEnd.INVALID), -1.0),
        (traj([turn(r"\boxed{0.5} " + CODE, ran())] * 3, TrajectoryEnd.MAX_TURNS), -1.0),
        (traj([turn(r"so \boxed{0.5}")], TrajectoryEnd.TURN_TOKENS), -1.0),
        (traj([], TrajectoryEnd.TOKEN_BUDGET), -1.0),
    ],
)
def test_boxed_answer_term(trajectory, reward):
    assert T.boxed_answer(trajectory) == reward
    assert SUCCESS_CRITERIA.get("boxed_answer")(trajectory) is (reward == 1.0)


def retool_reward():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return to_config(compose("config", overrides=["reward=retool"])).reward


def test_retool_reward_is_plus_or_minus_one_with_every_term_logged():
    cfg = retool_reward()
    assert cfg.success == "boxed_answer" and cfg.clip == 1.0
    right = solved_with(r"\boxed{0.5}")
    wrong = traj([turn("<think>" + "r" * 30 + "</think>" + r"\boxed{0.25}")], TrajectoryEnd.ANSWER)
    for trajectory, expected in [(right, 1.0), (wrong, -1.0)]:
        total, terms = score(trajectory, cfg)
        assert total == expected
        assert set(terms) == set(REWARD_TERMS.names())
        assert terms["boxed_answer"] == expected
        assert all(v == 0.0 for name, v in terms.items() if name != "boxed_answer")
    assert T.term_values(wrong)["think_length"] == 1.0  # computed, but weighed 0


def test_success_criterion_drives_the_metrics():
    # a box equal to the gt with the gt's text absent, and the gt's text with a wrong box
    boxed_only = solved_with(r"The code prints 0.5: \boxed{0.5}", kind="boxed")
    text_only = solved_with(r"1/2 at first sight, but \boxed{0.25}", kind="text")
    trajs = [boxed_only, text_only, traj([turn(r"\boxed{0.5}")], TrajectoryEnd.TURN_TOKENS, kind="boxed")]
    score_all(trajs, retool_reward())
    boxed, gt_in_answer = SUCCESS_CRITERIA.get("boxed_answer"), SUCCESS_CRITERIA.get("gt_in_answer")

    metrics = rollout_metrics(trajs, boxed, prefix="eval/")
    assert metrics["eval/rollout/success_rate"] == pytest.approx(1 / 3)
    assert metrics["eval/reward/boxed_answer"] == pytest.approx(-1 / 3) and metrics["eval/reward/gt_hit"] == 0.0
    assert success_by_kind(trajs, boxed, prefix="eval/") == {
        "eval/success_rate/boxed": 0.5,
        "eval/success_rate/text": 0.0,
    }

    assert rollout_metrics(trajs, gt_in_answer)["rollout/success_rate"] == pytest.approx(1 / 3)
    assert success_by_kind(trajs, gt_in_answer, prefix="") == {"success_rate/boxed": 0.0, "success_rate/text": 1.0}
