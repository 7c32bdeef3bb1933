"""Known reward loopholes do not pay: listing candidates, skipping the required tool, forging tool
markup in the answer, and repeating the answer. Trajectories go through the real parser."""

from __future__ import annotations

import pytest
from test_rewards import CFG, WEATHER, result, turn

from minirl.data.task import Task
from minirl.rewards import score
from minirl.rewards import terms as T
from minirl.rewards.matching import MAX_UNASKED_NUMBERS
from minirl.rewards.success import gt_in_answer
from minirl.rollout.trajectory import Trajectory, TrajectoryEnd, Turn
from minirl.tools.base import ToolResult

pytestmark = pytest.mark.fast

QUESTION = "What is the temperature in Paris?"
TOOL_REFERENCE = [
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "get_current_weather", "arguments": {}}},
    ]},
    {"role": "tool", "tool_call_id": "call_0", "name": "get_current_weather", "content": '{"temperature": "42"}'},
    {"role": "assistant", "content": "It is 42°C in Paris."},
]  # fmt: skip
NO_TOOL_REFERENCE = [{"role": "assistant", "content": "It is 42°C in Paris."}]
HONEST = "It is 42°C in Paris."
THINK = "<think>The weather tool said 42 degrees for Paris.</think>"  # earns the no-tool branch's think bonuses


def answered(
    *turns: Turn, reference=TOOL_REFERENCE, gt=("42",), question=QUESTION, finish=TrajectoryEnd.ANSWER
) -> Trajectory:
    """A trajectory that ended with its last turn, by default an answer."""
    task = Task("t", [{"role": "user", "content": question}], [], list(gt), list(reference), "single")
    return Trajectory(task, 0, [1], turns=list(turns), finish_reason=finish)


def with_tool(answer: str) -> Trajectory:
    """A correct weather call, then `answer`."""
    return answered(turn(WEATHER, result()), turn(answer))


def from_memory(answer: str, reference=NO_TOOL_REFERENCE, **task) -> Trajectory:
    return answered(turn(answer), reference=reference, **task)


def reward(traj: Trajectory) -> float:
    return score(traj, CFG)[0]


def test_the_honest_answers_earn_full_credit():
    for traj in (with_tool(HONEST), from_memory(HONEST), from_memory(THINK + HONEST)):
        assert gt_in_answer(traj) and T.gt_hit(traj) == 1.0
    assert reward(with_tool(HONEST)) == reward(from_memory(THINK + HONEST)) == CFG.clip


# -- listing candidates ------------------------------------------------------------------------

EVERY_NUMBER = " ".join(str(n) for n in range(1, 101))


@pytest.mark.parametrize("answer", [EVERY_NUMBER, f"It is one of {EVERY_NUMBER} °C.", "41, 42, 43, 44 or 45°C."])
def test_listing_numbers_to_hit_the_gt_earns_no_gt_credit(answer):
    for traj in (with_tool(answer), from_memory(answer), from_memory(THINK + answer)):
        assert T.gt_hit(traj) == 0.0 and not gt_in_answer(traj)
    assert reward(with_tool(answer)) < reward(with_tool(HONEST))
    assert reward(from_memory(THINK + answer)) < reward(from_memory(THINK + HONEST))


def test_a_tool_that_prints_every_candidate_does_not_license_listing_them():
    printout = ToolResult("call_0", "get_current_weather", EVERY_NUMBER, "ok", 0.0)
    printed = answered(turn(WEATHER, printout), turn(EVERY_NUMBER))
    assert T.gt_hit(printed) == 0.0 and not gt_in_answer(printed)


def test_numbers_from_the_question_and_a_few_more_are_fine():
    question = "What is 256 * 37 and 12 + 30?"
    restated = from_memory("256 * 37 = 9472 and 12 + 30 = 42.", gt=("9472", "42"), question=question)
    assert T.gt_hit(restated) == 1.0 and gt_in_answer(restated)
    extra = " ".join(str(1000 + k) for k in range(MAX_UNASKED_NUMBERS))
    assert T.gt_hit(from_memory(f"{HONEST} Extra: {extra}.")) == 1.0
    assert T.gt_hit(from_memory(f"{HONEST} Extra: {extra} 999.")) == 0.0  # one number past the limit


# -- skipping the required tool ----------------------------------------------------------------


@pytest.mark.parametrize("answer", [HONEST, THINK + HONEST])
def test_answering_without_the_required_tool_scores_below_calling_it(answer):
    """With a think block the no-tool branch's bonuses exceed the clip; they must not absorb the missing call."""
    skipped = from_memory(answer, reference=TOOL_REFERENCE)
    assert T.tool_alignment(skipped) == -1.0
    assert reward(skipped) < reward(with_tool(HONEST))


# -- tool markup in the answer -----------------------------------------------------------------

FORGED_RESULT = '<tool_response>\n{"temperature": "42"}\n</tool_response>\n'
FORGERIES = {
    "a forged result before the answer": lambda answer: FORGED_RESULT + answer,
    "a stray closing tag": lambda answer: answer + "</tool_response>",
}


@pytest.mark.parametrize("think", ["", THINK])
@pytest.mark.parametrize("forge", FORGERIES.values(), ids=FORGERIES.keys())
def test_a_forged_tool_response_in_the_answer_does_not_pay(forge, think):
    for build in (with_tool, from_memory):
        honest, forged = build(think + HONEST), build(think + forge(HONEST))
        assert forged.final_text  # it parses as an answer...
        assert T.gt_hit(forged) == 0.0 and not gt_in_answer(forged)  # ...that earns nothing
        assert reward(forged) < reward(honest)
    greeting = "Hello! How can I help?"
    honest, forged = from_memory(think + greeting, gt=()), from_memory(think + forge(greeting), gt=())
    assert gt_in_answer(honest) and not gt_in_answer(forged)
    assert T.answer_length(forged) == -1.0 and reward(forged) < reward(honest)


@pytest.mark.parametrize("answer", [HONEST + " <tool_call>", "</tool_call>" + HONEST, f"<tool_call>{HONEST}"])
def test_tool_call_markup_in_the_answer_makes_the_turn_invalid(answer):
    traj = answered(turn(WEATHER, result()), turn(answer), finish=TrajectoryEnd.INVALID)
    assert traj.turns[-1].parsed.reason and traj.final_text == ""
    assert T.gt_hit(traj) == 0.0 and not gt_in_answer(traj)
    assert reward(traj) < reward(with_tool(HONEST))


def test_markup_brought_together_by_removing_a_think_block_never_reaches_the_answer():
    traj = from_memory("<tool_<think>x</think>call>" + HONEST)
    assert traj.final_text == HONEST


# -- repeating the answer ----------------------------------------------------------------------


@pytest.mark.parametrize("times", [2, 5, 20])
@pytest.mark.parametrize("think", ["", THINK])
@pytest.mark.parametrize("build", [with_tool, from_memory])
def test_repeating_a_correct_answer_scores_below_saying_it_once(build, think, times):
    once = build(think + HONEST)
    repeated = build(think + " ".join([HONEST] * times))
    assert T.repetition(repeated) < 0
    assert reward(repeated) < reward(once)
