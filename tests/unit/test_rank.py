"""The ``rank`` process label: every series recorded in a worker process carries the worker's global
rank (set by the WorkerBase.__init__ hook), whatever the recorder, on /metrics and over OTLP; series of
processes hosting no worker carry none; handlers never pass it."""

import multiprocessing
import os

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry, generate_latest

from opentelemetry_instrumentation_vllm_ascend import catalogue, context, environment, recording, targets
from opentelemetry_instrumentation_vllm_ascend.catalogue import M
from opentelemetry_instrumentation_vllm_ascend.handlers import memory
from opentelemetry_instrumentation_vllm_ascend.handlers.process import WorkerInit
from opentelemetry_instrumentation_vllm_ascend.recording import pipeline
from opentelemetry_instrumentation_vllm_ascend.recording.files_reader import FilesCollector
from opentelemetry_instrumentation_vllm_ascend.state import STATE
from tests.conftest import Metrics
from tests.support.otlp_receiver import Receiver
from tests.support.process import set_process

WORKER_STEP = M["executor:model_runner_execute_model:duration"]
SCOPES = M["record_function_or_nullcontext"]
SCHEDULER = M["scheduler:duration"]


@pytest.fixture(params=["fast", "sdk"])
def recorder(request, monkeypatch):
    for name in (environment.PROMETHEUS_MULTIPROC_DIR, environment.FILES_DIR, environment.METRICS_EXPORTER):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(environment.RECORDER, request.param)
    monkeypatch.setattr(STATE, "observers", [])
    reader = InMemoryMetricReader()
    pipeline.reset(extra_readers=[reader])
    yield Metrics(reader)
    pipeline.reset()
    set_process("engine_core", "0", "mixed")


def step(phase="decode"):
    return context.step_labels(phase)


def test_worker_series_carry_the_process_rank_and_engine_core_series_none(recorder):
    set_process("worker", "1", "mixed", rank="3")
    recording.record(WORKER_STEP, 0.5, step())
    recording.record_many(SCOPES, [0.1, 0.2], context.step_labels_with("decode", "gpu_model_runner: forward"))
    recording.record_n(M["worker:model_inference:duration"], 0.25, 4, step("prefill"))
    memory.capture(type("W", (), {"rank": 9, "cache_config": type("C", (), {"gpu_memory_utilization": 0.8})})())
    recording.observe(M["npu:utilization"], lambda: [(context.step_labels_with("all", "0"), 42.0)])
    points = recorder.points()
    ((key, (count, total, _)),) = points["vllm_profiling_executor:model_runner_execute_model:duration"].items()
    assert dict(key) == {"dp": "1", "role": "mixed", "phase": "decode", "rank": "3"} and (count, total) == (1, 0.5)
    (scope_key,) = points["vllm_profiling_record_function_or_nullcontext"]
    assert dict(scope_key) == {
        "dp": "1",
        "role": "mixed",
        "phase": "decode",
        "name": "gpu_model_runner: forward",
        "rank": "3",
    }
    (inference_key,) = points["vllm_profiling_worker:model_inference:duration"]
    assert dict(inference_key)["rank"] == "3"
    assert points["vllm_profiling_worker:model_inference:duration"][inference_key][:2] == (4, 1.0)
    # The process's rank, not the worker object's: WorkerInit set it first.
    assert points["vllm_profiling_engine:memory:utilization_ratio"] == {
        (("dp", "1"), ("phase", "all"), ("rank", "3"), ("role", "mixed")): 0.8
    }
    assert points["vllm_profiling_npu:utilization"] == {
        (("device", "0"), ("dp", "1"), ("phase", "all"), ("rank", "3"), ("role", "mixed")): 42.0
    }


def test_a_process_hosting_no_worker_adds_no_rank(recorder):
    set_process("engine_core", "0", "mixed")
    recording.record(SCHEDULER, 0.001, step())
    recording.record(SCOPES, 0.001, context.step_labels_with("decode", "schedule: allocate_slots"))
    recording.process_started()
    points = recorder.points()
    assert list(points["vllm_profiling_scheduler:duration"]) == [(("dp", "0"), ("phase", "decode"), ("role", "mixed"))]
    assert list(points["vllm_profiling_record_function_or_nullcontext"]) == [
        (("dp", "0"), ("name", "schedule: allocate_slots"), ("phase", "decode"), ("role", "mixed"))
    ]
    assert list(points["vllm_profiling_instrumented_processes"]) == [
        (("dp", "0"), ("process", "engine_core"), ("role", "mixed"))
    ]


def test_engine_core_metrics_of_a_worker_hosting_process_stay_without_rank(recorder):
    """UniProcExecutor: the worker (rank 0) lives in the EngineCore process. Its worker metrics carry
    rank 0; the EngineCore's own metrics (not declared with the process label) carry none."""
    set_process("engine_core", "0", "mixed", rank="0")
    recording.record(SCHEDULER, 0.001, step())
    recording.record(WORKER_STEP, 0.01, step())
    recording.add(catalogue.RUNNING_TO_WAITING, 2, step())
    points = recorder.points()
    assert list(points["vllm_profiling_scheduler:duration"]) == [(("dp", "0"), ("phase", "decode"), ("role", "mixed"))]
    assert list(points["vllm_profiling_running_to_waiting_count"]) == [
        (("dp", "0"), ("phase", "decode"), ("role", "mixed"))
    ]
    assert list(points["vllm_profiling_executor:model_runner_execute_model:duration"]) == [
        (("dp", "0"), ("phase", "decode"), ("rank", "0"), ("role", "mixed"))
    ]


def test_eplb_gauges_keep_their_explicit_ep_rank(recorder):
    set_process("eplb", "0", "mixed", rank="5")  # forked from the worker of global rank 5
    spec = M["eplb:expert_hotness:current_mean"]
    recording.set_gauge(spec, 1.5, context.step_labels_with("all", "2"))  # EP rank 2
    assert recorder.points()["vllm_profiling_eplb:expert_hotness:current_mean"] == {
        (("dp", "0"), ("phase", "all"), ("rank", "2"), ("role", "mixed")): 1.5
    }


@pytest.mark.parametrize("call", ["positional", "keyword"])
def test_worker_init_takes_the_global_rank_from_its_arguments(call, monkeypatch):
    from types import SimpleNamespace as NS

    monkeypatch.setattr(recording, "process_started", lambda: None)
    monkeypatch.setattr("opentelemetry_instrumentation_vllm_ascend.handlers.memory.observe_utilization", lambda: None)
    set_process("unknown", "unknown", "mixed")
    config = NS(parallel_config=NS(data_parallel_index=1), kv_transfer_config=None)
    try:
        if call == "positional":  # CPUWorker: super().__init__(vllm_config, local_rank, rank, …)
            WorkerInit().before((object(), config, 0, 3, "tcp://x"), {})
        else:  # GPU Worker / NPUWorker: super().__init__(vllm_config=…, local_rank=…, rank=…, …)
            WorkerInit().before((object(),), {"vllm_config": config, "local_rank": 1, "rank": 3})
        assert context.PROCESS.labels == {"rank": "3"}
        assert (context.PROCESS.process, context.PROCESS.dp) == ("worker", "1")
    finally:
        set_process("engine_core", "0", "mixed")


def test_a_config_field_that_moved_costs_only_the_engine_labels(metrics):
    """The process family: AsyncLLM.__init__'s vllm_config with a parallel config that cannot be read (it raises):
    the process is still counted as an API server (with the dp / role it had), and the served model name, read from
    another field, is still taken; the failed read is counted. (Before, it lost both.)"""
    from types import SimpleNamespace as NS

    from opentelemetry_instrumentation_vllm_ascend.handlers.process import ApiServerInit

    class Config:
        model_config = NS(served_model_name="tiny")
        kv_transfer_config = None

        @property
        def parallel_config(self):
            raise RuntimeError("moved")

    set_process("unknown", "unknown", "mixed")
    ApiServerInit().before((object(), Config()), {})
    assert metrics.value("vllm_profiling_instrumented_processes", process="api_server", dp="unknown", role="mixed") == 1
    assert STATE.served_model == "tiny"
    assert STATE.failures == {("ApiServerInit", "vllm_config"): 1}


def test_catalogue_declares_rank_on_worker_recorded_metrics_only():
    for spec in catalogue.CATALOGUE:
        assert not set(spec.labels) & set(targets.process_labels(spec)), spec.seed
        # the package's own (hook_errors): recorded wherever hooks run, a worker's with its rank
        in_worker = "worker" in targets.recorded_in(spec.seed).split(", ") or spec.seed in catalogue.SELF_SEEDS
        assert targets.process_labels(spec) == (("rank",) if in_worker else ()), spec.seed
    assert "rank" in targets.all_labels(M["record_function_or_nullcontext"])
    assert M["engine:memory:kvcache_gb"].labels == catalogue.STEP_LABELS  # rank comes from the process now
    assert M["eplb:layer_load:max"].labels == catalogue.STEP_LABELS + ("rank", "layer")  # the EP rank
    assert targets.process_labels(M["eplb:layer_load:max"]) == ()


# -- across real processes: /metrics and OTLP -----------------------------------------------------------


def _worker(rank, steps, directory, endpoint):
    os.environ[environment.FILES_DIR] = directory
    os.environ[environment.METRICS_EXPORTER] = "otlp_proto_http"
    os.environ["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"] = endpoint
    set_process("worker", "0", "mixed", rank=rank)
    recording.process_started()
    for _ in range(steps):
        recording.record(WORKER_STEP, 0.002, context.step_labels("decode"))
    # exits normally: the exit handler exports to the files and pushes OTLP


@pytest.mark.parametrize("recorder_name", ["fast", "sdk"])
def test_tp_workers_stay_apart_on_metrics_and_otlp(recorder_name, tmp_path, monkeypatch):
    """Two TP workers of one engine record the same step count: /metrics shows one series per rank with
    that count (not their sum), and each worker's OTLP points carry its rank."""
    monkeypatch.setenv(environment.RECORDER, recorder_name)
    monkeypatch.setenv(environment.METRIC_EXPORT_INTERVAL, "3600000")
    monkeypatch.setenv(environment.PROMETHEUS_INTERVAL_MS, "3600000")
    ctx = multiprocessing.get_context("spawn")
    with Receiver() as receiver:
        procs = [ctx.Process(target=_worker, args=(rank, 7, str(tmp_path), receiver.endpoint)) for rank in ("0", "1")]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
            assert p.exitcode == 0
        otlp = {
            (resource["process.pid"], attrs.get("rank"))
            for resource, attrs, *_ in receiver.points("vllm_profiling_instrumented_processes")
        }
        histograms = receiver.histogram_counts("vllm_profiling_executor:model_runner_execute_model:duration")
    registry = CollectorRegistry()
    registry.register(FilesCollector(str(tmp_path)))
    text = generate_latest(registry).decode()
    name = "vllm_profiling_executor:model_runner_execute_model:duration_count"
    assert sorted(line for line in text.splitlines() if line.startswith(name)) == [
        name + '{dp="0",phase="decode",rank="0",role="mixed"} 7.0',
        name + '{dp="0",phase="decode",rank="1",role="mixed"} 7.0',
    ]
    assert {(pid, dict(attrs)["rank"]): count for (pid, attrs), count in histograms.items()} == {
        (procs[0].pid, "0"): 7,
        (procs[1].pid, "1"): 7,
    }
    assert otlp == {(procs[0].pid, None), (procs[1].pid, None)}  # a process count, not a worker series
