"""The OTLP logs sink of the step records (recording/step_sinks.py): each record the real stream builds reaches a
real OTLP/HTTP receiver as one log record (event ``vllm_ascend.step``), its attributes the record's fields with
dotted keys — the values the JSON-lines sink wrote for the same records, and the ones the steps were given — on
the metrics' resource; an exporter that cannot be built is one log line and the file sink goes on; the batch
processor's queue never drops unseen (``otlp_full``), and a failed export is counted (``otlp_error``)."""

from __future__ import annotations

import json
import logging
import sys
import threading

import pytest

from opentelemetry_instrumentation_vllm_ascend import environment
from opentelemetry_instrumentation_vllm_ascend.recording import pipeline, step_records, step_sinks
from tests.support.otlp_logs import LogsReceiver
from tests.support.process import set_process
from tests.support.step_feed import feed

#: (decode requests, new requests as (prompt, chunk), queued, wall seconds): a decode, a prefill, a mixed step.
STEPS = (
    (4, (), 0, 0.0078125),
    (0, ((100, 64), (30, 30)), 2, 0.03125),
    (3, ((40, 16),), 1, 0.015625),
    (5, (), 0, 0.00390625),
)


@pytest.fixture
def logs_env(monkeypatch, tmp_path):
    for name in (
        environment.STEPS_ZMQ,
        environment.OTLP_PROTOCOL,
        "OTEL_RESOURCE_ATTRIBUTES",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_BLRP_MAX_QUEUE_SIZE",
        "OTEL_BLRP_MAX_EXPORT_BATCH_SIZE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(environment.FILES_DIR, str(tmp_path))
    monkeypatch.setenv(environment.METRICS_EXPORTER, "none")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "steps-under-test")
    monkeypatch.setenv(environment.STEPS_OTLP_LOGS, "true")
    monkeypatch.setenv(environment.STEPS_FILE, str(tmp_path / "steps-{dp}.jsonl"))
    monkeypatch.setenv("OTEL_BLRP_SCHEDULE_DELAY", "50")
    set_process("engine_core", "0", "mixed")
    pipeline.reset()  # the resource from this environment
    yield monkeypatch
    step_records.close()
    pipeline.reset()


def _run(stream) -> None:
    stream.open_sinks()
    for counter, (decode, prefill, queued, wall) in enumerate(STEPS):
        feed(stream, counter, 1024.0 + counter, wall, decode, prefill, queued)
    stream.drain()
    step_records.close()


def test_each_record_is_one_otlp_log_record_with_the_records_values(logs_env, tmp_path):
    with LogsReceiver() as receiver:
        logs_env.setenv(environment.OTLP_PROTOCOL, "grpc")  # only the logs signal's own settings reach it
        logs_env.setenv(environment.OTLP_LOGS_PROTOCOL, "http/protobuf")
        logs_env.setenv("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", receiver.endpoint)
        stream = step_records.configure()
        assert stream is not None and stream.otlp_logs
        _run(stream)
        logs = receiver.logs()
    written = [json.loads(line) for line in (tmp_path / "steps-0.jsonl").read_text().splitlines()]
    assert len(written) == len(STEPS) == len(logs)
    assert [r.event_name for r in logs] == ["vllm_ascend.step"] * len(STEPS)
    assert [r.attributes for r in logs] == [step_sinks.flatten(r) for r in written]
    # The values the steps were given, independently of the record builder.
    by_counter = {r.attributes["counter_id"]: r for r in logs}
    assert sorted(by_counter) == list(range(len(STEPS)))
    for counter, (decode, prefill, queued, wall) in enumerate(STEPS):
        a = by_counter[counter].attributes
        assert a["wall_time"] == wall
        assert a["scheduled_requests.num_decode_requests"] == decode
        assert a["scheduled_requests.sum_decode_kv_tokens"] == 10 * decode
        assert a["scheduled_requests.num_prefill_requests"] == len(prefill)
        assert a["scheduled_requests.sum_prefill_tokens"] == sum(chunk for _, chunk in prefill)
        assert a["queued_requests.num_prefill_requests"] == queued
        assert a["queued_requests.sum_prefill_tokens"] == 8 * queued
        assert a["otel_vllm_ascend.sum_decode_tokens"] == decode
        assert a["otel_vllm_ascend.dp"] == "0" and a["dp_rank"] == 0
        assert by_counter[counter].time_unix_nano == int(a["otel_vllm_ascend.start_time_unix"] * 1e9)
    assert by_counter[1].attributes["scheduled_requests.var_prefill_length"] == 35.0**2  # prompts 100, 30
    assert by_counter[2].attributes["otel_vllm_ascend.phase"] == "mixed"
    assert {r.scope for r in logs} == {"opentelemetry_instrumentation_vllm_ascend"}
    resource = dict(pipeline.get().resource.attributes)
    assert all(r.resource == resource for r in logs) and resource["service.name"] == "steps-under-test"
    assert not any(stream.dropped.values())


def test_an_exporter_that_cannot_be_built_is_one_log_line_and_the_file_goes_on(logs_env, tmp_path, caplog):
    logs_env.setenv(environment.OTLP_LOGS_PROTOCOL, "carrier-pigeon")
    stream = step_records.configure()
    with caplog.at_level(logging.WARNING):
        _run(stream)
    lines = [r.getMessage() for r in caplog.records if "OTLP logs" in r.getMessage()]
    assert len(lines) == 1 and "carrier-pigeon" in lines[0]
    assert len((tmp_path / "steps-0.jsonl").read_text().splitlines()) == len(STEPS)


def test_without_the_sdks_logs_module_the_sink_is_off_in_one_line_and_the_file_goes_on(logs_env, tmp_path, caplog):
    """The logs SDK is still private (``opentelemetry.sdk._logs``, recording/private_otel.py): where a release has
    moved it, the OTLP logs sink is off, one line says why, and the other sinks write every record."""
    logs_env.setitem(sys.modules, "opentelemetry.sdk._logs", None)  # an import of it raises ImportError
    stream = step_records.configure()
    with caplog.at_level(logging.WARNING):
        _run(stream)
    lines = [r.getMessage() for r in caplog.records if "OTLP logs" in r.getMessage()]
    assert len(lines) == 1 and "opentelemetry.sdk._logs" in lines[0], lines
    assert len((tmp_path / "steps-0.jsonl").read_text().splitlines()) == len(STEPS)


class _Held:
    """An exporter whose first export waits until the test releases it (a collector that stopped answering)."""

    def __init__(self, result: str = "SUCCESS") -> None:
        from opentelemetry.sdk._logs.export import LogRecordExportResult

        self.release = threading.Event()
        self.result = LogRecordExportResult[result]
        self.exported: list = []

    def export(self, batch):
        self.release.wait(10)
        self.exported.extend(batch)
        return self.result

    def shutdown(self):
        pass

    def force_flush(self, timeout_millis=30_000):
        return True


def _sink_run(logs_env, exporter, n: int):
    logs_env.delenv(environment.STEPS_FILE)
    logs_env.setenv("OTEL_BLRP_MAX_QUEUE_SIZE", "4")
    logs_env.setenv("OTEL_BLRP_MAX_EXPORT_BATCH_SIZE", "2")
    stream = step_records.configure()
    sink = step_sinks.OtlpLogsSink(stream, exporter=exporter)
    stream.sinks.append(sink)
    for counter in range(n):
        feed(stream, counter, 1024.0 + counter, 0.0078125, decode=2)
    stream.drain()
    exporter.release.set()
    step_records.close()
    return stream


def test_a_full_batch_processor_is_counted_never_dropped_unseen(logs_env, metrics):
    exporter = _Held()
    stream = _sink_run(logs_env, exporter, 10)
    assert stream.dropped["otlp_full"] == 6 and len(exporter.exported) == 4
    assert [r.log_record.attributes["counter_id"] for r in exporter.exported] == [0, 1, 2, 3]
    step_records.STATE.step_stream = stream
    step_records.export_drops()
    step_records.STATE.step_stream = None
    assert metrics.points()["vllm_profiling_step_record_dropped"] == {
        (("dp", "0"), ("reason", "otlp_full"), ("role", "mixed")): 6
    }


def test_a_failed_export_is_counted(logs_env):
    exporter = _Held("FAILURE")
    stream = _sink_run(logs_env, exporter, 3)
    assert stream.dropped["otlp_error"] == 3 and stream.dropped["otlp_full"] == 0
