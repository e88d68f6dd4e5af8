"""The recording functions behind the facade (``recording``): each looks up the pipeline's instrument of a
catalogue entry once per pipeline and records into it.

Values are exact: ``add(spec, 0, …)`` adds nothing (no "≤0 counts as 1" rule). Labels are tuples of
values in the catalogue's label order (``context.step_labels(phase)`` gives the step-scoped ones), so
the hot path builds no dicts. Which recorder sits behind these functions is the pipeline's choice:
the pre-aggregating fast path (default) or the OTel SDK."""

from __future__ import annotations

from .. import catalogue, context, environment
from ..errors import report
from ..state import STATE
from . import pipeline

_instruments = STATE.instruments
#: The pipeline's instrument per seed, also while runtime control has it switched off.
_real = STATE.real_instruments


def generation() -> int:
    """Changes whenever the pipeline is rebuilt (reset, fork) or the state is reset: values cached as
    "already recorded" must be recorded again then."""
    return STATE.generation


def switched_off(seed: str) -> bool:
    """Whether runtime control (``recording.control``) has switched the metric ``seed`` off."""
    c = STATE.control
    if not c.on:
        return True
    patterns = c.patterns
    return bool(patterns) and environment.metric_disabled(seed, patterns)


class _Disabled:
    """A metric switched off by configuration, or one the pipeline cannot export (``Pipeline.instrument``
    gave None): every call is a no-op."""

    __slots__ = ()

    def add(self, value, labels) -> None:
        pass

    record = set = record_many = add

    def record_n(self, value, n, labels) -> None:
        pass

    def record_exemplar(self, value, labels, trace_id, span_id) -> None:
        pass


def _instrument(spec: catalogue.MetricSpec):
    instrument = _instruments.get(spec.seed)
    if instrument is None:
        if environment.metric_disabled(spec.seed) or switched_off(spec.seed):
            instrument = _instruments[spec.seed] = _Disabled()
        else:
            real = _real.get(spec.seed)
            if real is None:
                real = _real[spec.seed] = pipeline.get().instrument(spec) or _Disabled()
            instrument = _instruments[spec.seed] = real
    return instrument


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


def record_exemplar(spec: catalogue.MetricSpec, value: float, labels: tuple, trace_id: int, span_id: int) -> None:
    """One histogram observation, counted exactly as ``record`` counts it, that is also offered as its bucket's
    exemplar: ``trace_id`` (128-bit) and ``span_id`` (64-bit) of an exported trace, the value and the time. Each
    bucket of a series keeps its latest exemplar; they reach OTLP (``HistogramDataPoint.exemplars``) and the
    OpenMetrics format of ``/metrics``. With OTEL_METRICS_EXEMPLAR_FILTER=always_off only the observation is
    recorded. For a request's histograms (once per request): ``record`` stays the hot path's call."""
    instrument = _instruments.get(spec.seed)
    if instrument is None:
        instrument = _instrument(spec)
    instrument.record_exemplar(value, labels, trace_id, span_id)


def set_gauge(spec: catalogue.MetricSpec, value: float, labels: tuple) -> None:
    _instrument(spec).set(value, labels)


class _Observer:
    """What a failing observable gauge's callback is reported as (``errors.report`` reads its ``name``)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def _safe(spec, callback):
    observer = _Observer(f"observer of {spec.seed}")

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
    STATE.observers.append(entry)
    current = pipeline.current()
    if current is not None:
        current.observe(*entry)
    else:
        pipeline.get()  # built now: it registers every observer of STATE.observers


def process_started() -> None:
    """This process now contributes metrics: count it (once per label set) in instrumented_processes."""
    ctx = context.PROCESS
    labels = (ctx.process, ctx.dp, ctx.role)
    previous = STATE.process_labels
    if previous == labels:
        return
    if previous is not None:
        set_gauge(catalogue.INSTRUMENTED_PROCESSES, 0, previous)
    set_gauge(catalogue.INSTRUMENTED_PROCESSES, 1, labels)
    STATE.process_labels = labels
