"""Executor handlers (collective_rpc: RPC errors and execute_model / sample_tokens timing) on plain objects shaped like vLLM's (tests/support/fakes.py), driven through the real wrappers and
recorded through the real OTel SDK. Durations come from an injected clock advanced by exact binary
fractions, so every count, sum and bucket below is hand-computed and asserted exactly."""

import concurrent.futures
from collections import deque
from types import SimpleNamespace as NS

import pytest

from opentelemetry_instrumentation_vllm_ascend import context
from opentelemetry_instrumentation_vllm_ascend.handlers import executor, steps
from opentelemetry_instrumentation_vllm_ascend.handlers.executor import CollectiveRpc, exception_type
from opentelemetry_instrumentation_vllm_ascend.handlers.steps import PHASE_ATTRIBUTE
from opentelemetry_instrumentation_vllm_ascend.hooks import patches
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import FUTURE, wrap
from opentelemetry_instrumentation_vllm_ascend.state import STATE
from tests.support.fakes import (
    FakeExecutor,
    S,
    counts,
    key,
    name,
    record_waiting,
    step,
    waiting,
)

# -- executor RPC timing ----------------------------------------------------------------------------------


def rpc_fn():
    return wrap(FakeExecutor.collective_rpc, executor.CollectiveRpc(), FUTURE)[0]


def stamped(returned, ready, host=context.HOST_CLOCK):
    """A worker's reply that ends a step: stamped by the worker's hooks (see model_runner.reply)."""
    return NS(**{steps.READY_ATTRIBUTE: (host, returned, ready)})


EXEC, SAMPLE, RPC = (
    name("executor:execute_model:duration"),
    name("executor:sample_tokens:duration"),
    name("rpc_errors"),
)


def test_blocking_rpcs_are_timed_to_the_moments_the_worker_stamped(metrics, clock):
    ex, rpc = FakeExecutor(clock, 0.25), rpc_fn()
    STATE.last_step_phase = "decode"  # async scheduling: the next step is already scheduled
    so = NS(**{PHASE_ATTRIBUTE: "prefill"})
    assert rpc(ex, "execute_model", args=(so,)) is None  # sampling follows: its reply will say
    assert EXEC not in metrics.points()
    ex.cost = 0.125
    STATE.last_step_phase = "mixed"
    ex.replies["sample_tokens"] = reply = stamped(100.1875, 100.3125)  # dispatched at 100.0 and 100.25
    assert rpc(ex, "sample_tokens", None, (None,)) is reply  # follows its execute_model
    ex.cost = 0.5
    ex.replies["execute_model"] = stamped(100.625, 100.625)  # the step's output itself (dispatched at 100.375)
    rpc(ex, "execute_model", args=(NS(),))  # no phase stored: the step most recently scheduled
    ex.replies["execute_model"] = stamped(100.9375, 100.9375, host="another machine")  # another clock
    rpc(ex, "execute_model", args=(NS(),))
    ex.replies["execute_model"] = stamped(100.625, 100.625)  # stale: before this dispatch (vLLM reused it)
    rpc(ex, "execute_model", args=(NS(),))
    ex.replies["sample_tokens"] = stamped(None, 102.0)  # a step whose execute_model the worker did not see
    rpc(ex, "sample_tokens", args=(None,))
    rpc(ex, "get_kv_cache_spec")  # not timed
    assert metrics.points()[EXEC] == {
        key(**step("prefill")): (1, 0.1875, counts(S, b8=1)),
        key(**step("mixed")): (1, 0.25, counts(S, b8=1)),
    }
    assert metrics.points()[SAMPLE] == {
        key(**step("prefill")): (1, 0.0625, counts(S, b7=1)),
        key(**step("mixed")): (1, 0.125, counts(S, b8=1)),
    }  # 101.875 → 102
    assert RPC not in metrics.points()


def test_non_blocking_rpc_records_the_workers_moments_whenever_it_is_read(metrics, clock):
    ex, rpc = FakeExecutor(clock, 0.0078125), rpc_fn()
    so = NS(**{PHASE_ATTRIBUTE: "decode"})
    f1 = rpc(ex, "execute_model", args=(so,), non_block=True)  # dispatched at 100.0
    f2 = rpc(ex, "sample_tokens", args=(None,), non_block=True)  # dispatched at 100.0078125
    clock.t = 100.5
    f1.set_result(None)  # read now: sampling follows, nothing to record yet
    assert EXEC not in metrics.points() and SAMPLE not in metrics.points()
    clock.t = 101.0
    f2.set_result(stamped(100.25, 100.375))  # read a whole step after it was ready
    assert metrics.points()[EXEC] == {key(**step("decode")): (1, 0.25, counts(S, b8=1))}
    assert metrics.points()[SAMPLE] == {key(**step("decode")): (1, 0.3671875, counts(S, b9=1))}

    class AsyncOutputFuture(concurrent.futures.Future):
        """UniProcExecutor's: get_output runs when the engine reads it, so its ready moment is the read."""

    ex.futures = []
    ex.fail = None
    rpc(ex, "execute_model", args=(NS(**{PHASE_ATTRIBUTE: "prefill"}),), non_block=True).set_result(None)
    clock.t = 102.0
    lazy = AsyncOutputFuture()
    original = ex.collective_rpc

    def returns_lazy(*args, **kwargs):
        clock.t += 0.0078125
        return lazy

    ex.collective_rpc = returns_lazy
    rpc_wrapped = wrap(
        lambda self, method, timeout=None, args=(): self.collective_rpc(method), executor.CollectiveRpc(), FUTURE
    )[0]
    assert rpc_wrapped(ex, "sample_tokens", None, (None,)) is lazy
    ex.collective_rpc = original
    clock.t = 103.0
    lazy.set_result(stamped(101.5, 103.0))  # execute_model returned at 101.5 (dispatched at 101.0)
    assert metrics.points()[EXEC][key(**step("prefill"))] == (1, 0.5, counts(S, b9=1))
    assert key(**step("prefill")) not in metrics.points()[SAMPLE]


def test_failed_rpcs_count_once_and_record_no_duration(metrics, clock):
    ex, rpc = FakeExecutor(clock, 0.25), rpc_fn()
    so = NS(**{PHASE_ATTRIBUTE: "prefill"})
    ex.fail = RuntimeError("Worker failed with error 'oom'")
    with pytest.raises(RuntimeError, match="oom"):
        rpc(ex, "execute_model", args=(so,))
    ex.fail = None
    f = rpc(ex, "execute_model", args=(so,), non_block=True)
    g = rpc(ex, "sample_tokens", args=(None,), non_block=True)
    f.set_exception(TimeoutError("RPC call to execute_model timed out."))
    g.cancel()
    with pytest.raises(TimeoutError):
        f.result()
    assert metrics.points()[RPC] == {
        key(**step("prefill", exception_type="worker_failed")): 1,
        key(**step("prefill", exception_type="timeout")): 1,
        key(**step("prefill", exception_type="cancelled")): 1,
    }
    assert EXEC not in metrics.points() and SAMPLE not in metrics.points()


def test_real_future_wrapper_times_do_not_depend_on_when_vllm_reads_the_reply(metrics, clock):
    """vLLM's MultiprocExecutor.collective_rpc and FutureWrapper, with scripted reply queues whose
    dequeue takes time: a non-blocking RPC completes when vLLM reads its reply (possibly while
    draining the queue for a later future); the durations are the worker's stamps minus dispatch."""
    mp = pytest.importorskip("vllm.v1.executor.multiproc_executor")
    ok, failure = mp.WorkerProc.ResponseStatus.SUCCESS, mp.WorkerProc.ResponseStatus.FAILURE

    class Replies:
        def __init__(self, replies):
            self.replies = deque(replies)

        def dequeue(self, timeout=None):
            seconds, reply = self.replies.popleft()
            clock.t += seconds
            return reply

    installed = patches.hook_future_class(mp.FutureWrapper, completes_later=True)
    try:
        cls = type(
            "Executor",
            (mp.MultiprocExecutor,),
            {"collective_rpc": wrap(mp.MultiprocExecutor.collective_rpc, executor.CollectiveRpc(), FUTURE)[0]},
        )
        ex = cls.__new__(cls)
        ex.rpc_broadcast_mq = NS(enqueue=lambda item: None)
        ex.response_mqs = [
            Replies(
                [
                    (0.5, (ok, None)),
                    (0.125, (ok, stamped(100.125, 100.5))),
                    (0.25, (ok, stamped(101.75, 101.75))),
                    (0.0625, (failure, "oom")),
                ]
            )
        ]
        ex.futures_queue = deque()
        ex.is_failed = False

        f1 = ex.collective_rpc(
            "execute_model", args=(NS(**{PHASE_ATTRIBUTE: "decode"}),), non_block=True, unique_reply_rank=0
        )  # at 100.0
        clock.t = 100.25
        f2 = ex.collective_rpc("sample_tokens", args=(None,), non_block=True, unique_reply_rank=0)
        assert type(f1) is mp.FutureWrapper
        clock.t = 101.0
        assert f2.result().__dict__  # reads f1's reply at 101.5, then its own at 101.625
        assert f1.result() is None
        # blocking: the FutureWrapper stays inside vLLM; the call returns the reply (101.625 → 101.875)
        ex.collective_rpc("execute_model", args=(NS(**{PHASE_ATTRIBUTE: "prefill"}),), unique_reply_rank=0)
        f3 = ex.collective_rpc(
            "execute_model", args=(NS(**{PHASE_ATTRIBUTE: "mixed"}),), non_block=True, unique_reply_rank=0
        )
        with pytest.raises(RuntimeError, match="Worker failed with error 'oom'"):
            f3.result()
    finally:
        for patch in reversed(installed):
            patch.remove()
    assert metrics.points()[EXEC] == {
        key(**step("decode")): (1, 0.125, counts(S, b8=1)),
        key(**step("prefill")): (1, 0.125, counts(S, b8=1)),
    }
    assert metrics.points()[SAMPLE] == {key(**step("decode")): (1, 0.25, counts(S, b8=1))}
    assert metrics.points()[RPC] == {key(**step("mixed", exception_type="worker_failed")): 1}


# -- RPC errors -------------------------------------------------------------------------------

RPC = "vllm_profiling_rpc_errors"


@pytest.mark.parametrize(
    "exc, label",
    [
        (TimeoutError("RPC call to execute_model timed out."), "timeout"),
        (RuntimeError("Executor failed."), "executor_failed"),
        (RuntimeError("Worker failed with error 'boom', please check the stack trace above"), "worker_failed"),
        (RuntimeError("One or more workers failed"), "worker_failed"),
        (RuntimeError("cancelled"), "cancelled"),
        (concurrent.futures.CancelledError(), "cancelled"),
        (ValueError("x"), "other"),
        (RuntimeError("something else"), "other"),
    ],
)
def test_exception_type_is_bounded(exc, label):
    assert exception_type(exc) == label


def test_rpc_errors_blocking_and_through_the_future(metrics):
    ex = FakeExecutor(times_out={"get_kv_cache_spec"})
    rpc = wrap(FakeExecutor.collective_rpc, CollectiveRpc(), FUTURE)[0]
    STATE.last_step_phase = "prefill"

    fut = rpc(ex, "execute_model", args=("so",), non_block=True)
    assert metrics.points().get("vllm_profiling_rpc_errors") is None  # nothing failed yet
    fut.set_exception(RuntimeError("Worker failed with error 'oom'"))
    with pytest.raises(RuntimeError):
        fut.result()
    ok = rpc(ex, "sample_tokens", non_block=True)
    ok.set_result("fine")
    with pytest.raises(TimeoutError):
        rpc(ex, "get_kv_cache_spec")  # blocking utility call: phase unknown
    with pytest.raises(RuntimeError):
        rpc(ex, method="dead", non_block=True)  # raised before any future exists
    assert ex.calls == 4
    assert metrics.value(RPC, dp="0", role="mixed", phase="prefill", exception_type="worker_failed") == 1
    assert metrics.value(RPC, dp="0", role="mixed", phase="unknown", exception_type="timeout") == 1
    assert metrics.value(RPC, dp="0", role="mixed", phase="unknown", exception_type="executor_failed") == 1
    assert sum(metrics.points()[RPC].values()) == 3


def test_rpc_durations_wait_for_the_scheduler_s_records(metrics, clock):
    """The engine reads replies on its critical path: their durations are left for later
    (``recording.record_later``) and reach their series at the next ``run_deferred`` (the scheduler hook's
    flush, or a collection), each series in one go."""
    ex, rpc = FakeExecutor(clock, 0.25), rpc_fn()
    so = NS(**{PHASE_ATTRIBUTE: "decode"})
    for _ in range(2):
        start = clock.t
        rpc(ex, "execute_model", args=(so,))  # dispatched at start; sampling follows
        ex.replies["sample_tokens"] = stamped(start + 0.125, start + 0.375)
        rpc(ex, "sample_tokens", args=(None,))  # dispatched at start + 0.25
    assert (
        waiting()
        == [
            ("executor:sample_tokens:duration", 0.125, "decode"),
            ("executor:execute_model:duration", 0.125, "decode"),
        ]
        * 2
    )
    record_waiting()
    points = metrics.points()
    assert points[EXEC] == {key(**step("decode")): (2, 0.25, counts(S, b8=2))}  # 0.125 each
    assert points[SAMPLE] == {key(**step("decode")): (2, 0.25, counts(S, b8=2))}  # 0.125 each


# -- narrow degradation ------------------------------------------------------------------------------------------


def test_an_rpc_argument_shape_that_moved_costs_only_the_exact_phase(metrics, clock):
    """execute_model's arguments no longer a tuple holding the SchedulerOutput (the phase read fails): the RPC is
    still timed and its failure still counted, both with the step most recently scheduled; each failed read is
    counted in hook_errors. (Before, the failed read lost the RPC's state: neither was recorded.)"""
    ex, rpc = FakeExecutor(clock, 0.25), rpc_fn()
    STATE.last_step_phase = "decode"
    ex.replies["execute_model"] = stamped(100.125, 100.125)  # dispatched at 100.0
    rpc(ex, "execute_model", args=NS(scheduler_output=None))  # not subscriptable
    ex.fail = RuntimeError("Worker failed with error 'oom'")
    with pytest.raises(RuntimeError, match="oom"):
        rpc(ex, "execute_model", args=NS(scheduler_output=None))
    assert metrics.points()[EXEC] == {key(**step("decode")): (1, 0.125, counts(S, b8=1))}  # (0.1, 0.25]
    assert metrics.points()[RPC] == {key(**step("decode", exception_type="worker_failed")): 1}
    assert STATE.failures == {("CollectiveRpc", "scheduler_output phase"): 2}
