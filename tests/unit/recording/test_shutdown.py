"""Shutdown: a process about to be killed exports when asked (shutdown.py), and exit-time exports
are bounded (OTEL_VLLM_ASCEND_SHUTDOWN_TIMEOUT_MS)."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from prometheus_client.mmap_dict import MmapedDict

from opentelemetry_instrumentation_vllm_ascend import environment, recording
from opentelemetry_instrumentation_vllm_ascend.recording import identity, pipeline, shutdown

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

#: A child that instruments itself, records 7 preemptions, and then waits to be killed; both export
#: intervals are 10 minutes, so only a flush on request can put the 7 into its files.
CHILD = textwrap.dedent("""
    import sys, time
    from opentelemetry_instrumentation_vllm_ascend import VllmAscendInstrumentor, catalogue, context, recording
    from opentelemetry_instrumentation_vllm_ascend.recording import services
    VllmAscendInstrumentor().instrument(skip_dep_check=True)
    services.start()  # what a process of the server does when it loads its first hooked vLLM module
    recording.add(catalogue.RUNNING_TO_WAITING, 7, context.step_labels("decode"))
    recording.process_started()  # a live gauge
    print("ready", flush=True)
    time.sleep(600)
""")


def child_env(files_dir, tree):
    env = dict(os.environ)
    env.update(
        {
            "PYTHONPATH": ROOT,
            environment.FILES_DIR: str(files_dir),
            environment.ROOT_PID: str(os.getpid()),
            environment.TREE: tree,
            environment.PROMETHEUS_INTERVAL_MS: "600000",
            environment.ENABLED: "true",
            environment.METRICS_EXPORTER: "none",
        }
    )
    env.pop(environment.PROMETHEUS_MULTIPROC_DIR, None)
    return env


def counter_values(path):
    return {json.loads(k)[1]: v for k, v, _ts, _pos in MmapedDict.read_all_values_from_file(path)}


def start_child(tmp_path, tree):
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD], env=child_env(tmp_path, tree), stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_a_process_about_to_be_killed_exports_when_asked(tmp_path, monkeypatch):
    tree = "t" + os.urandom(8).hex()
    monkeypatch.setenv(environment.TREE, tree)
    proc = start_child(tmp_path, tree)
    try:
        counter = tmp_path / f"counter_otel-{proc.pid}.db"
        assert not counter.exists()  # nothing exported yet: a SIGKILL now would lose the 7
        started = time.monotonic()
        assert shutdown.flush_processes([proc.pid]) == {proc.pid}
        assert time.monotonic() - started < 1.0
        assert counter_values(counter) == {"vllm_profiling_running_to_waiting_count_total": 7.0}
        assert os.path.exists(tmp_path / f"gauge_livesum_otel-{proc.pid}.db")
    finally:
        proc.kill()
        proc.wait()
    # Killed: its counters stay (they count for /metrics), its live gauges go.
    identity.remove_dead_live_gauges(str(tmp_path))
    assert not os.path.exists(tmp_path / f"gauge_livesum_otel-{proc.pid}.db")
    assert counter_values(counter) == {"vllm_profiling_running_to_waiting_count_total": 7.0}


def test_the_exit_time_cleanup_also_drops_the_live_gauges_of_children_killed_since(files_dir, monkeypatch):
    """vLLM's stop SIGKILLs its children and the sweep after it waits for them only briefly: the API server's
    own exit-time cleanup sweeps again, so a child whose kill took effect late leaves no live gauge."""
    tree = "k" + os.urandom(8).hex()
    monkeypatch.setenv(environment.TREE, tree)
    proc = start_child(files_dir, tree)
    try:
        assert shutdown.flush_processes([proc.pid]) == {proc.pid}
        assert os.path.exists(os.path.join(files_dir, f"gauge_livesum_otel-{proc.pid}.db"))
    finally:
        proc.kill()
        proc.wait()
    recording.process_started()  # this process's pipeline, with its files reader, and a live gauge
    recording.flush()
    assert os.path.exists(os.path.join(files_dir, f"gauge_livesum_otel-{os.getpid()}.db"))
    pipeline.reset()  # this process's exit-time close
    assert not [n for n in os.listdir(files_dir) if n.startswith("gauge_live")]
    counter = os.path.join(files_dir, f"counter_otel-{proc.pid}.db")
    assert counter_values(counter) == {"vllm_profiling_running_to_waiting_count_total": 7.0}  # counters stay


def test_flush_requests_from_another_tree_or_to_uninstrumented_processes_are_not_answered(tmp_path, monkeypatch):
    proc = start_child(tmp_path, "a" + os.urandom(8).hex())
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        monkeypatch.setenv(environment.TREE, "b" + os.urandom(8).hex())  # another tree: another name
        started = time.monotonic()
        assert shutdown.flush_processes([proc.pid, plain.pid], timeout_s=0.5) == set()
        assert time.monotonic() - started < 0.2  # nobody listens under these names: no wait at all
        assert not (tmp_path / f"counter_otel-{proc.pid}.db").exists()
    finally:
        for p in (proc, plain):
            p.kill()
            p.wait()


def test_the_listener_ignores_other_users_and_malformed_requests(tmp_path, monkeypatch):
    tree = "c" + os.urandom(8).hex()
    monkeypatch.setenv(environment.TREE, tree)
    proc = start_child(tmp_path, tree)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.bind(b"")
            s.settimeout(0.5)
            s.sendto(b"not a request", shutdown._address(proc.pid, tree))
            with pytest.raises(socket.timeout):
                s.recvfrom(64)
        assert not (tmp_path / f"counter_otel-{proc.pid}.db").exists()
        assert shutdown.flush_processes([proc.pid]) == {proc.pid}  # and still serves a real one
    finally:
        proc.kill()
        proc.wait()


def test_exit_time_export_to_an_unreachable_collector_is_bounded(monkeypatch, tmp_path):
    """An OTLP endpoint nobody listens on: the SDK's exporter retries with backoff for up to its own
    timeout (10 s) and the reader's shutdown waited 5 s; now the whole close takes at most
    OTEL_VLLM_ASCEND_SHUTDOWN_TIMEOUT_MS (default 1 s)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: connections are refused
    from opentelemetry_instrumentation_vllm_ascend import catalogue, context

    monkeypatch.setenv(environment.FILES_DIR, str(tmp_path))
    monkeypatch.setenv(environment.METRICS_EXPORTER, "otlp_proto_http")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", f"http://127.0.0.1:{port}/v1/metrics")
    for setting, bound in ((None, 1.0), ("300", 0.3)):
        if setting is None:
            monkeypatch.delenv(environment.SHUTDOWN_TIMEOUT_MS, raising=False)
        else:
            monkeypatch.setenv(environment.SHUTDOWN_TIMEOUT_MS, setting)
        pipeline.reset()
        recording.add(catalogue.RUNNING_TO_WAITING, 1, context.step_labels("decode"))
        started = time.monotonic()
        pipeline.reset()  # the final export
        took = time.monotonic() - started
        assert took < bound + 0.25, (setting, took)
        # the files reader went first: its final export is there
        assert counter_values(tmp_path / f"counter_otel-{os.getpid()}.db") == {
            "vllm_profiling_running_to_waiting_count_total": 1.0
        }
        os.remove(tmp_path / f"counter_otel-{os.getpid()}.db")


@pytest.mark.parametrize(
    "raw, expected", [("250", 250), ("0", 1000), ("-5", 1000), ("x", 1000), ("999999999", 60_000), (None, 1000)]
)
def test_shutdown_timeout_setting(monkeypatch, raw, expected, caplog):
    if raw is None:
        monkeypatch.delenv(environment.SHUTDOWN_TIMEOUT_MS, raising=False)
    else:
        monkeypatch.setenv(environment.SHUTDOWN_TIMEOUT_MS, raw)
    assert environment.shutdown_timeout_ms() == expected
    assert environment.shutdown_timeout_ms() == expected
    warnings = [r for r in caplog.records if environment.SHUTDOWN_TIMEOUT_MS in r.getMessage()]
    assert len(warnings) == (0 if raw in (None, "250") else 1)


def test_signals_are_left_to_vllm():
    """The flush needs no signal handler of ours: vLLM's own SIGTERM/SIGINT handlers stay as they are."""
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    shutdown.setup()
    try:
        assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    finally:
        shutdown.teardown()


def test_teardown_stops_the_listener_thread():
    """teardown() returns once the listener thread has ended (uninstrument() then instrument() at once
    left two threads running for a moment: CI saw it on a loaded machine)."""
    import threading

    def listeners():
        return [t for t in threading.enumerate() if t.name == "otel-vllm-ascend-flush"]

    for _ in range(20):
        shutdown.setup()
        assert len(listeners()) == 1
        shutdown.teardown()
        assert listeners() == []  # gone when teardown returns: a setup() right after starts the only one


def _forked_listener(conn):
    from opentelemetry_instrumentation_vllm_ascend.state import STATE

    listener = STATE.flush_listener
    conn.send((os.getpid(), listener and listener[0]))
    conn.recv()  # until the parent asked


def test_a_forked_child_answers_flush_requests_on_its_own_socket(monkeypatch):
    """The fork handler (recording.pipeline's) gives a listening process's child a listener of its own:
    the parent's socket, inherited, is not the child's to read, and the child's pid names a new one."""
    import multiprocessing

    from opentelemetry_instrumentation_vllm_ascend.state import STATE

    monkeypatch.setenv(environment.TREE, "f" + os.urandom(8).hex())
    shutdown.setup()
    try:
        parent, child_end = multiprocessing.Pipe()
        child = multiprocessing.get_context("fork").Process(target=_forked_listener, args=(child_end,))
        child.start()
        try:
            assert parent.recv() == (child.pid, child.pid)
            assert shutdown.flush_processes([child.pid], timeout_s=5, with_descendants=False) == {child.pid}
            assert STATE.flush_listener[0] == os.getpid()  # the parent's own, unchanged
        finally:
            parent.send("done")
            child.join(10)
        assert child.exitcode == 0
    finally:
        shutdown.teardown()
