"""The one recording layer: every handler records through these functions, and nothing else
touches OTel instruments. The hot path can be made faster here, in one place.

Values are exact: ``add(spec, 0, …)`` adds nothing (no "≤0 counts as 1" rule).
"""

from __future__ import annotations

from . import catalogue, context, pipeline

_instruments: dict[str, object] = {}
_process_attrs: list = [None]


def _forget(_new_pipeline) -> None:
    _instruments.clear()
    _process_attrs[0] = None


pipeline._on_new_pipeline.append(_forget)


def _instrument(spec: catalogue.MetricSpec):
    instrument = _instruments.get(spec.seed)
    if instrument is None:
        meter = pipeline.get().meter
        if spec.kind == catalogue.COUNTER:
            instrument = meter.create_counter(spec.instrument_name, unit=spec.unit, description=spec.description)
        elif spec.kind == catalogue.HISTOGRAM:
            instrument = meter.create_histogram(
                spec.instrument_name,
                unit=spec.unit,
                description=spec.description,
                explicit_bucket_boundaries_advisory=list(spec.buckets or ()),
            )
        elif spec.kind == catalogue.GAUGE:
            instrument = meter.create_gauge(spec.instrument_name, unit=spec.unit, description=spec.description)
        else:  # pragma: no cover - the catalogue test checks kinds
            raise ValueError(f"unknown metric kind {spec.kind!r}")
        _instruments[spec.seed] = instrument
    return instrument


def add(spec: catalogue.MetricSpec, value: int | float, attributes: dict) -> None:
    if value:
        _instrument(spec).add(value, attributes)


def record(spec: catalogue.MetricSpec, value: float, attributes: dict) -> None:
    _instrument(spec).record(value, attributes)


def set_gauge(spec: catalogue.MetricSpec, value: float, attributes: dict) -> None:
    _instrument(spec).set(value, attributes)


def step_attributes(phase: str) -> dict:
    ctx = context.PROCESS
    return {"dp": ctx.dp, "role": ctx.role, "phase": phase}


def process_started() -> None:
    """This process now contributes metrics: count it (once per label set) in instrumented_processes."""
    ctx = context.PROCESS
    attrs = {"process": ctx.process, "dp": ctx.dp, "role": ctx.role}
    previous = _process_attrs[0]
    if previous == attrs:
        return
    if previous is not None:
        set_gauge(catalogue.INSTRUMENTED_PROCESSES, 0, previous)
    set_gauge(catalogue.INSTRUMENTED_PROCESSES, 1, attrs)
    _process_attrs[0] = attrs


def flush() -> None:
    current = pipeline.current()
    if current is not None:
        current.flush()
