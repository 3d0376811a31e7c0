"""The calculator tool: arithmetic on numbers, evaluated by walking the `ast`.

Only number literals, + - * / // % **, unary signs, parentheses, the constants
pi and e, and a short list of math functions are accepted; anything else (names,
attributes, strings, calls of other functions, comprehensions) is rejected before
any evaluation, so no code of the model's ever runs. Sizes are bounded before
they are computed: 9**9**9 is refused, not attempted.
"""
from __future__ import annotations

import ast
import math
import operator
from typing import Any

from dynarl.components.tools.outcome import ToolResult, reject

MAX_EXPRESSION_CHARS = 1000
MAX_INT_BITS = 10_000
"""About 3000 decimal digits: big enough for exact arithmetic, small enough to print."""

BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
          ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
CONSTANTS = {"pi": math.pi, "e": math.e, "tau": math.tau}
FUNCTIONS = {"abs": abs, "round": round, "min": min, "max": max, "sqrt": math.sqrt, "exp": math.exp,
             "log": math.log, "log2": math.log2, "log10": math.log10, "sin": math.sin, "cos": math.cos,
             "tan": math.tan, "asin": math.asin, "acos": math.acos, "atan": math.atan,
             "floor": math.floor, "ceil": math.ceil}


class CalculatorError(ValueError):
    """The text the model reads when an expression is refused or fails."""


def calculate(expression: Any) -> ToolResult:
    if not isinstance(expression, str):
        return reject(f"expression must be a string, got {type(expression).__name__}")
    if not expression.strip():
        return reject("expression is empty")
    try:
        value = evaluate(expression)
    except CalculatorError as exc:
        return ToolResult(ok=False, stdout="", error=str(exc))
    return ToolResult(ok=True, stdout=format_number(value))


def evaluate(expression: str) -> int | float:
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"not an arithmetic expression: {exc.msg}") from None
    except (RecursionError, MemoryError, ValueError):
        raise CalculatorError("not an arithmetic expression: too deeply nested or malformed") from None
    try:
        value = _eval(tree.body)
    except CalculatorError:
        raise
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except OverflowError:
        raise CalculatorError("number too large") from None
    except RecursionError:
        raise CalculatorError("expression too deeply nested") from None
    except (ValueError, TypeError) as exc:
        raise CalculatorError(f"math error: {exc}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("number too large")
    return value


def format_number(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return repr(value)


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant):
        if type(node.value) in (int, float):  # not bool, str, complex, bytes, None
            return node.value
        raise CalculatorError(f"not arithmetic: {type(node.value).__name__} literal {node.value!r}")
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        left, right = _eval(node.left), _eval(node.right)
        _check_size(node.op, left, right)
        return _bounded(BINARY[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
        return UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Name) and node.id in CONSTANTS:
        return CONSTANTS[node.id]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS:
        if node.keywords or any(isinstance(arg, ast.Starred) for arg in node.args):
            raise CalculatorError(f"not arithmetic: {node.func.id}() takes plain arguments only")
        return _bounded(FUNCTIONS[node.func.id](*(_eval(arg) for arg in node.args)))
    raise CalculatorError(f"not arithmetic: {_describe(node)} is not allowed")


def _check_size(op: ast.operator, left: int | float, right: int | float) -> None:
    # Exact integers grow without bound; refuse before computing, not after.
    if not (isinstance(left, int) and isinstance(right, int)):
        return
    if isinstance(op, ast.Pow) and right > 0 and abs(left) > 1 and left.bit_length() * right > MAX_INT_BITS:
        raise OverflowError
    if isinstance(op, ast.Mult) and left.bit_length() + right.bit_length() > MAX_INT_BITS + 1:
        raise OverflowError


def _bounded(value: Any) -> int | float:
    if isinstance(value, complex):  # (-8) ** (1/3)
        raise CalculatorError("math error: the result is a complex number")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise OverflowError
    return value


def _describe(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return f"the name {node.id!r}"
    if isinstance(node, ast.Call):
        return "calling " + (f"{node.func.id}()" if isinstance(node.func, ast.Name) else "a function")
    if isinstance(node, (ast.BinOp, ast.UnaryOp)):
        return f"the operator {type(node.op).__name__}"
    return f"{type(node).__name__}"
