"""Whole-token matching of ground-truth values in answer text.

A value counts only as a whole token, never as a substring: the gt "23" is found in "23",
"23°C", "is 23." and "(23)" but not in "123", "230", "23.5", "1.23" or "x23y". Plain substring
checks (MiniMind's `gt in text`) reward "1234" for a gt of "23", which a policy learns to exploit
by printing long digit strings.

- numeric values ("23", "-4.5", "1,024") are compared as numbers against every number in the
  text, so "23.0" and "23" agree and "1,024" matches "1024" (zero-padded ones, "023", only as
  written);
- other values are matched case-insensitively as a whole word or phrase (any run of whitespace
  between its words).

Both sides are NFKC-normalised first (full-width digits, "℃" -> "°C"). CJK characters count as
token boundaries, since CJK text has no spaces: "气温23度" contains "23" and "北京市" contains "北京".

`credited_hits` is what rewards and success use: `gt_hits` behind two guards against answers
that game the match, under which no value counts:

- tool-protocol markup (`<tool_call>`, `<tool_response>` and their closing tags) in the answer: a
  fake call or a forged tool result is not an answer;
- more than MAX_UNASKED_NUMBERS distinct numbers that are in neither the question nor the gt:
  listing candidates ("1 2 3 ... 100" for "42") is guessing. Numbers from tool results do not
  count as asked, or a tool that prints every candidate would make the listing pay.
"""

from __future__ import annotations

import re
import unicodedata
from decimal import Decimal, InvalidOperation

# kana, CJK ideographs and hangul: no spaces between words (Korean glues particles onto them)
CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
# one character that glues onto a token: a letter, digit or underscore that is not CJK
_WORD = rf"[^\W{CJK}]"
# a number in running text: not glued to a word or to a preceding "1." and not continued by
# ".5"; a leading minus belongs to it only when the minus itself starts a token ("-3", not "20-3")
_NUMBER = re.compile(rf"(?<!{_WORD})(?<!\d\.)(-?\d+(?:,\d{{3}})*(?:\.\d+)?)(?!{_WORD})(?!\.\d)")
_NUMERIC_VALUE = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
PROTOCOL_MARKUP = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
# the synthetic reference answers state at most one ("1 USD = 83.5 INR."); a rich tool result restated
# ("23°C, humidity 60%, wind 10 km/h") takes a few more
MAX_UNASKED_NUMBERS = 3


def _normalise(text: str) -> str:
    return unicodedata.normalize("NFKC", text)


def _as_number(token: str) -> Decimal | str:
    """The number a token stands for; a zero-padded integer part ("023", "08") stays a string,
    since it is usually a code or a clock reading, not the number 23."""
    digits = token.replace(",", "").lstrip("+")
    whole = digits.lstrip("-").split(".")[0]
    if len(whole) > 1 and whole.startswith("0"):
        return digits
    try:
        return Decimal(digits)
    except InvalidOperation:
        return digits


def _phrase_pattern(value: str) -> re.Pattern[str]:
    words = value.split()
    body = r"\s+".join(re.escape(w) for w in words)
    # boundaries only where the value itself ends in a token character: "C++" or "23%" may be
    # followed by anything, "abc" may not be followed by "d"
    before = rf"(?<!{_WORD})" if re.match(_WORD, words[0][0]) else ""
    after = rf"(?!{_WORD})" if re.match(_WORD, words[-1][-1]) else ""
    if words[0][0].isdigit():
        before += r"(?<!\d\.)"  # "2 cups" is not in "1.2 cups"
    if words[-1][-1].isdigit():
        after += r"(?!\.\d)"  # "Python 3" is not in "Python 3.11"
    return re.compile(before + body + after, re.IGNORECASE)


def contains_value(text: str, value: str) -> bool:
    """Whether `value` occurs in `text` as a whole token (see the module doc). Blank values never match."""
    text, value = _normalise(text), _normalise(value).strip()
    if not value:
        return False
    if _NUMERIC_VALUE.fullmatch(value):
        target = _as_number(value)
        return any(_as_number(m.group(1)) == target for m in _NUMBER.finditer(text))
    return _phrase_pattern(value.casefold()).search(text.casefold()) is not None


def gt_hits(text: str, gt: list[str]) -> list[bool]:
    """For each gt value, whether it occurs in `text` as a whole token."""
    return [contains_value(text, value) for value in gt]


def numbers_in(text: str) -> set[Decimal | str]:
    """Every number of `text` as `contains_value` compares them ("23.0" and "23" are one)."""
    return {_as_number(m.group(1)) for m in _NUMBER.finditer(_normalise(text))}


def has_protocol_markup(answer: str) -> bool:
    """Whether an answer carries tool-call or tool-result tags, which only calls and the framework write."""
    return any(tag in answer for tag in PROTOCOL_MARKUP)


def credited_hits(answer: str, gt: list[str], question: str) -> list[bool]:
    """`gt_hits` under the guards of the module doc: all False for an answer that carries
    tool-protocol markup or lists more than MAX_UNASKED_NUMBERS numbers found in neither
    `question` nor `gt`."""
    unasked = numbers_in(answer) - numbers_in(question) - numbers_in(" ".join(gt))
    if has_protocol_markup(answer) or len(unasked) > MAX_UNASKED_NUMBERS:
        return [False] * len(gt)
    return gt_hits(answer, gt)
