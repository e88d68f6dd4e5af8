"""What OpenTelemetry users set reaches what an OTLP receiver decodes: ``instrument(meter_provider=, tracer_provider=)``,
OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES, the per-signal exporter and protocol variables, the OTLP histogram
aggregation (exponential histograms over OTLP while /metrics keeps the catalogue's buckets) and
OTEL_METRIC_EXPORT_INTERVAL. Every test reads a real OTLP/HTTP receiver (tests/support/otlp_receiver.py)."""

from __future__ import annotations

import math
import time

import pytest
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from opentelemetry_instrumentation_vllm_ascend import VllmAscendInstrumentor, catalogue, context, environment, recording
from opentelemetry_instrumentation_vllm_ascend.recording import pipeline, traces
from tests.support.otlp_receiver import Receiver
from tests.support.otlp_traces import TraceReceiver
from tests.support.process import set_process

R2W = catalogue.RUNNING_TO_WAITING
DURATION = catalogue.M["scheduler:duration"]
VALUES = (3e-05, 0.0004, 0.0004, 0.002, 0.3)


@pytest.fixture
def env(monkeypatch, tmp_path):
    """A process that writes /metrics files to ``tmp_path`` and pushes nowhere until a test says where."""
    for name in (
        environment.PROMETHEUS_MULTIPROC_DIR,
        environment.OTLP_PROTOCOL,
        environment.OTLP_METRICS_PROTOCOL,
        environment.OTLP_TRACES_PROTOCOL,
        environment.OTLP_HISTOGRAM_AGGREGATION,
        "OTEL_SERVICE_NAME",
        "OTEL_RESOURCE_ATTRIBUTES",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(environment.FILES_DIR, str(tmp_path))
    monkeypatch.setenv(environment.METRICS_EXPORTER, "none")
    monkeypatch.setenv(environment.TRACES_EXPORTER, "none")
    monkeypatch.setenv(environment.METRIC_EXPORT_INTERVAL, "3600000")  # only explicit flushes
    monkeypatch.setenv(environment.PROMETHEUS_INTERVAL_MS, "3600000")
    set_process("engine_core", "0", "mixed")
    yield monkeypatch
    pipeline.reset()
    traces.use_provider(None)
    traces.install(None)


def _push_to(monkeypatch, receiver, protocol="http/protobuf", general_protocol="grpc"):
    """OTEL_METRICS_EXPORTER=otlp with the metrics signal's own protocol and endpoint; the general ones point
    elsewhere, so only the per-signal settings can reach ``receiver``."""
    monkeypatch.setenv(environment.METRICS_EXPORTER, "otlp")
    monkeypatch.setenv(environment.OTLP_PROTOCOL, general_protocol)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv(environment.OTLP_METRICS_PROTOCOL, protocol)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", receiver.endpoint)


def _record():
    recording.add(R2W, 3, context.step_labels("decode"))
    for value in VALUES:
        recording.record(DURATION, value, context.step_labels("decode"))


def _r2w(receiver) -> dict:
    return receiver.counter_totals(R2W.exposed_name, by="vllm.process.role")


def _journey_exported(tracing) -> traces.Journey:
    journey = traces.Journey("cmpl-1", "cmpl-1", "chat", "m", time.time() - 1.0)
    journey.e2e, journey.first_latency, journey.tokens, journey.reason = 0.5, 0.1, 3, "stop"
    assert tracing.decide(journey)
    assert tracing.submit(journey)
    tracing.flush()
    return journey


# -- resource ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("service", "attributes", "expected"),
    [
        (None, None, {"service.name": "vllm"}),
        ("chat-prod", None, {"service.name": "chat-prod"}),
        (None, "service.name=from-attrs,deployment.environment=prod", {"service.name": "from-attrs"}),
        ("chat-prod", "deployment.environment=prod,team=infer", {"service.name": "chat-prod", "team": "infer"}),
    ],
)
def test_service_name_and_resource_attributes_reach_the_receiver(env, service, attributes, expected):
    if service:
        env.setenv("OTEL_SERVICE_NAME", service)
    if attributes:
        env.setenv("OTEL_RESOURCE_ATTRIBUTES", attributes)
        expected = {**expected, "deployment.environment": "prod"}
    with Receiver() as receiver:
        _push_to(env, receiver)
        pipeline.reset()
        _record()
        recording.flush()
        (resource,) = receiver.resources()
    assert {key: resource.get(key) for key in expected} == expected
    assert resource["vllm.process.role"] == "engine_core" and resource["process.pid"] > 0  # ours beside theirs


def test_the_trace_resource_is_the_process_resource_the_user_named(env):
    env.setenv("OTEL_SERVICE_NAME", "chat-prod")
    env.setenv("OTEL_RESOURCE_ATTRIBUTES", "team=infer")
    with TraceReceiver() as receiver:
        env.setenv(environment.TRACES_EXPORTER, "otlp")
        env.setenv(environment.OTLP_TRACES_PROTOCOL, "http/protobuf")
        env.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.endpoint)
        pipeline.reset()
        _journey_exported(traces.tracing())
        (span,) = receiver.spans()
    assert span.resource["service.name"] == "chat-prod" and span.resource["team"] == "infer"
    assert span.resource["vllm.process.role"] == "engine_core"


# -- per-signal exporter and protocol ---------------------------------------------------------------------------
def test_the_metrics_signals_own_protocol_and_endpoint_win(env):
    with Receiver() as receiver:
        _push_to(env, receiver)  # general: gRPC to a closed port; metrics: http/protobuf to the receiver
        pipeline.reset()
        _record()
        recording.flush()
        assert _r2w(receiver) == {"engine_core": 3}


def test_otel_metrics_exporter_none_sends_nothing(env):
    with Receiver() as receiver:
        _push_to(env, receiver)
        env.setenv(environment.METRICS_EXPORTER, "none")
        pipeline.reset()
        _record()
        recording.flush()
        assert receiver.requests == []


@pytest.mark.parametrize("exporter", ["otlp", "none"])
def test_the_traces_signals_own_exporter_protocol_and_endpoint(env, exporter):
    with TraceReceiver() as receiver:
        env.setenv(environment.TRACES_EXPORTER, exporter)
        env.setenv(environment.OTLP_PROTOCOL, "grpc")
        env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
        env.setenv(environment.OTLP_TRACES_PROTOCOL, "http/protobuf")
        env.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.endpoint)
        pipeline.reset()
        tracing = traces.tracing()
        if exporter == "none":
            assert tracing.exporters == []
            return
        journey = _journey_exported(tracing)
        (span,) = receiver.spans()
    assert (span.trace_id, span.span_id, span.name) == (journey.trace_id, journey.span_id, "chat m")


# -- histogram aggregation ----------------------------------------------------------------------------------------
def _exponential_total(point) -> int:
    return point.zero_count + sum(point.positive.bucket_counts) + sum(point.negative.bucket_counts)


def test_exponential_histograms_reach_otlp_while_metrics_keeps_the_catalogue_buckets(env, tmp_path):
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    env.setenv(environment.OTLP_HISTOGRAM_AGGREGATION, "base2_exponential_bucket_histogram")
    with Receiver() as receiver:
        _push_to(env, receiver)
        pipeline.reset()
        _record()
        recording.flush()
        metrics = [m for _resource, m in receiver._metrics(DURATION.exposed_name)]
        assert _r2w(receiver) == {"engine_core": 3}  # counters as before
    assert [m.WhichOneof("data") for m in metrics] == ["exponential_histogram"]
    (point,) = metrics[0].exponential_histogram.data_points
    assert point.count == _exponential_total(point) == len(VALUES)
    assert point.sum == pytest.approx(sum(VALUES)) and (point.min, point.max) == (min(VALUES), max(VALUES))
    # Each value lies in its bucket: (base^index, base^(index+1)] with base = 2^(2^-scale).
    base = 2 ** (2**-point.scale)
    lows = []
    for i, count in enumerate(point.positive.bucket_counts):
        lows += [base ** (point.positive.offset + i)] * count
    for value, low in zip(sorted(VALUES), lows):
        assert low < value <= low * base * (1 + 1e-9)
    # /metrics (prometheus_client's multiprocess merge of our files, as vLLM serves them): the catalogue's buckets.
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    (family,) = [f for f in registry.collect() if f.name == DURATION.prometheus_name]
    bounds = [float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")]
    assert bounds == [*DURATION.buckets, math.inf]
    cumulative = [s.value for s in family.samples if s.name.endswith("_bucket")]
    assert cumulative == [sum(v <= b for v in VALUES) for b in bounds]


def test_explicit_buckets_over_otlp_by_default(env):
    with Receiver() as receiver:
        _push_to(env, receiver)
        pipeline.reset()
        _record()
        recording.flush()
        (metric,) = [m for _resource, m in receiver._metrics(DURATION.exposed_name)]
    (point,) = metric.histogram.data_points
    assert list(point.explicit_bounds) == list(DURATION.buckets)
    assert sum(point.bucket_counts) == len(VALUES)
    assert pipeline.current().store is not None  # the fast recorder


# -- export interval ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("interval_ms", "exports"), [(100, True), (3_600_000, False)])
def test_otel_metric_export_interval_sets_how_often_the_receiver_hears(env, interval_ms, exports):
    with Receiver() as receiver:
        _push_to(env, receiver)
        env.setenv(environment.METRIC_EXPORT_INTERVAL, str(interval_ms))
        pipeline.reset()
        _record()
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline and len(receiver.requests) < 3:
            time.sleep(0.05)
        heard = len(receiver.requests)
    assert (heard >= 3) is exports and (heard == 0) is not exports


# -- the user's providers ------------------------------------------------------------------------------------------
def test_a_users_meter_provider_gets_our_metrics(env):
    """Its readers and Views decide: with ``VllmAscendInstrumentor.views()`` the catalogue's names; its exporter's
    exponential preference gives exponential histograms; its resource. /metrics keeps ours."""
    env.setenv(environment.OTLP_HISTOGRAM_AGGREGATION, "base2_exponential_bucket_histogram")
    with Receiver() as receiver:
        reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=receiver.endpoint), export_interval_millis=3_600_000
        )
        provider = MeterProvider(
            metric_readers=[reader],
            resource=Resource.create({"service.name": "users-app"}),
            views=VllmAscendInstrumentor.views(),
        )
        try:
            pipeline.reset(meter_provider=provider)
            _record()
            recording.flush()
            (resource,) = receiver.resources()
            assert resource["service.name"] == "users-app" and "vllm.process.role" not in resource
            assert receiver.counter_totals(R2W.exposed_name, by="service.name") == {"users-app": 3}
            (metric,) = [m for _resource, m in receiver._metrics(DURATION.exposed_name)]
            assert metric.WhichOneof("data") == "exponential_histogram"
            (point,) = metric.exponential_histogram.data_points
            assert point.count == len(VALUES) and point.sum == pytest.approx(sum(VALUES))
            assert {kv.key for kv in point.attributes} == set(catalogue.STEP_LABELS)
            assert len(pipeline.current().readers) == 1  # our files reader; no push reader of ours
        finally:
            pipeline.reset()
            provider.shutdown()


def test_without_views_a_users_meter_provider_gets_instrument_names_and_the_catalogue_buckets(env):
    with Receiver() as receiver:
        reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=receiver.endpoint), export_interval_millis=3_600_000
        )
        provider = MeterProvider(metric_readers=[reader])
        try:
            pipeline.reset(meter_provider=provider)
            _record()
            recording.flush()
            assert receiver.counter_totals(R2W.instrument_name, by="vllm.process.role") == {None: 3}
            (metric,) = [m for _resource, m in receiver._metrics(DURATION.instrument_name)]
            (point,) = metric.histogram.data_points
            assert list(point.explicit_bounds) == list(DURATION.buckets)
            assert list(point.bucket_counts) == [
                sum(low < v <= high for v in VALUES)
                for low, high in zip((-math.inf, *DURATION.buckets), (*DURATION.buckets, math.inf))
            ]
        finally:
            pipeline.reset()
            provider.shutdown()


def test_instrument_takes_the_users_providers(env, monkeypatch):
    """The keywords reach the pipeline and the traces (``instrument()`` itself; its hooks wait for vLLM)."""
    with Receiver() as metrics_receiver, TraceReceiver() as trace_receiver:
        meter_provider = MeterProvider(
            metric_readers=[
                PeriodicExportingMetricReader(
                    OTLPMetricExporter(endpoint=metrics_receiver.endpoint), export_interval_millis=3_600_000
                )
            ]
        )
        tracer_provider = TracerProvider(resource=Resource.create({"service.name": "users-app"}))
        tracer_provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=trace_receiver.endpoint)))
        instrumentor = VllmAscendInstrumentor()
        instrumentor.instrument(meter_provider=meter_provider, tracer_provider=tracer_provider, skip_dep_check=True)
        try:
            _record()
            recording.flush()
            assert metrics_receiver.counter_totals(R2W.instrument_name, by="vllm.process.role") == {None: 3}
            journey = _journey_exported(traces.tracing())
            (span,) = trace_receiver.spans()
            # Our ids (exemplars name them), the user's resource and processors.
            assert (span.trace_id, span.span_id) == (journey.trace_id, journey.span_id)
            assert span.resource["service.name"] == "users-app"
        finally:
            instrumentor.uninstrument()
            meter_provider.shutdown()
            tracer_provider.shutdown()
    assert pipeline.current() is None or pipeline.current().user_meter is None
    from opentelemetry_instrumentation_vllm_ascend.state import STATE

    assert STATE.meter_provider is None and STATE.tracer_provider is None


def test_a_tracer_provider_that_is_not_the_sdks_is_one_log_line(env, caplog):
    from opentelemetry.trace import NoOpTracerProvider

    traces.use_provider(NoOpTracerProvider())
    assert traces.tracing().exporters == []  # OTEL_TRACES_EXPORTER=none
    assert sum("is not an OpenTelemetry SDK TracerProvider" in r.getMessage() for r in caplog.records) == 1
