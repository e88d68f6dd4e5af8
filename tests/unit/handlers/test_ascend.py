"""vllm-ascend handlers (NPU runner phase, Ascend schedulers, memory, device utilization) on fakes
whose attribute names are the ones tests/contract/test_ascend.py checks against vllm-ascend's source."""

import sys
import types
from types import SimpleNamespace as NS

import pytest

from opentelemetry_instrumentation_vllm_ascend import recording
from opentelemetry_instrumentation_vllm_ascend.handlers import memory, steps
from opentelemetry_instrumentation_vllm_ascend.handlers.scheduler import Schedule
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import SYNC, wrap
from opentelemetry_instrumentation_vllm_ascend.state import STATE
from tests.support.fakes import AscendAttentionState, RecomputeScheduler, npu_runner
from tests.support.process import set_process


@pytest.mark.parametrize(
    "state, phase",
    [
        (AscendAttentionState.PrefillNoCache, "prefill"),
        (AscendAttentionState.PrefillCacheHit, "prefill"),
        (AscendAttentionState.DecodeOnly, "decode"),
        (AscendAttentionState.SpecDecoding, "decode"),
        (AscendAttentionState.ChunkedPrefill, "mixed"),
    ],
)
def test_npu_step_phase_from_attn_state_when_the_output_carries_none(metrics, state, phase):
    runner = npu_runner(state)
    runner.execute_model(NS())  # no phase attribute: the EngineCore was not instrumented
    runner.sample_tokens(None)
    labels = {"dp": "0", "role": "mixed", "phase": phase}
    assert metrics.value("vllm_profiling_worker:model_inference:duration", **labels)[0] == 1
    assert metrics.value("vllm_profiling_executor:model_runner_execute_model:duration", **labels)[0] == 1
    assert metrics.value("vllm_profiling_executor:prepare_inputs:duration", **labels)[0] == 1


def test_npu_attn_state_unreadable_costs_only_the_phase(metrics):
    """An attn_state vllm-ascend changed into something we cannot read (its name raises): the step's phase is
    unknown, but its input preparation, execute_model and inference times are each recorded once; the failed read
    is counted. (Before, the failed read also lost the prepare-inputs duration.)"""

    class Moved:
        @property
        def name(self):
            raise RuntimeError("not an AscendAttentionState any more")

    runner = npu_runner(Moved())
    runner.execute_model(NS())
    runner.sample_tokens(None)
    labels = {"dp": "0", "role": "mixed", "phase": "unknown"}
    assert metrics.value("vllm_profiling_executor:prepare_inputs:duration", **labels)[0] == 1
    assert metrics.value("vllm_profiling_executor:model_runner_execute_model:duration", **labels)[0] == 1
    assert metrics.value("vllm_profiling_worker:model_inference:duration", **labels)[0] == 1
    assert STATE.failures == {("NPUPrepareInputs", "attn_state"): 1}


def test_npu_step_phase_carried_by_the_output_wins(metrics):
    runner = npu_runner(AscendAttentionState.ChunkedPrefill)
    out = NS(**{steps.PHASE_ATTRIBUTE: "prefill"})  # exact, from the EngineCore: a chunked prefill
    runner.execute_model(out)
    runner.sample_tokens(None)
    assert (
        metrics.value("vllm_profiling_worker:model_inference:duration", dp="0", role="mixed", phase="prefill")[0] == 1
    )
    assert metrics.value("vllm_profiling_worker:model_inference:duration", dp="0", role="mixed", phase="mixed") is None


def test_requests_sent_back_for_recompute_are_recompute_events(metrics):
    cls = type("Hooked", (RecomputeScheduler,), {})
    cls.schedule = wrap(RecomputeScheduler.schedule, Schedule(), SYNC)[0]
    sched = cls(recomputed=3)
    sched.schedule()
    step = {"dp": "0", "role": "mixed", "phase": "decode"}
    assert metrics.value("vllm_profiling_scheduler:recompute_events", **step) == 3
    assert metrics.value("vllm_profiling_running_to_waiting_count", **step) is None  # not back to waiting
    sched.recomputed = 0
    sched.schedule()
    assert metrics.value("vllm_profiling_scheduler:recompute_events", **step) == 3


def test_a_subclass_schedule_calling_the_base_is_measured_once(metrics):
    """BalanceScheduler.schedule may return super().schedule(): both are hooked, one step is recorded."""

    class Base(RecomputeScheduler):
        pass

    Base.schedule = wrap(RecomputeScheduler.schedule, Schedule(), SYNC)[0]

    class Balance(Base):
        def schedule(self):
            return super().schedule()

    Balance.schedule = wrap(Balance.schedule, Schedule(), SYNC)[0]
    Balance(recomputed=1).schedule()
    step = {"dp": "0", "role": "mixed", "phase": "decode"}
    assert metrics.value("vllm_profiling_scheduler:duration", **step)[0] == 1
    assert metrics.value("vllm_profiling_scheduler:recompute_events", **step) == 1


def npu_worker(**stored):
    """The attributes NPUWorker stores while profiling and warming up (GiB multiples here)."""
    gib = 1 << 30
    worker = NS(rank=3, cache_config=NS(gpu_memory_utilization=0.9), model_runner=NS(model_memory_usage=2 * gib))
    values = dict(
        init_snapshot=NS(total_memory=64 * gib),
        requested_memory=int(57.6 * gib),
        available_kv_cache_memory_bytes=40 * gib,
        non_torch_memory=gib // 2,
        peak_activation_memory=3 * gib,
        npugraph_memory_bytes=gib // 4,
    )
    values.update(stored)
    for k, v in values.items():
        if v is not None:
            setattr(worker, k, v)
    return worker


def memory_values(metrics):
    return {
        name.split(":")[-1]: series
        for name, series in metrics.points().items()
        if name.startswith("vllm_profiling_engine:memory:")
    }


def test_memory_after_warm_up_in_gib_with_the_workers_rank(metrics):
    class Worker:
        def compile_or_warm_up_model(self):
            return 1.5

    Worker.compile_or_warm_up_model = wrap(Worker.compile_or_warm_up_model, memory.WarmUp(), SYNC)[0]
    worker = npu_worker()
    assert Worker.compile_or_warm_up_model(worker) == 1.5
    labels = (("dp", "0"), ("phase", "all"), ("rank", "3"), ("role", "mixed"))
    got = {k: v[labels] for k, v in memory_values(metrics).items()}
    assert got == {
        "total_gb": 64.0,
        "utilization_ratio": 0.9,
        "reserved_gb": pytest.approx(57.6),
        "weights_gb": 2.0,
        "kvcache_gb": 40.0,
        "non_torch_gb": 0.5,
        "activation_gb": 3.0,
        "graph_gb": 0.25,
    }


def test_memory_values_a_worker_does_not_store_are_absent_not_zero(metrics):
    memory.capture(npu_worker(non_torch_memory=None, npugraph_memory_bytes=None, init_snapshot=None))
    assert set(memory_values(metrics)) == {
        "utilization_ratio",
        "reserved_gb",
        "weights_gb",
        "kvcache_gb",
        "activation_gb",
    }


def test_memory_is_captured_at_the_first_step_when_instrumented_after_warm_up(metrics):
    class Worker:
        calls = 0

        def execute_model(self, scheduler_output):
            Worker.calls += 1
            return "out"

    Worker.execute_model = wrap(Worker.execute_model, memory.LateCapture(), SYNC)[0]
    worker = npu_worker()
    worker.execute_model = types.MethodType(Worker.execute_model, worker)
    assert worker.execute_model(None) == "out"
    assert memory_values(metrics)["kvcache_gb"]
    worker.available_kv_cache_memory_bytes = 0
    worker.execute_model(None)
    labels = (("dp", "0"), ("phase", "all"), ("rank", "3"), ("role", "mixed"))
    assert memory_values(metrics)["kvcache_gb"][labels] == 40.0
    assert Worker.calls == 2


def test_device_utilization_is_observed_at_collection_and_absent_without_a_device(metrics, monkeypatch):
    readings = iter([37.0, 55.0])
    calls = []
    npu = NS(
        is_available=lambda: True,
        is_initialized=lambda: True,
        current_device=lambda: 1,
        utilization=lambda index: calls.append(index) or next(readings),
    )
    monkeypatch.setitem(sys.modules, "torch", NS(npu=npu, cuda=None))
    monkeypatch.setattr(STATE, "observers", [])
    monkeypatch.setattr(STATE, "utilization_observed", False)
    memory.observe_utilization()
    memory.observe_utilization()  # once per process
    key = (("device", "1"), ("dp", "0"), ("phase", "all"), ("role", "mixed"))
    assert metrics.points()["vllm_profiling_npu:utilization"][key] == 37.0
    assert metrics.points()["vllm_profiling_npu:utilization"][key] == 55.0
    assert calls == [1, 1]  # read once per collection, for the process's own device
    # No device (CPU): nothing is exported for the gauge, rather than a 0.
    monkeypatch.setitem(sys.modules, "torch", NS(npu=None, cuda=NS(is_available=lambda: False)))
    assert memory.utilization() == []


@pytest.mark.parametrize("recorder", ["fast", "sdk"])
def test_observable_gauges_work_with_both_recorders(monkeypatch, recorder):
    """recording.observe: read at each collection, with the fast recorder and the OTel SDK alike, and
    registered again when the pipeline is rebuilt (as after a fork)."""
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from opentelemetry_instrumentation_vllm_ascend import environment
    from opentelemetry_instrumentation_vllm_ascend.catalogue import M
    from opentelemetry_instrumentation_vllm_ascend.recording import pipeline
    from tests.conftest import Metrics

    for name in (environment.PROMETHEUS_MULTIPROC_DIR, environment.FILES_DIR, environment.METRICS_EXPORTER):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(environment.RECORDER, recorder)
    monkeypatch.setattr(STATE, "observers", [])
    set_process("worker", "0", "mixed")
    readings = iter([12.0, 34.0, 56.0])
    key = (("device", "7"), ("dp", "0"), ("phase", "all"), ("role", "mixed"))
    try:
        reader = InMemoryMetricReader()
        pipeline.reset(extra_readers=[reader])
        recording.observe(M["npu:utilization"], lambda: [(("0", "mixed", "all", "7"), next(readings))])
        assert Metrics(reader).points()["vllm_profiling_npu:utilization"][key] == 12.0
        assert Metrics(reader).points()["vllm_profiling_npu:utilization"][key] == 34.0
        reader = InMemoryMetricReader()
        pipeline.reset(extra_readers=[reader])
        pipeline.get()  # a new pipeline (as after a fork, on the process's first recording): observed too
        assert Metrics(reader).points()["vllm_profiling_npu:utilization"][key] == 56.0
    finally:
        pipeline.reset()
