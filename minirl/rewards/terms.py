"""Rule rewards for tool use, split into named terms: MiniMind's (minirl/conf/reward/minimind.yaml) and
ReTool's (minirl/conf/reward/retool.yaml).

Each term is a plain function `term(traj) -> float` returning an UNWEIGHTED value; the weights
come from `reward.weights` in the config, and `reward.caps` bounds what a term's value counts before
its weight (MiniMind's cap of 0.5 on repetition). `score` computes every registered term, so each one
has an entry in the logged dict even at weight 0 (`term_values` gives the unweighted, uncapped values),
and clips the weighted sum to [-clip, clip], saturating the bonuses before the penalties count.

Add a term:

    @REWARD_TERMS.register("my_term")
    def my_term(traj: Trajectory) -> float: ...

then `+reward.weights.my_term=0.5`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from minirl.errors import ConfigError
from minirl.protocol.formats import THINK_CLOSE, THINK_OPEN
from minirl.protocol.parsing import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, TurnKind
from minirl.registry import Registry
from minirl.rewards import success
from minirl.rewards.matching import CJK, has_protocol_markup
from minirl.rollout.trajectory import Trajectory, TrajectoryEnd

RewardTerm = Callable[[Trajectory], float]
REWARD_TERMS: Registry[RewardTerm] = Registry("reward term")

_OUT_OF_BUDGET = (TrajectoryEnd.MAX_TURNS, TrajectoryEnd.TURN_TOKENS, TrajectoryEnd.TOKEN_BUDGET)
# a word is a run of letters/digits; each CJK character is a word of its own (no spaces there)
_WORDS = re.compile(rf"[{CJK}]|[^\W_{CJK}]+")


class RewardWeights(Protocol):
    """What `score` reads from the config (`RewardConfig`)."""

    weights: Mapping[str, float]
    clip: float
    caps: Mapping[str, float]


def used_tools(traj: Trajectory) -> bool:
    """Whether any turn parsed to a tool call; selects MiniMind's tool or no-tool branch."""
    return any(turn.parsed.kind is TurnKind.TOOL for turn in traj.turns)


def _think_text(text: str) -> str:
    """The reasoning before the first </think>; the opening <think> may sit in the prompt."""
    head = text.split(THINK_CLOSE, 1)[0]
    return head.rsplit(THINK_OPEN, 1)[-1].strip()


def _last_words(traj: Trajectory) -> str:
    """The final answer, or the last turn's raw text when the trajectory did not end with one."""
    if traj.finish_reason is TrajectoryEnd.ANSWER:
        return traj.final_text
    return traj.turns[-1].text if traj.turns else ""


# -- both branches ---------------------------------------------------------------------------


@REWARD_TERMS.register("tool_alignment")
def tool_alignment(traj: Trajectory) -> float:
    """+1 if the valid calls match the expected count and none is invalid, else -gap.

    gap = |valid calls - expected| + invalid calls, counted over executed calls (ToolResult); a call
    is invalid when it named an unknown tool or its arguments were rejected. `expected` is the
    number of calls in the task's reference answer; MiniMind's proxy, one call per gt value, is
    used for rows without one. MiniMind scored this term only when tools were used, so answering
    a tool task from memory paid as much as a correct call with a wrong answer; here it counts
    whenever a call is expected, and answering without the required tool does not pay.
    """
    expected = traj.task.expected_tool_calls
    if not used_tools(traj) and not expected:
        return 0.0
    if expected is None:
        expected = len(traj.task.gt)
    results = [r for turn in traj.turns for r in turn.tool_results]
    valid = sum(1 for r in results if r.valid_call)
    gap = abs(valid - expected) + (len(results) - valid)
    return 1.0 if gap == 0 else -float(gap)


@REWARD_TERMS.register("gt_hit")
def gt_hit(traj: Trajectory) -> float:
    """Share of gt values found, as whole tokens, in the final answer; 0 without gt.

    MiniMind checked gt only on the tool branch; checking it on both means a tool task answered
    from memory without tools cannot out-score a correct one. No value counts in an answer that
    carries tool-protocol markup or lists more than MAX_UNASKED_NUMBERS numbers found in neither
    the question nor the gt (minirl/rewards/matching.py): forging a tool result or listing
    candidates does not pay.
    """
    gt = traj.task.gt
    if not gt:
        return 0.0
    return sum(success.answer_hits(traj)) / len(gt)


@REWARD_TERMS.register("unfinished")
def unfinished(traj: Trajectory) -> float:
    """-1 when turns or tokens ran out before an answer."""
    return -1.0 if traj.finish_reason in _OUT_OF_BUDGET else 0.0


@REWARD_TERMS.register("invalid_turn")
def invalid_turn(traj: Trajectory) -> float:
    """-1 when the rollout stopped on a turn that could not be parsed."""
    return -1.0 if traj.finish_reason is TrajectoryEnd.INVALID else 0.0


@REWARD_TERMS.register("tag_balance")
def tag_balance(traj: Trajectory) -> float:
    """-sum over turns of |#<tool_call> - #</tool_call>| in the raw turn text."""
    return -float(sum(abs(t.text.count(TOOL_CALL_OPEN) - t.text.count(TOOL_CALL_CLOSE)) for t in traj.turns))


@REWARD_TERMS.register("repetition")
def repetition(traj: Trajectory) -> float:
    """Minus the share of word 3-grams that repeat an earlier one, in [-1, 0].

    Scored on the final answer, or on the last turn's raw text when there is no answer (a
    degenerate loop usually is what ran out of tokens). Fewer than three words -> 0. MiniMind's
    rep_penalty is this share capped at 0.5 (reward.caps.repetition, as reward=minimind sets it).
    """
    words = _WORDS.findall(_last_words(traj).casefold())
    grams = list(zip(words, words[1:], words[2:], strict=False))  # shorter lists on purpose
    if not grams:
        return 0.0
    return -(len(grams) - len(set(grams))) / len(grams)


# -- no-tool branch only (0 when tools were used) ----------------------------------------------


@REWARD_TERMS.register("answer_length")
def answer_length(traj: Trajectory) -> float:
    """+1 if the final answer has 5..800 characters and no tool-protocol markup, else -1 (no answer
    counts as empty): a forged `<tool_response>` is not an answer."""
    if used_tools(traj):
        return 0.0
    answer = traj.final_text
    return 1.0 if 5 <= len(answer) <= 800 and not has_protocol_markup(answer) else -1.0


@REWARD_TERMS.register("think_length")
def think_length(traj: Trajectory) -> float:
    """If the last turn closes a <think> block: +1 if the reasoning has 20..300 characters, else -0.5."""
    if used_tools(traj) or not traj.turns or THINK_CLOSE not in traj.turns[-1].text:
        return 0.0
    return 1.0 if 20 <= len(_think_text(traj.turns[-1].text)) <= 300 else -0.5


@REWARD_TERMS.register("think_count")
def think_count(traj: Trajectory) -> float:
    """If the last turn closes a <think> block: +1 for exactly one </think>, else -1."""
    if used_tools(traj) or not traj.turns or THINK_CLOSE not in traj.turns[-1].text:
        return 0.0
    return 1.0 if traj.turns[-1].text.count(THINK_CLOSE) == 1 else -1.0


# -- ReTool ----------------------------------------------------------------------------------


@REWARD_TERMS.register("boxed_answer")
def boxed_answer(traj: Trajectory) -> float:
    r"""ReTool's outcome reward (arXiv:2504.11536): +1 if the final answer's last `\boxed{}` is
    equivalent to the first gt value (minirl/rewards/math_answer.py), else -1: no answer, no box,
    a wrong one, an invalid turn, turns or tokens run out, no gt."""
    return 1.0 if success.boxed_answer(traj) else -1.0


# -- learned ----------------------------------------------------------------------------------


@REWARD_TERMS.register("rm")
def rm(traj: Trajectory) -> float:
    """The reward model's score, clipped to [-reward.model.clip, reward.model.clip]: MiniMind's reward-model
    bonus. Set on the trajectory (`rm_score`) by minirl/training/reward_model.py before the terms are summed;
    0 for a trajectory it does not score (reward.model.trajectories), with reward.model off, and in held-out
    evaluation."""
    return traj.rm_score


# -- scoring -----------------------------------------------------------------------------------


def check_weights(weights: Mapping[str, float]) -> None:
    """Raise ConfigError for a weight on an unknown term or a weight that is not a finite number."""
    for name, weight in weights.items():
        if name not in REWARD_TERMS:
            REWARD_TERMS.get(name)  # raises, listing the known terms
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ConfigError(f"reward.weights.{name}: must be a finite number, got {weight!r}")


def check_caps(caps: Mapping[str, float]) -> None:
    """Raise ConfigError for a cap on an unknown term or a cap that is not a finite number > 0."""
    for name, cap in caps.items():
        if name not in REWARD_TERMS:
            REWARD_TERMS.get(name)  # raises, listing the known terms
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not (math.isfinite(cap) and cap > 0):
            raise ConfigError(f"reward.caps.{name}: must be a finite number > 0, got {cap!r}")


def term_values(traj: Trajectory) -> dict[str, float]:
    """Term name -> UNWEIGHTED value, for every registered term."""
    return {name: float(REWARD_TERMS.get(name)(traj)) for name in REWARD_TERMS}


def score(traj: Trajectory, cfg: RewardWeights) -> tuple[float, dict[str, float]]:
    """(clipped weighted sum, term name -> weighted value) over every registered term.

    A term without a weight counts with weight 0 but is still computed and present in the dict; a
    term with a cap counts as its value clipped to [-cap, cap] before the weight. The bonuses
    (positive weighted values) saturate at `clip` before the penalties are added, and the total is
    clipped to [-clip, clip]: bonuses past the clip cannot absorb a penalty, so a trajectory that
    repeats itself or skips a required tool scores below a clean one even when both earn every bonus.
    """
    check_weights(cfg.weights)
    check_caps(cfg.caps)
    caps = {name: cfg.caps.get(name, math.inf) for name in REWARD_TERMS}
    values = {name: min(max(v, -caps[name]), caps[name]) for name, v in term_values(traj).items()}
    # "+ 0.0" turns the -0.0 of a zero weight times a penalty into 0.0 in the logs
    weighted = {name: float(cfg.weights.get(name, 0.0)) * v + 0.0 for name, v in values.items()}
    bonuses = sum((v for v in weighted.values() if v > 0), 0.0)
    penalties = sum((v for v in weighted.values() if v < 0), 0.0)
    total = max(min(bonuses, cfg.clip) + penalties, -cfg.clip)
    return total, weighted


def score_all(trajs: Iterable[Trajectory], cfg: RewardWeights) -> None:
    """Set `reward` and `reward_terms` on each trajectory."""
    for traj in trajs:
        traj.reward, traj.reward_terms = score(traj, cfg)
