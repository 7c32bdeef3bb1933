r"""Final answers of math solutions: the last `\boxed{...}` of a text, and whether two answers are equal.

`equivalent` never runs model text. Both sides get the same light LaTeX clean-up, then an exact
rational evaluation over a whitelisted syntax tree (`evaluate_exact` in minirl/tools/safe_math.py,
bounded in length, exponent and digits, so `9^9^9^9` fails at once). math-verify and sympy are
deliberately not used: sympy's `parse_expr` runs `eval` on its input, unacceptable on model output.

The rules, applied to both sides alike:

- Unicode is NFKC-normalised (full-width digits are digits), and `−` is a minus;
- `$`, `\!`, `\,`, `\;`, `\:`, `\ `, `\left`, `\right` and `\displaystyle` go; `\dfrac` and `\tfrac`
  are `\frac`;
- `\text{..}`, `\textrm{..}`, `\textbf{..}`, `\mathrm{..}`, `\mathbf{..}` and `\mbox{..}` are unwrapped;
  one that ends a longer answer is a unit and goes (`10\text{ cm}` is 10), as does a final `%`,
  `\%`, `°` or `^\circ`;
- thousands separators go: `1,234`, `1{,}234` and `1\,234` are 1234;
- one leading single-letter variable goes: `x=5` is 5, but `x+y=5`, `f(x)=5` and `x=y=5` stay as
  they are (and so never equal 5);
- then both are read as numbers: `\frac{a}{b}` (also `\frac12`) is (a)/(b), `\cdot`, `\times`, `×`
  are *, `\div` is /, `^` is **, braces are parentheses, leading zeros go (`007` is 7); `1/2`, `0.5`,
  `\frac{1}{2}` and `2/4` agree, `0.333` and `1/3` do not;
- arithmetic without a value (division by zero, a value too big, a fractional power) equals nothing;
- an answer that is more than numbers and arithmetic (a letter, `\sqrt`, `\pi` or any other command,
  a comma) is compared as text: case-insensitive, runs of whitespace as one space.

An empty answer equals nothing.
"""

from __future__ import annotations

import re
import unicodedata
from fractions import Fraction

from minirl.tools.safe_math import MathError, evaluate_exact

MAX_EXPRESSION_CHARS = 200  # longer answers are compared as text only
MAX_EXPONENT = 1000  # 2^{1000} is a number; 2^{1001} and 9^{9^9} are not
MAX_DIGITS = 400  # of a numerator or denominator, intermediate values included

_BOX_OPEN = re.compile(r"\\boxed\s*\{")
_BRACE = re.compile(r"\\.|[{}]", re.DOTALL)  # an escaped character does not count as a brace
_DEPTH_CHANGE = {"{": 1, "}": -1}

_FRAC_VARIANT = re.compile(r"\\[dt]frac(?![A-Za-z])")
_DROPPED = re.compile(r"\$|\\[!,]|\{,\}|\\(?:left|right|displaystyle)(?![A-Za-z])")
_SPACES = re.compile(r"\\[;: ]")
_TEXT_COMMAND = r"\\(?:text|textrm|textbf|mathrm|mathbf|mbox)\s*\{([^{}]*)\}"
_UNIT_TEXT_AT_END = re.compile(_TEXT_COMMAND + r"\s*\Z")
_TEXT = re.compile(_TEXT_COMMAND)
_UNIT_SIGN_AT_END = re.compile(r"(?:\\?%|°|\^\s*\{?\s*\\circ\s*\}?)\s*\Z")
_THOUSANDS = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3})+(?![\d,])")
_VARIABLE = re.compile(r"[A-Za-z]\s*=\s*")

_LATEX_TOKEN = re.compile(r"\\[A-Za-z]+|\\.|.", re.DOTALL)
_OPERATORS = {r"\cdot": "*", r"\times": "*", "×": "*", "·": "*", r"\div": "/", "÷": "/", "−": "-", "^": "**"}
_NUMBER_LITERAL = re.compile(r"(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_BETWEEN_NUMBERS = re.compile(r"[-+*/()\s]*")
_LEADING_ZEROS = re.compile(r"(?<![\w.])0+(?=\d)")


def last_boxed(text: str) -> str | None:
    r"""The stripped content of the last `\boxed{...}` in `text`; None without one or when it is never closed.

    Nested and escaped braces are handled: `\boxed{\frac{1}{2}}` gives `\frac{1}{2}`. "Last" is the
    box that opens last, so `\boxed{\boxed{3}}` gives `3`. Only the braced form counts (`\boxed 3`
    is not read). Linear in the length of the text.

    >>> last_boxed(r"so \boxed{2} or rather \boxed{\frac{1}{3}}.")
    '\\frac{1}{3}'
    """
    start = None
    for match in _BOX_OPEN.finditer(text):
        start = match.end()
    if start is None:
        return None
    depth = 1
    for brace in _BRACE.finditer(text, start):
        depth += _DEPTH_CHANGE.get(brace.group(), 0)
        if depth == 0:
            return text[start : brace.start()].strip()
    return None


def equivalent(answer: str, reference: str) -> bool:
    r"""Whether two answers are mathematically equal, by the rules in the module doc.

    >>> equivalent(r"\frac{1}{2}", "0.5"), equivalent("0.333", "1/3"), equivalent("x = 1{,}000", "1000")
    (True, False, True)
    """
    answer, reference = _normalise(answer), _normalise(reference)
    if not answer or not reference:
        return False
    try:
        return _value(answer) == _value(reference)
    except MathError:  # arithmetic without a value: 1/0, 9^{9^9}
        return False


def _normalise(text: str) -> str:
    """The LaTeX clean-up shared by the number and the text comparison."""
    text = unicodedata.normalize("NFKC", text)
    text = _FRAC_VARIANT.sub(r"\\frac", text)
    text = _SPACES.sub(" ", _DROPPED.sub("", text))
    unit = _UNIT_TEXT_AT_END.search(text)
    if unit and text[: unit.start()].strip():
        text = text[: unit.start()]
    text = _TEXT.sub(r"\1", text)
    text = _UNIT_SIGN_AT_END.sub("", text.strip())
    text = _THOUSANDS.sub(lambda m: m.group().replace(",", ""), text).strip()
    variable = _VARIABLE.match(text)
    if variable and "=" not in text[variable.end() :]:
        text = text[variable.end() :]
    return text.strip()


def _value(text: str) -> Fraction | str:
    """The exact value of an arithmetic answer, else its text form; MathError for arithmetic without a value."""
    expression = _arithmetic(text)
    if expression is None:
        return " ".join(text.split()).casefold()
    # the expression is at most twice as long as the LaTeX ("^" -> "**")
    return evaluate_exact(
        expression, max_length=2 * MAX_EXPRESSION_CHARS, max_exponent=MAX_EXPONENT, max_digits=MAX_DIGITS
    )


def _arithmetic(text: str) -> str | None:
    """The answer as a Python expression of numbers and + - * / ** ( ), or None when it is more than that."""
    if len(text) > MAX_EXPRESSION_CHARS:
        return None
    try:
        expression = _LatexReader(text).expression()
    except _NotArithmetic:
        return None
    rest, numbers = _NUMBER_LITERAL.subn(" ", expression)
    if not numbers or not _BETWEEN_NUMBERS.fullmatch(rest):
        return None
    return _LEADING_ZEROS.sub("", expression)


class _NotArithmetic(Exception):
    """The LaTeX uses more than numbers, fractions, braces and arithmetic operators."""


class _LatexReader:
    r"""Arithmetic LaTeX as a Python expression: `\frac{1}{2}^{3}` -> `(((1))/((2)))**(3)`."""

    def __init__(self, latex: str) -> None:
        self.tokens = _LATEX_TOKEN.findall(latex)
        self.position = 0

    def expression(self) -> str:
        text = self._group()
        if self.position < len(self.tokens):  # a "}" without its "{"
            raise _NotArithmetic
        return text

    def _group(self) -> str:
        """Items up to the "}" closing the current group (left unread) or the end."""
        items = []
        while self.position < len(self.tokens) and self.tokens[self.position] != "}":
            items.append(self._item())
        return "".join(items)

    def _item(self) -> str:
        token = self.tokens[self.position]
        self.position += 1
        if token == "{":
            inner = self._group()
            if self.position == len(self.tokens):  # never closed
                raise _NotArithmetic
            self.position += 1
            return f"({inner})"
        if token == r"\frac":
            return f"(({self._argument()})/({self._argument()}))"
        if token in _OPERATORS:
            return _OPERATORS[token]
        if token.startswith("\\"):
            raise _NotArithmetic
        return token

    def _argument(self) -> str:
        """A braced group or a single token, as in `\frac12`."""
        while self.position < len(self.tokens) and self.tokens[self.position].isspace():
            self.position += 1
        if self.position == len(self.tokens) or self.tokens[self.position] == "}":
            raise _NotArithmetic
        return self._item()
