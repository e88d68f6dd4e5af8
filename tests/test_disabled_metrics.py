"""OTEL_VLLM_ASCEND_DISABLED_METRICS: a hook feeding only disabled metrics is not installed; other
disabled metrics are not recorded; hooks others depend on stay."""

import pytest

from opentelemetry_instrumentation_vllm_ascend import catalogue, context, environment, recording
from opentelemetry_instrumentation_vllm_ascend.hooks import targets
from opentelemetry_instrumentation_vllm_ascend.hooks.installer import DISABLED, RESOLVED, check, gate_of


@pytest.fixture
def disabled(monkeypatch):
    def set_(value):
        monkeypatch.setenv(environment.DISABLED_METRICS, value)

    return set_


def test_patterns_match_seed_names_with_or_without_the_prefix(disabled):
    disabled("npu:*, vllm_profiling_record_function_or_nullcontext")
    assert environment.metric_disabled("npu:kernel_launch")
    assert environment.metric_disabled("record_function_or_nullcontext")
    assert not environment.metric_disabled("scheduler:duration")


def test_hooks_feeding_only_disabled_metrics_are_not_installed(disabled):
    pytest.importorskip("vllm")
    disabled("engine_core:*,scheduler:add_request:duration,worker:model_inference:duration,worker:stage_*,npu:*")
    status = {row["symbol"]: row["status"] for row in check()}
    assert status["vllm.v1.engine.core:EngineCore.step"] == DISABLED
    assert status["vllm.v1.engine.core:EngineCoreProc._process_input_queue"] == DISABLED
    assert status["vllm.v1.core.sched.scheduler:Scheduler.add_request"] == DISABLED
    assert status["vllm.v1.worker.gpu_model_runner:GPUModelRunner.sample_tokens"] == DISABLED
    # Context others depend on stays: the step's phase, the process identity.
    assert status["vllm.v1.core.sched.scheduler:Scheduler.schedule"] == RESOLVED
    assert status["vllm.v1.worker.worker_base:WorkerBase.__init__"] == RESOLVED
    schedule = next(t for t in targets.TARGETS if t.symbol.endswith("Scheduler.schedule"))
    disabled(",".join(schedule.feeds))
    assert gate_of(schedule, None, None) is None


def test_disabled_metrics_are_not_recorded(metrics, disabled):
    disabled("scheduler:duration")
    labels = context.step_labels("decode")
    recording.record(catalogue.M["scheduler:duration"], 0.5, labels)
    recording.record(catalogue.M["scheduler:batch_size"], 3, labels)
    points = metrics.points()
    assert "vllm_profiling_scheduler:duration" not in points
    assert points["vllm_profiling_scheduler:batch_size"][(("dp", "0"), ("phase", "decode"), ("role", "mixed"))][0] == 1
