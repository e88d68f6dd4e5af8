"""OpenTelemetry SDK instruments on a meter — the SDK recorder's (``OTEL_VLLM_ASCEND_RECORDER=sdk``, or exponential
histograms over OTLP) and a user's MeterProvider's (``instrument(meter_provider=…)``) — with the recording layer's
tuple-label interface, and the exporter that hands request spans to a user's TracerProvider
(``instrument(tracer_provider=…)``)."""

from __future__ import annotations

from .. import catalogue, context, targets


class SdkInstrument:
    """The recording layer's tuple-label interface over an OTel SDK instrument. A spec's process labels
    (``rank`` in a worker) are added to the attributes of each measurement, as the fast path adds them
    to each series at collection."""

    __slots__ = ("_instrument", "_labels", "_process_labels")

    def __init__(self, instrument, labels, process_labels=()) -> None:
        self._instrument = instrument
        self._labels = labels
        self._process_labels = process_labels

    def _attributes(self, labels: tuple) -> dict:
        extra = context.process_attributes(self._process_labels) if self._process_labels else None
        return context.series_attributes(self._labels, labels, extra)

    def add(self, value, labels: tuple) -> None:
        self._instrument.add(value, self._attributes(labels))

    def record(self, value, labels: tuple) -> None:
        self._instrument.record(value, self._attributes(labels))

    def record_exemplar(self, value, labels: tuple, trace_id: int, span_id: int) -> None:
        """One observation in the context of a sampled span of that trace: the SDK's exemplar filter and
        reservoir (``OTEL_METRICS_EXEMPLAR_FILTER``) make it its bucket's exemplar."""
        self._instrument.record(value, self._attributes(labels), context=exemplar_context(trace_id, span_id))

    def set(self, value, labels: tuple) -> None:
        self._instrument.set(value, self._attributes(labels))

    def record_many(self, values, labels: tuple) -> None:
        attributes = self._attributes(labels)
        for value in values:
            self._instrument.record(value, attributes)

    def record_n(self, value, n: int, labels: tuple) -> None:
        attributes = self._attributes(labels)
        for _ in range(n):
            self._instrument.record(value, attributes)


class Both:
    """One recording-layer instrument that records into two: this pipeline's and the user's MeterProvider's."""

    __slots__ = ("_own", "_theirs")

    def __init__(self, own, theirs) -> None:
        self._own = own
        self._theirs = theirs

    def add(self, value, labels: tuple) -> None:
        self._own.add(value, labels)
        self._theirs.add(value, labels)

    def record(self, value, labels: tuple) -> None:
        self._own.record(value, labels)
        self._theirs.record(value, labels)

    def record_exemplar(self, value, labels: tuple, trace_id: int, span_id: int) -> None:
        self._own.record_exemplar(value, labels, trace_id, span_id)
        self._theirs.record_exemplar(value, labels, trace_id, span_id)

    def set(self, value, labels: tuple) -> None:
        self._own.set(value, labels)
        self._theirs.set(value, labels)

    def record_many(self, values, labels: tuple) -> None:
        self._own.record_many(values, labels)
        self._theirs.record_many(values, labels)

    def record_n(self, value, n: int, labels: tuple) -> None:
        self._own.record_n(value, n, labels)
        self._theirs.record_n(value, n, labels)


def sdk_instrument(meter, spec: catalogue.MetricSpec) -> SdkInstrument:
    """An SDK instrument of ``spec`` on ``meter`` (its instrument name; the catalogue's buckets as its advice)."""
    if spec.kind == catalogue.COUNTER:
        inst = meter.create_counter(spec.instrument_name, unit=spec.unit, description=spec.description)
    elif spec.kind == catalogue.HISTOGRAM:
        inst = meter.create_histogram(
            spec.instrument_name,
            unit=spec.unit,
            description=spec.description,
            explicit_bucket_boundaries_advisory=list(spec.buckets or ()),
        )
    else:
        inst = meter.create_gauge(spec.instrument_name, unit=spec.unit, description=spec.description)
    return SdkInstrument(inst, spec.labels, targets.process_labels(spec))


def observe(meter, spec: catalogue.MetricSpec, callback) -> None:
    """An observable gauge of ``spec`` on an SDK ``meter``, observing ``callback()``'s values at each collection."""
    from opentelemetry.metrics import Observation

    process_labels = targets.process_labels(spec)

    def sdk_callback(_options):
        extra = context.process_attributes(process_labels)
        return [
            Observation(value, context.series_attributes(spec.labels, labels, extra)) for labels, value in callback()
        ]

    meter.create_observable_gauge(
        spec.instrument_name, callbacks=[sdk_callback], unit=spec.unit, description=spec.description
    )


def exemplar_context(trace_id: int, span_id: int):
    """A context whose current span is a non-recording span of a sampled ``trace_id`` / ``span_id`` (what the
    SDK's trace-based exemplar filter and reservoirs read; nothing is started or exported)."""
    from opentelemetry import trace

    span_context = trace.SpanContext(trace_id, span_id, is_remote=False, trace_flags=trace.TraceFlags(1))
    return trace.set_span_in_context(trace.NonRecordingSpan(span_context))


class ProviderSpans:
    """An exporter that hands each finished span to a user's TracerProvider's span processors
    (``instrument(tracer_provider=…)``), as the provider's own spans reach them when they end: their batching,
    exporters and shutdown are the provider's."""

    def __init__(self, processor) -> None:
        self.processor = processor

    def export(self, spans):
        from opentelemetry.sdk.trace.export import SpanExportResult

        for span in spans:
            self.processor.on_end(span)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """The provider is the user's: its processors are shut down with it."""
