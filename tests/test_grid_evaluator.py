"""The grid's expression language: integer arithmetic, comparisons, max/min — and nothing else."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from opperf.grid.evaluator import ExpressionError, compile_expression, compile_shape


@pytest.mark.parametrize("text, env, expected", [
    ("m + k * 2", {"m": 3, "k": 5}, 13),
    ("(m + k) * 2", {"m": 3, "k": 5}, 16),
    ("n // 16 - 1", {"n": 100}, 5),
    ("n % 16", {"n": 100}, 4),
    ("-n + 1", {"n": 4}, -3),
    ("max(1, n // 64)", {"n": 32}, 1),
    ("min(a, b, c)", {"a": 7, "b": 3, "c": 5}, 3),
    ("1 <= t <= max_tokens", {"t": 4, "max_tokens": 4}, True),
    ("1 < t < 4", {"t": 4}, False),
    ("t % 8 != 0 and not t == 3", {"t": 5}, True),
    ("t == 3 or h > 10", {"t": 1, "h": 11}, True),
])
def test_expressions_evaluate_like_integer_arithmetic(text, env, expected):
    assert compile_expression(text).evaluate(env) == expected


def test_names_are_collected_at_compile_time():
    assert compile_expression("max(m, k // block) + m").names == frozenset({"m", "k", "block"})


@pytest.mark.parametrize("text, reason", [
    ("m / 2", "operator '/' is not allowed"),
    ("m ** 2", "operator '**' is not allowed"),
    ("m << 2", "operator '<<' is not allowed"),
    ("abs(m)", "call of 'abs' is not allowed"),
    ("__import__('os').system('true')", "is not allowed"),
    ("m.bit_length()", "is not allowed"),
    ("[m][0]", "is not allowed"),
    ("'m'", "only integer constants"),
    ("1.5 * m", "only integer constants"),
    ("lambda: 1", "Lambda is not allowed"),
    ("max(m)", "two or more positional arguments"),
    ("max(m, key=k)", "two or more positional arguments"),
    ("m +", "cannot parse"),
    ("x if m else y", "IfExp is not allowed"),
])
def test_anything_outside_the_language_is_rejected(text, reason):
    with pytest.raises(ExpressionError, match=reason.replace("(", r"\(").replace("*", r"\*")):
        compile_expression(text)


def test_unknown_name_and_division_by_zero_say_what_went_wrong():
    with pytest.raises(ExpressionError, match="unknown name 'q'"):
        compile_expression("m + q").evaluate({"m": 1})
    with pytest.raises(ExpressionError, match=r"division by zero in 'm // k' \(k=0, m=4\)"):
        compile_expression("m // k").evaluate({"m": 4, "k": 0})


@pytest.mark.parametrize("text, expected", [
    ("m, k", (4, 8)), ("(m, k)", (4, 8)), ("(n,)", (16,)), ("n", (16,)), ("m * 2, max(k, 16)", (8, 16)),
    ("", None), ("()", None), (None, None),
])
def test_shapes_are_tuples_of_dimension_expressions_or_an_empty_slot(text, expected):
    assert compile_shape(text).evaluate({"m": 4, "k": 8, "n": 16}) == expected


@given(a=st.integers(-10**6, 10**6), b=st.integers(1, 10**4), c=st.integers(-100, 100))
def test_agrees_with_python_integer_semantics(a, b, c):
    text = "max(a, c) * 3 - a // b + a % b - min(b, c)"
    assert compile_expression(text).evaluate({"a": a, "b": b, "c": c}) == \
        max(a, c) * 3 - a // b + a % b - min(b, c)
