"""OTEL_VLLM_ASCEND_DISABLED_METRICS: a hook feeding only disabled metrics is not installed; other
disabled metrics are not recorded; hooks others depend on stay."""

import pytest

from opentelemetry_instrumentation_vllm_ascend import catalogue, context, environment, recording, targets
from opentelemetry_instrumentation_vllm_ascend.recording import pipeline
from opentelemetry_instrumentation_vllm_ascend.wiring.installer import DISABLED, RESOLVED, check, gate_of


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


def test_the_output_loop_budget_is_disabled_with_its_start_gauge(metrics, disabled):
    """``api_server:output_loop_stage_*``: the API server's boundary is a no-op, and whatever its clock
    holds is not recorded, neither the seconds nor the start gauge; get_output_async's row stays (it gives
    output_processor_duration & co. their engine)."""
    from opentelemetry_instrumentation_vllm_ascend.handlers import budget

    disabled("api_server:output_loop_stage_*")
    pipeline.get()  # built: a collection reads what the clock holds
    assert budget.boundary(budget.API) is budget.off
    assert budget.boundary(budget.ENGINE) == budget.ENGINE.to
    budget.API.to(budget.WAIT_ENGINE, 10.0)
    budget.API.to(budget.PROCESS, 10.5)
    recording.flush()
    points = metrics.points()
    assert catalogue.PREFIX + "api_server:output_loop_stage_seconds" not in points
    assert catalogue.PREFIX + "api_server:output_loop_stage_start_time" not in points
    pytest.importorskip("vllm")
    status = {row["symbol"]: row["status"] for row in check()}
    assert status["vllm.v1.engine.core_client:AsyncMPClient.get_output_async"] == RESOLVED


def test_kv_cache_writes_are_disabled_with_their_row(metrics, disabled):
    from opentelemetry_instrumentation_vllm_ascend.handlers import kv_transfer
    from opentelemetry_instrumentation_vllm_ascend.state import STATE

    disabled("kv_cache:write_bytes")
    pipeline.get()
    STATE.kv_bytes_per_token = 2048
    kv_transfer.kv_writes(5, context.step_labels_with("prefill", "prefill"))
    assert catalogue.PREFIX + "kv_cache:write_bytes" not in metrics.points()
    pytest.importorskip("vllm")
    status = {row["symbol"]: row["status"] for row in check()}
    assert status["vllm.v1.core.sched.scheduler:Scheduler.__init__"] == DISABLED


def test_kv_transfer_pattern_leaves_every_connector_row_unhooked(disabled):
    """``kv_transfer:*``: every KV connector row (ExampleConnector, OffloadingConnector's 0.32+ and 0.23 rows,
    NIXL, Mooncake, vllm-ascend's) is not installed; the KV-cache write row, which feeds kv_cache:*, stays."""
    pytest.importorskip("vllm")
    disabled("kv_transfer:*")
    status = {row["symbol"]: row["status"] for row in check()}
    rows = [t.symbol for t in targets.TARGETS if t.handler.startswith("kv_transfer:") and t.symbol != _SCHEDULER_INIT]
    assert len(rows) >= 20
    assert {symbol: status[symbol] for symbol in rows} == dict.fromkeys(rows, DISABLED)
    for method in ("save_kv_layer", "start_load_kv"):
        assert status[f"{_EXAMPLE}:ExampleConnector.{method}"] == DISABLED
    for method in ("handle_preemptions", "start_kv_transfers", "get_finished"):
        assert status[f"{_OFFLOADING}:OffloadingConnectorWorker.{method}"] == DISABLED
    assert status[_SCHEDULER_INIT] == RESOLVED


_EXAMPLE = "vllm.distributed.kv_transfer.kv_connector.v1.example_connector"
_OFFLOADING = "vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker"
_SCHEDULER_INIT = "vllm.v1.core.sched.scheduler:Scheduler.__init__"


@pytest.mark.parametrize("hooks_stop", [False, True], ids=["pattern", "recording_off"])
def test_a_budget_switched_off_and_on_at_runtime_keeps_its_sum_equal_to_time_since_its_start(
    metrics, monkeypatch, hooks_stop
):
    """``control off engine_core:stage_*`` then ``on`` (or recording off altogether, when no hook runs and
    so no boundary moves): nothing is recorded while off; once on, each stage holds only the seconds it
    gained while on, and the start gauge moved forward by the time off, so the stages still sum to the
    system clock's time since the start gauge."""
    from opentelemetry_instrumentation_vllm_ascend.handlers import budget
    from opentelemetry_instrumentation_vllm_ascend.recording import control
    from tests.support.fakes import Clock

    clock = Clock(100.0)
    monkeypatch.setattr(budget, "perf_counter", clock)
    monkeypatch.setattr(budget, "time", lambda: 1_700_000_000.0 + clock.t - 100.0)  # the same clock, as time()
    engine = budget.ENGINE
    name = catalogue.PREFIX + "engine_core:stage_seconds"
    start = catalogue.PREFIX + "engine_core:stage_start_time"

    def seconds():
        return {dict(k)["stage"]: v for k, v in metrics.points().get(name, {}).items()}

    def at(t, stage=None):
        clock.t = t
        if stage is not None:
            engine.to(stage, t)

    pipeline.get()
    try:
        at(100.0, budget.SCHEDULE)  # the clock starts
        at(101.0, budget.DISPATCH)
        at(101.5)
        recording.flush()
        assert seconds() == {"schedule": 1.0, "dispatch": 0.5}
        at(102.0)
        if hooks_stop:
            control.set_state(False)
        else:
            control.set_state(True, ("engine_core:stage_*",))
        if not hooks_stop:  # the hooks that feed other metrics still move their boundaries
            at(103.0, budget.WAIT_WORKERS)
            at(105.0, budget.UPDATE)
        at(105.5)
        recording.flush()
        assert seconds() == {"schedule": 1.0, "dispatch": 0.5}  # nothing while off
        at(106.0)
        control.set_state(True, ())
        at(107.0, budget.OUTPUT if not hooks_stop else budget.UPDATE)
        at(108.0)
        recording.flush()
        got = seconds()
        if hooks_stop:  # the off time, all in the stage in progress (dispatch), left out
            assert got == {"schedule": 1.0, "dispatch": 1.0 + 1.0, "update": 1.0}
        else:  # each stage's off time left out: update's second after on counts, wait_workers' 2 did not
            assert got == {"schedule": 1.0, "dispatch": 1.0, "update": 1.0, "output": 1.0}
        (started,) = metrics.points()[start].values()
        assert started == 1_700_000_000.0 + 4.0  # moved forward by the 4 s off
        assert sum(got.values()) == budget.time() - started == 4.0
    finally:
        control.set_state(True, ())


@pytest.mark.parametrize("patterns", [None, ("executor:*",)], ids=["recording_off", "pattern"])
def test_values_left_for_later_before_control_off_are_recorded_and_none_taken_while_off(metrics, patterns):
    """Values hooks left for later (``record_later``) were measured while on: ``control off`` (all, or a pattern
    matching them) records them before their metric goes off; what is left for later while off is dropped."""
    from opentelemetry_instrumentation_vllm_ascend.recording import control
    from tests.support.fakes import key, name, record_waiting, step, waiting

    spec = catalogue.M["executor:execute_model:duration"]
    try:
        recording.record_later(spec, 0.25, context.step_labels("decode"))
        recording.record_later(spec, 0.5, context.step_labels("decode"))
        if patterns is None:
            control.set_state(False)
        else:
            control.set_state(True, patterns)
        assert waiting() == []  # recorded at the switch
        recording.record_later(spec, 1.0, context.step_labels("decode"))
        record_waiting()  # made while off: dropped
        assert metrics.points()[name("executor:execute_model:duration")][key(**step("decode"))][:2] == (2, 0.75)
    finally:
        control.set_state(True, ())
