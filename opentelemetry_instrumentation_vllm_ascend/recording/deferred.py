"""Records a hook leaves for later (``defer``), run at the next ``run_deferred()``: by the engine when it
waits, and by the pipeline at the start of every collection and before its final export. The queue
is ``STATE.deferred``; ``state.reset()`` (fork, tests) and a pipeline reset drop what is pending."""

from __future__ import annotations

from ..state import STATE
from . import pipeline

_deferred = STATE.deferred


def defer(function, *args) -> None:
    """Call ``function(*args)`` (which records) at the next ``run_deferred()`` instead of now: for a
    hook on the engine's critical path whose values can wait until the engine waits (the EngineCore
    runs its scheduler hook's records after it has sent the step to the workers). Every collection
    and ``flush()`` run what is pending first, so nothing is exported late by more than that wait.

    A function with a ``many`` attribute is handed all its pending calls at once (the records of different
    functions do not depend on each other's order: an in-process worker's step records interleave with the
    scheduler's): ``function.many([args, …])`` records them together (oldest first)."""
    _deferred.append((function, args))
    if pipeline.current() is None:
        pipeline.get()  # its collections run what is pending: it must exist before the first one


def run_deferred(_popleft=_deferred.popleft) -> None:
    """Run the pending deferred records, oldest first (any thread; each runs once)."""
    taken = []
    while _deferred:
        try:
            taken.append(_popleft())
        except IndexError:  # another thread took the last one
            break
    by_function: dict = {}  # each function's calls, oldest first (functions in order of first appearance)
    for function, args in taken:
        calls = by_function.get(function)
        if calls is None:
            by_function[function] = [args]
        else:
            calls.append(args)
    for function, calls in by_function.items():
        many = getattr(function, "many", None)
        if many is not None and len(calls) > 1:
            _guarded(function, many, calls)
        else:
            for args in calls:
                _guarded(function, function, *args)


def _guarded(function, call, *args) -> None:
    try:
        call(*args)
    except Exception:
        from ..hooks.handler import report

        report(_DeferredRecords, getattr(function, "__name__", "deferred"))


class _DeferredRecords:
    name = "deferred records"
