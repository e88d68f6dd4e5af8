"""vLLM's real ``MultiprocExecutor.collective_rpc`` and ``FutureWrapper`` (in-process, with stand-in
message queues instead of worker processes): failures of non-blocking calls, which surface only
when vLLM reads the reply, are counted once; blocking failures too."""

from collections import deque

import pytest

from tests.conftest import instrumented

pytest.importorskip("vllm")

from opentelemetry_instrumentation_vllm_ascend.state import STATE

RPC = "vllm_profiling_rpc_errors"


class Broadcast:
    def __init__(self):
        self.sent = []

    def enqueue(self, item):
        self.sent.append(item)


class Replies:
    """A response queue: each dequeue pops the next scripted reply (or raises it)."""

    def __init__(self, replies):
        self.replies = deque(replies)

    def dequeue(self, timeout=None):
        reply = self.replies.popleft()
        if isinstance(reply, BaseException):
            raise reply
        return reply


@pytest.fixture
def executor_cls(metrics, monkeypatch):
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    original = MultiprocExecutor.__dict__["collective_rpc"]
    with instrumented(monkeypatch):
        assert MultiprocExecutor.__dict__["collective_rpc"] is not original
        yield MultiprocExecutor
    assert MultiprocExecutor.__dict__["collective_rpc"] is original


def fake_executor(replies):
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    ex = MultiprocExecutor.__new__(MultiprocExecutor)  # no workers are started
    ex.rpc_broadcast_mq = Broadcast()
    ex.response_mqs = [Replies(replies)]
    ex.futures_queue = deque()
    ex.is_failed = False
    return ex


def test_non_blocking_failures_are_counted_when_the_reply_is_read(executor_cls, metrics):
    from vllm.v1.executor.multiproc_executor import WorkerProc

    ok, failure = WorkerProc.ResponseStatus.SUCCESS, WorkerProc.ResponseStatus.FAILURE
    ex = fake_executor([(failure, "CUDA error: out of memory"), (ok, "sampled"), TimeoutError("dequeue")])
    STATE.last_step_phase = "decode"

    f1 = ex.collective_rpc("execute_model", args=("so",), non_block=True, unique_reply_rank=0)
    f2 = ex.collective_rpc("sample_tokens", args=("go",), non_block=True, unique_reply_rank=0)
    assert metrics.points().get(RPC) is None  # nothing read yet, nothing failed yet
    assert f2.result() == "sampled"  # draining the queue reads f1's reply first: f1 fails now
    with pytest.raises(RuntimeError, match="Worker failed with error 'CUDA error: out of memory'"):
        f1.result()
    with pytest.raises(TimeoutError, match="RPC call to get_kv_cache_spec timed out"):
        ex.collective_rpc("get_kv_cache_spec", timeout=5)  # blocking, not a step's work

    ex.is_failed = True
    with pytest.raises(RuntimeError, match="Executor failed"):
        ex.collective_rpc("execute_model", non_block=True)

    assert metrics.points()[RPC] == {
        (("dp", "0"), ("exception_type", "worker_failed"), ("phase", "decode"), ("role", "mixed")): 1,
        (("dp", "0"), ("exception_type", "timeout"), ("phase", "unknown"), ("role", "mixed")): 1,
        (("dp", "0"), ("exception_type", "executor_failed"), ("phase", "decode"), ("role", "mixed")): 1,
    }
    assert len(ex.rpc_broadcast_mq.sent) == 3  # each RPC was sent exactly once


def test_uniproc_in_process_failure_through_the_future(executor_cls, metrics):
    """One device: the worker runs in the EngineCore; a failing step arrives as a failed Future."""
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    class Worker:
        def execute_model(self, scheduler_output):
            raise RuntimeError("NPU out of memory")

    ex = UniProcExecutor.__new__(UniProcExecutor)
    ex.driver_worker = Worker()
    STATE.last_step_phase = "prefill"
    future = ex.collective_rpc("execute_model", args=("so",), non_block=True, single_value=True)
    with pytest.raises(RuntimeError, match="NPU out of memory"):
        future.result()
    with pytest.raises(RuntimeError, match="NPU out of memory"):
        ex.collective_rpc("execute_model", args=("so",))  # blocking: raises in place
    assert metrics.points()[RPC] == {
        (("dp", "0"), ("exception_type", "other"), ("phase", "prefill"), ("role", "mixed")): 2,
    }
