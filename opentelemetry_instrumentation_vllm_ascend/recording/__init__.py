"""The one recording layer: every handler records through these functions, and nothing else
touches OTel instruments. The hot path can be made faster here, in one place.

Values are exact: ``add(spec, 0, …)`` adds nothing (no "≤0 counts as 1" rule). Labels are tuples of
values in the catalogue's label order (``context.step_labels(phase)`` gives the step-scoped ones), so
the hot path builds no dicts. Which recorder sits behind these functions is the pipeline's choice:
the pre-aggregating fast path (default) or the OTel SDK.
"""

from __future__ import annotations

from collections import deque
from itertools import groupby
from operator import itemgetter

from .. import catalogue, context, environment
from . import control, pipeline

_instruments: dict[str, object] = {}
#: The pipeline's instrument per seed, also while runtime control has it switched off.
_real: dict[str, object] = {}
_process_labels: list = [None]


_generation = [0]


def generation() -> int:
    """Changes whenever the pipeline is rebuilt (reset, fork): values cached as "already recorded"
    must be recorded again then."""
    return _generation[0]


def _forget(new_pipeline) -> None:
    _instruments.clear()
    _real.clear()
    _process_labels[0] = None
    _generation[0] += 1
    if new_pipeline is None:  # reset (after its final export) or fork: a parent's pending records are not ours
        _deferred.clear()


#: Records a hook left for later: (function, arguments), oldest first.
_deferred: deque = deque()


def defer(function, *args) -> None:
    """Call ``function(*args)`` (which records) at the next ``run_deferred()`` instead of now: for a
    hook on the engine's critical path whose values can wait until the engine waits (the EngineCore
    runs its scheduler hook's records after it has sent the step to the workers). Every collection
    and ``flush()`` run what is pending first, so nothing is exported late by more than that wait.

    A function with a ``many`` attribute is handed consecutive pending calls of its own at once:
    ``function.many([args, …])`` records them together (oldest first)."""
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
    for function, group in groupby(taken, key=itemgetter(0)):  # consecutive calls of one function
        calls = [args for _, args in group]
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


pipeline._on_new_pipeline.append(_forget)


class _Disabled:
    """A metric switched off by configuration: every call is a no-op."""

    __slots__ = ()

    def add(self, value, labels) -> None:
        pass

    record = set = record_many = add

    def record_n(self, value, n, labels) -> None:
        pass


def _instrument(spec: catalogue.MetricSpec):
    instrument = _instruments.get(spec.seed)
    if instrument is None:
        if environment.metric_disabled(spec.seed) or control.switched_off(spec.seed):
            instrument = _instruments[spec.seed] = _Disabled()
        else:
            real = _real.get(spec.seed)
            if real is None:
                real = _real[spec.seed] = pipeline.get().instrument(spec)
            instrument = _instruments[spec.seed] = real
    return instrument


def control_changed() -> None:
    """Runtime control switched metrics on or off: every instrument is looked up again at its next
    record (the pipeline's own instruments, kept in ``_real``, keep their values)."""
    _instruments.clear()
    if not control.is_on():
        _deferred.clear()  # records a hook left for later are not made while off


def add(spec: catalogue.MetricSpec, value: int | float, labels: tuple, _get=_instruments.get) -> None:
    """Counter += value. ``labels``: label values in the order of ``spec.labels``."""
    if value:
        instrument = _get(spec.seed)
        if instrument is None:
            instrument = _instrument(spec)
        instrument.add(value, labels)


def record(spec: catalogue.MetricSpec, value: float, labels: tuple, _get=_instruments.get) -> None:
    """One histogram observation."""
    instrument = _get(spec.seed)
    if instrument is None:
        instrument = _instrument(spec)
    instrument.record(value, labels)


def record_many(spec: catalogue.MetricSpec, values: list, labels: tuple, _get=_instruments.get) -> None:
    """One histogram observation per item of ``values`` (non-empty), all with the same labels."""
    instrument = _get(spec.seed)
    if instrument is None:
        instrument = _instrument(spec)
    instrument.record_many(values, labels)


def record_n(spec: catalogue.MetricSpec, value: float, n: int, labels: tuple, _get=_instruments.get) -> None:
    """``n`` (> 0) histogram observations of the same value with the same labels (values that
    repeat over many steps, counted at once)."""
    instrument = _get(spec.seed)
    if instrument is None:
        instrument = _instrument(spec)
    instrument.record_n(value, n, labels)


def record_in_step(
    spec: catalogue.MetricSpec,
    value: float,
    _get=_instruments.get,
    _phase=context.LAST_STEP_PHASE,
    _labels=context._step_labels,
) -> None:
    """One histogram observation labelled (dp, role, phase of the step most recently scheduled)."""
    phase = _phase[0]
    labels = _labels.get(phase) or context.step_labels(phase)
    instrument = _get(spec.seed)
    if instrument is None:
        instrument = _instrument(spec)
    instrument.record(value, labels)


def set_gauge(spec: catalogue.MetricSpec, value: float, labels: tuple) -> None:
    _instrument(spec).set(value, labels)


_observers: list = []


def _safe(spec, callback):
    from ..hooks.handler import Handler, report

    class _Observer(Handler):
        name = f"observer of {spec.seed}"

    observer = _Observer()

    def observe():
        try:
            return list(callback())
        except Exception:
            report(observer, "collection")
            return []

    return observe


def observe(spec: catalogue.MetricSpec, callback) -> None:
    """Register an observable gauge for this process: ``callback()`` returns ``[(labels, value), …]``
    at each collection, in the collecting thread. It survives pipeline rebuilds (fork)."""
    if environment.metric_disabled(spec.seed):
        return
    entry = (spec, _safe(spec, callback))
    _observers.append(entry)
    current = pipeline.current()
    if current is not None:
        current.observe(*entry)
    else:
        pipeline.get()  # built now: _reobserve registers every observer with it


def _reobserve(new_pipeline) -> None:
    if new_pipeline is None:
        return
    for spec, callback in _observers:
        new_pipeline.observe(spec, callback)


pipeline._on_new_pipeline.append(_reobserve)


def process_started() -> None:
    """This process now contributes metrics: count it (once per label set) in instrumented_processes."""
    ctx = context.PROCESS
    labels = (ctx.process, ctx.dp, ctx.role)
    previous = _process_labels[0]
    if previous == labels:
        return
    if previous is not None:
        set_gauge(catalogue.INSTRUMENTED_PROCESSES, 0, previous)
    set_gauge(catalogue.INSTRUMENTED_PROCESSES, 1, labels)
    _process_labels[0] = labels


pipeline.before_collect_hooks.append(run_deferred)
pipeline.before_collect_hooks.append(control.exported)


def flush(timeout_millis: float = 5_000) -> None:
    run_deferred()
    current = pipeline.current()
    if current is not None:
        current.flush(timeout_millis)
