"""Each private shape of a dependency the package uses, taken away: the fallback keeps every recorded value exact
(the real SDK's readers and exporters, real prometheus_client files, compared with what the private shape gives),
and says so in one log line (tests/unit/test_private_names.py keeps the shapes in their modules). Where the
package moved off a private name to public API, the public way is checked against the private field it replaced."""

from __future__ import annotations

import logging
import os
import sys

import pytest
from opentelemetry.sdk.metrics import Counter, Histogram
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricExportResult,
    PeriodicExportingMetricReader,
)
from prometheus_client.mmap_dict import MmapedDict, mmap_key

from opentelemetry_instrumentation_vllm_ascend import environment, neighbours
from opentelemetry_instrumentation_vllm_ascend.recording import files_writer, otlp, private_otel, traces
from opentelemetry_instrumentation_vllm_ascend.recording.pipeline import Pipeline
from tests.unit.recording.test_fastpath import RECORD_MANY, _env, apply, normalized, run

assert _env  # the fast path tests' environment (no files, no exporters) and test histogram
DELTA, CUMULATIVE = AggregationTemporality.DELTA, AggregationTemporality.CUMULATIVE
#: Counter adds, gauge sets, histogram records (single and many) over both label sets, in three collections.
BATCHES = [
    [(0, 0, 3), (0, 1, 2), (2, 0, 4), (3, 0, 0.5), (3, 1, 0.0009765625), (RECORD_MANY, 0, [0.25, 7.0, 12.5])],
    [(0, 0, 1), (1, 1, 2), (2, 0, 1), (3, 0, 19.0), (5, 1, (0.125, 9))],
    [(2, 1, 0), (3, 1, 2.0)],
]


@pytest.fixture
def fresh_log(monkeypatch, caplog):
    monkeypatch.setattr(environment, "_WARNED", set())
    caplog.set_level(logging.WARNING)
    return caplog


def _sdk_version() -> tuple[int, ...]:
    from opentelemetry.sdk.version import __version__

    return tuple(int(part) for part in __version__.split(".")[:2])


def _same_data(fast, fallback) -> None:
    """The fast path's collections and the SDK recorder's are the same data. Below opentelemetry-sdk 1.45 the SDK
    drops a synchronous gauge not set since the previous collection where the fast path keeps it (issue 49): the
    fallback only runs on an SDK newer than the private shapes, so there the gauges are left out of the comparison."""
    keep = (lambda row: True) if _sdk_version() >= (1, 45) else (lambda row: row[5] != "Gauge")
    assert [{r for r in normalized(f) if keep(r)} for f in fast] == [
        {r for r in normalized(s) if keep(r)} for s in fallback
    ]
    assert all(normalized(f) for f in fast)


def _lines(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


# -- the fast recorder's reader hand-off ---------------------------------------------------------------------------
@pytest.mark.parametrize("temporality", [CUMULATIVE, DELTA])
def test_without_the_sdks_internal_instrument_classes_the_sdk_recorder_gives_the_same_data(
    monkeypatch, fresh_log, temporality
):
    fast = run("fast", BATCHES, temporality)
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.metrics._internal.instrument", None)  # the import fails
    keys = private_otel._instrument_keys()
    assert keys is None
    monkeypatch.setattr(private_otel, "INSTRUMENT_KEYS", keys)
    assert Pipeline(recorder="fast").recorder == "sdk"
    fallback = run("fast", BATCHES, temporality)
    _same_data(fast, fallback)
    assert len(_lines(fresh_log, "_internal.instrument._Counter")) == 1  # two pipelines, one line


@pytest.mark.parametrize("shape", ["_COLLECT_CALLBACK", "_TEMPORALITY"])
def test_without_a_readers_private_hand_off_the_sdk_recorder_gives_the_same_data(monkeypatch, fresh_log, shape):
    """The reader shape renamed (as a refactored SDK would have it): the fast path is not used, the SDK's public
    MeterProvider records (the SDK's own reader keeps working: it is its own shape)."""
    fast = run("fast", BATCHES, DELTA)
    monkeypatch.setattr(private_otel, shape, "_renamed_in_a_newer_sdk")
    assert Pipeline(recorder="fast").recorder == "sdk"
    fallback = run("fast", BATCHES, DELTA)
    _same_data(fast, fallback)
    assert len(_lines(fresh_log, "this opentelemetry-sdk has no MetricReader.")) == 1


# -- the fork guard of an exporter --------------------------------------------------------------------------------
class Received(MetricExporter):
    """What an exporter with its own preferences (delta counters and histograms) is handed."""

    def __init__(self) -> None:
        super().__init__(preferred_temporality={Counter: DELTA, Histogram: DELTA})
        self.exports: list = []

    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        self.exports.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        pass


def _pushed(batches) -> tuple[list, MetricExporter]:
    received = Received()
    guarded = otlp.fork_guarded(received)
    reader = PeriodicExportingMetricReader(guarded, export_interval_millis=10**9)
    pipeline = Pipeline(extra_readers=[reader], recorder="fast")
    for ops in batches:
        apply(pipeline, ops)
        reader.force_flush()
    pipeline.close()
    return [normalized(m) for m in received.exports[: len(batches)]], guarded


def test_without_the_exporters_private_preferences_it_is_guarded_in_place_with_the_same_data(monkeypatch, fresh_log):
    wrapped, guard = _pushed(BATCHES)
    assert isinstance(guard, otlp.PidGuardedExporter)
    monkeypatch.setattr(private_otel, "_PREFERENCES", ("_renamed_temporality", "_renamed_aggregation"))
    in_place, guarded = _pushed(BATCHES)
    assert isinstance(guarded, Received)  # the exporter itself: the SDK's reader reads its own preferences
    assert wrapped == in_place and wrapped[0]
    assert {x[6] for x in wrapped[1] if x[6] is not None} == {DELTA}
    assert len(_lines(fresh_log, "_preferred_temporality/_preferred_aggregation")) == 1


def test_an_exporter_guarded_in_place_exports_nothing_in_a_forked_child(monkeypatch, fresh_log):
    monkeypatch.setattr(private_otel, "_PREFERENCES", ("_renamed_temporality", "_renamed_aggregation"))
    received = Received()
    guarded = otlp.fork_guarded(received)
    parent = os.getpid()
    monkeypatch.setattr(os, "getpid", lambda: parent + 1)  # the copy a forked child inherited
    assert guarded.export(object()) == MetricExportResult.SUCCESS and received.exports == []
    assert guarded.force_flush() is True


# -- a forked child's inherited reader ----------------------------------------------------------------------------
@pytest.mark.parametrize("renamed", [False, True])
def test_a_childs_inherited_reader_stops_and_exports_nothing_with_or_without_the_private_event(
    monkeypatch, fresh_log, renamed
):
    if renamed:
        monkeypatch.setattr(private_otel, "_SHUTDOWN_EVENT", "_renamed_event")
    received = Received()
    reader = PeriodicExportingMetricReader(otlp.fork_guarded(received), export_interval_millis=10**9)
    pipeline = Pipeline(extra_readers=[reader], recorder="fast")
    apply(pipeline, BATCHES[0])
    parent = os.getpid()
    monkeypatch.setattr(os, "getpid", lambda: parent + 1)  # now "the child"
    pipeline.abandon()
    reader._daemon_thread.join(timeout=5)
    assert not reader._daemon_thread.is_alive()
    assert received.exports == []  # the parent's data, never exported from the child
    assert len(_lines(fresh_log, "PeriodicExportingMetricReader._shutdown_event")) == (1 if renamed else 0)
    monkeypatch.setattr(os, "getpid", lambda: parent)
    pipeline.close()


# -- a user's TracerProvider ----------------------------------------------------------------------------------------
def test_without_the_providers_private_processor_request_traces_go_to_the_environments_exporters(
    monkeypatch, fresh_log
):
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider()
    assert private_otel.span_processor(provider) is not None
    monkeypatch.setattr(private_otel, "_SPAN_PROCESSOR", "_renamed_processor")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    tracing = traces._for_provider(provider)
    assert not any(isinstance(e, traces.providers.ProviderSpans) for e in tracing.exporters)
    tracing.shutdown()
    assert len(_lines(fresh_log, "TracerProvider._active_span_processor")) == 1


def test_the_sampler_is_the_sdks_reading_of_the_environment(monkeypatch):
    """Public ``TracerProvider().sampler`` replaced ``sampling._get_from_env_or_default()``: the same sampler."""
    from opentelemetry.sdk.trace import sampling

    for name, arg in (
        ("always_off", None),
        ("traceidratio", "0.25"),
        ("parentbased_traceidratio", "0.5"),
        (None, None),
    ):
        for variable, value in (("OTEL_TRACES_SAMPLER", name), ("OTEL_TRACES_SAMPLER_ARG", arg)):
            if value is None:
                monkeypatch.delenv(variable, raising=False)
            else:
                monkeypatch.setenv(variable, value)
        ours, theirs = traces.Tracing._sampler(), sampling._get_from_env_or_default()
        assert (type(ours), ours.get_description()) == (type(theirs), theirs.get_description())


# -- prometheus_client: public ground --------------------------------------------------------------------------------
def test_the_writers_own_count_of_each_file_is_prometheus_clients(tmp_path):
    """files_writer counts keys, bytes used and file size itself (no private field of MmapedDict); they equal
    MmapedDict's own fields after the file grew twice, and on a file reopened."""
    path = str(tmp_path / "counter_otel-1.db")
    files_writer._allocate(path, files_writer._INITIAL_SIZE)
    f = files_writer._File(path)
    for i in range(30_000):  # about 3 MiB of keys: the file doubles twice
        key = mmap_key("m", "m_total", ["i", "pad"], [str(i), "x" * (i % 13)], "help")
        if key not in f.keys:
            files_writer._reserve(f, key)
        f.write_value(key, float(i), 0.0)
        if i % 7_500 == 0 or i == 29_999:
            m = f.mmaped
            assert (f.keys, f.used, f.capacity) == (set(m._positions), m._used, m._capacity)
            assert os.path.getsize(path) == f.capacity
    assert f.capacity == 4 * files_writer._INITIAL_SIZE
    f.mmaped.close()
    again = files_writer._File(path)
    m = MmapedDict(path, read_mode=True)
    assert (again.keys, again.used, again.capacity) == (set(again.mmaped._positions), m._used, m._capacity)
    assert sorted(v for _, v, _ in again.mmaped.read_all_values()) == [float(i) for i in range(30_000)]
    again.mmaped.close()
    m.close()


# -- wrapt ----------------------------------------------------------------------------------------------------------
def test_without_wraps_private_wrapper_field_a_neighbour_is_known_by_its_layers_and_one_line(monkeypatch, caplog):
    import wrapt

    def wrapper(wrapped, instance, args, kwargs):
        return wrapped(*args, **kwargs)

    proxy = wrapt.FunctionWrapper(len, wrapper)
    assert neighbours.wrapt_wrapper(proxy) is wrapper
    assert neighbours.wrapt_wrapper(len) is None
    monkeypatch.setattr(environment, "_WARNED", set())
    caplog.set_level(logging.WARNING)
    real = object.__getattribute__
    monkeypatch.setattr(
        neighbours,
        "object",
        type(
            "NoSelfWrapper",
            (),
            {"__getattribute__": staticmethod(lambda o, n: _no(n) if n == "_self_wrapper" else real(o, n))},
        ),
        raising=False,
    )
    assert neighbours.wrapt_wrapper(proxy) is None and neighbours.wrapt_wrapper(proxy) is None
    assert len([r for r in caplog.records if "_self_wrapper" in r.getMessage()]) == 1
    assert proxy("abc") == 3  # the proxy itself is untouched


def _no(name):
    raise AttributeError(name)
