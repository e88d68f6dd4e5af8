"""The catalogue: names, Views, and docs generated from it."""

import os
import re

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from opentelemetry_instrumentation_vllm_ascend import catalogue, targets
from opentelemetry_instrumentation_vllm_ascend.cli import docgen
from opentelemetry_instrumentation_vllm_ascend.recording import pipeline
from opentelemetry_instrumentation_vllm_ascend.wiring import declarative

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_docs_metrics_md_is_current():
    with open(os.path.join(ROOT, "docs", "metrics.md")) as f:
        committed = f.read()
    assert committed == docgen.render_metrics_md(), (
        "docs/metrics.md is stale: run python -m opentelemetry_instrumentation_vllm_ascend.cli.docgen > docs/metrics.md"
    )


def test_exposed_names_follow_the_seed_names():
    assert [s.prometheus_name for s in catalogue.CATALOGUE[:4]] == [
        "vllm_profiling_running_to_waiting_count_total",
        "vllm_profiling_scheduler:recompute_events_total",
        "vllm_profiling_block_allocate_failures_total",
        "vllm_profiling_rpc_errors_total",
    ]
    for spec in catalogue.CATALOGUE:
        if spec.name:  # the GenAI semantic conventions' metrics: their own names, OTel→Prometheus on /metrics
            assert spec.exposed_name == spec.seed == spec.instrument_name
            assert re.fullmatch(r"gen_ai\.server\.[a-z_.]+", spec.name)
            assert spec.prometheus_name == spec.name.replace(".", "_") + "_seconds"
        else:
            assert re.fullmatch(r"vllm_profiling_[a-z0-9_:]+", spec.exposed_name)
        assert ":" not in spec.instrument_name
        assert spec.kind in (catalogue.COUNTER, catalogue.HISTOGRAM, catalogue.GAUGE)
        if spec.kind == catalogue.HISTOGRAM:
            assert spec.buckets and list(spec.buckets) == sorted(spec.buckets)


def test_views_rename_every_instrument_and_drop_foreign_labels():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], views=pipeline.views())
    meter = provider.get_meter(catalogue.SCOPE_NAME)
    for spec in catalogue.CATALOGUE:
        attrs = {label: "x" for label in targets.all_labels(spec)}
        attrs["request_id"] = "must-not-appear"  # never label with request ids
        if spec.kind == catalogue.COUNTER:
            meter.create_counter(spec.instrument_name, unit=spec.unit).add(1, attrs)
        elif spec.kind == catalogue.GAUGE:
            meter.create_gauge(spec.instrument_name, unit=spec.unit).set(1, attrs)
        else:
            meter.create_histogram(spec.instrument_name, unit=spec.unit).record(1, attrs)
    metrics = {
        m.name: m for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }
    assert set(metrics) == {s.exposed_name for s in catalogue.CATALOGUE}
    for spec in catalogue.CATALOGUE:
        (point,) = metrics[spec.exposed_name].data.data_points
        assert set(point.attributes) == set(targets.all_labels(spec))
        assert metrics[spec.exposed_name].unit == spec.unit


def test_every_target_feeds_catalogue_metrics_and_has_a_handler():
    for t in targets.TARGETS:
        assert all(seed in catalogue.BY_SEED for seed in t.feeds)
        if t.kind == "future_class":
            assert declarative.load_handler(t) is None
        else:
            assert declarative.load_handler(t).name
