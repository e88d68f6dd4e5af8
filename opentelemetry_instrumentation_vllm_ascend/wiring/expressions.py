"""The expression language of hook files (``expr:`` and label expressions): a small, allow-listed subset of Python
expressions, parsed and checked once, at load, into a code object that can only read values and call a fixed set of
pure functions.

Allowed: the target's parameters by name, ``self``, ``result`` (what the call returned; ``ret``, ms-service-metric's
name for it, reads the same), ``duration`` (seconds the call took); attribute access (never a dunder name, never
frame/code introspection), subscripts and slices, literals (numbers, strings, bytes, True/False/None, tuples,
lists), arithmetic (``+ - * / // %``, ``**`` with a small literal exponent), unary ``- + not ~``, comparisons
(``in`` and ``is`` included), ``and`` / ``or``, ``x if c else y``, and calls of ``len min max sum abs int float
round`` and of the functions ms-service-metric's expressions allow (``str pow sqrt log exp sin cos tan ceil floor``,
also as ``math.sqrt(…)``; ``pow``'s exponent bounded as ``**``'s), with positional and keyword arguments (``ndigits
base default mod exp encoding errors``; never ``key``, which would call what it names). Anything else — other names
or calls, lambdas, comprehensions, f-strings, walrus, ``*args`` / ``**kwargs``, shifts, a sequence literal
multiplied — is rejected at load with its position. Bounded: at most ``MAX_LENGTH`` characters and ``MAX_DEPTH``
levels of nesting.

Safety rests on what can be written, not on sandboxing eval: the code object is built from a tree in which every
node passed the allow-list, and evaluated with no builtins; the only callables it can reach are the functions below.
Attribute access and subscripts do run the objects' own code (properties, ``__getitem__``) — vLLM's code, as the
hooked function itself does."""

from __future__ import annotations

import ast
import math

MAX_LENGTH = 1000
MAX_DEPTH = 24
#: Largest literal exponent of ``**`` (and largest magnitude of its base literal: none).
MAX_EXPONENT = 64


def _pow(base, exp, mod=None):
    """``pow`` with ``**``'s bound on the exponent (a three-argument pow is cheap whatever its exponent)."""
    if mod is None and abs(exp) > MAX_EXPONENT:
        raise ValueError(f"pow: exponent above {MAX_EXPONENT}")
    return pow(base, exp, mod)


#: The functions an expression may call: ours, then those ms-service-metric's expressions allow besides.
FUNCTIONS = {
    "len": len,
    "min": min,
    "max": max,
    "sum": sum,
    "abs": abs,
    "int": int,
    "float": float,
    "round": round,
    "str": str,
    "pow": _pow,
    "sqrt": math.sqrt,
    "log": math.log,
    "exp": math.exp,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "ceil": math.ceil,
    "floor": math.floor,
}
#: Keyword arguments a call may pass (``key`` never: min/max would call the object it names).
KEYWORDS = frozenset({"ndigits", "base", "default", "mod", "exp", "encoding", "errors"})
#: Names every hook's expressions can read besides its parameters.
SPECIAL = ("self", "result", "duration")
#: ms-service-metric's name of the result: an expression that reads it reads ``result``.
RESULT_ALIAS = "ret"
#: Attribute names refused besides dunders: the ways from an object to frames, code and globals.
FORBIDDEN_ATTRIBUTES = frozenset(
    {
        "gi_frame",
        "gi_code",
        "gi_yieldfrom",
        "cr_frame",
        "cr_code",
        "cr_await",
        "ag_frame",
        "ag_code",
        "ag_await",
        "f_globals",
        "f_locals",
        "f_builtins",
        "f_back",
        "f_code",
        "tb_frame",
        "tb_next",
        "func_globals",
        "func_code",
        "mro",
        "format",
        "format_map",
    }
)

_BINOPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)
_UNARY = (ast.Not, ast.USub, ast.UAdd, ast.Invert)
_COMPARE = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.Is, ast.IsNot)
_SEQUENCES = (ast.List, ast.Tuple)


class ExpressionError(ValueError):
    """An expression that is not in the language: the message says what and where (column)."""


class Expression:
    """A checked expression: ``names`` it reads (parameters / special names), ``evaluate(values)``
    with a dict holding at least those names. ``evaluate`` raises whatever the evaluation raises."""

    __slots__ = ("source", "names", "_code")

    def __init__(self, source: str, names: tuple[str, ...], code) -> None:
        self.source = source
        self.names = names
        self._code = code

    def evaluate(self, values: dict, _functions=FUNCTIONS):
        return eval(self._code, {"__builtins__": {}}, {**_functions, **values})  # noqa: S307 (checked tree)

    def __repr__(self) -> str:
        return f"Expression({self.source!r})"

    # Equal by source (the code is a function of it): a reloaded file's unchanged entry is the same entry.
    def __eq__(self, other) -> bool:
        return isinstance(other, Expression) and other.source == self.source

    def __hash__(self) -> int:
        return hash(self.source)


def compile_expression(source, parameters=()) -> Expression:
    """Parse and check ``source``; ``parameters``: the target's parameter names (None: any name is
    accepted as a parameter, for checking a file without importing the target)."""
    if not isinstance(source, str):
        raise ExpressionError(f"an expression must be a string, not {type(source).__name__}")
    if not source.strip():
        raise ExpressionError("empty expression at column 1")
    if len(source) > MAX_LENGTH:
        raise ExpressionError(f"too long at column {MAX_LENGTH + 1} (at most {MAX_LENGTH} characters)")
    too_deep = _too_deep(source)
    if too_deep is not None:
        raise ExpressionError(f"nested deeper than {MAX_DEPTH} levels at column {too_deep}")
    text = source.strip()
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        # A SyntaxError's offset is 1-based; 0 or None: the input ended too early.
        column = (exc.offset or len(text) + 1) if isinstance(exc, SyntaxError) else 1
        raise ExpressionError(f"not an expression at column {column}: {getattr(exc, 'msg', exc)}") from None
    allowed = None if parameters is None else set(parameters) | set(SPECIAL)
    names: list[str] = []
    tree = _IncumbentForms().visit(tree)
    _check(tree.body, allowed, names, 1)
    code = compile(ast.fix_missing_locations(tree), "<hook expression>", "eval")
    return Expression(source, tuple(dict.fromkeys(names)), code)


class _IncumbentForms(ast.NodeTransformer):
    """ms-service-metric's spellings, made ours before the check: ``ret`` is ``result``, ``math.f(…)`` is ``f(…)``
    for an allowed ``f`` (its evaluator calls a method by its attribute name alone)."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id == RESULT_ALIAS:
            return ast.copy_location(ast.Name("result", node.ctx), node)
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "math"
            and func.attr in FUNCTIONS
        ):
            node.func = ast.copy_location(ast.Name(func.attr, ast.Load()), func)
        return node


def _too_deep(source: str) -> int | None:
    """The column of the first bracket nested deeper than ``MAX_DEPTH``, or None."""
    depth = 0
    for column, char in enumerate(source, 1):
        if char in "([{":
            depth += 1
            if depth > MAX_DEPTH:
                return column
        elif char in ")]}":
            depth -= 1
    return None


def _fail(node, what: str):
    raise ExpressionError(f"{what} at column {getattr(node, 'col_offset', 0) + 1}")


def _check(node, allowed, names: list, depth: int) -> None:
    if depth > MAX_DEPTH:
        _fail(node, f"nested deeper than {MAX_DEPTH} levels")
    below = depth + 1
    if isinstance(node, ast.Constant):
        if not isinstance(node.value, (int, float, str, bytes, bool, type(None))):
            _fail(node, f"literal {node.value!r} not allowed")
        return
    if isinstance(node, ast.Name):
        if node.id in FUNCTIONS:
            _fail(node, f"function {node.id!r} may only be called")
        if node.id.startswith("__") or (allowed is not None and node.id not in allowed):
            _fail(node, f"unknown name {node.id!r} (allowed: the target's parameters, {', '.join(SPECIAL)})")
        names.append(node.id)
        return
    if isinstance(node, ast.Attribute):
        if node.attr.startswith("__") or node.attr.endswith("__") or node.attr in FORBIDDEN_ATTRIBUTES:
            _fail(node, f"attribute {node.attr!r} not allowed")
        _check(node.value, allowed, names, below)
        return
    if isinstance(node, ast.Subscript):
        _check(node.value, allowed, names, below)
        _check(node.slice, allowed, names, below)
        return
    if isinstance(node, ast.Slice):
        for part in (node.lower, node.upper, node.step):
            if part is not None:
                _check(part, allowed, names, below)
        return
    if isinstance(node, _SEQUENCES):
        if len(node.elts) > 64:
            _fail(node, "literal with more than 64 items")
        for element in node.elts:
            if isinstance(element, ast.Starred):
                _fail(element, "starred expression not allowed")
            _check(element, allowed, names, below)
        return
    if isinstance(node, ast.BinOp):
        if not isinstance(node.op, _BINOPS):
            _fail(node, f"operator {type(node.op).__name__} not allowed")
        if isinstance(node.op, ast.Pow):
            exponent = node.right
            if not (
                isinstance(exponent, ast.Constant)
                and isinstance(exponent.value, (int, float))
                and not isinstance(exponent.value, bool)
                and abs(exponent.value) <= MAX_EXPONENT
            ):
                _fail(node, f"'**' needs a literal exponent of at most {MAX_EXPONENT}")
            if any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow) for n in ast.walk(node.left)):
                _fail(node, "a power of a power is not allowed")
        if isinstance(node.op, ast.Mult) and (_is_sequence_literal(node.left) or _is_sequence_literal(node.right)):
            _fail(node, "a string or sequence literal may not be multiplied")
        _check(node.left, allowed, names, below)
        _check(node.right, allowed, names, below)
        return
    if isinstance(node, ast.UnaryOp):
        if not isinstance(node.op, _UNARY):
            _fail(node, f"operator {type(node.op).__name__} not allowed")
        _check(node.operand, allowed, names, below)
        return
    if isinstance(node, ast.BoolOp):
        for value in node.values:
            _check(value, allowed, names, below)
        return
    if isinstance(node, ast.Compare):
        for op in node.ops:
            if not isinstance(op, _COMPARE):
                _fail(node, f"comparison {type(op).__name__} not allowed")
        _check(node.left, allowed, names, below)
        for comparator in node.comparators:
            _check(comparator, allowed, names, below)
        return
    if isinstance(node, ast.IfExp):
        for part in (node.test, node.body, node.orelse):
            _check(part, allowed, names, below)
        return
    if isinstance(node, ast.Call):
        if not (isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS):
            what = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
            _fail(node, f"call of {what!r} not allowed (allowed: {', '.join(FUNCTIONS)})")
        for keyword in node.keywords:
            if keyword.arg is None:
                _fail(keyword.value, "**arguments not allowed")
            if keyword.arg not in KEYWORDS:
                _fail(keyword.value, f"keyword {keyword.arg!r} not allowed (allowed: {', '.join(sorted(KEYWORDS))})")
            _check(keyword.value, allowed, names, below)
        for argument in node.args:
            if isinstance(argument, ast.Starred):
                _fail(argument, "starred arguments not allowed")
            _check(argument, allowed, names, below)
        return
    _fail(node, f"{type(node).__name__} not allowed")


def _is_sequence_literal(node) -> bool:
    return isinstance(node, _SEQUENCES) or (isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)))
