"""Records a hook leaves for later (``defer``) and histogram observations it leaves for later
(``record_later``, ``record_in_step``), made at the next ``run_deferred()``: by the engine when it waits, and
by the pipeline at the start of every collection and before its final export. The queues are
``STATE.deferred`` and ``STATE.deferred_values``; ``state.reset()`` (fork, tests) and a pipeline reset drop
what is pending."""

from __future__ import annotations

from ..context import STEP_LABELS, step_labels
from ..errors import report
from ..state import STATE
from . import pipeline
from .instruments import record_many

_deferred = STATE.deferred


def defer(function, *args, _state=STATE) -> None:
    """Call ``function(*args)`` (which records) at the next ``run_deferred()`` instead of now: for a
    hook on the engine's critical path whose values can wait until the engine waits (the EngineCore
    runs its scheduler hook's records after it has sent the step to the workers). Every collection
    and ``flush()`` run what is pending first, so nothing is exported late by more than that wait.

    A function with a ``many`` attribute is handed all its pending calls at once (the records of different
    functions do not depend on each other's order: an in-process worker's step records interleave with the
    scheduler's): ``function.many([args, …])`` records them together (oldest first)."""
    _deferred.append((function, args))
    if _state.pipeline is None:  # pipeline.current(), without the call
        pipeline.get()  # its collections run what is pending: it must exist before the first one


#: More observations than this waiting (no ``run_deferred`` for a long while: the scheduler's hook, whose
#: records trigger it, switched off): they are recorded at once.
MAX_VALUES = 4096

_values = STATE.deferred_values


def record_later(spec, value: float, labels: tuple, _append=_values.append, _state=STATE) -> None:
    """One histogram observation (as ``recording.record``) made at the next ``run_deferred()``, together with the
    others of its series (one ``record_many``): for a per-step value on the engine's critical path, whose
    series the step would otherwise touch, cold, to add one value."""
    _append((spec, value, labels))
    if _state.pipeline is None:
        pipeline.get()  # its collections run what is pending: it must exist before the first one
    elif len(_values) >= MAX_VALUES:
        run_deferred()


def record_in_step(spec, value: float, _append=_values.append, _state=STATE, _labels=STEP_LABELS) -> None:
    """One histogram observation labelled (dp, role, phase of the step most recently scheduled), left for later
    as ``record_later`` leaves it (inline): a timer inside an engine or worker step touches no series."""
    phase = _state.last_step_phase
    _append((spec, value, _labels.get(phase) or step_labels(phase)))
    if _state.pipeline is None:
        pipeline.get()  # its collections run what is pending: it must exist before the first one
    elif len(_values) >= MAX_VALUES:
        run_deferred()


def _record_values(_popleft=_values.popleft) -> None:
    by_series: dict = {}  # (seed, labels) -> [spec, values…]
    while _values:
        try:
            spec, value, labels = _popleft()
        except IndexError:  # another thread took the last one
            break
        series = by_series.get((spec.seed, labels))
        if series is None:
            by_series[(spec.seed, labels)] = [spec, value]
        else:
            series.append(value)
    if by_series:
        for (_seed, labels), (spec, *values) in by_series.items():
            _guarded(record_many, record_many, spec, values, labels)


def run_deferred(_popleft=_deferred.popleft) -> None:
    """Run the pending deferred records, oldest first (any thread; each runs once), and make the observations
    left for later (``record_later``)."""
    if _values:
        _record_values()
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
        report(_DeferredRecords, getattr(function, "__name__", "deferred"))


class _DeferredRecords:
    name = "deferred records"


def flush(timeout_millis: float = 5_000) -> None:
    """Make the records left for later, then export now (every reader of this process's pipeline)."""
    run_deferred()
    current = pipeline.current()
    if current is not None:
        current.flush(timeout_millis)
