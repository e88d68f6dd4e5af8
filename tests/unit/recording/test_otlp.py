"""Push exporters are chosen as the OTel SDK's configurator chooses them: ``OTEL_METRICS_EXPORTER=otlp`` follows
OTEL_EXPORTER_OTLP_METRICS_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL, so ``http/protobuf`` reaches an HTTP collector
(it loaded the gRPC exporter whatever the protocol said); the exporter then honours the endpoint, headers and
compression settings; an unknown protocol is one warning and no exporter, never an exception."""

from __future__ import annotations

import itertools

import pytest

from opentelemetry_instrumentation_vllm_ascend import catalogue, context, environment, recording
from opentelemetry_instrumentation_vllm_ascend.recording import otlp, pipeline
from tests.support.otlp_receiver import Receiver
from tests.support.process import set_process

PROTOCOLS = (None, "grpc", "http/protobuf", " http/protobuf ")
NAMES = ("otlp", "otlp_proto_grpc", "otlp_proto_http", "console")


def _set(monkeypatch, name, value):
    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize(("name", "general", "metrics"), list(itertools.product(NAMES, PROTOCOLS, PROTOCOLS)))
def test_the_exporter_is_the_one_the_sdk_configurator_picks(monkeypatch, name, general, metrics):
    configuration = pytest.importorskip("opentelemetry.sdk._configuration")
    sdk_choice = getattr(configuration, "_get_exporter_entry_point", None)
    if sdk_choice is None:
        pytest.skip("this SDK has no protocol-aware exporter choice")
    _set(monkeypatch, environment.OTLP_PROTOCOL, general)
    _set(monkeypatch, environment.OTLP_METRICS_PROTOCOL, metrics)
    assert otlp.entry_point_name(name) == sdk_choice(name, "metrics")


@pytest.mark.parametrize(
    ("general", "metrics", "expected"),
    [
        (None, None, "otlp_proto_grpc"),
        ("http/protobuf", None, "otlp_proto_http"),
        ("grpc", "http/protobuf", "otlp_proto_http"),  # the signal's own setting first
        ("http/protobuf", "grpc", "otlp_proto_grpc"),
    ],
)
def test_otlp_follows_the_metrics_protocol_then_the_general_one(monkeypatch, general, metrics, expected):
    if expected == "otlp_proto_grpc":
        pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc", reason="the otlp extra's gRPC exporter")
    _set(monkeypatch, environment.OTLP_PROTOCOL, general)
    _set(monkeypatch, environment.OTLP_METRICS_PROTOCOL, metrics)
    assert otlp.entry_point_name("otlp") == expected
    monkeypatch.setenv(environment.METRICS_EXPORTER, "otlp")
    (exporter,) = otlp.push_exporters()
    transport = "http" if expected.endswith("http") else "grpc"
    assert type(exporter.inner).__module__ == f"opentelemetry.exporter.otlp.proto.{transport}.metric_exporter"


def test_http_protobuf_reaches_an_http_collector_with_its_headers_and_compression(monkeypatch, tmp_path):
    monkeypatch.delenv(environment.PROMETHEUS_MULTIPROC_DIR, raising=False)
    monkeypatch.setenv(environment.FILES_DIR, str(tmp_path))
    monkeypatch.setenv(environment.METRICS_EXPORTER, "otlp")
    monkeypatch.setenv(environment.OTLP_PROTOCOL, "http/protobuf")
    monkeypatch.delenv(environment.OTLP_METRICS_PROTOCOL, raising=False)
    monkeypatch.setenv(environment.METRIC_EXPORT_INTERVAL, "3600000")  # only explicit flushes
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=team-a")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    with Receiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", receiver.endpoint)
        pipeline.reset()
        set_process("engine_core", "0", "mixed")
        try:
            recording.add(catalogue.RUNNING_TO_WAITING, 3, context.step_labels("decode"))
            recording.flush()
            totals = receiver.counter_totals(
                catalogue.PREFIX + catalogue.RUNNING_TO_WAITING.seed, by="vllm.process.role"
            )
            assert totals == {"engine_core": 3}
            assert receiver.headers and all(h["x-tenant"] == "team-a" for h in receiver.headers)
            assert {h.get("content-encoding") for h in receiver.headers} == {"gzip"}
        finally:
            pipeline.reset()


def test_an_unknown_protocol_is_one_warning_and_no_exporter(monkeypatch, caplog):
    monkeypatch.setenv(environment.METRICS_EXPORTER, "otlp")
    monkeypatch.setenv(environment.OTLP_PROTOCOL, "http/json")
    monkeypatch.delenv(environment.OTLP_METRICS_PROTOCOL, raising=False)
    with caplog.at_level("WARNING"):
        assert otlp.push_exporters() == []
        assert otlp.push_exporters() == []
    lines = [r.getMessage() for r in caplog.records if "http/json" in r.getMessage()]
    assert len(lines) == 1 and "unsupported OTLP protocol" in lines[0]
