"""A loaded hook-file entry as a declarative row (``wiring/declarative.py``) on the function it names: the function
found on the original class (``function_of``), the row's wrapper kind and parameters (``row_of``), and for ``check
--config`` each loaded entry resolved against the installed vLLM (``resolve_entries``) or marked unresolved."""

from __future__ import annotations

import inspect

from ..hooks.patches import original_class
from ..kinds import ASYNC_GENERATOR, COROUTINE, COROUTINE_TIMER, SYNC, SYNC_TIMER
from ..targets import Target
from .declarative import argument_names, expressions_of
from .entries import LOADED, REJECTED, Entry, short
from .expressions import SPECIAL


def parameters_of(function) -> tuple[str, ...]:
    """Names of ``function``'s parameters, in order (``self`` first for a method)."""
    try:
        return tuple(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return ()


def kind_of(function) -> str:
    """The wrapper kind of ``function`` itself: the original's, through wrappers of ours (a built-in
    hook on the same function: an async generator's wrapper is a plain function returning one)."""

    original = inspect.unwrap(function, stop=lambda f: not hasattr(f, "__otel_vllm_ascend_hook__"))
    if inspect.isasyncgenfunction(original):
        return ASYNC_GENERATOR
    if inspect.iscoroutinefunction(original):
        return COROUTINE
    return SYNC


def row_of(entry: Entry, function):
    """The declarative row of ``entry`` on ``function`` (what it names, found by ``function_of``): the
    timer wrapper kind of a sync function or a coroutine, the stream kind of an async generator, the
    function's parameters (after ``self`` for a method) as the row's ``params``. Raises ValueError
    when an expression reads a name the function does not have."""

    kind = {COROUTINE: COROUTINE_TIMER, ASYNC_GENERATOR: ASYNC_GENERATOR}.get(kind_of(function), SYNC_TIMER)
    parameters = parameters_of(function)
    params = parameters[1:] if "." in entry.qualname else parameters
    row = Target(entry.module, entry.qualname, kind, vllm="", params=params, measures=entry.measures)
    why = check_names(entry, argument_names(row))
    if why is not None:
        raise ValueError(why)
    return row


def check_names(entry: Entry, names: tuple[str, ...]) -> str | None:
    """Why the entry's expressions cannot run on a target whose arguments are ``names``, or None."""

    allowed = set(names) | set(SPECIAL)
    for m in entry.measures:
        for expression in expressions_of(m):
            unknown = [n for n in expression.names if n not in allowed]
            if unknown:
                return (
                    f"{m.metric}: expr {expression.source!r} reads {unknown[0]!r}, not a parameter of "
                    f"{entry.symbol} ({', '.join(names) or 'none'})"
                )
    return None


def function_of(module, entry: Entry):
    """(owner, attribute, function) that ``entry`` names in ``module``, on the original class (a name
    the module rebinds to a subclass is walked back to the definition, as for the built-in rows)."""

    if "." in entry.qualname:
        owner_name, attribute = entry.qualname.rsplit(".", 1)
        owner = original_class(module, owner_name)
    else:
        owner, attribute = module, entry.qualname
    function = getattr(owner, "__dict__", {}).get(attribute)
    if function is None:
        raise AttributeError(f"{entry.qualname} is not defined in {module.__name__}")
    return owner, attribute, function


def unresolved(entries: list[Entry]) -> list[Entry]:
    """For ``check --config`` where vLLM is not installed: loaded entries say that their symbol was not resolved."""
    for entry in entries:
        if entry.status == LOADED:
            entry.reason += " (not resolved: vLLM is not installed here)"
    return entries


def resolve_entries(entries: list[Entry]) -> list[Entry]:
    """For ``check --config``: import each loaded entry's module (never anything the file names
    besides it) and check the symbol exists and its expressions read only its parameters (a vllm_ascend symbol
    where vllm-ascend is not installed: not resolved, as every symbol where vLLM is not)."""
    import importlib
    import importlib.util

    for entry in entries:
        if entry.status != LOADED:
            continue
        if entry.module.split(".")[0] not in ("vllm", "vllm_ascend"):
            entry.reason += " (not resolved: check imports only vllm and vllm_ascend modules)"
            continue
        if entry.module.split(".")[0] == "vllm_ascend" and importlib.util.find_spec("vllm_ascend") is None:
            entry.reason += " (not resolved: vllm-ascend is not installed here)"
            continue
        try:
            module = importlib.import_module(entry.module)
            _, _, function = function_of(module, entry)
            if isinstance(function, (staticmethod, classmethod)):
                raise TypeError("static and class methods are not hooked")
            row_of(entry, function)
        except Exception as exc:
            entry.status, entry.reason = REJECTED, f"cannot hook: {type(exc).__name__}: {short(exc)}"
    return entries
