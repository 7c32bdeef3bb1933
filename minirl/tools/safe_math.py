"""Bounded arithmetic on model-written expressions, without eval.

The expression is parsed with `ast.parse(mode="eval")` and walked over a whitelist: int/float
literals, + - * / // % **, unary + -, parentheses, the calls `math.<fn>(...)` of sqrt, exp, log, log2,
log10, sin, cos, tan, fabs, floor, ceil, pow and factorial, and the constants `math.pi`, `math.e`. Other
names, calls, attributes, subscripts, strings and everything else are rejected. Sizes are bounded: the
expression length, the exponent, and the magnitude of every intermediate value (checked from bit
lengths before a big product, power or factorial is computed).

Before parsing, the text is rewritten as MiniMind's calculator rewrites it (its trainer/train_agent.py):
`^` is a power, not XOR (`2^3*2` is 16: the rewrite is `**`, with its precedence), `×` `÷` `−` are
* / -, and full-width brackets `（ ）` are ( ). MiniMind's namespace is `math`, so `sqrt(2)` without it is
refused there and here.

`evaluate` computes with int and float; `evaluate_exact` with fractions.Fraction, so `0.1 + 0.2`
is exactly 3/10 and `1/3` is not 0.3333 (integer exponents only; numerator and denominator bounded).
"""

from __future__ import annotations

import ast
import math
import operator
import threading
import warnings
from collections.abc import Callable, Collection
from decimal import Decimal
from fractions import Fraction

Number = int | float


class MathError(ValueError):
    """The expression is not allowed, too big, or undefined (e.g. division by zero)."""


# MiniMind's rewrites of model-written arithmetic (module docstring)
REWRITES = str.maketrans({"^": "**", "×": "*", "÷": "/", "−": "-", "（": "(", "）": ")"})
MATH_CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e}


class _Evaluator:
    """Walks an expression tree; every value it returns is a real number below 10**max_digits."""

    def __init__(self, max_exponent: int, max_digits: int) -> None:
        self.max_exponent = max_exponent
        self.max_digits = max_digits
        self.limit = 10**max_digits
        self.nodes: dict[type, Callable[[ast.AST], Number]] = {
            ast.Expression: lambda node: self.value_of(node.body),
            ast.Constant: self._constant,
            ast.BinOp: self._binary,
            ast.UnaryOp: self._unary,
            ast.Call: self._call,
            ast.Attribute: lambda node: MATH_CONSTANTS[self._math_name(node, MATH_CONSTANTS, "Attribute")],
        }
        # math.<name> -> the function; each result is checked like any value, big ones refused before they exist
        self.functions: dict[str, Callable[..., Number]] = {
            "sqrt": math.sqrt,
            "exp": math.exp,  # OverflowError past 1e308: "too large"
            "log": math.log,
            "log2": math.log2,
            "log10": math.log10,
            "sin": math.sin,
            "cos": math.cos,
            "tan": math.tan,
            "fabs": math.fabs,
            "floor": math.floor,
            "ceil": math.ceil,
            "pow": lambda base, exponent: float(self._power(base, exponent)),
            "factorial": self._factorial,
        }
        self.binary: dict[type, Callable[[Number, Number], Number]] = {
            ast.Add: operator.add,
            ast.Sub: operator.sub,
            ast.Mult: self._multiply,
            ast.Div: operator.truediv,
            ast.FloorDiv: operator.floordiv,
            ast.Mod: operator.mod,
            ast.Pow: self._power,
        }
        self.unary: dict[type, Callable[[Number], Number]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}

    def value_of(self, node: ast.AST) -> Number:
        handler = self.nodes.get(type(node))
        if handler is None:
            raise MathError(f"{type(node).__name__} is not allowed; use numbers, + - * / // % ** and parentheses")
        return self._checked(handler(node))

    def _checked(self, value: Number) -> Number:
        if isinstance(value, complex):
            raise MathError("the result is not a real number")
        if isinstance(value, float) and not math.isfinite(value):
            raise MathError("the result is too large")
        if abs(value) >= self.limit:
            raise MathError(f"the result has more than {self.max_digits} digits")
        return value

    def _too_big(self, min_bits: int) -> None:
        """Reject a result known to need at least `min_bits` bits before computing it."""
        if min_bits > self.limit.bit_length():
            raise MathError(f"the result has more than {self.max_digits} digits")

    def _constant(self, node: ast.Constant) -> Number:
        if type(node.value) not in (int, float):
            raise MathError(f"{type(node.value).__name__} literals are not allowed; only numbers")
        return node.value

    def _binary(self, node: ast.BinOp) -> Number:
        op = self.binary.get(type(node.op))
        if op is None:
            raise MathError(f"operator {type(node.op).__name__} is not allowed; use + - * / // % **")
        return op(self.value_of(node.left), self.value_of(node.right))

    def _unary(self, node: ast.UnaryOp) -> Number:
        op = self.unary.get(type(node.op))
        if op is None:
            raise MathError(f"operator {type(node.op).__name__} is not allowed; use unary + or -")
        return op(self.value_of(node.operand))

    def _math_name(self, node: ast.AST, known: Collection[str], kind: str) -> str:
        """NAME of `math.NAME` when it is one of `known`; else MathError naming the `kind` of node refused."""
        if not (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "math"
            and node.attr in known
        ):
            raise MathError(
                f"{kind} is not allowed; besides numbers and operators only math.pi, math.e and "
                f"math.<fn>(...) for fn in {', '.join(self.functions)}"
            )
        return node.attr

    def _call(self, node: ast.Call) -> Number:
        name = self._math_name(node.func, self.functions, "Call")
        if node.keywords:
            raise MathError(f"math.{name} takes no keyword arguments")
        arguments = [self.value_of(argument) for argument in node.args]
        try:
            return self.functions[name](*arguments)
        except MathError:
            raise
        except TypeError as err:  # the wrong number of arguments
            raise MathError(f"math.{name}: {err}") from err
        except ValueError as err:  # math.sqrt(-1), math.log(0): "math domain error"
            raise MathError(f"math.{name} is undefined at {', '.join(map(str, arguments))}") from err

    def _factorial(self, n: Number) -> int:
        if n < 0 or n != int(n):
            raise MathError(f"math.factorial needs a non-negative integer, got {n}")
        if n > 1 and math.lgamma(n + 1) / math.log(10) >= self.max_digits:  # log10(n!) before n! exists
            raise MathError(f"the result has more than {self.max_digits} digits")
        return math.factorial(int(n))

    def _multiply(self, a: Number, b: Number) -> Number:
        if isinstance(a, int) and isinstance(b, int) and a and b:
            self._too_big(a.bit_length() + b.bit_length() - 1)
        return a * b

    def _check_exponent(self, exponent: Number | Fraction) -> None:
        if abs(exponent) > self.max_exponent:
            raise MathError(f"the exponent {exponent} exceeds the limit of {self.max_exponent}")

    def _power(self, base: Number, exponent: Number) -> Number:
        self._check_exponent(exponent)
        if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
            self._too_big((abs(base).bit_length() - 1) * exponent + 1)
        return base**exponent


class _ExactEvaluator(_Evaluator):
    """Rational arithmetic: every value is a Fraction whose numerator and denominator stay below
    10**max_digits. Decimal literals are read from their source text, not through float."""

    def __init__(self, source: str, max_exponent: int, max_digits: int) -> None:
        super().__init__(max_exponent, max_digits)
        self.source = source

    def _checked(self, value: Number | Fraction) -> Fraction:
        if not isinstance(value, (int, Fraction)):  # a Fraction to a fractional power is a float
            raise MathError("the result is not a rational number")
        value = Fraction(value)
        if value.denominator >= self.limit:
            raise MathError(f"the denominator has more than {self.max_digits} digits")
        return super()._checked(value)

    def _constant(self, node: ast.Constant) -> Fraction:
        if type(super()._constant(node)) is int:
            return Fraction(node.value)
        literal = Decimal(ast.get_source_segment(self.source, node))  # "0.1" is 1/10, not the nearest float
        if abs(literal.adjusted()) >= self.max_digits:  # "1e999999999" would take long to expand
            raise MathError(f"the number {literal} has more than {self.max_digits} digits")
        return Fraction(literal)

    def _power(self, base: Fraction, exponent: Fraction) -> Fraction:
        if exponent.denominator != 1:
            raise MathError(f"the exponent {exponent} is not an integer; exact arithmetic needs one")
        self._check_exponent(exponent)
        size = max(abs(base.numerator), base.denominator)
        if size > 1:
            self._too_big((size.bit_length() - 1) * abs(exponent.numerator) + 1)
        return base**exponent.numerator


_PARSE_LOCK = threading.Lock()
PARSE_ERRORS = (SyntaxError, ValueError, RecursionError, MemoryError)  # what parse_expression raises on bad text


def parse_expression(text: str) -> ast.Expression:
    """`ast.parse(text, mode="eval")`, one thread at a time, without the SyntaxWarnings the parser prints on
    stderr for text like "204kg" ("invalid decimal literal") before it fails or yields a tree a whitelist
    refuses. CPython before 3.13 keeps the AST constructor's recursion depth in interpreter-wide state, so two
    threads parsing at once (the tool executor runs calls in threads) can fail with a spurious SystemError
    "AST constructor recursion depth mismatch" (python/cpython#106905); warnings' filters are process-wide too."""
    with _PARSE_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        return ast.parse(text, mode="eval")


def _source(expression: str, max_length: int) -> str:
    """The text to parse: `expression` within the length limit, with MiniMind's rewrites (REWRITES), stripped."""
    if not isinstance(expression, str):
        raise MathError("the expression must be a string")
    if len(expression) > max_length:
        raise MathError(f"the expression is {len(expression)} characters long; the limit is {max_length}")
    return expression.translate(REWRITES).strip()


def _parse(source: str, expression: str) -> ast.Expression:
    try:
        return parse_expression(source)
    except PARSE_ERRORS as err:
        raise MathError(f"not a valid arithmetic expression: {expression!r}") from err


def _walk(evaluator: _Evaluator, tree: ast.Expression) -> Number | Fraction:
    try:
        return evaluator.value_of(tree)
    except ZeroDivisionError as err:
        raise MathError("division by zero") from err
    except OverflowError as err:
        raise MathError("the result is too large") from err
    except RecursionError as err:
        raise MathError("the expression is nested too deeply") from err


def evaluate(expression: str, *, max_length: int = 200, max_exponent: int = 64, max_digits: int = 100) -> Number:
    """The value of an arithmetic expression; raises MathError for anything else."""
    source = _source(expression, max_length)
    return _walk(_Evaluator(max_exponent, max_digits), _parse(source, expression))


def evaluate_exact(
    expression: str, *, max_length: int = 200, max_exponent: int = 64, max_digits: int = 100
) -> Fraction:
    """The exact rational value of an arithmetic expression; raises MathError for anything else (a function
    whose value is not rational, such as math.sqrt(2), included)."""
    source = _source(expression, max_length)
    return _walk(_ExactEvaluator(source, max_exponent, max_digits), _parse(source, expression))


def format_number(x: Number) -> str:
    """Ints as-is; integral floats as ints, from the shortest decimal that reads back as the float (1e23 is
    100000000000000000000000, not its binary value's 99999999999999991611392); other floats rounded to 4
    decimals, trailing zeros cut."""
    if isinstance(x, int):
        return str(x)
    if x.is_integer():
        return str(int(Decimal(repr(x))))
    rounded = round(x, 4) or 0.0  # `or` turns -0.0 into 0.0
    return f"{rounded:.4f}".rstrip("0").rstrip(".")
