NUM_GPUS = 0

import pytest

from dynarl.components.tools.calculator import calculate


@pytest.mark.parametrize("expression, expected", [
    pytest.param("1 + 2 * 3", "7", id="precedence"),
    pytest.param("(1 + 2) * 3", "9", id="parentheses"),
    pytest.param("7 / 2", "3.5", id="true_division"),
    pytest.param("7 // 2", "3", id="floor_division"),
    pytest.param("-7 % 3", "2", id="modulo"),
    pytest.param("2 ** 10", "1024", id="power"),
    pytest.param("-(-3)", "3", id="unary"),
    pytest.param("0.1 + 0.2", "0.30000000000000004", id="float"),
    pytest.param("sqrt(16) + abs(-2)", "6", id="functions"),
    pytest.param("round(pi, 3)", "3.142", id="constant"),
    pytest.param("max(1, 5, 3) - min(4, 2)", "3", id="min_max"),
    pytest.param("2 ** 100", str(2 ** 100), id="exact_big_int"),
    pytest.param("1_000 * 3", "3000", id="underscore_literal"),
    pytest.param("-" * 500 + "1", "1", id="deep_unary"),
])
def test_arithmetic_is_evaluated(expression, expected):
    result = calculate(expression)
    assert result.ok, result.error
    assert result.stdout == expected


@pytest.mark.parametrize("expression, error", [
    pytest.param("__import__('os')", "not arithmetic: calling __import__() is not allowed", id="import"),
    pytest.param("__import__('os').system('true')", "not arithmetic: calling a function is not allowed", id="method"),
    pytest.param("open('/etc/passwd')", "not arithmetic: calling open() is not allowed", id="open"),
    pytest.param("x + 1", "not arithmetic: the name 'x' is not allowed", id="name"),
    pytest.param("(1).__class__", "not arithmetic: Attribute is not allowed", id="attribute"),
    pytest.param("'a' * 3", "not arithmetic: str literal 'a'", id="string"),
    pytest.param("True + 1", "not arithmetic: bool literal True", id="bool"),
    pytest.param("1j * 2", "not arithmetic: complex literal 1j", id="complex"),
    pytest.param("[1, 2]", "not arithmetic: List is not allowed", id="list"),
    pytest.param("[x for x in ()]", "not arithmetic: ListComp is not allowed", id="comprehension"),
    pytest.param("lambda: 1", "not arithmetic: Lambda is not allowed", id="lambda"),
    pytest.param("1 << 4", "not arithmetic: the operator LShift is not allowed", id="shift"),
    pytest.param("1 if 2 else 3", "not arithmetic: IfExp is not allowed", id="conditional"),
    pytest.param("x = 1", "not an arithmetic expression: invalid syntax", id="statement"),
    pytest.param("round(1.5, ndigits=1)", "not arithmetic: round() takes plain arguments only", id="keyword"),
    pytest.param("1 / 0", "division by zero", id="zero_division"),
    pytest.param("9 ** 9 ** 9", "number too large", id="huge_power"),
    pytest.param("10.0 ** 400", "number too large", id="float_overflow"),
    pytest.param("exp(1000)", "number too large", id="exp_overflow"),
    pytest.param("1e308 * 10", "number too large", id="infinity"),
    pytest.param("sqrt(-1)", "math error: math domain error", id="domain"),
    pytest.param("(-8) ** (1 / 3)", "math error: the result is a complex number", id="complex_result"),
    pytest.param("1 +" * 400 + "1", "expression longer than 1000 characters", id="too_long"),
    pytest.param("(" * 300 + "1" + ")" * 300, "too many nested parentheses", id="deep_parentheses"),
])
def test_non_arithmetic_input_is_rejected(expression, error):
    result = calculate(expression)
    assert not result.ok
    assert error in result.error
    assert result.stdout == ""


@pytest.mark.parametrize("request_, error", [
    pytest.param(42, "malformed request: expression must be a string, got int", id="not_a_string"),
    pytest.param("   ", "malformed request: expression is empty", id="empty"),
])
def test_malformed_requests_are_rejected(request_, error):
    result = calculate(request_)
    assert (result.ok, result.error, result.rejected) == (False, error, True)
