"""The GenAI semantic conventions' server metrics (gen_ai.server.*), from real vLLM stats objects
(IterationStats, RequestStateStats, FinishReason) through the real wrapper, recorded by both recorders into
the real OTel SDK reader, encoded as OTLP, and written to /metrics files read by prometheus_client. Every
value is a binary fraction set on the stats objects: sums and bucket counts are exact."""

from types import SimpleNamespace as NS

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from opentelemetry_instrumentation_vllm_ascend import catalogue, context, environment
from opentelemetry_instrumentation_vllm_ascend.handlers import api
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import SYNC, wrap
from opentelemetry_instrumentation_vllm_ascend.recording import pipeline
from opentelemetry_instrumentation_vllm_ascend.recording.files_reader import FilesCollector
from opentelemetry_instrumentation_vllm_ascend.recording.files_writer import FilesExporter
from opentelemetry_instrumentation_vllm_ascend.state import STATE
from tests.conftest import Metrics

pytest.importorskip("vllm")

from vllm.v1.engine import FinishReason  # noqa: E402
from vllm.v1.metrics.stats import IterationStats, RequestStateStats  # noqa: E402

from tests.support.process import set_process

DURATION = "gen_ai.server.request.duration"
TPOT = "gen_ai.server.time_per_output_token"
TTFT = "gen_ai.server.time_to_first_token"

#: (request id, finish reason, arrival, first token latency, first/last token timestamps, generated tokens);
#: every IterationStats is stamped at 10.5, so e2e = 10.5 - arrival.
REQUESTS = (
    ("chatcmpl-abc", FinishReason.STOP, 10.0, 0.125, 3.0, 3.75, 4),  # e2e 0.5, TPOT 0.75 / 3 = 0.25
    ("cmpl-xyz-0", FinishReason.LENGTH, 8.5, 0.0625, 4.0, 4.0, 1),  # e2e 2.0, one token: no TPOT
    ("cmpl-xyz-1", FinishReason.ABORT, 10.25, 0.03125, 5.0, 5.5, 3),  # e2e 0.25, failed: duration only
    ("resp_1", FinishReason.STOP, 9.5, 0.5, 6.0, 6.5, 2),  # e2e 1.0, TPOT 0.5; not an OpenAI completion id
    ("chatcmpl-def", FinishReason.ERROR, 10.375, 0.0, 0.0, 0.0, 0),  # e2e 0.125, failed before a token
)


def counts(bounds, *values):
    out = [0] * (len(bounds) + 1)
    for v in values:
        out[next((i for i, b in enumerate(bounds) if v <= b), len(bounds))] += 1
    return tuple(out)


def attrs(operation, error=None, model="tiny"):
    out = {"gen_ai.operation.name": operation, "gen_ai.provider.name": "vllm", "gen_ai.request.model": model}
    if error:
        out["error.type"] = error
    return tuple(sorted(out.items()))


@pytest.fixture(params=["fast", "sdk"])
def reader(request, monkeypatch):
    for name in (environment.PROMETHEUS_MULTIPROC_DIR, environment.FILES_DIR, environment.METRICS_EXPORTER):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(environment.RECORDER, request.param)
    r = InMemoryMetricReader()
    pipeline.reset(extra_readers=[r])
    saved = (context.PROCESS.process, context.PROCESS.dp, context.PROCESS.role)
    set_process("api_server", "0", "mixed")
    api.set_served_model(NS(model_config=NS(served_model_name="tiny")))
    yield r
    pipeline.reset()
    set_process(*saved)
    api.set_served_model(None)


def finish_all(requests=REQUESTS):
    """Each request finished through the wrapped real ``update_from_finished_request``, as vLLM's output
    processor calls it (keywords); returns vLLM's own FinishedRequestStats."""
    update = wrap(IterationStats.update_from_finished_request, api.FinishedRequest(), SYNC)[0]
    finished = []
    for request_id, reason, arrival, ttft, first_ts, last_ts, tokens in requests:
        stats = IterationStats()
        stats.iteration_timestamp = 10.5
        req = RequestStateStats(arrival_time=arrival)
        req.first_token_latency, req.first_token_ts, req.last_token_ts = ttft, first_ts, last_ts
        req.num_generation_tokens = tokens
        update(
            stats,
            finish_reason=reason,
            request_id=request_id,
            num_prompt_tokens=7,
            max_tokens_param=None,
            req_stats=req,
            num_cached_tokens=0,
        )
        finished += stats.finished_requests
    return finished


def test_values_attributes_and_buckets_are_the_conventions(reader):
    finished = finish_all()
    points = Metrics(reader).points()
    assert set(points) == {DURATION, TPOT, TTFT}
    d, p, t = catalogue.GENAI_REQUEST_SECONDS, catalogue.GENAI_TPOT_SECONDS, catalogue.GENAI_TTFT_SECONDS
    assert points[DURATION] == {
        attrs("chat"): (1, 0.5, counts(d, 0.5)),
        attrs("text_completion"): (1, 2.0, counts(d, 2.0)),
        attrs("text_completion", "abort"): (1, 0.25, counts(d, 0.25)),
        attrs("_OTHER"): (1, 1.0, counts(d, 1.0)),
        attrs("chat", "error"): (1, 0.125, counts(d, 0.125)),
    }
    assert points[TTFT] == {
        attrs("chat"): (1, 0.125, counts(t, 0.125)),
        attrs("text_completion"): (1, 0.0625, counts(t, 0.0625)),
        attrs("_OTHER"): (1, 0.5, counts(t, 0.5)),
    }
    assert points[TPOT] == {
        attrs("chat"): (1, 0.25, counts(p, 0.25)),
        attrs("_OTHER"): (1, 0.5, counts(p, 0.5)),
    }
    # The duration is vLLM's own e2e latency of each request, the TPOT its mean time per output token.
    assert sorted(f.e2e_latency for f in finished) == sorted(v[1] for v in points[DURATION].values())
    succeeded = [f for f in finished if str(f.finish_reason) not in ("abort", "error")]
    assert sorted(f.mean_time_per_output_token for f in succeeded if f.mean_time_per_output_token) == [0.25, 0.5]
    data = reader.get_metrics_data()
    for metric in data.resource_metrics[0].scope_metrics[0].metrics:
        assert metric.unit == "s"
        bounds = {TTFT: t, TPOT: p, DURATION: d}[metric.name]
        assert all(tuple(point.explicit_bounds) == bounds for point in metric.data.data_points)


def test_no_model_name_before_the_async_llm_is_built(reader):
    api.set_served_model(None)
    finish_all(REQUESTS[:1])
    ((key, (count, total, _)),) = Metrics(reader).points()[TTFT].items()
    assert key == (("gen_ai.operation.name", "chat"), ("gen_ai.provider.name", "vllm"))  # no model: no attribute
    assert (count, total) == (1, 0.125)


def test_served_model_name_of_a_real_model_config_shape():
    api.set_served_model(NS(model_config=NS(served_model_name=["first", "alias"])))
    assert STATE.served_model == "first"
    api.set_served_model(NS())
    assert STATE.served_model is None


def test_operation_from_vllms_request_id_prefixes():
    assert api.genai_operation("chatcmpl-0f3a") == "chat"
    assert api.genai_operation("cmpl-0f3a-2") == "text_completion"
    for other in ("resp_0f3a", "0", None, "embd-1", "chat-1"):
        assert api.genai_operation(other) == "_OTHER"


def test_otlp_carries_the_conventions_names_and_dotted_attributes(reader):
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    finish_all()
    request = ExportMetricsServiceRequest.FromString(encode_metrics(reader.get_metrics_data()).SerializeToString())
    metrics = {m.name: m for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert set(metrics) == {DURATION, TPOT, TTFT}
    chat = [
        p
        for p in metrics[TTFT].histogram.data_points
        if {kv.key: kv.value.string_value for kv in p.attributes}.get("gen_ai.operation.name") == "chat"
    ]
    (point,) = chat
    assert {kv.key: kv.value.string_value for kv in point.attributes} == dict(attrs("chat"))
    assert (point.count, point.sum, tuple(point.explicit_bounds)) == (1, 0.125, catalogue.GENAI_TTFT_SECONDS)


def scrape(directory) -> dict:
    registry = CollectorRegistry()
    registry.register(FilesCollector(str(directory)))
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_metrics_endpoint_only_with_the_switch_and_under_prometheus_names(reader, tmp_path, monkeypatch):
    finish_all()
    data = reader.get_metrics_data()
    monkeypatch.delenv(environment.GENAI_PROMETHEUS, raising=False)
    (tmp_path / "off").mkdir()
    FilesExporter(str(tmp_path / "off")).export(data)  # default: off
    assert not any(name.startswith("gen_ai") for name, _ in scrape(tmp_path / "off"))

    monkeypatch.setenv(environment.GENAI_PROMETHEUS, "true")
    (tmp_path / "on").mkdir()
    FilesExporter(str(tmp_path / "on")).export(data)
    samples = scrape(tmp_path / "on")
    labels = (
        ("gen_ai_operation_name", "chat"),
        ("gen_ai_provider_name", "vllm"),
        ("gen_ai_request_model", "tiny"),
    )
    assert samples[("gen_ai_server_time_to_first_token_seconds_count", labels)] == 1
    assert samples[("gen_ai_server_time_to_first_token_seconds_sum", labels)] == 0.125
    assert samples[("gen_ai_server_time_to_first_token_seconds_bucket", labels + (("le", "0.1"),))] == 0
    assert samples[("gen_ai_server_time_to_first_token_seconds_bucket", labels + (("le", "0.25"),))] == 1
    aborted = tuple(sorted((("error_type", "abort"),) + labels[1:] + (("gen_ai_operation_name", "text_completion"),)))
    assert samples[("gen_ai_server_request_duration_seconds_count", aborted)] == 1
    assert samples[("gen_ai_server_request_duration_seconds_sum", aborted)] == 0.25
    assert sum(v for (n, _), v in samples.items() if n == "gen_ai_server_time_per_output_token_seconds_count") == 2
