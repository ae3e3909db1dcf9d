"""The safe expression language of `config/grid.yaml`: integer arithmetic over named values, never `eval`.

Shape and constraint strings (`"m, k"`, `"max(1, n // 16)"`, `"m * k <= 268435456"`) are parsed with
`ast` and compiled into closures over a whitelist of node types:

- integers (and `True`/`False`), names bound by iterators and constants;
- `+ - * // %`, unary `-`, comparisons (`== != < <= > >=`, chained), `and`, `or`, `not`;
- calls of `max(...)` and `min(...)` only.

Anything else (attributes, subscripts, `/`, `**`, strings, lambdas, other calls) is rejected when the
pattern is loaded (ExpressionError, which the config loader turns into an OpperfError naming the pattern
and field), so a bad pattern fails before any row is generated.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass


Environment = Mapping[str, int]
_Compiled = Callable[[Environment], int]

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge}
_FUNCTIONS = {"max": max, "min": min}
_SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Mod: "%", ast.Div: "/",
            ast.Pow: "**", ast.LShift: "<<", ast.RShift: ">>", ast.BitAnd: "&", ast.BitOr: "|",
            ast.BitXor: "^", ast.MatMult: "@"}


class ExpressionError(ValueError):
    """A problem with one expression; the caller adds which pattern and field it came from."""


@dataclass(frozen=True)
class Expression:
    """One compiled integer/boolean expression with the names it reads."""

    text: str
    names: frozenset[str]
    _function: _Compiled

    def evaluate(self, env: Environment) -> int:
        try:
            return self._function(env)
        except ZeroDivisionError:
            values = ", ".join(f"{n}={env[n]}" for n in sorted(self.names) if n in env)
            raise ExpressionError(f"division by zero in {self.text!r} ({values})") from None


@dataclass(frozen=True)
class ShapeExpression:
    """A tensor slot: a tuple of dimension expressions, or None for an empty slot."""

    text: str
    dims: tuple[Expression, ...] | None

    @property
    def names(self) -> frozenset[str]:
        return frozenset().union(*(d.names for d in self.dims)) if self.dims else frozenset()

    def evaluate(self, env: Environment) -> tuple[int, ...] | None:
        if self.dims is None:
            return None
        return tuple(d.evaluate(env) for d in self.dims)


def compile_expression(text: object) -> Expression:
    """Compile one expression (`"max(1, n // 16)"`); raises ExpressionError on anything outside the language."""
    source = _as_source(text)
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"cannot parse {source!r}: {exc.msg}") from None
    names: set[str] = set()
    function = _compile(tree.body, source, names)
    return Expression(source, frozenset(names), function)


def compile_shape(text: object) -> ShapeExpression:
    """Compile one shape slot: `"m, k"` or `"(m, k)"` or `"(n,)"` → dims; `""`/None → an empty slot."""
    if text is None:
        return ShapeExpression("", None)
    source = _as_source(text)
    if source.strip() in ("", "()"):
        return ShapeExpression(source, None)
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"cannot parse shape {source!r}: {exc.msg}") from None
    elements = tree.body.elts if isinstance(tree.body, ast.Tuple) else [tree.body]
    dims = []
    for element in elements:
        names: set[str] = set()
        function = _compile(element, source, names)
        dims.append(Expression(ast.get_source_segment(source, element) or source, frozenset(names), function))
    return ShapeExpression(source, tuple(dims))


def _as_source(text: object) -> str:
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise ExpressionError(f"expected an expression string, got {type(text).__name__} {text!r}")
    return str(text)


def _compile(node: ast.AST, source: str, names: set[str]) -> _Compiled:
    """Turn one whitelisted ast node into a closure; everything not listed here is an error."""
    if isinstance(node, ast.Constant):
        value = node.value
        if not isinstance(value, int):      # bool is an int: True/False are allowed in constraints
            raise ExpressionError(f"only integer constants are allowed, got {value!r} in {source!r}")
        return lambda env: value
    if isinstance(node, ast.Name):
        name = node.id
        names.add(name)

        def lookup(env: Environment) -> int:
            try:
                return env[name]
            except KeyError:
                raise ExpressionError(f"unknown name {name!r} in {source!r} "
                                      f"(known: {', '.join(sorted(env)) or 'none'})") from None
        return lookup
    if isinstance(node, ast.BinOp):
        function = _BINARY.get(type(node.op))
        if function is None:
            raise ExpressionError(f"operator {_SYMBOLS.get(type(node.op), type(node.op).__name__)!r} is not "
                                  f"allowed in {source!r} (allowed: + - * // % max min)")
        left, right = _compile(node.left, source, names), _compile(node.right, source, names)
        return lambda env: function(left(env), right(env))
    if isinstance(node, ast.UnaryOp):
        operand = _compile(node.operand, source, names)
        if isinstance(node.op, ast.USub):
            return lambda env: -operand(env)
        if isinstance(node.op, ast.UAdd):
            return operand
        if isinstance(node.op, ast.Not):
            return lambda env: not operand(env)
        raise ExpressionError(f"unary operator {type(node.op).__name__} is not allowed in {source!r}")
    if isinstance(node, ast.BoolOp):
        operands = [_compile(v, source, names) for v in node.values]
        if isinstance(node.op, ast.And):
            return lambda env: all(o(env) for o in operands)
        return lambda env: any(o(env) for o in operands)
    if isinstance(node, ast.Compare):
        first = _compile(node.left, source, names)
        steps = []
        for op, comparator in zip(node.ops, node.comparators):
            function = _COMPARE.get(type(op))
            if function is None:
                raise ExpressionError(f"comparison {type(op).__name__} is not allowed in {source!r}")
            steps.append((function, _compile(comparator, source, names)))

        def compare(env: Environment) -> bool:
            left = first(env)
            for function, right_of in steps:
                right = right_of(env)
                if not function(left, right):
                    return False
                left = right
            return True
        return compare
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCTIONS:
            called = node.func.id if isinstance(node.func, ast.Name) else ast.dump(node.func)
            raise ExpressionError(f"call of {called!r} is not allowed in {source!r} (allowed: max, min)")
        if node.keywords or len(node.args) < 2:
            raise ExpressionError(f"{node.func.id}() takes two or more positional arguments in {source!r}")
        function = _FUNCTIONS[node.func.id]
        arguments = [_compile(a, source, names) for a in node.args]
        return lambda env: function(a(env) for a in arguments)
    raise ExpressionError(f"{type(node).__name__} is not allowed in {source!r} "
                          "(allowed: integers, names, + - * // %, comparisons, and/or/not, max, min)")
