"""The "no room" shape without a wrapper frame: a copy of the target whose own ``return`` statements
tell the handler when they return None.

A hook that only cares whether a call returned None (``Handler.after_only_on_none``, with no
``before`` and no arguments read) is called on a per-request path: vLLM's
``KVCacheManager.allocate_slots`` runs once per running request per engine step. A wrapper there costs
a second Python frame that binds and passes on the target's twelve parameters on every call — on the
real Scheduler at batch 256 that frame was most of what the default set added to the EngineCore's
critical path (benchmarks/real_scheduler.py). Here the target's function is recompiled from its own
source with each ``return`` rewritten:

- ``return`` / ``return None`` → ``return _otel_on_none()``;
- ``return X`` → ``return _otel_v if (_otel_v := X) is not None else _otel_on_none()`` (``X`` is
  evaluated once; a successful call pays a local store and an identity test, no call);
- falling off the end → ``return _otel_on_none()``;
- the body sits in ``try: … except BaseException: _otel_on_error(); raise`` (free in CPython 3.11+
  until something raises; the exception reaches the caller unchanged, with its traceback).

``_otel_on_none`` / ``_otel_on_error`` read the hook's handler (None once removed under someone
else's wrapper, or switched off at runtime) and call ``after`` / ``error`` as the generated wrapper
would, a failing handler reported once. The copy runs in the original module's globals, with the
original's defaults, keyword defaults and annotations (the very same objects) and its file name and
line numbers: tracebacks show the real source lines.

Anything that cannot be copied exactly is refused (``None``: the caller builds the ordinary
wrapper): no source, a closure or ``super()`` (free variables), decorators, a generator or coroutine,
a source whose function is not the one running (edited file), a name clash with ``_otel_``."""

from __future__ import annotations

import ast
import copy
import inspect
import sys
import textwrap
import types

from .handler import Hook, report

_ON_NONE = "_otel_on_none"
_ON_ERROR = "_otel_on_error"
_VALUE = "_otel_v"
_FACTORY = "_otel_vllm_ascend_copy"
# CO_GENERATOR | CO_COROUTINE | CO_ITERABLE_COROUTINE | CO_ASYNC_GENERATOR
_NOT_PLAIN = 0x20 | 0x80 | 0x100 | 0x200


class _Returns(ast.NodeTransformer):
    """Rewrites the ``return`` statements of one function body, not those of nested scopes."""

    def visit_FunctionDef(self, node):  # nested def: its returns are its own
        return node

    visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = visit_FunctionDef

    def visit_Return(self, node):
        on_none = ast.Call(func=ast.Name(_ON_NONE, ast.Load()), args=[], keywords=[])
        value = node.value
        if value is None or (isinstance(value, ast.Constant) and value.value is None):
            new = ast.Return(value=on_none)
        else:
            walrus = ast.NamedExpr(target=ast.Name(_VALUE, ast.Store()), value=value)
            test = ast.Compare(left=walrus, ops=[ast.IsNot()], comparators=[ast.Constant(None)])
            new = ast.Return(value=ast.IfExp(test=test, body=ast.Name(_VALUE, ast.Load()), orelse=on_none))
        return ast.copy_location(new, node)


def refusal(node: ast.AST) -> str | None:
    """Why the function defined by ``node`` (its source's AST) cannot be copied, or None. The contract
    tests ask this of ``KVCacheManager.allocate_slots`` in every supported vLLM's source."""
    if not isinstance(node, ast.FunctionDef):
        return "not a plain function"
    if node.decorator_list:
        return "decorated"
    own = list(_own_nodes(node))
    if any(isinstance(n, (ast.Yield, ast.YieldFrom, ast.Await)) for n in own):
        return "a generator"
    names = [n.id for n in ast.walk(node) if isinstance(n, ast.Name)]
    names += [a.arg for a in ast.walk(node) if isinstance(a, ast.arg)]
    if any(name.startswith("_otel_") for name in names):
        return "a name of ours"
    if any(name in ("super", "__class__") for name in names):
        return "super() or __class__ (a closure cell)"
    return None


def _own_nodes(node):
    """The nodes of a function's own body, not those of the scopes nested in it."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        yield child
        yield from _own_nodes(child)


def _source_function(original) -> ast.FunctionDef | None:
    code = original.__code__
    try:
        lines, first = inspect.getsourcelines(original)
    except (OSError, TypeError):
        return None
    if first != code.co_firstlineno:
        return None
    source = "".join(lines)
    indent = len(lines[0]) - len(lines[0].lstrip())
    tree = ast.parse(textwrap.dedent(source))
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef):
        return None
    node = tree.body[0]
    if node.name != code.co_name or refusal(node) is not None:
        return None
    ast.increment_lineno(tree, code.co_firstlineno - 1)
    if indent:  # columns as in the file (a traceback's carets point into the file's lines)
        for part in ast.walk(tree):
            if isinstance(part, (ast.stmt, ast.expr, ast.arg, ast.keyword, ast.excepthandler)):
                part.col_offset += indent
                if part.end_col_offset is not None:
                    part.end_col_offset += indent
    return node


def none_returns(original, hook: Hook):
    """A copy of ``original`` that tells ``hook``'s handler of every call that returned None
    (``after(None, (), None, None)``) or raised (``error(None, (), None, exc)``), or None where that
    copy cannot be made exactly."""
    code = getattr(original, "__code__", None)
    if not isinstance(original, types.FunctionType) or code is None or code.co_freevars or code.co_flags & _NOT_PLAIN:
        return None
    try:
        node = _source_function(original)
    except (SyntaxError, ValueError, RecursionError):
        return None
    if node is None or not _is_running(node, code):
        return None
    # Defaults, keyword defaults and annotations are the original's own objects (set below), not
    # evaluated again: the copy's are placeholders.
    args = node.args
    args.defaults = [ast.Constant(None) for _ in args.defaults]
    args.kw_defaults = [None if d is None else ast.Constant(None) for d in args.kw_defaults]
    for arg in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
        if arg is not None:
            arg.annotation = None
    node.returns = None
    body = _Returns().generic_visit(node).body  # type: ignore[attr-defined]
    end = node.end_lineno or node.lineno
    tail = ast.Return(value=ast.Call(func=ast.Name(_ON_NONE, ast.Load()), args=[], keywords=[]))
    handler = ast.ExceptHandler(
        type=ast.Name("BaseException", ast.Load()),
        name=None,
        body=[
            ast.Expr(value=ast.Call(func=ast.Name(_ON_ERROR, ast.Load()), args=[], keywords=[])),
            ast.Raise(exc=None, cause=None),
        ],
    )
    for part in (tail, handler):
        ast.copy_location(part, node)
        part.lineno = part.end_lineno = end
    node.body = [ast.Try(body=body + [tail], handlers=[handler], orelse=[], finalbody=[])]
    ast.copy_location(node.body[0], body[0])
    factory_code = _factory(node, code.co_filename)
    if factory_code is None:
        return None
    copied = types.FunctionType(factory_code, original.__globals__)(*_callbacks(hook))
    params = code.co_argcount + code.co_kwonlyargcount
    if (
        set(copied.__code__.co_freevars) - {_ON_NONE, _ON_ERROR}
        or copied.__code__.co_argcount != code.co_argcount
        or copied.__code__.co_varnames[:params] != code.co_varnames[:params]
    ):
        return None
    copied.__defaults__ = original.__defaults__
    copied.__kwdefaults__ = original.__kwdefaults__
    copied.__annotations__ = original.__annotations__
    try:
        copied.__code__ = copied.__code__.replace(co_qualname=code.co_qualname)  # 3.11+
    except TypeError:
        pass
    return copied


def _factory(node: ast.FunctionDef, filename: str) -> types.CodeType | None:
    """The code of ``def _otel_vllm_ascend_copy(_otel_on_none, _otel_on_error): <node>; return <node's
    name>``, compiled for ``filename`` (``node`` keeps its own line numbers)."""
    factory = ast.FunctionDef(
        name=_FACTORY,
        args=ast.arguments(
            posonlyargs=[],
            args=[ast.arg(_ON_NONE), ast.arg(_ON_ERROR)],
            kwonlyargs=[],
            kw_defaults=[],
            defaults=[],
        ),
        body=[node, ast.Return(value=ast.Name(node.name, ast.Load()))],
        decorator_list=[],
    )
    if sys.version_info >= (3, 12):
        factory.type_params = []
    ast.copy_location(factory, node)
    module = ast.fix_missing_locations(ast.Module(body=[factory], type_ignores=[]))
    try:
        compiled = compile(module, filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError, TypeError):
        return None
    return next(c for c in compiled.co_consts if isinstance(c, types.CodeType) and c.co_name == _FACTORY)


def _is_running(node: ast.FunctionDef, code: types.CodeType) -> bool:
    """Whether the source ``node`` is the function that runs (``code``): its own compilation has the same
    bytecode, names and local variables — not a file edited or replaced since it was imported."""
    factory_code = _factory(copy.deepcopy(node), code.co_filename)
    if factory_code is None:
        return False
    inner = [c for c in factory_code.co_consts if isinstance(c, types.CodeType) and c.co_name == code.co_name]
    return len(inner) == 1 and all(
        getattr(inner[0], attribute) == getattr(code, attribute)
        for attribute in ("co_code", "co_names", "co_varnames", "co_argcount", "co_kwonlyargcount")
    )


def _callbacks(hook: Hook):
    def on_none(_hook=hook):
        handler = _hook.handler
        if handler is not None:
            try:
                handler.after(None, (), None, None)
            except Exception:
                report(handler, "after")

    def on_error(_hook=hook):
        handler = _hook.handler
        if handler is not None:
            try:
                handler.error(None, (), None, sys.exc_info()[1])
            except Exception:
                report(handler, "error")

    return on_none, on_error
