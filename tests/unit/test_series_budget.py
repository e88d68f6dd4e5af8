"""The series budget's opt-in families (catalogue.OPT_IN): off by default as if named in
OTEL_VLLM_ASCEND_DISABLED_METRICS, on where OTEL_VLLM_ASCEND_ENABLED_METRICS names them; documented either way.
(The suite's conftest enables them all; these tests unset the variable.) The budget itself is counted on a real
scrape: tests/e2e/test_catalogue.py::test_default_set_fits_the_series_budget."""

from opentelemetry_instrumentation_vllm_ascend import catalogue, environment, recording
from opentelemetry_instrumentation_vllm_ascend.cli import docgen
from opentelemetry_instrumentation_vllm_ascend.handlers import scopes
from tests.support.fakes import fake_utils
from tests.support.scrape import series_counts


def test_opt_in_families_are_catalogue_histograms_with_a_reason():
    assert set(catalogue.OPT_IN) <= set(catalogue.BY_SEED)
    assert all(why.strip() for why in catalogue.OPT_IN.values())


def test_by_default_exactly_the_opt_in_families_are_off(enabled):
    off = {spec.seed for spec in catalogue.CATALOGUE if environment.metric_disabled(spec.seed)}
    assert off == set(catalogue.OPT_IN)
    assert environment.disabled_metric_patterns() == tuple(catalogue.OPT_IN)


def test_enabled_metrics_names_opt_in_families_by_seed_pattern_or_prefixed_name(enabled):
    enabled("record_function_or_nullcontext, vllm_profiling_engine_core:*")
    assert not environment.metric_disabled("record_function_or_nullcontext")
    assert not environment.metric_disabled("engine_core:process_engine_step:duration")
    assert environment.metric_disabled("total_tokens")
    enabled("*")
    assert not any(environment.metric_disabled(seed) for seed in catalogue.OPT_IN)


def test_disabled_metrics_wins_over_enabled_metrics(enabled, monkeypatch):
    enabled("*")
    monkeypatch.setenv(environment.DISABLED_METRICS, "record_function_or_nullcontext,scheduler:duration")
    assert environment.metric_disabled("record_function_or_nullcontext")
    assert environment.metric_disabled("scheduler:duration")
    assert not environment.metric_disabled("total_tokens")


def test_an_opt_in_family_off_records_nothing_and_on_records(enabled, metrics):
    spec = catalogue.M["total_tokens"]
    labels = ("0", "mixed", "decode", "0")
    recording.record(spec, 7, labels)
    assert spec.exposed_name not in metrics.points()
    enabled("total_tokens")
    recording.control_changed()
    recording.record(spec, 7, labels)
    (value,) = metrics.points()[spec.exposed_name].values()
    assert value[:2] == (1, 7)


def test_docs_mark_each_opt_in_family():
    text = docgen.render_metrics_md()
    for seed in catalogue.OPT_IN:
        row = next(
            line for line in text.splitlines() if line.startswith(f"| `{catalogue.BY_SEED[seed].prometheus_name}` |")
        )
        assert "**opt-in**" in row and f"OTEL_VLLM_ASCEND_ENABLED_METRICS={seed}" in row, seed
    for spec in catalogue.CATALOGUE:
        if spec.seed not in catalogue.OPT_IN:
            row = next(line for line in text.splitlines() if line.startswith(f"| `{spec.prometheus_name}` |"))
            assert "**opt-in**" not in row, spec.seed


def test_series_counts_counts_every_exposed_sample_per_family():
    text = (
        "# TYPE vllm_profiling_x histogram\n"
        'vllm_profiling_x_bucket{dp="0",le="1.0"} 1.0\n'
        'vllm_profiling_x_bucket{dp="0",le="+Inf"} 2.0\n'
        'vllm_profiling_x_count{dp="0"} 2.0\n'
        'vllm_profiling_x_sum{dp="0"} 3.0\n'
        'vllm_profiling_x_bucket{dp="0",rank="1",le="1.0"} 0.0\n'
        'vllm_profiling_x_bucket{dp="0",rank="1",le="+Inf"} 1.0\n'
        'vllm_profiling_x_count{dp="0",rank="1"} 1.0\n'
        'vllm_profiling_x_sum{dp="0",rank="1"} 1.5\n'
        "# TYPE vllm_profiling_c_total counter\n"
        'vllm_profiling_c_total{dp="0"} 4.0\n'
        "# TYPE vllm:other gauge\n"
        "vllm:other 1.0\n"
    )
    assert series_counts(text) == {"vllm_profiling_x": (8, 4), "vllm_profiling_c": (1, 0)}
    assert series_counts(text, "")["vllm:other"] == (1, 0)


def test_with_the_scope_histogram_off_only_the_forward_postprocess_and_sample_scopes_are_timed(enabled):
    """The scopes the worker's forward / kernel-launch durations and its step budget's forward / sample stages are
    measured from stay timed; every other scope (the scheduler's per-request "schedule: allocate_slots" included)
    runs as without us: vLLM's own choice."""
    module = fake_utils()
    patch = scopes.ProfilerScopes().install(module)
    try:
        factory = module._PROFILER_FUNC
        timed = ("gpu_model_runner: forward", "gpu_model_runner: postprocess", "forward", "post process")
        for name in (*timed, "gpu_model_runner: sample", "sample_token"):
            assert isinstance(factory(name), scopes._Scope), name
        for name in ("schedule: allocate_slots", "gpu_model_runner: preprocess", 7):
            assert not isinstance(factory(name), scopes._Scope), name
    finally:
        patch.remove()
    enabled("record_function_or_nullcontext")
    patch = scopes.ProfilerScopes().install(module)
    try:
        assert isinstance(module._PROFILER_FUNC("schedule: allocate_slots"), scopes._Scope)
    finally:
        patch.remove()
