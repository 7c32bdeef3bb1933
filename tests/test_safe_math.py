import gc
import math
import operator
import re
import sys
import threading
import time
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minirl.tools.safe_math import MathError, evaluate, evaluate_exact, format_number

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("256 * 37", 9472),
        ("2 + 3 * 4", 14),
        ("(2 + 3) * 4", 20),
        ("7 / 2", 3.5),
        ("7 // 2", 3),
        ("-7 // 2", -4),
        ("7 % 3", 1),
        ("-7 % 3", 2),
        ("2 ** 10", 1024),
        ("2 ** -2", 0.25),
        ("-2 ** 2", -4),
        ("+5 - -3", 8),
        ("1.5 * 4", 6.0),
        ("  12.5 + 0.25 ", 12.75),
        ("((((1))))", 1),
        ("2 ** 3 ** 2", 512),
        ("10 ** 64", 10**64),
    ],
)
def test_arithmetic(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("__import__('os')", "Call is not allowed"),
        ("().__class__", "Attribute is not allowed"),
        ("().__class__.__bases__[0].__subclasses__()", "not allowed"),
        ("x + 1", "Name is not allowed"),
        ("abs(-1)", "Call is not allowed"),
        ("[1, 2][0]", "Subscript is not allowed"),
        ("'a' * 3", "str literals are not allowed"),
        ("True + 1", "bool literals are not allowed"),
        ("1j * 2", "complex literals are not allowed"),
        ("[x for x in (1, 2)]", "ListComp is not allowed"),
        ("lambda: 1", "Lambda is not allowed"),
        ("1 if 1 else 2", "IfExp is not allowed"),
        ("1 < 2", "Compare is not allowed"),
        ("1 << 64", "LShift is not allowed"),
        ("~1", "Invert is not allowed"),
        ("2 ** 10 ** 10", "exponent 10000000000 exceeds the limit of 64"),
        ("9 ** 99999", "exponent 99999 exceeds"),
        ("2 ** -100", "exponent -100 exceeds"),
        ("99 ** 60", "more than 100 digits"),
        ("10 ** 60 * 10 ** 60", "more than 100 digits"),
        ("1" * 101, "more than 100 digits"),
        ("1e300 * 1e300", "more than 100 digits"),
        ("1.5 ** 64.5", "exponent 64.5 exceeds"),
        ("(-8) ** 0.5", "not a real number"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("1 // 0.0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("1 +", "not a valid arithmetic expression"),
        ("", "not a valid arithmetic expression"),
        ("1; 2", "not a valid arithmetic expression"),
        ("1" + "+1" * 5000, "10001 characters long; the limit is 200"),
        ("(1).__class__", "Attribute is not allowed"),
        ("getattr(1, '__class__')", "Call is not allowed"),
        ("f'{1}'", "JoinedStr is not allowed"),
        ("(x := 1)", "NamedExpr is not allowed"),
        ("1 and 2", "BoolOp is not allowed"),
        ("(1, 2)", "Tuple is not allowed"),
        ("...", "ellipsis literals are not allowed"),
        ("None", "NoneType literals are not allowed"),
        ("(x for x in (1,))", "GeneratorExp is not allowed"),
        ("{x: 1 for x in (1,)}", "DictComp is not allowed"),
        ("1\x00", "not a valid arithmetic expression"),
        ("(-1) ** 10 ** 100", "exponent 100 exceeds"),
    ],
)
def test_rejections(expression, fragment):
    with pytest.raises(MathError, match=re.escape(fragment)):
        evaluate(expression)


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("2^10", 1024),
        ("2^3*2", 16),  # ^ is **, with its precedence: not 2 ** 6
        ("2^3^2", 512),
        ("256 × 37", 9472),
        ("100 ÷ 4", 25.0),
        ("3 − 1", 2),
        ("（3+4）*2", 14),
        ("math.sqrt(144)", 12.0),
        ("math.sqrt(2^4) + math.fabs(-1)", 5.0),
        ("math.log(8, 2)", 3.0),
        ("math.log10(1000)", 3.0),
        ("math.exp(0)", 1.0),
        ("math.floor(7 / 2) + math.ceil(0.5)", 4),
        ("math.factorial(5)", 120),
        ("math.pow(2, 10)", 1024.0),
        ("math.cos(0) * math.pi", math.pi),
        ("math.e ** 0", 1.0),
    ],
)
def test_minimind_rewrites_and_math_functions(expression, value):
    """What MiniMind's calculator reads (its rewrites, its `math` namespace) means the same here."""
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("9^9^9", "exponent 387420489 exceeds the limit of 64"),
        ("2^65", "exponent 65 exceeds"),
        ("99^60", "more than 100 digits"),
        ("math.pow(2, 10^10)", "exponent 10000000000 exceeds"),
        ("math.factorial(70)", "more than 100 digits"),
        ("math.factorial(10**50)", "more than 100 digits"),
        ("math.factorial(2.5)", "non-negative integer"),
        ("math.exp(1000)", "too large"),
        ("math.exp(231)", "more than 100 digits"),
        ("math.sqrt(-1)", "math.sqrt is undefined at -1"),
        ("math.log(0)", "math.log is undefined at 0"),
        ("math.sqrt(1, 2)", "math.sqrt: "),
        ("math.sqrt(x=4)", "math.sqrt takes no keyword arguments"),
        ("math.sqrt(*[4])", "Starred is not allowed"),
        ("sqrt(4)", "Call is not allowed"),
        ("math.system('ls')", "Call is not allowed"),
        ("math.sqrt.__call__(4)", "Call is not allowed"),
        ("math.__dict__", "Attribute is not allowed"),
        ("math.sqrt", "Attribute is not allowed"),
        ("math", "Name is not allowed"),
        ("(math).pi.real", "Attribute is not allowed"),
    ],
)
def test_minimind_rewrites_stay_inside_the_whitelist_and_limits(expression, fragment):
    started = time.perf_counter()
    with pytest.raises(MathError, match=re.escape(fragment)):
        evaluate(expression)
    assert time.perf_counter() - started < 0.1


def test_rewrites_count_towards_the_length_limit_as_written():
    assert evaluate("2^1", max_length=3) == 2  # 3 characters as written, 4 as "2**1"
    with pytest.raises(MathError, match="4 characters long; the limit is 3"):
        evaluate("2 ^1", max_length=3)


def test_non_string_is_rejected():
    with pytest.raises(MathError, match="must be a string"):
        evaluate(12)  # type: ignore[arg-type]


def test_limits_are_configurable_and_cheap():
    with pytest.raises(MathError, match="more than 10 digits"):
        evaluate("99999 * 999999", max_digits=10)
    with pytest.raises(MathError, match="exponent 9 exceeds the limit of 8"):
        evaluate("2 ** 9", max_exponent=8)
    started = time.perf_counter()
    with pytest.raises(MathError):
        evaluate("9 ** 9 ** 9 ** 9")
    with pytest.raises(MathError):
        evaluate("(10 ** 50) ** 64")
    assert time.perf_counter() - started < 0.1


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("-" * 2000 + "1", "nested too deeply"),
        ("(" * 1000 + "1" + ")" * 1000, "not a valid arithmetic expression"),
        ("-" * 100_000 + "1", "not a valid arithmetic expression"),
        ("1" + "+1" * 3000, "not a valid arithmetic expression"),
    ],
    ids=["2000 minus signs", "1000 parentheses", "100000 minus signs", "3000 additions"],
)
def test_deep_and_long_expressions_fail_cleanly_past_a_raised_length_limit(expression, fragment):
    started = time.perf_counter()
    with pytest.raises(MathError, match=fragment):
        evaluate(expression, max_length=10**6)
    assert time.perf_counter() - started < 0.5


_OPERATORS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv, "%": operator.mod}


@given(a=st.integers(-(10**12), 10**12), b=st.integers(1, 10**12), op=st.sampled_from(sorted(_OPERATORS)))
def test_integer_arithmetic_matches_python(a, b, op):
    assert evaluate(f"{a} {op} {b}") == _OPERATORS[op](a, b)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (9472, "9472"),
        (-3, "-3"),
        (3.0, "3"),
        (0.92, "0.92"),
        (12.4375, "12.4375"),
        (1 / 3, "0.3333"),
        (2 / 3, "0.6667"),
        (-0.00001, "0"),
        (2.99999, "3"),
        (1e20, "100000000000000000000"),
        (1e23, "100000000000000000000000"),  # not the binary value, 99999999999999991611392
        (0.1 * 1e24, "100000000000000010000000"),
        (-2.5e17, "-250000000000000000"),
        (-1.5, "-1.5"),
    ],
)
def test_format_number(value, text):
    assert format_number(value) == text


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("0.1 + 0.2", Fraction(3, 10)),
        ("1 / 3", Fraction(1, 3)),
        ("(7 // 2) / (5 // 2)", Fraction(3, 2)),
        ("2 ** -3", Fraction(1, 8)),
        ("0.5 ** 2", Fraction(1, 4)),
        ("1e3", Fraction(1000)),
        (".5", Fraction(1, 2)),
        ("0.10000000000000000001", Fraction(10**19 + 1, 10**20)),  # not the float 0.1
        ("-7 % 3", Fraction(2)),
        ("0.5^2 × 4 − 0.1", Fraction(9, 10)),  # MiniMind's rewrites, with exact decimals after the longer "**"
        ("math.floor(7 / 2)", Fraction(3)),
    ],
)
def test_exact_arithmetic(expression, value):
    result = evaluate_exact(expression)
    assert type(result) is Fraction and result == value


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("2 ** 0.5", "exponent 1/2 is not an integer"),
        ("2 ** 65", "exponent 65 exceeds the limit of 64"),
        ("10 ** 60 * 10 ** 60", "more than 100 digits"),
        ("1 / 10 ** 60 / 10 ** 60", "denominator has more than 100 digits"),
        ("1e999999999", "more than 100 digits"),
        ("1e-999999999", "more than 100 digits"),
        ("0 ** -1", "division by zero"),
        ("1 / 0", "division by zero"),
        ("x + 1", "Name is not allowed"),
        ("9 ** 9 ** 9 ** 9", "exponent 387420489 exceeds"),
        ("9^9^9", "exponent 387420489 exceeds"),
        ("math.sqrt(2)", "not a rational number"),
    ],
)
def test_exact_rejections(expression, fragment):
    started = time.perf_counter()
    with pytest.raises(MathError, match=re.escape(fragment)):
        evaluate_exact(expression)
    assert time.perf_counter() - started < 0.5


@pytest.mark.parametrize("expression", ["204kg", "3in [3]", "1if 1 else 2"])
def test_text_the_parser_warns_about_is_rejected_without_a_warning(expression, recwarn):
    with pytest.raises(MathError):
        evaluate(expression)
    assert not [w for w in recwarn if issubclass(w.category, SyntaxWarning)]


class _FreedByTheCollector:
    """A cycle whose finalizer yields the GIL: collected mid-parse in whatever thread allocates, it lets another
    thread run inside ast.parse's AST construction."""

    def __init__(self) -> None:
        self.cycle = self

    def __del__(self) -> None:
        time.sleep(0)


def test_expressions_parse_correctly_in_many_threads_at_once():
    """The tool executor runs calls in threads. Unlocked, ast.parse's shared recursion counter (CPython before
    3.13) made about 1 in 12000 of these parses fail with "AST constructor recursion depth mismatch" (a race:
    this test failed in 1 of 3 runs without the lock, and in 0 of 4 with it)."""
    expression = "((1 + 2) * (3 - 4)) ** 2 + " + "+".join(["(5*6)"] * 10)
    failures: list[str] = []

    def parse_many() -> None:
        for _ in range(6000):
            garbage = _FreedByTheCollector()  # freed by the collector once the next one replaces it
            try:
                value = evaluate(expression)
            except SystemError as err:
                failures.append(str(err))
                continue
            if value != 309:
                failures.append(f"{expression} = {value}")
        del garbage

    threshold, interval = gc.get_threshold(), sys.getswitchinterval()
    gc.set_threshold(5)  # collections during parses
    sys.setswitchinterval(1e-6)  # and thread switches at every chance
    try:
        threads = [threading.Thread(target=parse_many) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        gc.set_threshold(*threshold)
        sys.setswitchinterval(interval)
    assert failures == []
