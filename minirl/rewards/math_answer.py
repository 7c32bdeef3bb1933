r"""Final answers of math solutions: the last `\boxed{...}` of a text, and whether two answers are equal.

`equivalent` never runs model text: no `eval`, no sympy `parse_expr` (it runs `eval` on its input).
Both sides get the same LaTeX clean-up and are read into a meaning: a choice, a structure (set,
interval, tuple, union, list), a relation, a value, or text. A value is read by a reader written
here into a whitelisted expression tree and computed exactly with fractions where it is rational
(`evaluate_exact`, minirl/tools/safe_math.py), else with 50-digit mpmath arithmetic. The suite that
pins these rules, and how they differ from math-verify, is in docs/math_answers.md.

Clean-up, on both sides alike, in this order:

- Unicode is NFKC-normalised (full-width digits are digits), and `−` is a minus;
- `\dfrac`, `\tfrac` and `\cfrac` are `\frac`; `\ge(q)`, `\le(q)`, `\ne(q)`, `\gt`, `\lt` are
  `>=`, `<=`, `!=`, `>`, `<`; `bmatrix` is `pmatrix`;
- a marked thousands separator between digits goes: `32,\! 349` and `1{,}000` are 32349 and 1000;
- `$`, `\$`, `\!`, `\,`, `\left`, `\right` and `\displaystyle` go; `\;`, `\:`, `\ `, `~` and `\quad`
  are spaces (`\\`, a matrix row break, stays);
- a final `\text{..}`, `\textrm`, `\textbf`, `\textit`, `\textnormal`, `\mathrm`, `\mathbf` or `\mbox`
  after something else is a unit and goes, with a power after it (`10 \text{ cm}^2` is 10); the
  others are unwrapped (`\text{Evelyn}` is Evelyn); ` and ` (`, and `) is a comma: `6 and 8` is `6, 8`;
- a final `%`, `\%`, ` percent`, ` pct`, `°`, `^\circ`, `^{\circ}` or `\degree` goes (`28\%` is 28, and
  `0.28` is not 28), then a final word of two or more letters after a number (`5 apples` is 5), unless
  it is a number word (`5 thousand` stays);
- plain thousands separators go: `1,234` and `1 234` are 1234, but not inside brackets (`(12,102)` is
  a pair), nor `1,2`, `0,111` or `32, 349` (decimal commas are not read);
- `0.1\overline{6}` is the fraction it is, 1/6;
- one leading variable or tuple of variables goes when what follows has no letter and no `=`:
  `x=5`, `k = \frac13`, `a_1 = 2`, `(p,q) = (1,2)` and `x \in [0, 7)` are their right-hand side;
  `y = 2x + 1`, `x+y=5` and `x=y=5` stay (an equation never equals a number).

Meaning, read from the cleaned text:

- a choice letter: `C`, `(C)`, `(c)`, `c` and `\text{(C)}` are the choice C;
- longer than `MAX_EXPRESSION_CHARS`: text;
- `A \cup B \cup ...`: a union, its parts compared in any order;
- `{...}` (LaTeX grouping) is what it groups;
- `\{a, b\}`: a set, elements in any order, repeats ignored;
- `(a, b)`, `[a, b)`, `(a, b, c)`: an interval or tuple; the brackets must match and the elements
  match in order, so `(1, 2)` is not `[1, 2]` nor `(2, 1)`;
- exactly one of `= < <= > >= !=`: a relation, `a > b` read as `b < a`; two relations are equal when
  the sign is the same and the sides' differences are proportional at every sample (by a positive
  factor for `<` and `<=`): `2x + 4y - 3 = 0` is `y = -\frac12 x + \frac34`;
- `a, b` with no brackets around, or one `\pm`: a set (`-2, 1` is `1, -2`; `1 \pm \sqrt{2}` is
  `1+\sqrt2, 1-\sqrt2`); a set's elements are read the same way, at most 3 levels deep;
- anything else is a value if the reader takes it: numbers (leading zeros go: `007` is 7; `1e3` is
  1000), `+ - * /`, `\cdot`, `\times`, `\div`, `^`, braces and parentheses, `\frac{a}{b}` (and
  `\frac12`), a mixed number (`3\frac{1}{2}` is 7/2), `\sqrt{x}`, `\sqrt[n]{x}`, `n!`, `\binom{n}{k}`,
  `\pi`, `\infty`, `\sin \cos \tan \cot \sec \csc \ln \exp` (`\tan^2 x` too, `\sin^{-1}` not),
  `\log_b x`, single-letter and Greek-letter variables, and implicit products (`3\sqrt{13}`,
  `2\pi r`); two numbers side by side (`1 2`) are not a value;
- two values are equal when both are rational and equal exactly (`0.333` is not 1/3), else when they
  agree to a relative `RELATIVE_TOLERANCE` (1e-30; `ABSOLUTE_TOLERANCE` 1e-40 near 0), with each
  variable set to the same `SAMPLE_POINTS` fixed values in [0.5, 2.5) on both sides (`2-2p` is `-2p+2`,
  not `2-2q`); a side defined at a sample where the other is not differs; values are real only;
- arithmetic without a value (1/0, `\sqrt{-1}`, a value of more than `MAX_DIGITS` digits such as
  `9^{9^{9^9}}`, `n!` past `MAX_FACTORIAL`) equals nothing, itself included;
- the rest is text: compared case-insensitively, whitespace removed except one space between two
  letters or digits (`(1, 2)` is `(1,2)`, `1 2` is not `12`), so matrices compare entry text.

An empty answer equals nothing, and so does one longer than `MAX_ANSWER_CHARS`. That bounds every
check: the clean-up is a fixed number of linear regular-expression passes over at most
`MAX_ANSWER_CHARS` characters, only `MAX_EXPRESSION_CHARS` of them are read as math, in at most
`MAX_ELEMENTS` elements a level, and a power, exponential, factorial or trigonometric function is
refused from the sizes of its arguments before it is computed."""

from __future__ import annotations

import ast
import math
import operator
import random
import re
import unicodedata
from collections.abc import Callable
from fractions import Fraction
from functools import lru_cache

import mpmath

from minirl.tools.safe_math import PARSE_ERRORS, MathError, evaluate_exact, parse_expression

MAX_ANSWER_CHARS = 10_000  # longer answers equal nothing: no reference is that long
MAX_EXPRESSION_CHARS = 400  # longer answers are compared as text only
MAX_ELEMENTS = 32  # of a set, tuple, interval, union or list; more are compared as text
MAX_EXPONENT = 1000  # of an exact power: 2^{1000} is a number, 2^{1001} is valued with mpmath
MAX_DIGITS = 400  # of a value, a numerator or a denominator, intermediate values included
MAX_FACTORIAL = 200  # 200! has 375 digits
SAMPLE_POINTS = 3  # values tried for each variable
RELATIVE_TOLERANCE = mpmath.mpf("1e-30")
ABSOLUTE_TOLERANCE = mpmath.mpf("1e-40")

_MAX_BITS = int(MAX_DIGITS * math.log2(10))
_MP = mpmath.MPContext()
_MP.dps = 50  # digits of the numeric comparison; the tolerances above leave 20 for rounding

# -- last_boxed --------------------------------------------------------------------------------

_BOX_OPEN = re.compile(r"\\boxed\s*\{")
_BRACE = re.compile(r"\\.|[{}]", re.DOTALL)  # an escaped character does not count as a brace
_DEPTH_CHANGE = {"{": 1, "}": -1}


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


# -- equivalent --------------------------------------------------------------------------------


def equivalent(answer: str, reference: str) -> bool:
    r"""Whether two answers are mathematically equal, by the rules in the module doc.

    >>> equivalent(r"\frac{1}{2}", "0.5"), equivalent("0.333", "1/3"), equivalent(r"3\sqrt{13}", r"\sqrt{117}")
    (True, False, True)
    """
    if len(answer) > MAX_ANSWER_CHARS or len(reference) > MAX_ANSWER_CHARS:
        return False
    answer, reference = _clean(answer), _clean(reference)
    if not answer or not reference:
        return False
    return _same(_meaning(answer), _meaning(reference))


# -- clean-up ----------------------------------------------------------------------------------

_FRAC_VARIANT = re.compile(r"\\[dtc]frac(?![A-Za-z])")
_MARKED_SEPARATOR = re.compile(r"(?<=\d)(?:,\\!|\{,\})\s*(?=\d{3}(?!\d))")
_DROPPED = re.compile(r"\\\$|\$|(?<!\\)\\[!,]|\\(?:left|right|displaystyle)(?![A-Za-z])")
_RELATION_COMMANDS = {"geq": ">=", "ge": ">=", "leq": "<=", "le": "<=", "neq": "!=", "ne": "!=", "gt": ">", "lt": "<"}
_RELATION_COMMAND = re.compile(r"\\(geq|ge|leq|le|neq|ne|gt|lt)(?![A-Za-z])")
_MATRIX = re.compile(r"\\(begin|end)\{[bp]matrix\}")
_SPACES = re.compile(r"(?<!\\)\\[;: ]|~|\\q?quad(?![A-Za-z])")
_TEXT_COMMAND = r"\\(?:text|textrm|textbf|textit|textnormal|mathrm|mathbf|mbox)\s*\{([^{}]*)\}"
_UNIT_AT_END = re.compile(_TEXT_COMMAND + r"(?:\s*\^\s*(?:\d|\{\s*\d\s*\}))?\s*\Z")
_TEXT = re.compile(_TEXT_COMMAND)
_UNIT_SIGN_AT_END = re.compile(
    r"(?:\\?%|\s(?:percent|percentage|pct)|°|\\degree|\^\s*\\circ|\^\s*\{\s*\\circ\s*\})\s*\Z", re.IGNORECASE
)
_THOUSANDS = re.compile(r"(?<![\d.,])[1-9]\d{0,2}(?:(,| )\d{3})(?:\1\d{3})*(?![\d,])")
_NAME = r"(?:[A-Za-z]|\\[a-z]+)(?:_\{?\w+\}?)?"
_VARIABLE = re.compile(rf"(?:{_NAME}|\(\s*{_NAME}(?:\s*,\s*{_NAME})*\s*\))\s*(?:=|\\in(?![A-Za-z]))\s*")
_EQUALS_OR_LETTER = re.compile(r"=|(?<![\\A-Za-z])[A-Za-z]")  # a letter not in a command
_NOT_UNITS = "hundred|thousand|million|billion|trillion|dozen|squared|cubed|times|and|or"
_UNIT_WORD_AT_END = re.compile(rf"(?<=[\d}}).])\s+(?!(?:{_NOT_UNITS})\b)[A-Za-z]{{2,}}(?:\^?\d)?\s*\Z", re.IGNORECASE)
_REPEATING = re.compile(r"(\d{0,20})\.(\d{0,20})\\overline\s*\{(\d{1,20})\}")
_AND = re.compile(r"\s*,?\s+and\s+")  # "6 and 8", "19, 46, and 82": lists
_TEXT_PASSES = 3  # \text{\textbf{x}} needs two; more nesting stays


def _without_separators(match: re.Match, text: str) -> str:
    """The number without its thousands separators, but in brackets a plain comma separates: (12,102)."""
    before = text[: match.start()]
    inside = before.count("(") + before.count("[") - before.count(")") - before.count("]") > 0
    return match.group() if inside and match.group(1) == "," else match.group().replace(match.group(1), "")


def _repeating_decimal(match: re.Match) -> str:
    r"""`0.1\overline{6}` as the fraction it is, 1/6."""
    whole, fixed, repeated = match.group(1) or "0", match.group(2), match.group(3)
    value = int(whole) + Fraction(int(fixed or "0"), 10 ** len(fixed))
    value += Fraction(int(repeated), 10 ** len(fixed) * (10 ** len(repeated) - 1))
    return rf"\frac{{{value.numerator}}}{{{value.denominator}}}"


def _clean(text: str) -> str:
    """The LaTeX clean-up shared by every comparison."""
    text = unicodedata.normalize("NFKC", text).replace("−", "-")
    text = _FRAC_VARIANT.sub(r"\\frac", text)
    text = _MARKED_SEPARATOR.sub("", text)
    text = _RELATION_COMMAND.sub(lambda m: _RELATION_COMMANDS[m.group(1)], text)
    text = _MATRIX.sub(r"\\\1{pmatrix}", text)
    text = _SPACES.sub(" ", _DROPPED.sub("", text)).strip()
    unit = _UNIT_AT_END.search(text)
    if unit and text[: unit.start()].strip():
        text = text[: unit.start()]
    for _ in range(_TEXT_PASSES):
        text = _TEXT.sub(r"\1", text)
    text = _AND.sub(", ", text)
    text = _UNIT_SIGN_AT_END.sub("", text.strip())
    text = _UNIT_WORD_AT_END.sub("", text)
    text = _THOUSANDS.sub(lambda m: _without_separators(m, text), text.strip())
    if r"\overline" in text:  # the pattern backtracks at every digit; most answers have none
        text = _REPEATING.sub(_repeating_decimal, text)
    variable = _VARIABLE.match(text)
    if variable and not _EQUALS_OR_LETTER.search(text, variable.end()):  # y = 2x + 1 is an equation
        text = text[variable.end() :]
    return text.strip()


# -- meaning: structure, values and text -------------------------------------------------------

# A meaning is one of:
#   ("choice", letter) | ("text", key) | ("value", Fraction | samples | None)
#   ("ordered", (open, close), elements) | ("unordered", kind, elements) with kind "set", "union", "list"
Meaning = tuple

_CHOICE = re.compile(r"\(?([A-Ea-e])\)?")
_PLUS_MINUS = re.compile(r"\\pm(?![A-Za-z])")
_SPLIT_TOKEN = re.compile(r"\\[{}]|\\[A-Za-z]+|\\.|.", re.DOTALL)
_OPENERS = {"(", "[", "{", r"\{"}
_CLOSERS = {")", "]", "}", r"\}"}
_RELATION = re.compile(r"<=|>=|!=|=|<|>")
_UNSPACED = re.compile(r"\s+(?!\w)|(?<!\w)\s+")


def _meaning(text: str, depth: int = 0) -> Meaning:
    """What the cleaned answer says: a choice, a structure of elements, a value or text."""
    choice = _CHOICE.fullmatch(text)
    if choice:
        return ("choice", choice.group(1).upper())
    if len(text) > MAX_EXPRESSION_CHARS or depth > 3:
        return ("text", _text_key(text))
    tokens = _SPLIT_TOKEN.findall(text)
    parts = _split(tokens, r"\cup")
    if len(parts) > 1:
        return _elements("unordered", "union", parts, depth) or ("text", _text_key(text))
    if _enclosed(tokens) and tokens[0] == "{":  # LaTeX grouping: {1, 3} shows as 1, 3
        return _meaning("".join(tokens[1:-1]).strip(), depth + 1)
    if _enclosed(tokens) and tokens[0] == r"\{":
        return _elements("unordered", "set", _split(tokens[1:-1], ","), depth) or ("text", _text_key(text))
    if _enclosed(tokens) and tokens[0] in "([" and tokens[-1] in ")]":
        elements = _split(tokens[1:-1], ",")
        if len(elements) > 1:
            return _elements("ordered", (tokens[0], tokens[-1]), elements, depth) or ("text", _text_key(text))
    relation = _relation(text)
    if relation:
        return relation
    elements = _split(tokens, ",")
    if len(elements) > 1 or len(_PLUS_MINUS.findall(text)) == 1:  # "-2, 1" and "1 \pm \sqrt{2}": sets
        return _elements("unordered", "set", elements, depth) or ("text", _text_key(text))
    return _scalar(text)


def _relation(text: str) -> Meaning | None:
    """`a < b` as ("relation", "<", the value of a - b), `a > b` as `b < a`; None without exactly one
    relation sign or when a side is not a value."""
    found = _RELATION.findall(text)
    if len(found) != 1:
        return None
    lhs, rhs = (side.strip() for side in _RELATION.split(text))
    relation = found[0]
    if relation in (">", ">="):
        lhs, relation, rhs = rhs, relation.replace(">", "<"), lhs
    if not lhs or not rhs:
        return None
    difference = _scalar(f"{{{lhs}}}-{{{rhs}}}")
    return ("relation", relation, difference[1]) if difference[0] == "value" else None


def _split(tokens: list[str], separator: str) -> list[str]:
    """The texts between top-level separators; [the whole text] when brackets do not balance."""
    parts, start, depth = [], 0, 0
    for i, token in enumerate(tokens):
        depth += (token in _OPENERS) - (token in _CLOSERS)
        if depth < 0:
            return ["".join(tokens)]
        if depth == 0 and token == separator:
            parts.append("".join(tokens[start:i]))
            start = i + 1
    if depth != 0:
        return ["".join(tokens)]
    return [*parts, "".join(tokens[start:])]


def _enclosed(tokens: list[str]) -> bool:
    """Whether the first token opens a bracket that the last token closes (any kind: `[0, 1)`)."""
    if len(tokens) < 2 or tokens[0] not in _OPENERS or tokens[-1] not in _CLOSERS:
        return False
    depth = 0
    for i, token in enumerate(tokens):
        depth += (token in _OPENERS) - (token in _CLOSERS)
        if depth == 0:
            return i == len(tokens) - 1
    return False


def _elements(order: str, kind: str | tuple[str, str], parts: list[str], depth: int) -> Meaning | None:
    """A structure of the parts' meanings; None when it has too many or an empty one."""
    parts = [part.strip() for part in parts]
    if kind == "set":  # "1 \pm 2" is the set of 1 + 2 and 1 - 2
        parts = [signed for part in parts for signed in _signs(part)]
    if len(parts) > MAX_ELEMENTS or not all(parts):
        return None
    return (order, kind, tuple(_meaning(part, depth + 1) for part in parts))


def _signs(part: str) -> list[str]:
    """The part with its one `\\pm` read as + and as -; the part itself without exactly one."""
    if len(_PLUS_MINUS.findall(part)) != 1:
        return [part]
    return [_PLUS_MINUS.sub(sign, part) for sign in "+-"]


def _text_key(text: str) -> str:
    key = " ".join(text.split())
    return (_UNSPACED.sub("", key) if " " in key else key).casefold()


def _same(a: Meaning, b: Meaning) -> bool:
    """Whether two meanings are equal (module doc)."""
    if a[0] != b[0]:
        return False
    if a[0] == "value":
        return _same_value(a[1], b[1])
    if a[0] == "relation":
        return a[1] == b[1] and _proportional(a[2], b[2], positive=a[1] in ("<", "<="))
    if a[0] in ("choice", "text"):
        return a[1] == b[1]
    if a[1] != b[1]:  # brackets, or set / union / list
        return False
    if a[0] == "ordered":
        return len(a[2]) == len(b[2]) and all(_same(x, y) for x, y in zip(a[2], b[2]))
    return all(any(_same(x, y) for y in b[2]) for x in a[2]) and all(any(_same(x, y) for x in a[2]) for y in b[2])


# -- values ------------------------------------------------------------------------------------

Samples = tuple  # (mpf | None, ...): the value at each sample point (one for a constant), None where it has none
Value = Fraction | Samples | None  # None: arithmetic without a value


def _scalar(text: str) -> Meaning:
    """The value of the text if the reader takes it, else its text key."""
    try:
        reader = _LatexReader(text)
        expression = reader.expression()
    except _NotAnExpression:
        return ("text", _text_key(text))
    try:
        tree = _parse(expression)
    except MathError:  # "2 +" or "(1)(": not an expression after all
        return ("text", _text_key(text))
    if reader.rational:
        try:
            exact = evaluate_exact(
                expression, max_length=len(expression), max_exponent=MAX_EXPONENT, max_digits=MAX_DIGITS
            )
            return ("value", exact)
        except MathError:  # 2^{1/2} or 2^{1001}: not an exact rational, perhaps a real number
            pass
    points = SAMPLE_POINTS if reader.variables else 1
    samples = tuple(_NumericEvaluator(expression, point).defined_value(tree) for point in range(points))
    if all(sample is None for sample in samples):
        return ("value", None)
    return ("value", samples)


def _same_value(a: Value, b: Value) -> bool:
    if a is None or b is None:
        return False
    if isinstance(a, Fraction) and isinstance(b, Fraction):
        return a == b
    pairs = _sample_pairs(a, b)
    if any((x is None) != (y is None) for x, y in pairs):
        return False
    return all(_close(x, y) for x, y in pairs if x is not None)


def _proportional(a: Value, b: Value, positive: bool) -> bool:
    """Whether a = c * b for one constant c != 0 (c > 0 if `positive`) at every sample: `2x = 4` is `x - 2 = 0`."""
    if a is None or b is None:
        return False
    ratios = []
    for x, y in _sample_pairs(a, b):
        if (x is None) != (y is None):
            return False
        if x is None:
            continue
        if _close(x, 0) or _close(y, 0):
            if not (_close(x, 0) and _close(y, 0)):
                return False
            continue
        ratios.append(x / y)
    if not ratios or not all(_close(ratio, ratios[0]) for ratio in ratios):
        return False
    return ratios[0] > 0 or not positive


def _sample_pairs(a: Fraction | Samples, b: Fraction | Samples) -> list[tuple]:
    """The two values side by side at each sample; a constant has one sample, the same at every point."""
    a, b = (((_MP.mpf(v.numerator) / v.denominator),) if isinstance(v, Fraction) else v for v in (a, b))
    if len(a) != len(b):
        a, b = (a * SAMPLE_POINTS)[:SAMPLE_POINTS], (b * SAMPLE_POINTS)[:SAMPLE_POINTS]
    return list(zip(a, b))


def _close(x: mpmath.mpf, y: mpmath.mpf) -> bool:
    if _MP.isinf(x) or _MP.isinf(y):
        return x == y
    return abs(x - y) <= max(RELATIVE_TOLERANCE * max(abs(x), abs(y)), ABSOLUTE_TOLERANCE)


# -- the reader: LaTeX -> a Python expression over a whitelist ---------------------------------

_TOKEN = re.compile(
    r"\\[A-Za-z]+|\\.|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[A-Za-z]+|π|∞|√|\s+|.",
    re.DOTALL,
)
_OPERATORS = {
    "+": "+", "-": "-", "*": "*", "/": "/",
    r"\cdot": "*", r"\times": "*", "×": "*", "·": "*", r"\div": "/", "÷": "/",
}  # fmt: skip
_CONSTANTS = {r"\pi": "pi", "π": "pi", r"\infty": "inf", "∞": "inf"}
_FUNCTIONS = {rf"\{name}": name for name in ("sin", "cos", "tan", "cot", "sec", "csc", "ln", "exp")}
_GREEK = {
    rf"\{name}"
    for name in ("alpha", "beta", "gamma", "delta", "epsilon", "theta", "vartheta", "lambda", "mu", "nu", "rho")
    + ("sigma", "tau", "phi", "varphi", "chi", "psi", "omega")
}
_GROUPS = {"{": "}", "(": ")"}
_INTEGER = re.compile(r"\(?\d+\)?")


class _NotAnExpression(Exception):
    """The LaTeX uses more than the reader takes (module doc)."""


class _LatexReader:
    r"""LaTeX as a Python expression over numbers, `v_<name>` variables, `pi`, `inf` and the calls `sqrt`,
    `root`, `fact`, `binom` and the functions of `_FUNCTIONS`: `2\frac{\pi}{3}x` -> `2*((pi)/(3))*v_x`."""

    def __init__(self, latex: str) -> None:
        self.tokens = [token for token in _TOKEN.findall(latex) if not token.isspace()]
        self.position = 0
        self.rational = True  # no constant, root, factorial, function or variable
        self.variables = False

    def expression(self) -> str:
        text = self._sequence()
        if self.position < len(self.tokens):  # a closer without its opener
            raise _NotAnExpression
        return text

    def _sequence(self) -> str:
        """Items up to a closing bracket (left unread) or the end, implicit products made explicit."""
        parts: list[tuple[str, str]] = []  # (text, kind); kind: "number", "operand" or "operator"
        while self.position < len(self.tokens) and self.tokens[self.position] not in "})]":
            token = self.tokens[self.position]
            if token == "!":
                self.position += 1
                if not parts or parts[-1][1] == "operator":
                    raise _NotAnExpression
                parts[-1] = (f"fact({parts[-1][0]})", "operand")
                self.rational = False
                continue
            if token == "^":
                self.position += 1
                parts += [("**", "operator"), (f"({self._argument()})", "operand")]
                continue
            mixed = token == r"\frac" and parts and parts[-1][1] == "number" and parts[-1][0].isdigit()
            mixed = mixed and (len(parts) < 2 or parts[-2][0] != "**")
            text, kind = self._item()
            if mixed and kind == "fraction" and all(_INTEGER.fullmatch(arg) for arg in text):
                parts[-1] = (f"({parts[-1][0]}+({text[0]})/({text[1]}))", "operand")
                continue
            if kind == "fraction":
                text, kind = f"(({text[0]})/({text[1]}))", "operand"
            if kind != "operator" and parts and parts[-1][1] != "operator":
                if kind == parts[-1][1] == "number":  # "1 2" is not 12, nor 2
                    raise _NotAnExpression
                parts.append(("*", "operator"))
            parts.append((text, kind))
        return "".join(text for text, _ in parts)

    def _item(self) -> tuple:
        token = self.tokens[self.position]
        self.position += 1
        if token in _GROUPS:
            inner = self._sequence()
            if self.position == len(self.tokens) or self.tokens[self.position] != _GROUPS[token]:
                raise _NotAnExpression
            self.position += 1
            return f"({inner})", "operand"
        if token[0].isdigit() or token[0] == ".":
            return re.sub(r"\A0+(?=\d)", "", token), "number"
        if token in _OPERATORS:
            return _OPERATORS[token], "operator"
        if token == r"\frac":
            return (self._argument(), self._argument()), "fraction"
        self.rational = False
        if token in _CONSTANTS:
            return _CONSTANTS[token], "operand"
        if token in (r"\sqrt", "√"):
            return self._root(), "operand"
        if token in (r"\binom", r"\dbinom", r"\tbinom"):
            return f"binom({self._argument()},{self._argument()})", "operand"
        if token in _FUNCTIONS:
            return self._call(_FUNCTIONS[token]), "operand"
        if token == r"\log" and self.position < len(self.tokens) and self.tokens[self.position] == "_":
            self.position += 1
            base = self._argument()
            return f"(ln({self._argument()})/ln({base}))", "operand"
        if (token.isascii() and token.isalpha() and len(token) == 1) or token in _GREEK:
            self.variables = True
            return "v_" + token.lstrip("\\"), "operand"
        raise _NotAnExpression

    def _call(self, name: str) -> str:
        r"""`\sin x` as sin(x), `\tan^2 x` as (tan(x))**(2); `\sin^{-1}` (arcsin) is not read."""
        power = None
        if self.position < len(self.tokens) and self.tokens[self.position] == "^":
            self.position += 1
            power = self._argument()
            if power.lstrip("(").startswith("-"):
                raise _NotAnExpression
        call = f"{name}({self._argument()})"
        return f"({call})**({power})" if power else call

    def _root(self) -> str:
        r"""`\sqrt{x}` as sqrt(x), `\sqrt[n]{x}` as root(x, n)."""
        if self.position < len(self.tokens) and self.tokens[self.position] == "[":
            self.position += 1
            degree = self._sequence()
            if self.position == len(self.tokens) or self.tokens[self.position] != "]":
                raise _NotAnExpression
            self.position += 1
            return f"root({self._argument()},{degree})"
        return f"sqrt({self._argument()})"

    def _argument(self) -> str:
        r"""A braced group or a single token: the first digit only of a number, as in `\frac12`."""
        if self.position == len(self.tokens) or self.tokens[self.position] in "})]":
            raise _NotAnExpression
        token = self.tokens[self.position]
        if token[0].isdigit() and len(token) > 1:
            self.tokens[self.position] = token[1:]
            return token[0]
        text, kind = self._item()
        if kind == "operator":
            raise _NotAnExpression
        if kind == "fraction":
            return f"(({text[0]})/({text[1]}))"
        return text


def _parse(expression: str) -> ast.Expression:
    try:
        return parse_expression(expression)
    except PARSE_ERRORS as err:
        raise MathError(f"not an expression: {expression!r}") from err


# -- numeric values ----------------------------------------------------------------------------


@lru_cache(maxsize=256)
def _sample(name: str, point: int) -> mpmath.mpf:
    """The value of variable `name` at sample `point`: fixed, the same on both sides, in [0.5, 2.5)."""
    return _MP.mpf(random.Random(f"{name}/{point}").uniform(0.5, 2.5))


class _NumericEvaluator:
    """Walks a tree made by `_LatexReader` with 50-digit mpmath values; every value is real and below
    `MAX_DIGITS` digits (or infinite, from `\\infty`), checked before the cost of computing it grows."""

    def __init__(self, source: str, point: int) -> None:
        self.source = source
        self.point = point
        self.binary: dict[type, Callable] = {
            ast.Add: operator.add,
            ast.Sub: operator.sub,
            ast.Mult: operator.mul,
            ast.Div: operator.truediv,
            ast.Pow: self._power,
        }
        self.calls: dict[str, Callable] = {
            "sqrt": self._sqrt,
            "root": self._nth_root,
            "fact": self._factorial,
            "binom": self._binomial,
            "sin": self._periodic(_MP.sin),
            "cos": self._periodic(_MP.cos),
            "tan": self._periodic(_MP.tan),
            "cot": self._periodic(_MP.cot),
            "sec": self._periodic(_MP.sec),
            "csc": self._periodic(_MP.csc),
            "ln": self._ln,
            "exp": self._exp,
        }

    def defined_value(self, tree: ast.Expression) -> mpmath.mpf | None:
        """The value of the tree, None where it has none (1/0, sqrt(-1), too big)."""
        try:
            return self.value(tree.body)
        except (MathError, ZeroDivisionError, OverflowError, ValueError, RecursionError):
            return None

    def value(self, node: ast.AST) -> mpmath.mpf:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            literal = node.value if type(node.value) is int else ast.get_source_segment(self.source, node)
            return self._checked(_MP.mpf(literal))
        if isinstance(node, ast.Name):
            if node.id == "pi":
                return +_MP.pi
            if node.id == "inf":
                return _MP.inf
            if node.id.startswith("v_"):
                return _sample(node.id, self.point)
        if isinstance(node, ast.BinOp) and type(node.op) in self.binary:
            left, right = self.value(node.left), self.value(node.right)
            return self._checked(self.binary[type(node.op)](left, right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            operand = self.value(node.operand)
            return -operand if isinstance(node.op, ast.USub) else operand
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in self.calls:
            return self._checked(self.calls[node.func.id](*(self.value(arg) for arg in node.args)))
        raise MathError(f"{ast.dump(node)[:40]} is not allowed")

    def _checked(self, x: mpmath.mpf) -> mpmath.mpf:
        if not isinstance(x, _MP.mpf) or _MP.isnan(x):
            raise MathError("not a real number")
        if not _MP.isinf(x) and x != 0 and abs(_MP.mag(x)) > _MAX_BITS:
            raise MathError(f"more than {MAX_DIGITS} digits")
        return x

    def _finite(self, *values: mpmath.mpf) -> None:
        if any(_MP.isinf(x) for x in values):
            raise MathError("infinity in arithmetic that needs a number")

    def _power(self, base: mpmath.mpf, exponent: mpmath.mpf) -> mpmath.mpf:
        self._finite(base, exponent)
        if base < 0 and not _MP.isint(exponent):
            raise MathError("a negative number to a fractional power")
        if base != 0 and abs(base) != 1 and abs(exponent * _MP.log(abs(base), 2)) > _MAX_BITS:
            raise MathError(f"more than {MAX_DIGITS} digits")
        return _MP.power(base, exponent)

    def _sqrt(self, x: mpmath.mpf) -> mpmath.mpf:
        self._finite(x)
        if x < 0:
            raise MathError("the square root of a negative number")
        return _MP.sqrt(x)

    def _nth_root(self, x: mpmath.mpf, degree: mpmath.mpf) -> mpmath.mpf:
        self._finite(x, degree)
        if not _MP.isint(degree) or not 1 <= degree <= MAX_EXPONENT:
            raise MathError(f"a root of degree {degree}")
        if x < 0 and int(degree) % 2 == 0:
            raise MathError("an even root of a negative number")
        return _MP.root(x, int(degree)) if x >= 0 else -_MP.root(-x, int(degree))

    def _factorial(self, x: mpmath.mpf) -> mpmath.mpf:
        if not _MP.isint(x) or not 0 <= x <= MAX_FACTORIAL:
            raise MathError(f"the factorial of {x}")
        return _MP.mpf(math.factorial(int(x)))

    def _binomial(self, n: mpmath.mpf, k: mpmath.mpf) -> mpmath.mpf:
        if not (_MP.isint(n) and _MP.isint(k)) or not 0 <= k <= n <= MAX_FACTORIAL:
            raise MathError(f"the binomial coefficient of {n} and {k}")
        return _MP.mpf(math.comb(int(n), int(k)))

    def _periodic(self, function: Callable) -> Callable:
        def bounded(x: mpmath.mpf) -> mpmath.mpf:
            self._finite(x)
            if abs(x) > 2**64:  # the reduction modulo 2 pi would need as many digits as x has
                raise MathError("a trigonometric function of a huge number")
            return function(x)

        return bounded

    def _ln(self, x: mpmath.mpf) -> mpmath.mpf:
        self._finite(x)
        if x <= 0:
            raise MathError("the logarithm of a number that is not positive")
        return _MP.ln(x)

    def _exp(self, x: mpmath.mpf) -> mpmath.mpf:
        self._finite(x)
        if abs(x) > _MAX_BITS * math.log(2):
            raise MathError(f"more than {MAX_DIGITS} digits")
        return _MP.exp(x)
