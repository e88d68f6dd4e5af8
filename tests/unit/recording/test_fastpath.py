"""The pre-aggregating fast path gives exactly what the OTel SDK path gives — MetricsData, Prometheus
exposition and OTLP payloads, names/Views included — for the same measurements; and loses nothing
when threads record at once."""

import math
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common._internal.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics import Counter, Histogram
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from prometheus_client import CollectorRegistry, generate_latest

from opentelemetry_instrumentation_vllm_ascend import catalogue, environment
from opentelemetry_instrumentation_vllm_ascend.recording.files_reader import FilesCollector
from opentelemetry_instrumentation_vllm_ascend.recording.files_writer import FilesExporter
from opentelemetry_instrumentation_vllm_ascend.recording.pipeline import Pipeline

HIST = catalogue.MetricSpec(
    seed="test:step:duration",
    kind=catalogue.HISTOGRAM,
    unit="s",
    description="A test timer.",
    buckets=(0.001, 0.01, 0.1, 1.0, 10.0),
)
SPECS = [catalogue.RUNNING_TO_WAITING, catalogue.RPC_ERRORS, catalogue.INSTRUMENTED_PROCESSES, HIST, HIST, HIST]
RECORD_MANY = 4  # the same histogram, several values at once (a scheduling step's per-request scopes)
RECORD_N = 5  # the same histogram, one value n times (equal batch sizes of several steps)
LABELS = {
    catalogue.RUNNING_TO_WAITING.seed: [("0", "mixed", "decode"), ("1", "decode", "prefill")],
    catalogue.RPC_ERRORS.seed: [("0", "mixed", "unknown", "timeout"), ("0", "mixed", "decode", "other")],
    catalogue.INSTRUMENTED_PROCESSES.seed: [("worker", "0", "mixed"), ("engine_core", "1", "prefill")],
    HIST.seed: [("0", "mixed", "decode"), ("0", "mixed", "prefill")],
}


def ops(values):
    return st.one_of(
        st.tuples(st.just(0), st.integers(0, 1), st.integers(1, 5)),  # counter add
        st.tuples(st.just(1), st.integers(0, 1), st.integers(1, 3)),
        st.tuples(st.just(2), st.integers(0, 1), st.integers(0, 4)),  # gauge set
        st.tuples(st.just(3), st.integers(0, 1), values),  # histogram record
        st.tuples(st.just(RECORD_MANY), st.integers(0, 1), st.lists(values, min_size=1, max_size=40)),
        st.tuples(st.just(RECORD_N), st.integers(0, 1), st.tuples(values, st.integers(1, 40))),
    )


# Multiples of 1/1024 up to 20: every partial sum is exact, so any order of addition gives the same
# bits and the two paths must agree bit for bit. Arbitrary floats: sums may differ in the last bits
# (the SDK adds per collection interval, then to the running total; the fast path keeps one total).
EXACT = st.integers(0, 20 * 1024).map(lambda k: k / 1024)
ANY = st.floats(0, 20, allow_nan=False, allow_infinity=False)


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    for name in (environment.FILES_DIR, environment.PROMETHEUS_MULTIPROC_DIR, environment.METRICS_EXPORTER):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(catalogue, "CATALOGUE", catalogue.CATALOGUE + (HIST,))


def apply(pipeline, ops):
    for kind, label_index, value in ops:
        spec = SPECS[kind]
        inst = pipeline.instrument(spec)
        labels = LABELS[spec.seed][label_index]
        if kind == RECORD_MANY:
            inst.record_many(value, labels)
        elif kind == RECORD_N:
            inst.record_n(value[0], value[1], labels)
        elif spec.kind == catalogue.COUNTER:
            inst.add(value, labels)
        elif spec.kind == catalogue.GAUGE:
            inst.set(value, labels)
        else:
            inst.record(value, labels)


def normalized(metrics_data, round_sums=False):
    """MetricsData without timestamps/resource identity, order-independent. ``round_sums``: leave
    histogram sums out (compared by ``histogram_sums`` instead: delta sums of the fast path are
    differences of cumulative sums, which may differ from the SDK's in the last bits)."""
    if metrics_data is None:
        return set()
    out = set()
    for rm in metrics_data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                d = m.data
                for p in d.data_points:
                    attrs = tuple(sorted(p.attributes.items()))
                    if hasattr(p, "bucket_counts"):
                        total = None if round_sums else p.sum
                        value = (p.count, total, tuple(p.bucket_counts), tuple(p.explicit_bounds), p.min, p.max)
                    else:
                        value = p.value
                    out.add(
                        (
                            sm.scope.name,
                            sm.scope.version,
                            m.name,
                            m.description,
                            m.unit,
                            type(d).__name__,
                            getattr(d, "aggregation_temporality", None),
                            getattr(d, "is_monotonic", None),
                            attrs,
                            value,
                        )
                    )
    return out


def histogram_sums(metrics_data):
    out = {}
    for rm in metrics_data.resource_metrics if metrics_data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    if hasattr(p, "bucket_counts"):
                        out[(m.name, tuple(sorted(p.attributes.items())))] = p.sum
    return out


def otlp_bytes(metrics_data):
    """The OTLP protobuf payload with timestamps and per-process resource attributes cleared."""
    request = encode_metrics(metrics_data)
    for rm in request.resource_metrics:
        keep = [kv for kv in rm.resource.attributes if kv.key not in ("service.instance.id", "process.pid")]
        del rm.resource.attributes[:]
        rm.resource.attributes.extend(keep)
        for sm in rm.scope_metrics:
            sm.metrics.sort(key=lambda m: m.name)
            for m in sm.metrics:
                data = getattr(m, m.WhichOneof("data"))
                for p in data.data_points:
                    p.start_time_unix_nano = 0
                    p.time_unix_nano = 0
                points = sorted(data.data_points, key=lambda p: p.SerializeToString())
                del data.data_points[:]
                data.data_points.extend(points)
    return request.SerializeToString(deterministic=True)


def exposition(metrics_data, directory):
    exporter = FilesExporter(str(directory))
    exporter.export(metrics_data)
    registry = CollectorRegistry()
    registry.register(FilesCollector(str(directory)))
    return generate_latest(registry).decode()


def run(recorder, batches, temporality):
    preferred = {Counter: temporality, Histogram: temporality}
    reader = InMemoryMetricReader(preferred_temporality=preferred)
    pipeline = Pipeline(extra_readers=[reader], recorder=recorder)
    results = []
    for ops in batches:
        apply(pipeline, ops)
        results.append(reader.get_metrics_data())
    pipeline.close()
    return results


BATCHES = dict(min_size=1, max_size=3)
TEMPORALITIES = st.sampled_from([AggregationTemporality.CUMULATIVE, AggregationTemporality.DELTA])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(ops(EXACT), max_size=25), **BATCHES), temporality=TEMPORALITIES)
def test_identical_metrics_exposition_and_otlp_payloads(batches, temporality, tmp_path_factory):
    fast = run("fast", batches, temporality)
    sdk = run("sdk", batches, temporality)
    for i, (f, s) in enumerate(zip(fast, sdk)):
        assert normalized(f) == normalized(s), f"collection {i}"
        if s is None:
            continue
        assert otlp_bytes(f) == otlp_bytes(s)
        if temporality == AggregationTemporality.CUMULATIVE:  # /metrics is cumulative
            assert exposition(f, tmp_path_factory.mktemp("fast")) == exposition(s, tmp_path_factory.mktemp("sdk"))


@settings(max_examples=80, deadline=None)
@given(batches=st.lists(st.lists(ops(ANY), max_size=25), **BATCHES), temporality=TEMPORALITIES)
def test_arbitrary_values_agree_up_to_float_rounding_of_sums(batches, temporality):
    fast = run("fast", batches, temporality)
    sdk = run("sdk", batches, temporality)
    for i, (f, s) in enumerate(zip(fast, sdk)):
        assert normalized(f, round_sums=True) == normalized(s, round_sums=True), f"collection {i}"
        fs, ss = histogram_sums(f), histogram_sums(s)
        assert fs.keys() == ss.keys()
        for key in fs:
            assert math.isclose(fs[key], ss[key], rel_tol=1e-12, abs_tol=1e-12), key


def test_histogram_bucket_edges_match_the_sdk():
    """A value equal to a bound belongs to that bound's bucket (le semantics), in both paths."""
    ops = [(3, 0, v) for v in (0.001, 0.0010001, 10.0, 10.5, 0.0)]
    fast, sdk = (
        run("fast", [ops], AggregationTemporality.CUMULATIVE),
        run("sdk", [ops], AggregationTemporality.CUMULATIVE),
    )
    assert normalized(fast[0]) == normalized(sdk[0])
    (point,) = [p for p in normalized(fast[0]) if p[2] == HIST.exposed_name]
    assert point[-1][2] == (2, 1, 0, 0, 1, 1)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.one_of(st.sampled_from(HIST.buckets), EXACT), min_size=1, max_size=80))
def test_record_many_is_record_once_per_value(values):
    """Both of record_many's ways to count buckets (all in one bucket; per value) give the state that
    one record() per value gives, values on bucket bounds included."""
    from opentelemetry_instrumentation_vllm_ascend.recording.fastpath import FastHistogram

    for windows in (False, True):
        one, many = FastHistogram(HIST, windows), FastHistogram(HIST, windows)
        for value in values:
            one.record(value, ("0", "mixed", "decode"))
        many.record_many(values, ("0", "mixed", "decode"))
        assert many.snapshot() == one.snapshot()


@settings(max_examples=200, deadline=None)
@given(value=st.one_of(st.sampled_from(HIST.buckets), st.integers(0, 100), EXACT), n=st.integers(1, 1000))
def test_record_n_is_n_records(value, n):
    """record_n(value, n) gives the state that n record(value) give, on bucket bounds too; its sum
    adds value * n, which equals n additions for the integer values it is used for (and any exact
    binary fraction), and may differ in the last bits otherwise (a bound such as 0.001)."""
    from opentelemetry_instrumentation_vllm_ascend.recording.fastpath import FastHistogram

    for windows in (False, True):
        one, at_once = FastHistogram(HIST, windows), FastHistogram(HIST, windows)
        one.record(0.5, ("0", "mixed", "decode"))
        at_once.record(0.5, ("0", "mixed", "decode"))
        for _ in range(n):
            one.record(value, ("0", "mixed", "decode"))
        at_once.record_n(value, n, ("0", "mixed", "decode"))
        (expected,), (got,) = one.snapshot().values(), at_once.snapshot().values()
        if value in HIST.buckets:
            assert got[1] == pytest.approx(expected[1], rel=1e-12)
            got[1] = expected[1]
        assert got == expected


def test_threads_recording_at_once_lose_nothing():
    reader = InMemoryMetricReader()
    pipeline = Pipeline(extra_readers=[reader], recorder="fast")
    counter = pipeline.instrument(catalogue.RUNNING_TO_WAITING)
    hist = pipeline.instrument(HIST)
    n_threads, n = 8, 20_000
    barrier = threading.Barrier(n_threads)
    snapshots = []

    def worker(i):
        barrier.wait()
        labels = LABELS[catalogue.RUNNING_TO_WAITING.seed][i % 2]
        for k in range(n):
            counter.add(1, labels)
            hist.record(0.005, LABELS[HIST.seed][0])
            if k % 5000 == 0 and i == 0:
                snapshots.append(reader.get_metrics_data())  # collection while others record

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    points = normalized(reader.get_metrics_data())
    by_metric = {}
    for p in points:
        by_metric.setdefault(p[2], {})[p[8]] = p[9]
    r2w = by_metric[catalogue.RUNNING_TO_WAITING.exposed_name]
    assert sorted(r2w.values()) == [n * n_threads // 2, n * n_threads // 2]
    (h,) = by_metric[HIST.exposed_name].values()
    assert h[0] == n * n_threads and h[2] == (0, n * n_threads, 0, 0, 0, 0)
    assert len(snapshots) == 4
    pipeline.close()
