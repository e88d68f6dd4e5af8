"""The per-step records' queue, drops and sinks (recording/step_records.py), through the scheduler hooks' own
functions (``handlers.scheduler._keep_step`` and ``UpdateFromOutput``): with no sink on there is no stream; a full
queue drops and counts exactly; a ZMQ subscriber that never reads never blocks a step, and every record is either
received or counted as dropped; the JSON-lines file rotates and stays within its bound. vLLM's real Scheduler is
tests/contract/test_step_records.py's."""

from __future__ import annotations

import json
import os
import time
from collections import deque
from types import SimpleNamespace

import pytest

from opentelemetry_instrumentation_vllm_ascend import environment
from opentelemetry_instrumentation_vllm_ascend.handlers.scheduler import UpdateFromOutput, _keep_step
from opentelemetry_instrumentation_vllm_ascend.handlers.steps import Step
from opentelemetry_instrumentation_vllm_ascend.recording import step_records
from opentelemetry_instrumentation_vllm_ascend.state import STATE

zmq = pytest.importorskip("zmq")
pytest.importorskip("msgspec")

N_REQ = 4


def _scheduler():
    return SimpleNamespace(
        requests={f"r{i}": SimpleNamespace(num_prompt_tokens=8) for i in range(N_REQ)}, waiting=deque()
    )


def _output():
    """A decode step of N_REQ requests, each at 10 computed tokens, scheduled 1 token."""
    ids = [f"r{i}" for i in range(N_REQ)]
    cached = SimpleNamespace(req_ids=ids, num_computed_tokens=[10] * N_REQ, num_output_tokens=[3] * N_REQ)
    return SimpleNamespace(
        num_scheduled_tokens=dict.fromkeys(ids, 1),
        total_num_scheduled_tokens=N_REQ,
        scheduled_new_reqs=[],
        scheduled_cached_reqs=cached,
        finished_req_ids=set(),
    )


UPDATE = UpdateFromOutput()


def _step(stream, scheduler, counter: int, update=UPDATE) -> float:
    """One step through both hooks' record code; returns the seconds the EngineCore spent in it."""
    output = _output()
    t0 = time.perf_counter()
    _keep_step(
        stream, output, scheduler, counter, t0, t0, Step(), ("decode", 0, 0, N_REQ, N_REQ), (N_REQ, 0, 0, 6), (16, 10)
    )
    update.after(time.perf_counter(), (scheduler, output, None), {}, None)
    return time.perf_counter() - t0


@pytest.fixture
def stream_env(monkeypatch, tmp_path):
    for name in (environment.STEPS_ZMQ, environment.STEPS_FILE):
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch
    step_records.close()


def test_no_sink_no_stream(stream_env):
    assert step_records.configure() is None
    assert STATE.step_stream is None


def test_a_full_queue_drops_and_counts_exactly(stream_env, metrics, tmp_path):
    stream_env.setenv(environment.STEPS_FILE, str(tmp_path / "steps.jsonl"))
    stream_env.setenv(environment.STEPS_QUEUE, "5")
    stream = step_records.configure()
    stream.started = True  # no background thread: nothing drains
    scheduler = _scheduler()
    for counter in range(12):
        _step(stream, scheduler, counter)
    assert len(stream.queue) == 5 and stream.queue_full == 7 and not stream.pending
    step_records.export_drops()
    assert metrics.points()["vllm_profiling_step_record_dropped"] == {
        (("dp", "0"), ("reason", "queue_full"), ("role", "mixed")): 7
    }


def test_an_update_that_never_came_is_counted_incomplete(stream_env, tmp_path):
    stream_env.setenv(environment.STEPS_FILE, str(tmp_path / "steps.jsonl"))
    stream = step_records.configure()
    stream.started = True
    scheduler = _scheduler()
    lost = _output()
    _keep_step(stream, lost, scheduler, 1, 0.0, 0.0, Step(), ("decode", 0, 0, N_REQ, N_REQ), None, None)
    _step(stream, scheduler, 2)
    assert stream.dropped["incomplete"] == 1 and len(stream.queue) == 1 and not stream.pending


def test_a_subscriber_that_never_reads_never_blocks_a_step(stream_env, tmp_path):
    endpoint = f"ipc://{tmp_path}/steps.sock"
    stream_env.setenv(environment.STEPS_ZMQ, endpoint)
    stream_env.setenv(environment.STEPS_ZMQ_HWM, "10")
    stream_env.setenv(environment.STEPS_QUEUE, "100000")
    stream = step_records.configure()
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 10)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    stream.start()
    deadline = time.monotonic() + 10
    while not stream.subscribers:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    scheduler = _scheduler()
    n = 5000
    # A step that waited for the socket would wait for a reader that never comes: every step returns, while the
    # socket is full (zmq_full below). (No timing is asserted: benchmarks/step_record_cost.py measures the cost.)
    for counter in range(n):
        _step(stream, scheduler, counter)
    deadline = time.monotonic() + 30
    while stream.queue or stream.written < n:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(0.1)  # the last drain's sends
    dropped = stream.dropped["zmq_full"]
    assert dropped > 0 and stream.sent + dropped == n  # every record: sent or counted
    received = 0
    while sub.poll(500):
        sub.recv_multipart()
        received += 1
    assert received == stream.sent
    sub.close(linger=0)


def test_the_file_rotates_within_its_bound(stream_env, tmp_path):
    path = tmp_path / "steps.jsonl"
    stream_env.setenv(environment.STEPS_FILE, str(tmp_path / "steps-{dp}.jsonl"))
    stream_env.setenv(environment.STEPS_FILE_MAX_BYTES, "4096")
    stream_env.setenv(environment.STEPS_FILE_BACKUPS, "2")
    stream = step_records.configure()
    stream.started = True
    stream.open_sinks()
    scheduler = _scheduler()
    for counter in range(200):
        _step(stream, scheduler, counter)
    stream.drain()
    step_records.close()
    path = tmp_path / "steps-unknown.jsonl" if not (tmp_path / "steps-0.jsonl").exists() else tmp_path / "steps-0.jsonl"
    files = sorted(os.listdir(tmp_path))
    assert files == sorted([path.name, path.name + ".1", path.name + ".2"])
    sizes = [os.path.getsize(tmp_path / f) for f in files]
    assert all(size <= 4096 for size in sizes)
    with open(path, encoding="utf-8") as f:
        last = [json.loads(line) for line in f][-1]
    assert last["counter_id"] == 199 and last["scheduled_requests"]["sum_decode_kv_tokens"] == 10 * N_REQ
    assert last["scheduled_requests"]["num_decode_requests"] == N_REQ
    assert last["otel_vllm_ascend"]["kv_blocks_used"] == 5  # 16 total, 10 free, the null block


def test_a_flush_request_sends_what_is_queued(stream_env, tmp_path):
    stream_env.setenv(environment.STEPS_FILE, str(tmp_path / "steps.jsonl"))
    stream = step_records.configure()
    scheduler = _scheduler()
    for counter in range(10):
        _step(stream, scheduler, counter)  # (the first starts the thread, which waits 20 ms before a drain)
    step_records.flush(5.0)
    assert stream.written == 10 and not stream.queue and not stream.closed
