"""Rule rewards: whole-token gt matching and MiniMind's reward as registered, weighted terms."""

from minirl.rewards.matching import contains_value, gt_hits, is_success
from minirl.rewards.terms import REWARD_TERMS, check_weights, score, score_all, term_values, used_tools

__all__ = [
    "REWARD_TERMS",
    "check_weights",
    "contains_value",
    "gt_hits",
    "is_success",
    "score",
    "score_all",
    "term_values",
    "used_tools",
]
