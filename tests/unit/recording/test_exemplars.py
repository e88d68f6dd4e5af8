"""``recording.record_exemplar``: one histogram observation, counted as ``record`` counts it, that becomes its
bucket's exemplar — the same exemplars on the fast path and the SDK path (the SDK's own reservoir), each reader
getting each exemplar once, none with OTEL_METRICS_EXEMPLAR_FILTER=always_off; and on the OTLP wire (real
protobuf decoding) with the trace id, span id and value as recorded, in the bucket the value falls in."""

from __future__ import annotations

from bisect import bisect_left

import pytest
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader

from opentelemetry_instrumentation_vllm_ascend import catalogue, environment, recording
from opentelemetry_instrumentation_vllm_ascend.recording import pipeline
from opentelemetry_instrumentation_vllm_ascend.recording.pipeline import Pipeline
from tests.support.otlp_receiver import Receiver
from tests.support.process import set_process

TTFT = next(spec for spec in catalogue.GENAI_SERVER if spec.exposed_name == "gen_ai.server.time_to_first_token")
CHAT = ("chat", "vllm", "model-a")
TEXT = ("text_completion", "vllm", "model-a")
#: (value, labels, trace id, span id): 128- and 64-bit ids with their top bits set (no sign or width slips).
OFFERS = (
    (0.03, CHAT, 0x8BADF00D_DEADBEEF_01234567_89ABCDEF, 0xF00DFACE_CAFEBABE),
    (0.035, CHAT, 0x0000000A_00000000_00000000_0000000B, 0x1),  # same bucket as the first: replaces it
    (0.3, CHAT, 0xFFFFFFFF_FFFFFFFF_FFFFFFFF_FFFFFFFF, 0xFFFFFFFF_FFFFFFFF),
    (12.0, CHAT, 0x1234, 0x5678),  # the +Inf bucket
    (0.3, TEXT, 0xABCDEF, 0x42),
)


def expected_exemplars(offers, bounds):
    """{(label values, bucket index): (value, trace id, span id)}: the latest offer per series and bucket."""
    out = {}
    for value, labels, trace_id, span_id in offers:
        out[(labels, bisect_left(bounds, value))] = (value, trace_id, span_id)
    return out


def exemplars_of(metrics_data, name, label_names):
    """{(label values, bucket index): (value, trace id, span id)} of ``name``'s points, and the points' counts."""
    found, counts = {}, {}
    for rm in metrics_data.resource_metrics if metrics_data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name != name:
                    continue
                for p in m.data.data_points:
                    labels = tuple(p.attributes[k] for k in label_names)
                    counts[labels] = tuple(p.bucket_counts)
                    for e in p.exemplars:
                        index = bisect_left(list(p.explicit_bounds), e.value)
                        assert (labels, index) not in found, "two exemplars in one bucket"
                        assert e.filtered_attributes == {}
                        found[(labels, index)] = (e.value, e.trace_id, e.span_id)
    return found, counts


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    for name in (
        environment.FILES_DIR,
        environment.PROMETHEUS_MULTIPROC_DIR,
        environment.METRICS_EXPORTER,
        environment.METRICS_EXEMPLAR_FILTER,
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(environment.PROMETHEUS, "false")


def _counts(offers, bounds):
    counts: dict = {}
    for value, labels, *_ in offers:
        per = counts.setdefault(labels, [0] * (len(bounds) + 1))
        per[bisect_left(bounds, value)] += 1
    return {labels: tuple(per) for labels, per in counts.items()}


@pytest.mark.parametrize("recorder", ["fast", "sdk"])
@pytest.mark.parametrize("temporality", [AggregationTemporality.CUMULATIVE, AggregationTemporality.DELTA])
def test_each_bucket_keeps_its_latest_exemplar_once_per_reader(recorder, temporality):
    from opentelemetry.sdk.metrics import Histogram

    first = InMemoryMetricReader(preferred_temporality={Histogram: temporality})
    second = InMemoryMetricReader(preferred_temporality={Histogram: temporality})
    p = Pipeline(extra_readers=[first, second], recorder=recorder)
    try:
        inst = p.instrument(TTFT)
        for value, labels, trace_id, span_id in OFFERS:
            inst.record_exemplar(value, labels, trace_id, span_id)
        inst.record(0.3, CHAT)  # a plain observation: counted, never an exemplar
        bounds = tuple(TTFT.buckets)
        expected = expected_exemplars(OFFERS, bounds)
        counts = _counts(OFFERS + ((0.3, CHAT, 0, 0),), bounds)

        found, got_counts = exemplars_of(first.get_metrics_data(), TTFT.exposed_name, TTFT.labels)
        assert found == expected and got_counts == counts
        # The other reader has its own reservoir: the same exemplars, once.
        assert exemplars_of(second.get_metrics_data(), TTFT.exposed_name, TTFT.labels)[0] == expected
        # Collected once: the next collection has none, until a new offer, which comes alone.
        assert exemplars_of(first.get_metrics_data(), TTFT.exposed_name, TTFT.labels)[0] == {}
        inst.record_exemplar(2.0, TEXT, 99, 98)
        later = {(TEXT, bisect_left(bounds, 2.0)): (2.0, 99, 98)}
        assert exemplars_of(first.get_metrics_data(), TTFT.exposed_name, TTFT.labels)[0] == later
        assert exemplars_of(second.get_metrics_data(), TTFT.exposed_name, TTFT.labels)[0] == later
    finally:
        p.close()


@pytest.mark.parametrize("recorder", ["fast", "sdk"])
def test_always_off_records_the_observation_without_exemplar(monkeypatch, recorder):
    monkeypatch.setenv(environment.METRICS_EXEMPLAR_FILTER, "always_off")
    reader = InMemoryMetricReader()
    p = Pipeline(extra_readers=[reader], recorder=recorder)
    try:
        inst = p.instrument(TTFT)
        for value, labels, trace_id, span_id in OFFERS:
            inst.record_exemplar(value, labels, trace_id, span_id)
        found, counts = exemplars_of(reader.get_metrics_data(), TTFT.exposed_name, TTFT.labels)
        assert found == {} and counts == _counts(OFFERS, tuple(TTFT.buckets))
    finally:
        p.close()


@pytest.mark.parametrize("recorder", ["fast", "sdk"])
def test_record_exemplar_counts_as_record(recorder):
    """The same observations through ``record`` and through ``record_exemplar``: the same points."""
    data = []
    for exemplar in (False, True):
        reader = InMemoryMetricReader()
        p = Pipeline(extra_readers=[reader], recorder=recorder)
        try:
            inst = p.instrument(TTFT)
            for value, labels, trace_id, span_id in OFFERS:
                if exemplar:
                    inst.record_exemplar(value, labels, trace_id, span_id)
                else:
                    inst.record(value, labels)
            md = reader.get_metrics_data()
            data.append(
                {
                    (m.name, tuple(sorted(pt.attributes.items()))): (
                        pt.count,
                        pt.sum,
                        tuple(pt.bucket_counts),
                        pt.min,
                        pt.max,
                    )
                    for rm in md.resource_metrics
                    for sm in rm.scope_metrics
                    for m in sm.metrics
                    for pt in m.data.data_points
                }
            )
        finally:
            p.close()
    assert data[0] == data[1] and data[0]


@pytest.mark.parametrize("recorder", ["fast", "sdk"])
def test_exemplars_on_the_otlp_wire(monkeypatch, recorder):
    """Through the facade (``recording.record_exemplar``), pushed as OTLP/HTTP protobuf and decoded: each
    exemplar's trace id and span id bytes, value and bucket as recorded."""
    monkeypatch.setenv(environment.RECORDER, recorder)
    monkeypatch.setenv(environment.METRICS_EXPORTER, "otlp_proto_http")
    monkeypatch.setenv(environment.METRIC_EXPORT_INTERVAL, "3600000")  # only explicit flushes
    with Receiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", receiver.endpoint)
        pipeline.reset()
        set_process("api_server", "0", "mixed")
        try:
            for value, labels, trace_id, span_id in OFFERS:
                recording.record_exemplar(TTFT, value, labels, trace_id, span_id)
            recording.flush()
            found = {}
            for _resource, metric in receiver._metrics(TTFT.exposed_name):
                for p in metric.histogram.data_points:
                    attrs = {kv.key: kv.value.string_value for kv in p.attributes}
                    labels = tuple(attrs[k] for k in TTFT.labels)
                    for e in p.exemplars:
                        assert len(e.trace_id) == 16 and len(e.span_id) == 8
                        assert e.time_unix_nano > 0 and not e.filtered_attributes
                        index = bisect_left(list(p.explicit_bounds), e.as_double)
                        found[(labels, index)] = (
                            e.as_double,
                            int.from_bytes(e.trace_id, "big"),
                            int.from_bytes(e.span_id, "big"),
                        )
            assert found == expected_exemplars(OFFERS, tuple(TTFT.buckets))
        finally:
            pipeline.reset()
