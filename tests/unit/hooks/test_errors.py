"""Loud degradation: every handler failure is counted in ``hook_errors`` (labels: process, dp, role, hook, where;
a worker's rank), on vLLM's /metrics (the multiprocess files, real prometheus_client exposition) and on OTLP (a
real OTLP/HTTP receiver), from every process; the first failure per (hook, place) is logged; nothing is counted
or paid while nothing fails."""

from __future__ import annotations

import logging
import multiprocessing

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry, generate_latest

from opentelemetry_instrumentation_vllm_ascend import catalogue, environment, recording
from opentelemetry_instrumentation_vllm_ascend.hooks import wrappers
from opentelemetry_instrumentation_vllm_ascend.hooks.handler import Handler, report
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import SYNC
from opentelemetry_instrumentation_vllm_ascend.recording import failures, pipeline
from opentelemetry_instrumentation_vllm_ascend.recording.files_reader import FilesCollector
from opentelemetry_instrumentation_vllm_ascend.state import STATE
from tests.conftest import Metrics
from tests.support.otlp_receiver import Receiver
from tests.support.process import set_process

NAME = catalogue.HOOK_ERRORS.prometheus_name


class Failing(Handler):
    """A hook's handler whose ``after`` raises on every call, and whose ``before`` loses one guarded read
    (reported under the read's name) on odd calls, recording the rest."""

    def __init__(self, name):
        self.name = name
        self.calls = 0

    def before(self, args, kwargs):
        self.calls += 1
        if self.calls % 2:
            try:
                raise AttributeError("resumed_req_ids")
            except AttributeError:
                report(self, "resumed_req_ids")
        return None

    def after(self, state, args, kwargs, result):
        raise KeyError("bug")


def _call(name: str, n: int) -> None:
    wrapped, _ = wrappers.wrap(lambda x: x + 1, Failing(name), SYNC)
    for i in range(n):
        assert wrapped(i) == i + 1  # vLLM's call is untouched


def exposition(directory: str) -> list[str]:
    registry = CollectorRegistry()
    registry.register(FilesCollector(directory))
    return sorted(line for line in generate_latest(registry).decode().splitlines() if line.startswith(NAME))


@pytest.mark.parametrize("recorder", ["fast", "sdk"])
def test_each_failure_is_counted_on_metrics_with_its_hook_and_place(recorder, files_dir, monkeypatch, caplog):
    monkeypatch.setenv(environment.RECORDER, recorder)
    pipeline.reset()
    with caplog.at_level(logging.WARNING, logger="opentelemetry_instrumentation_vllm_ascend.hooks.handler"):
        _call("Scheduler.schedule", 7)
    recording.flush()
    labels = 'dp="0",hook="Scheduler.schedule",process="engine_core",role="decode"'
    assert exposition(files_dir) == [
        f'{NAME}{{{labels},where="after"}} 7.0',
        f'{NAME}{{{labels},where="resumed_req_ids"}} 4.0',
    ]
    # logged once per (hook, place), counted each time
    logged = [r for r in caplog.records if "Scheduler.schedule" in r.getMessage()]
    assert len(logged) == 2 and all("hook_errors_total" in r.getMessage() for r in logged)
    # the next collection adds what came since, once
    _call("Scheduler.schedule", 2)
    recording.flush()
    recording.flush()
    assert exposition(files_dir) == [
        f'{NAME}{{{labels},where="after"}} 9.0',
        f'{NAME}{{{labels},where="resumed_req_ids"}} 5.0',
    ]


def test_a_new_pipeline_gets_the_whole_count(metrics):
    _call("EngineCore.step", 3)
    recording.flush()
    attrs = dict(process="engine_core", dp="0", role="mixed", hook="EngineCore.step", where="after")
    assert metrics.value(catalogue.HOOK_ERRORS.exposed_name, **attrs) == 3
    rebuilt = Metrics(InMemoryMetricReader())
    pipeline.reset(extra_readers=[rebuilt.reader])  # a new pipeline: its counter starts at 0 and gets the 3, once
    recording.process_started()
    _call("EngineCore.step", 1)
    recording.flush()
    recording.flush()
    assert rebuilt.value(catalogue.HOOK_ERRORS.exposed_name, **attrs) == 4


def test_nothing_fails_nothing_is_counted(metrics):
    class Fine(Handler):
        name = "Fine.hook"

        def after(self, state, args, kwargs, result):
            pass

    wrapped, _ = wrappers.wrap(lambda: 1, Fine(), SYNC)
    for _ in range(5):
        wrapped()
    recording.process_started()
    recording.flush()
    assert STATE.failures == {}
    assert catalogue.HOOK_ERRORS.exposed_name not in metrics.points()  # absent, not 0


def test_degraded_lists_the_failed_hooks_most_failures_first():
    _call("A.one", 3)
    _call("B.two", 1)
    assert failures.degraded() == [
        {"hook": "A.one", "where": "after", "failures": 3},
        {"hook": "A.one", "where": "resumed_req_ids", "failures": 2},
        {"hook": "B.two", "where": "after", "failures": 1},
        {"hook": "B.two", "where": "resumed_req_ids", "failures": 1},
    ]


def _worker(rank, n, directory, endpoint):
    import os

    os.environ[environment.FILES_DIR] = directory
    os.environ[environment.METRICS_EXPORTER] = "otlp_proto_http"
    os.environ["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"] = endpoint
    set_process("worker", "0", "mixed", rank=rank)
    recording.process_started()
    _call("GPUModelRunner.execute_model", n)
    # exits normally: the exit handler exports to the files and pushes OTLP


def test_every_process_counts_its_own_on_metrics_and_otlp(tmp_path, monkeypatch):
    """Two TP workers, each failing a different number of times: one series per rank on /metrics, each worker's
    OTLP points carry its own count and rank."""
    monkeypatch.setenv(environment.METRIC_EXPORT_INTERVAL, "3600000")
    monkeypatch.setenv(environment.PROMETHEUS_INTERVAL_MS, "3600000")
    ctx = multiprocessing.get_context("spawn")
    with Receiver() as receiver:
        procs = [
            ctx.Process(target=_worker, args=(rank, n, str(tmp_path), receiver.endpoint))
            for rank, n in (("0", 3), ("1", 5))
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
            assert p.exitcode == 0
        otlp = sorted(
            (attrs["rank"], attrs["where"], value)
            for _resource, attrs, value, *_ in receiver.points(catalogue.HOOK_ERRORS.exposed_name)
        )
    labels = 'dp="0",hook="GPUModelRunner.execute_model",process="worker"'
    assert exposition(str(tmp_path)) == [
        f'{NAME}{{{labels},rank="0",role="mixed",where="after"}} 3.0',
        f'{NAME}{{{labels},rank="0",role="mixed",where="resumed_req_ids"}} 2.0',
        f'{NAME}{{{labels},rank="1",role="mixed",where="after"}} 5.0',
        f'{NAME}{{{labels},rank="1",role="mixed",where="resumed_req_ids"}} 3.0',
    ]
    assert otlp == [("0", "after", 3), ("0", "resumed_req_ids", 2), ("1", "after", 5), ("1", "resumed_req_ids", 3)]
