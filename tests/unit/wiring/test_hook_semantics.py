"""OTEL_VLLM_ASCEND_HOOK_SEMANTICS: what a hook file's metrics record where ms-service-metric records otherwise
(docs/configuration.md "Recording semantics"). The same file and the same calls under both settings, the values
computed by hand from ms-service-metric's rules: handlers/builtin.py ``_record_metrics_common`` (a ``timer``
records the duration, its ``expr`` unused; any other type records ``expr``'s value, 1 where it raises or where
there is none) and metrics/metrics_manager.py ``record_metric`` (a counter adds ``value if value > 0 else 1``),
ms-service-metric 26.0.0 and master (GitHub mirror Cztk5380/msserviceprofiler)."""

from __future__ import annotations

import logging
import types

import pytest
from packaging.version import Version

from opentelemetry_instrumentation_vllm_ascend import catalogue, environment
from opentelemetry_instrumentation_vllm_ascend.wiring import installer, userfile

P = catalogue.PREFIX
LABELS = {"dp": "0", "role": "mixed", "phase": "unknown"}
MODULE = "fake_semantics_module"

FILE = f"""- symbol: {MODULE}:C.add_request
  metrics:
    - {{name: s:calls, type: counter}}
    - {{name: s:n, type: histogram, expr: request.n, buckets: [0, 8]}}
    - {{name: s:delta, type: counter, expr: request.n - 2}}
    - {{name: s:bad, type: histogram, expr: request.missing, buckets: [0, 1, 8]}}
    - {{name: s:bad_count, type: counter, expr: request.missing}}
    - {{name: s:plain, type: histogram, buckets: [0, 1, 8]}}
    - {{name: s:timed, type: timer, expr: request.n * 1000}}
    - {{name: s:text, type: histogram, expr: request.k}}
    - {{name: s:nan, type: counter, expr: request.f}}
"""
GAUGE = f"- symbol: {MODULE}:C.add_request\n  metrics: [{{name: s:gauge, type: gauge}}]\n"
#: The calls: request.n, request.k, request.f.
CALLS = ((3, "a", float("nan")), (0, "a", float("nan")), (5, "b", float("nan")))


class C:
    def add_request(self, request):
        return request.n


@pytest.fixture
def semantics(monkeypatch):
    monkeypatch.setenv(environment.CONFIG_MODULES, MODULE)

    def set_(value):
        if value is None:
            monkeypatch.delenv(environment.HOOK_SEMANTICS, raising=False)
        else:
            monkeypatch.setenv(environment.HOOK_SEMANTICS, value)

    return set_


def install(tmp_path, text):
    path = tmp_path / "hooks.yaml"
    path.write_text(text)
    (entry,) = userfile.load([str(path)], Version("0.32.0"), None)
    assert entry.status == userfile.LOADED, entry.reason
    cls = type("C", (C,), {"add_request": C.add_request})
    hooks = installer.Installer(table=(), ready_points=())
    module = types.ModuleType(MODULE)
    module.C = cls
    hooks.file_pending.add(entry.key)
    hooks.active = True
    hooks._apply(module, entries=[entry])
    assert entry.status == userfile.LOADED, entry.reason
    for m in entry.measures:
        catalogue.EXTRA.setdefault(m.metric, m.spec)
    return hooks, cls


def run(tmp_path, text):
    hooks, cls = install(tmp_path, text)
    try:
        for n, k, f in CALLS:
            assert cls().add_request(types.SimpleNamespace(n=n, k=k, f=f)) == n
    finally:
        hooks.uninstall()


def errors(metrics, metric):
    hook = f"{MODULE}:C.add_request"
    return metrics.value(P + "hook_errors", process="engine_core", dp="0", role="mixed", hook=hook, where=metric)


def test_default_semantics_skip_a_failing_sample_and_a_histogram_without_expr_records_the_duration(
    tmp_path, metrics, semantics
):
    semantics(None)
    run(tmp_path, FILE)
    value = lambda name: metrics.value(P + name, **LABELS)  # noqa: E731
    assert value("s:calls") == 3
    assert value("s:n")[:3] == (3, 8, (1, 2, 0))  # 3 + 0 + 5: 0 in <= 0; 3 and 5 in <= 8; none above
    assert value("s:delta") == 4 and errors(metrics, "s:delta") == 1  # 1 + (-2: an error, skipped) + 3
    assert value("s:bad") is None and errors(metrics, "s:bad") == 3
    assert value("s:bad_count") is None and errors(metrics, "s:bad_count") == 3
    count, seconds, _ = value("s:plain")
    assert count == 3 and 0 <= seconds < 1  # the calls' durations
    assert value("s:timed")[:2] == (3, 8000)  # 3000 + 0 + 5000: a timer with expr records the expr
    assert value("s:text") is None and errors(metrics, "s:text") == 3  # not a number
    assert value("s:nan") is None and errors(metrics, "s:nan") == 3


def test_ms_service_metric_semantics_record_1_where_it_does(tmp_path, metrics, semantics):
    semantics("MS-Service-Metric")
    run(tmp_path, FILE)
    value = lambda name: metrics.value(P + name, **LABELS)  # noqa: E731
    assert value("s:calls") == 3
    assert value("s:n")[:3] == (3, 8, (1, 2, 0))  # a value that computes records the same
    assert value("s:delta") == 5 and errors(metrics, "s:delta") is None  # 1 + (-2 <= 0: adds 1) + 3
    # A failing expression records 1 (and still counts as a failure): count 3, sum 3, in the bucket <= 1.
    assert value("s:bad")[:3] == (3, 3, (0, 3, 0, 0)) and errors(metrics, "s:bad") == 3
    assert value("s:bad_count") == 3 and errors(metrics, "s:bad_count") == 3
    assert value("s:plain")[:3] == (3, 3, (0, 3, 0, 0))  # no expr: 1 per call
    count, seconds, _ = value("s:timed")
    assert count == 3 and 0 <= seconds < 1  # the duration; the timer's expr is not used
    assert value("s:text") is None and errors(metrics, "s:text") == 3  # not a number: skipped, as there
    assert value("s:nan") == 3  # NaN > 0 is false: adds 1


def test_a_gauge_without_expr_is_rejected_by_default_and_sets_1_under_ms_service_metric(tmp_path, metrics, semantics):
    semantics(None)
    path = tmp_path / "g.yaml"
    path.write_text(GAUGE)
    (entry,) = userfile.load([str(path)], Version("0.32.0"), None)
    assert entry.status == userfile.REJECTED and "a gauge needs expr" in entry.reason
    semantics("ms-service-metric")
    run(tmp_path, GAUGE)
    assert metrics.value(P + "s:gauge", **LABELS) == 1


def test_the_specs_say_what_is_recorded(tmp_path, semantics):
    """A histogram without expr is a duration (unit s) by default, a count of 1s (unit 1) under ms-service-metric;
    a timer with expr the reverse."""
    path = tmp_path / "hooks.yaml"
    path.write_text(FILE)
    for setting, plain, timed in ((None, "s", "1"), ("ms-service-metric", "1", "s")):
        semantics(setting)
        (entry,) = userfile.load([str(path)], Version("0.32.0"), None, log=False)
        by = {m.metric: m for m in entry.measures}
        assert (by["s:plain"].spec.unit, by["s:timed"].spec.unit) == (plain, timed), setting
        assert all(m.incumbent is (setting is not None) for m in entry.measures)


def test_an_unknown_setting_is_the_default_with_one_warning(semantics, caplog):
    semantics("incumbent")
    with caplog.at_level(logging.WARNING):
        assert environment.hook_semantics() == environment.DEFAULT_SEMANTICS
        assert environment.hook_semantics() == environment.DEFAULT_SEMANTICS
    assert [r.getMessage() for r in caplog.records].count(
        "opentelemetry-instrumentation-vllm-ascend: OTEL_VLLM_ASCEND_HOOK_SEMANTICS='incumbent' is neither default "
        "nor ms-service-metric; using default"
    ) == 1


def test_the_differences_said_follow_the_setting(tmp_path, semantics):
    """``check --config`` says the value-rule differences only where they hold: under the default semantics,
    not under ms-service-metric's (which records as the incumbent does)."""
    path = tmp_path / "hooks.yaml"
    path.write_text(FILE)
    said = {}
    for value in (None, environment.INCUMBENT_SEMANTICS):
        semantics(value)
        (entry,) = userfile.load([str(path)], Version("0.32.0"), None, log=False)
        said[value] = [d for d in entry.differences if "ms-service-metric" in d]
    assert any("s:plain: a histogram without expr records the call's duration" in d for d in said[None])
    assert any("s:delta: an expr value of 0 adds nothing" in d for d in said[None])
    assert said[environment.INCUMBENT_SEMANTICS] == []
