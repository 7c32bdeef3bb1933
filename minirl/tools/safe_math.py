"""Bounded arithmetic on model-written expressions, without eval.

The expression is parsed with `ast.parse(mode="eval")` and walked over a whitelist: int/float
literals, + - * / // % **, unary + -, parentheses. Names, calls, attributes, subscripts,
strings and everything else are rejected. Sizes are bounded: the expression length, the
exponent, and the magnitude of every intermediate value (checked from bit lengths before a
big product or power is computed).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

Number = int | float


class MathError(ValueError):
    """The expression is not allowed, too big, or undefined (e.g. division by zero)."""


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

    def _multiply(self, a: Number, b: Number) -> Number:
        if isinstance(a, int) and isinstance(b, int) and a and b:
            self._too_big(a.bit_length() + b.bit_length() - 1)
        return a * b

    def _power(self, base: Number, exponent: Number) -> Number:
        if abs(exponent) > self.max_exponent:
            raise MathError(f"the exponent {exponent} exceeds the limit of {self.max_exponent}")
        if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
            self._too_big((abs(base).bit_length() - 1) * exponent + 1)
        return base**exponent


def evaluate(expression: str, *, max_length: int = 200, max_exponent: int = 64, max_digits: int = 100) -> Number:
    """The value of an arithmetic expression; raises MathError for anything else."""
    if not isinstance(expression, str):
        raise MathError("the expression must be a string")
    if len(expression) > max_length:
        raise MathError(f"the expression is {len(expression)} characters long; the limit is {max_length}")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        raise MathError(f"not a valid arithmetic expression: {expression!r}") from err
    try:
        return _Evaluator(max_exponent, max_digits).value_of(tree)
    except ZeroDivisionError as err:
        raise MathError("division by zero") from err
    except OverflowError as err:
        raise MathError("the result is too large") from err
    except RecursionError as err:
        raise MathError("the expression is nested too deeply") from err


def format_number(x: Number) -> str:
    """Ints as-is; integral floats as ints; other floats rounded to 4 decimals, trailing zeros cut."""
    if isinstance(x, int) or x.is_integer():
        return str(int(x))
    rounded = round(x, 4) or 0.0  # `or` turns -0.0 into 0.0
    return f"{rounded:.4f}".rstrip("0").rstrip(".")
