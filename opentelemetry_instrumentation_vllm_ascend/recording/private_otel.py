"""The OpenTelemetry SDK's private names that the package uses: this is the only module that names them
(tests/unit/test_private_names.py keeps it so). Each function uses the private shape where the installed SDK
has it, else a public way that keeps every value true (slower, or with what it cannot do said), with one log
line naming the shape that is gone.

- ``MetricReader._set_collect_callback``, ``MetricReader._instrument_class_temporality`` and the classes that key
  it (``opentelemetry.sdk.metrics._internal.instrument._Counter`` …): the fast recorder hands its data to a reader
  as a MeterProvider does. Without them: the SDK recorder (a real MeterProvider, public API) records instead.
- ``MetricExporter._preferred_temporality`` / ``_preferred_aggregation``: the fork guard around an exporter
  carries its preferences. Without them: the exporter itself is guarded in place (its own shape, whatever it is,
  is what the SDK's reader reads).
- ``PeriodicExportingMetricReader._shutdown_event``: a forked child stops the reader thread it inherited.
  Without it: the reader's public ``shutdown()`` (its exporters are fork-guarded: nothing is exported twice).
- ``opentelemetry.sdk._logs`` (the logs SDK has no public module yet): the step records' OTLP logs sink. Without
  it: that sink is off (one log line); the other sinks go on.
- ``TracerProvider._active_span_processor``: request spans go to a user's TracerProvider's processors. Without it:
  they go to OTEL_TRACES_EXPORTER's exporters (as for a provider that is not the SDK's), said in the log line.
"""

from __future__ import annotations

import logging
import os

from .. import environment

logger = logging.getLogger(__name__)

#: The private attribute names read here (a test renames one to show its fallback).
_COLLECT_CALLBACK = "_set_collect_callback"
_TEMPORALITY = "_instrument_class_temporality"
_PREFERENCES = ("_preferred_temporality", "_preferred_aggregation")
_SHUTDOWN_EVENT = "_shutdown_event"
_SPAN_PROCESSOR = "_active_span_processor"


def _missing(shape: str, instead: str) -> None:
    """One warning per process and shape."""
    environment.warn_once(
        ("private shape", shape),
        "opentelemetry-instrumentation-vllm-ascend: this opentelemetry-sdk has no %s; %s",
        shape,
        instead,
    )


# -- the fast recorder's reader hand-off ---------------------------------------------------------------------------
def _instrument_keys() -> tuple | None:
    try:
        from opentelemetry.sdk.metrics._internal.instrument import _Counter, _Gauge, _Histogram
    except ImportError:
        return None
    return _Counter, _Histogram, _Gauge


#: (counter, histogram, gauge): the classes MetricReader's temporality table is keyed by; None: not this SDK's shape.
INSTRUMENT_KEYS = _instrument_keys()


def fast_path_fits(readers) -> bool:
    """Whether the fast recorder can hand its data to each of ``readers`` (the SDK's private reader shapes are
    there); False is one log line, and the caller records with the SDK recorder instead."""
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricReader

    readers = (*readers, InMemoryMetricReader())  # an SDK reader of its own: the shape holds for every reader
    if INSTRUMENT_KEYS is None:
        _missing("opentelemetry.sdk.metrics._internal.instrument._Counter/_Histogram/_Gauge", _SDK_RECORDER)
        return False
    for reader in (MetricReader, *readers):
        if not callable(getattr(reader, _COLLECT_CALLBACK, None)):
            _missing("MetricReader._set_collect_callback", _SDK_RECORDER)
            return False
    for reader in readers:
        if not isinstance(getattr(reader, _TEMPORALITY, None), dict):
            _missing("MetricReader._instrument_class_temporality", _SDK_RECORDER)
            return False
    return True


_SDK_RECORDER = "the SDK recorder (a MeterProvider) records instead of the fast path (same values, slower)"


def set_collect_callback(reader, callback) -> None:
    """``reader.collect()`` calls ``callback(reader, timeout_millis)``, as for a MeterProvider's reader."""
    getattr(reader, _COLLECT_CALLBACK)(callback)


def temporalities(reader) -> dict:
    """The reader's {SDK instrument class: temporality} table (empty: the reader's defaults)."""
    return getattr(reader, _TEMPORALITY, {})


# -- the fork guard of an exporter --------------------------------------------------------------------------------
def exporter_preferences(exporter) -> tuple | None:
    """(preferred temporality, preferred aggregation) of an SDK MetricExporter; None where it does not hold
    them so (one log line): the caller guards the exporter in place instead of wrapping it."""
    if all(hasattr(exporter, name) for name in _PREFERENCES):
        return tuple(getattr(exporter, name) for name in _PREFERENCES)
    _missing(
        "MetricExporter._preferred_temporality/_preferred_aggregation",
        "exporters are fork-guarded in place instead of wrapped (same values)",
    )
    return None


# -- a forked child's inherited reader ----------------------------------------------------------------------------
def stop_inherited_reader(reader) -> None:
    """In a forked child: the reader thread it inherited (restarted by the SDK after fork) stops, exporting
    nothing (the exporters are fork-guarded)."""
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    event = getattr(reader, _SHUTDOWN_EVENT, None)
    if event is not None and callable(getattr(event, "set", None)):
        event.set()
        return
    if not isinstance(reader, PeriodicExportingMetricReader):
        return  # no thread of its own
    _missing(
        "PeriodicExportingMetricReader._shutdown_event",
        "an inherited reader is stopped with shutdown() (nothing exported twice)",
    )
    try:
        reader.shutdown(timeout_millis=0)
    except Exception:  # an inherited reader: never an error in the child
        logger.debug("inherited reader shutdown in pid %s", os.getpid(), exc_info=True)


# -- a user's TracerProvider ----------------------------------------------------------------------------------------
def span_processor(provider):
    """The span processor an SDK TracerProvider sends ended spans to; None where ``provider`` has none so (not
    the SDK's, or an SDK without that shape: one log line)."""
    processor = getattr(provider, _SPAN_PROCESSOR, None)
    if processor is not None and hasattr(processor, "on_end"):
        return processor
    from opentelemetry.sdk.trace import TracerProvider

    if isinstance(provider, TracerProvider):
        _missing(
            "TracerProvider._active_span_processor",
            "request traces go to OTEL_TRACES_EXPORTER, not to the tracer_provider given to instrument()",
        )
    return None


# -- the logs SDK ---------------------------------------------------------------------------------------------------
def logs_sdk() -> tuple:
    """(LoggerProvider, BatchLogRecordProcessor) of the SDK's logs module, still private
    (``opentelemetry.sdk._logs``). Raises ImportError where it is gone: the step records' OTLP logs sink is then
    off, with its one log line (``step_sinks.open_sinks``)."""
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor

    return LoggerProvider, BatchLogRecordProcessor
