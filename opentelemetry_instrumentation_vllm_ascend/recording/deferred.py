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
_append_value = _values.append


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


#: ``record_in_step(_otel_spec, _otel_seconds)``, line for line, as a generated timer wrapper runs it in place of
#: the two calls (``in_step_inline``; tests/unit/recording checks that both leave the same).
_IN_STEP_LINES = """\
_otel_phase = _otel_state.last_step_phase
_otel_append((_otel_spec, _otel_seconds, _otel_labels.get(_otel_phase) or _otel_step_labels(_otel_phase)))
if _otel_state.pipeline is None:
    _otel_pipeline.get()
elif _otel_len(_otel_values) >= _otel_deferred.MAX_VALUES:
    _otel_deferred.run_deferred()
"""


def in_step_inline(spec) -> tuple[str, dict]:
    """``(lines, names)`` that do what ``record_in_step(spec, _otel_seconds)`` does, for a timer's generated wrapper
    (``Handler.timed_inline``)."""
    import sys

    names = {
        "_otel_state": STATE,
        "_otel_append": _append_value,
        "_otel_spec": spec,
        "_otel_labels": STEP_LABELS,
        "_otel_step_labels": step_labels,
        "_otel_pipeline": pipeline,
        "_otel_len": len,
        "_otel_values": _values,
        "_otel_deferred": sys.modules[__name__],
    }
    return _IN_STEP_LINES, names


def _record_values(_popleft=_values.popleft) -> None:
    by_series: dict = {}  # (seed, labels) -> [spec, values…]
    last_spec = last_labels = None
    series: list = []
    while _values:
        try:
            spec, value, labels = _popleft()
        except IndexError:  # another thread took the last one
            break
        if spec is last_spec and labels is last_labels:  # the series of the value before: no key to build
            series.append(value)
            continue
        key = (spec.seed, labels)
        found = by_series.get(key)
        if found is None:
            series = by_series[key] = [spec, value]
        else:
            series = found
            series.append(value)
        last_spec, last_labels = spec, labels
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
