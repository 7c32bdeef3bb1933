"""Rule rewards: whole-token gt matching, math answer equivalence, MiniMind's and ReTool's rewards as
registered, weighted terms, and the success criteria behind the success-rate metrics."""

from minirl.rewards.matching import contains_value, gt_hits
from minirl.rewards.math_answer import equivalent, last_boxed
from minirl.rewards.success import SUCCESS_CRITERIA, SuccessCriterion
from minirl.rewards.terms import REWARD_TERMS, check_caps, check_weights, score, score_all, term_values, used_tools

__all__ = [
    "REWARD_TERMS",
    "SUCCESS_CRITERIA",
    "SuccessCriterion",
    "check_caps",
    "check_weights",
    "contains_value",
    "equivalent",
    "gt_hits",
    "last_boxed",
    "score",
    "score_all",
    "term_values",
    "used_tools",
]
