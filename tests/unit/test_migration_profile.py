"""The migration profile (OTEL_VLLM_ASCEND_ENABLED_METRICS=ms-service-metric): the opt-in families ms-service-metric
records by default, so that its dashboard and files keep their series. The real-server check is
tests/e2e/test_prometheus.py::test_the_incumbents_dashboard_queries_return_series_with_the_migration_profile."""

import re

from opentelemetry_instrumentation_vllm_ascend import catalogue, environment
from tests.support import incumbent_dashboard

PROFILE = catalogue.PROFILES["ms-service-metric"]


def test_the_profile_names_opt_in_families_and_every_one_the_incumbents_dashboard_queries():
    assert set(PROFILE) <= set(catalogue.OPT_IN)
    queried = set()
    for _, expr, _ in incumbent_dashboard.QUERIES:
        for name in re.findall(r"vllm_profiling_([\w:]+?)(?:_bucket|_sum|_count)?\b(?![\w:])", expr):
            queried.add(name)
    assert queried <= set(catalogue.BY_SEED), queried - set(catalogue.BY_SEED)
    assert queried & set(catalogue.OPT_IN) == {"batch_size", "waiting_batch_size", "record_function_or_nullcontext"}
    assert queried & set(catalogue.OPT_IN) <= set(PROFILE)
    # Today the incumbent records every family our series budget makes opt-in (its handlers and v1_metrics.yaml).
    assert set(PROFILE) == set(catalogue.OPT_IN)


def test_the_profile_switches_its_families_on_and_nothing_else_changes(enabled):
    enabled("ms-service-metric")
    assert not any(environment.metric_disabled(seed) for seed in PROFILE)
    assert environment.enabled_metric_patterns() == PROFILE
    enabled(" MS-Service-Metric , total_tokens")  # any case, beside names and patterns
    assert environment.enabled_metric_patterns() == (*PROFILE, "total_tokens")
    assert not any(environment.metric_disabled(seed) for seed in PROFILE)


def test_disabled_metrics_still_wins_over_the_profile(enabled, monkeypatch):
    enabled("ms-service-metric")
    monkeypatch.setenv(environment.DISABLED_METRICS, "record_function_or_nullcontext")
    assert environment.metric_disabled("record_function_or_nullcontext")
    assert not environment.metric_disabled("batch_size")


def test_without_the_profile_its_families_are_off(enabled, monkeypatch):
    monkeypatch.delenv(environment.ENABLED_METRICS, raising=False)
    assert all(environment.metric_disabled(seed) for seed in PROFILE)
