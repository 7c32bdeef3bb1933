"""Whole-token matching, each reward term on hand-built trajectories, and the weighted score."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import compose_config

from minirl.config import RewardConfig
from minirl.data.task import Task
from minirl.errors import ConfigError
from minirl.protocol.parsing import parse_turn
from minirl.rewards import REWARD_TERMS, check_caps, check_weights, contains_value, gt_hits, score, score_all
from minirl.rewards import terms as T
from minirl.rewards.success import gt_in_answer
from minirl.rollout.trajectory import Trajectory, TrajectoryEnd, Turn
from minirl.tools.base import ToolResult

pytestmark = pytest.mark.fast

# the defaults in minirl/conf/reward/minimind.yaml
WEIGHTS = {
    "tool_alignment": 0.5,
    "gt_hit": 2.5,
    "unfinished": 0.5,
    "invalid_turn": 0.5,
    "tag_balance": 0.5,
    "repetition": 1.0,
    "answer_length": 0.5,
    "think_length": 1.0,
    "think_count": 0.25,
    "boxed_answer": 0.0,
    "rm": 1.0,
}
CFG = RewardConfig(weights=WEIGHTS, clip=3.0, caps={"repetition": 0.5})  # minimind.yaml's caps too


# -- builders ----------------------------------------------------------------------------------


def call_text(name: str = "get_current_weather", **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def result(status: str = "ok", name: str = "get_current_weather") -> ToolResult:
    return ToolResult(call_id="call_0", name=name, content="{}", status=status, latency_s=0.01)


def turn(text: str, *results: ToolResult) -> Turn:
    return Turn(text=text, parsed=parse_turn(text), tool_results=list(results))


REFERENCE_CALL = {"id": "call_0", "type": "function", "function": {"name": "get_current_weather", "arguments": {}}}
TOOL_REFERENCE = [
    {"role": "assistant", "content": "", "tool_calls": [REFERENCE_CALL]},
    {"role": "tool", "tool_call_id": "call_0", "name": "get_current_weather", "content": '{"temperature": "23"}'},
    {"role": "assistant", "content": "It is 23°C in Paris."},
]


def traj(
    turns: list[Turn], finish: TrajectoryEnd | None, gt: tuple[str, ...] = ("23",), reference=TOOL_REFERENCE
) -> Trajectory:
    task = Task(
        id="t0",
        messages=[{"role": "user", "content": "What is the temperature in Paris?"}],
        tools=[],
        gt=list(gt),
        reference=list(reference),
        kind="single",
    )
    return Trajectory(task=task, group_index=0, prompt_ids=[1, 2, 3], turns=turns, finish_reason=finish)


ANSWER = "The temperature in Paris is 23°C right now."
WEATHER = call_text(city="Paris")


def correct() -> Trajectory:
    return traj([turn(WEATHER, result()), turn(ANSWER)], TrajectoryEnd.ANSWER)


# -- matching ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["23", "23°C", "is 23.", "(23)", "it is 23, not 24", "23%", "气温23度", "\uff12\uff13", "23.0", "from 20-23"],
)
def test_contains_value_whole_number(text):
    assert contains_value(text, "23")


@pytest.mark.parametrize("text", ["123", "230", "23.5", "x23y", "1.23", "-23", "023", "23rd", "a_23", ""])
def test_contains_value_rejects_partial_numbers(text):
    assert not contains_value(text, "23")


def test_contains_value_number_forms():
    assert contains_value("about 1,024 items", "1024")
    assert contains_value("about 1024 items", "1,024")
    assert contains_value("it was -4.5 degrees", "-4.5")
    assert not contains_value("it was 4.5 degrees", "-4.5")
    assert contains_value("ratio 0.50", "0.5")
    assert not contains_value("zip 02139", "2139")


def test_contains_value_words_and_phrases():
    assert contains_value("I live in PARIS.", "paris")
    assert not contains_value("Parisian food", "Paris")
    assert contains_value("welcome to new\n york!", "New York")
    assert not contains_value("NewYork", "New York")
    assert not contains_value("Python 3.11", "Python 3")
    assert contains_value("I write C++ daily", "c++")
    assert contains_value("我住在北京市", "北京")
    assert not contains_value("anything", "  ")


@settings(max_examples=80, deadline=None)
@given(
    st.integers(-(10**6), 10**6),
    st.sampled_from(["", " ", "(", "is ", "\n", "温度", "= "]),
    st.sampled_from(["", ".", "°C", ")", " ", "%", ",", "度", "!"]),
)
def test_contains_value_finds_any_number_in_context(n, before, after):
    assert contains_value(f"{before}{n}{after}", str(n))


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 10**6), st.sampled_from(["1", "x", "9.", "_"]), st.sampled_from(["", "0", "y", ".5"]))
def test_contains_value_never_matches_a_glued_number(n, before, after):
    assert not contains_value(f"{before}{n}", str(n))
    if after:
        assert not contains_value(f"{n}{after}", str(n))


def test_gt_hits_and_success():
    assert gt_hits("Paris is 23°C", ["23", "paris", "123"]) == [True, True, False]
    assert gt_in_answer(correct())
    assert not gt_in_answer(traj([turn("It is 123°C.")], TrajectoryEnd.ANSWER))
    assert not gt_in_answer(traj([turn(WEATHER, result())], TrajectoryEnd.MAX_TURNS))
    assert gt_in_answer(traj([turn("Hello there!")], TrajectoryEnd.ANSWER, gt=()))
    assert not gt_in_answer(traj([turn("<tool_call>{")], TrajectoryEnd.INVALID, gt=()))


# -- terms -------------------------------------------------------------------------------------


def test_registered_terms():
    assert REWARD_TERMS.names() == sorted(WEIGHTS)


def test_tool_alignment():
    assert T.tool_alignment(correct()) == 1.0
    assert T.tool_alignment(traj([turn(ANSWER)], TrajectoryEnd.ANSWER)) == -1.0  # the expected call is missing
    # without a reference, one call per gt value is expected (MiniMind)
    two = traj([turn(WEATHER + WEATHER, result(), result()), turn(ANSWER)], TrajectoryEnd.ANSWER, ("23", "Paris"), ())
    assert T.tool_alignment(two) == 1.0
    # one valid call for two gt values, plus one invalid: gap = |1 - 2| + 1
    mixed = traj([turn(WEATHER + WEATHER, result(), result("bad_arguments"))], TrajectoryEnd.MAX_TURNS, ("a", "b"), ())
    assert T.tool_alignment(mixed) == -2.0
    # a tool that failed or timed out was still called correctly
    assert T.tool_alignment(traj([turn(WEATHER, result("timeout")), turn(ANSWER)], TrajectoryEnd.ANSWER)) == 1.0
    assert T.tool_alignment(traj([turn(WEATHER, result("error")), turn(ANSWER)], TrajectoryEnd.ANSWER)) == 1.0
    assert T.tool_alignment(traj([turn(WEATHER, result("unknown_tool")), turn(ANSWER)], TrajectoryEnd.ANSWER)) == -2.0
    three = traj([turn(WEATHER, result()) for _ in range(3)], TrajectoryEnd.MAX_TURNS)
    assert T.tool_alignment(three) == -2.0


def test_gt_hit():
    both = ("23", "Paris")
    assert T.gt_hit(traj([turn("Paris: 23°C")], TrajectoryEnd.ANSWER, gt=both)) == 1.0
    assert T.gt_hit(traj([turn("Paris: 123°C")], TrajectoryEnd.ANSWER, gt=both)) == 0.5
    assert T.gt_hit(traj([turn("It is 123°C")], TrajectoryEnd.ANSWER)) == 0.0
    assert T.gt_hit(traj([turn("Hi there")], TrajectoryEnd.ANSWER, gt=())) == 0.0
    # only the final answer counts, not text written before giving up
    assert T.gt_hit(traj([turn("23 " + WEATHER, result())], TrajectoryEnd.MAX_TURNS)) == 0.0
    # the <think> block is not part of the answer
    assert T.gt_hit(traj([turn("<think>maybe 23</think>No idea.")], TrajectoryEnd.ANSWER)) == 0.0


@pytest.mark.parametrize(
    "finish,unfinished,invalid",
    [
        (TrajectoryEnd.ANSWER, 0.0, 0.0),
        (TrajectoryEnd.INVALID, 0.0, -1.0),
        (TrajectoryEnd.MAX_TURNS, -1.0, 0.0),
        (TrajectoryEnd.TURN_TOKENS, -1.0, 0.0),
        (TrajectoryEnd.TOKEN_BUDGET, -1.0, 0.0),
    ],
)
def test_unfinished_and_invalid_turn(finish, unfinished, invalid):
    t = traj([turn("some text here")], finish)
    assert T.unfinished(t) == unfinished
    assert T.invalid_turn(t) == invalid


def test_tag_balance():
    assert T.tag_balance(correct()) == 0.0
    t = traj(
        [turn(WEATHER, result()), turn("<tool_call><tool_call>{}</tool_call>"), turn("</tool_call> oops")],
        TrajectoryEnd.INVALID,
    )
    assert T.tag_balance(t) == -2.0


def test_a_cap_bounds_what_a_term_counts_before_its_weight():
    """MiniMind's rep_penalty: the share of repeated 3-grams, at most 0.5 (reward.caps.repetition)."""
    looped = traj([turn("go " * 20)], TrajectoryEnd.ANSWER)
    once = traj([turn("go go go go once")], TrajectoryEnd.ANSWER)
    assert T.repetition(looped) == pytest.approx(-17 / 18) and T.repetition(once) == pytest.approx(-1 / 3)
    capped = RewardConfig(weights={"repetition": 2.0}, clip=3.0, caps={"repetition": 0.5})
    assert score(looped, capped)[1]["repetition"] == pytest.approx(-1.0)  # -0.5, then the weight
    assert score(once, capped)[1]["repetition"] == pytest.approx(-2 / 3)  # under the cap: as it was
    uncapped = RewardConfig(weights={"repetition": 2.0}, clip=3.0)  # the schema's default: no cap
    assert score(looped, uncapped)[1]["repetition"] == pytest.approx(-34 / 18)


def test_minimind_caps_repetition_at_half_and_the_other_rewards_cap_nothing(tmp_path):
    assert compose_config(tmp_path, tmp_path, "reward=minimind").reward.caps == {"repetition": 0.5}
    for reward in ("outcome", "retool"):  # the default run's reward scores as before
        assert compose_config(tmp_path, tmp_path, f"reward={reward}").reward.caps == {}
    assert compose_config(tmp_path, tmp_path, "reward=minimind", "reward.caps.repetition=1").reward.caps == {
        "repetition": 1.0
    }


def test_unknown_or_bad_cap_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown reward term 'repetitions'; known: "):
        check_caps({"repetitions": 0.5})
    for bad in (0.0, -1.0, float("inf"), True):
        with pytest.raises(ConfigError, match=r"^reward\.caps\.repetition: must be a finite number > 0"):
            check_caps({"repetition": bad})
    with pytest.raises(ConfigError, match=r"^reward\.caps\.repetition: must be > 0, got 0"):
        RewardConfig(caps={"repetition": 0})


def test_repetition():
    assert T.repetition(traj([turn("a b c a b c a b c")], TrajectoryEnd.ANSWER)) == pytest.approx(-4 / 7)
    assert T.repetition(traj([turn("The cat sat on the mat.")], TrajectoryEnd.ANSWER)) == 0.0
    assert T.repetition(traj([turn("yes yes")], TrajectoryEnd.ANSWER)) == 0.0  # no 3-gram at all
    assert T.repetition(traj([turn("好好好好好")], TrajectoryEnd.ANSWER)) == pytest.approx(-2 / 3)
    # no answer: the last turn's raw text is scored
    loop = traj([turn(ANSWER), turn("go go go go go go")], TrajectoryEnd.TURN_TOKENS)
    assert T.repetition(loop) == pytest.approx(-3 / 4)
    assert T.repetition(traj([], TrajectoryEnd.TOKEN_BUDGET)) == 0.0
    assert -1.0 <= T.repetition(traj([turn("x " * 500)], TrajectoryEnd.ANSWER)) <= 0.0


@pytest.mark.parametrize("n,expected", [(0, -1.0), (4, -1.0), (5, 1.0), (800, 1.0), (801, -1.0)])
def test_answer_length(n, expected):
    assert T.answer_length(traj([turn("a" * n)], TrajectoryEnd.ANSWER)) == expected


def test_answer_length_no_answer_and_tool_branch():
    assert T.answer_length(traj([turn("<tool_call>{")], TrajectoryEnd.INVALID)) == -1.0
    assert T.answer_length(correct()) == 0.0


@pytest.mark.parametrize(
    "text,length,count",
    [
        ("<think>" + "r" * 20 + "</think>The answer is 23.", 1.0, 1.0),
        ("<think>\n" + "r" * 300 + "\n</think>The answer is 23.", 1.0, 1.0),
        ("<think>" + "r" * 19 + "</think>The answer is 23.", -0.5, 1.0),
        ("<think>" + "r" * 301 + "</think>The answer is 23.", -0.5, 1.0),
        ("r" * 30 + "</think>The answer is 23.", 1.0, 1.0),  # <think> was in the prompt
        ("<think>" + "r" * 30 + "</think>x</think>The answer is 23.", 1.0, -1.0),
        ("The answer is 23.", 0.0, 0.0),
    ],
)
def test_think_terms(text, length, count):
    t = traj([turn(text)], TrajectoryEnd.ANSWER)
    assert T.think_length(t) == length
    assert T.think_count(t) == count


def test_think_terms_are_zero_on_the_tool_branch():
    t = traj([turn(WEATHER, result()), turn("<think>" + "r" * 5 + "</think></think>23")], TrajectoryEnd.ANSWER)
    assert T.think_length(t) == 0.0 and T.think_count(t) == 0.0


# -- score -------------------------------------------------------------------------------------


def test_answering_a_tool_task_without_the_tool_does_not_pay():
    from_memory = traj([turn(ANSWER.replace("23", "21"))], TrajectoryEnd.ANSWER)
    assert T.tool_alignment(from_memory) == -1.0  # one expected call missing
    valid_call_wrong_answer = traj([turn(WEATHER, result()), turn("It is 21°C.")], TrajectoryEnd.ANSWER)
    assert score(valid_call_wrong_answer, CFG)[0] > score(from_memory, CFG)[0]
    # a task whose reference needs no tool: no penalty without tools, a penalty for calling one
    no_tool = [{"role": "assistant", "content": "Paris."}]
    assert T.tool_alignment(traj([turn("Paris.")], TrajectoryEnd.ANSWER, ("Paris",), no_tool)) == 0.0
    assert (
        T.tool_alignment(traj([turn(WEATHER, result()), turn("Paris.")], TrajectoryEnd.ANSWER, ("Paris",), no_tool))
        == -1.0
    )
    # rows without a reference fall back to MiniMind: one call per gt value, scored only with tools
    assert T.tool_alignment(traj([turn(ANSWER)], TrajectoryEnd.ANSWER, reference=())) == 0.0
    assert T.tool_alignment(traj([turn(WEATHER, result()), turn(ANSWER)], TrajectoryEnd.ANSWER, reference=())) == 1.0


def test_correct_tool_trajectory_scores_highest():
    best, terms = score(correct(), CFG)
    assert terms["tool_alignment"] == 0.5 and terms["gt_hit"] == 2.5
    assert best == pytest.approx(3.0)
    worse = {
        "wrong arguments": traj([turn(WEATHER, result("bad_arguments")), turn(ANSWER)], TrajectoryEnd.ANSWER),
        "unknown tool": traj(
            [turn(call_text("get_weather", city="Paris"), result("unknown_tool", "get_weather")), turn(ANSWER)],
            TrajectoryEnd.ANSWER,
        ),
        "unclosed tag": traj([turn(WEATHER.replace("</tool_call>", ""))], TrajectoryEnd.INVALID),
        "max turns": traj([turn(WEATHER, result()) for _ in range(3)], TrajectoryEnd.MAX_TURNS),
        "wrong value": traj([turn(WEATHER, result()), turn(ANSWER.replace("23", "123"))], TrajectoryEnd.ANSWER),
        "extra call": traj([turn(WEATHER + WEATHER, result(), result()), turn(ANSWER)], TrajectoryEnd.ANSWER),
        "memory, wrong": traj([turn(ANSWER.replace("23", "21"))], TrajectoryEnd.ANSWER),
    }
    for name, t in worse.items():
        total, _ = score(t, CFG)
        assert total < best, name
    # answering from memory without tools cannot out-score the correct tool use
    assert score(traj([turn(ANSWER)], TrajectoryEnd.ANSWER), CFG)[0] <= best


def test_score_is_the_clipped_weighted_sum_with_every_term_logged():
    t = traj([turn(WEATHER.replace("</tool_call>", ""))], TrajectoryEnd.INVALID)
    raw = T.term_values(t)
    total, terms = score(t, RewardConfig(weights={"invalid_turn": 2.0, "tag_balance": 0.0}, clip=100.0))
    assert set(terms) == set(REWARD_TERMS.names())  # weight 0 or absent: still present
    assert raw["tag_balance"] == -1.0 and terms["tag_balance"] == 0.0
    assert terms["invalid_turn"] == -2.0 and terms["gt_hit"] == 0.0
    assert total == pytest.approx(-2.0)

    full = RewardConfig(weights=WEIGHTS, clip=100.0)
    total, terms = score(t, full)
    assert total == pytest.approx(sum(w * raw[k] for k, w in WEIGHTS.items()))
    assert total == pytest.approx(sum(terms.values()))
    assert score(t, RewardConfig(weights=WEIGHTS, clip=1.0))[0] == -1.0  # clipped below
    assert score(correct(), RewardConfig(weights={"gt_hit": 10.0}, clip=3.0))[0] == 3.0  # clipped above


def test_a_trajectory_that_earns_nothing_scores_a_float_zero():
    """Under the outcome reward a wrong answer earns no term at all; its reward must still be a float, or
    a batch of them becomes an integer tensor that the advantage estimators cannot average."""
    wrong = traj([turn(WEATHER, result()), turn("It is 19°C in Paris.")], TrajectoryEnd.ANSWER)
    total, terms = score(wrong, RewardConfig(weights={"gt_hit": 1.0}, clip=3.0))
    assert total == 0.0 and isinstance(total, float) and terms["gt_hit"] == 0.0


def test_unknown_or_bad_weight_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown reward term 'gt_hits'; known: answer_length, boxed_answer, gt_hit"):
        check_weights({"gt_hits": 1.0})
    with pytest.raises(ConfigError, match="unknown reward term"):
        score(correct(), RewardConfig(weights={"nope": 1.0}, clip=3.0))
    with pytest.raises(ConfigError, match=r"reward\.weights\.gt_hit"):
        check_weights({"gt_hit": float("nan")})
    check_weights(WEIGHTS)


def test_score_all_sets_reward_and_terms():
    trajs = [correct(), traj([turn("It is 123°C.")], TrajectoryEnd.ANSWER)]
    score_all(trajs, CFG)
    for t in trajs:
        assert (t.reward, t.reward_terms) == score(t, CFG)
    assert trajs[0].reward > trajs[1].reward
