"""Handlers on plain objects shaped like vLLM's, recorded through the real OTel SDK."""

import concurrent.futures
from types import SimpleNamespace as NS

import pytest
from fakes import FakeExecutor, FakeKV, PlannedScheduler, output, req

from opentelemetry_instrumentation_vllm_ascend import context
from opentelemetry_instrumentation_vllm_ascend.handlers import steps
from opentelemetry_instrumentation_vllm_ascend.handlers.executor import CollectiveRpc, exception_type
from opentelemetry_instrumentation_vllm_ascend.handlers.kv_cache import AllocateSlots
from opentelemetry_instrumentation_vllm_ascend.handlers.scheduler import PreemptRequest, ResetPrefixCache, Schedule
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import FUTURE, SYNC, wrap
from opentelemetry_instrumentation_vllm_ascend.state import STATE

R2W = "vllm_profiling_running_to_waiting_count"
RECOMPUTE = "vllm_profiling_scheduler:recompute_events"
ALLOC = "vllm_profiling_block_allocate_failures"
RPC = "vllm_profiling_rpc_errors"


def instrumented(scheduler):
    cls = type(scheduler)
    sched = type("Instrumented", (cls,), {})
    sched.schedule = wrap(cls.schedule, Schedule(), SYNC)[0]
    sched._preempt_request = wrap(cls._preempt_request, PreemptRequest(), SYNC)[0]
    sched.reset_prefix_cache = wrap(cls.reset_prefix_cache, ResetPrefixCache(), SYNC)[0]
    scheduler.__class__ = sched
    kv = type("KV", (FakeKV,), {"allocate_slots": wrap(FakeKV.allocate_slots, AllocateSlots(), SYNC)[0]})
    scheduler.kv_cache_manager.__class__ = kv
    return scheduler


# -- phase classification -------------------------------------------------------------------

REQUESTS = {
    "new": req(0, 8),  # a new request (its NewRequestData), whatever its prefix-cache hit
    "resumed": req(0, 13, prompt=10),  # preempted after 3 outputs: recomputes 13 tokens
    "chunk": req(4, 10),  # chunked prefill: 4 of 10 prompt tokens done before this step
    "last_chunk": req(8, 10),  # the final chunk of 2 prompt tokens
    "decode": req(12, 13, prompt=10),  # 12 of 13 computed: computes the last sampled token
    "spec": req(12, 13, prompt=10),  # decode with 2 speculative drafts
    "resumed_chunk2": req(8, 13, prompt=10),  # resumed, second chunk: 8 of 13 recomputed so far
}


class Sched:
    def __init__(self, requests):
        self.requests = requests


@pytest.mark.parametrize(
    "new, cached, resumed, recomputing, expected",
    [
        (["new"], [], [], [], "prefill"),
        ([], [("resumed", 13)], ["resumed"], ["resumed"], "prefill"),
        ([], [("chunk", 4)], [], [], "prefill"),
        ([], [("last_chunk", 2)], [], [], "prefill"),
        ([], [("resumed_chunk2", 5)], [], ["resumed_chunk2"], "prefill"),  # not in resumed_req_ids any more
        ([], [("decode", 1)], [], [], "decode"),
        ([], [("decode", 1), ("spec", 3)], [], [], "decode"),
        (["new"], [("decode", 1)], [], [], "mixed"),
        ([], [("decode", 1), ("chunk", 4)], [], [], "mixed"),
        ([], [("decode", 1), ("resumed", 13)], ["resumed"], ["resumed"], "mixed"),
        ([], [("decode", 1), ("resumed_chunk2", 5)], [], ["resumed_chunk2"], "mixed"),
        ([], [], [], [], "idle"),
    ],
)
@pytest.mark.parametrize("path", ["fast", "exact"])
def test_step_phase(new, cached, resumed, recomputing, expected, path):
    """All four request classes, through the fast path (no request recomputing unless the case has
    one) and the exact per-request loop (forced by an unrelated recomputing request)."""
    sched = Sched(dict(REQUESTS))
    for rid in recomputing:
        steps.mark_recomputing(sched, rid)
    if path == "exact":
        sched.requests["other"] = req(3, 20, prompt=10)
        steps.mark_recomputing(sched, "other")
    assert steps.step_phase(sched, output(REQUESTS, new, cached, resumed)) == expected


@pytest.mark.parametrize("path", ["fast", "exact"])
def test_classify_step_splits_requests_and_tokens_by_req_phase(path):
    """Hand-computed: a new request (6 tokens), a chunk (4), a decode (1), a spec decode (3)."""
    sched = Sched(dict(REQUESTS))
    if path == "exact":
        sched.requests["other"] = req(3, 20, prompt=10)
        steps.mark_recomputing(sched, "other")
    out = output(REQUESTS, [("new", 6)], [("chunk", 4), ("decode", 1), ("spec", 3)])
    assert steps.classify_step(sched, out) == ("mixed", 2, 10, 2, 4)
    out = output(REQUESTS, [], [("decode", 1), ("spec", 3)])
    assert steps.classify_step(sched, out) == ("decode", 0, 0, 2, 4)
    out = output(REQUESTS, [("new", 6)], [("last_chunk", 2)])
    assert steps.classify_step(sched, out) == ("prefill", 2, 8, 0, 0)
    if path == "exact":  # a resumed request recomputes: prefill tokens, even though it has outputs
        out = output(REQUESTS, [], [("resumed", 13), ("decode", 1)], ["resumed"])
        assert steps.classify_step(sched, out) == ("mixed", 1, 13, 1, 1)


def test_recomputing_requests_are_forgotten_once_caught_up_or_gone():
    sched = Sched({"r": req(5, 13, prompt=10), "gone": req(0, 4)})
    steps.mark_recomputing(sched, "r")
    steps.mark_recomputing(sched, "gone")
    del sched.requests["gone"]
    out = output(sched.requests, cached=[("r", 5)])
    assert steps.step_phase(sched, out) == "prefill"  # 5 of 13 done before the step
    assert STATE.recomputing[sched] == {"r"}
    sched.requests["r"].num_computed_tokens = 12  # after this step: caught up (12 == 13 - 1)
    steps.step_phase(sched, output(sched.requests, cached=[("r", 7)]))
    assert STATE.recomputing[sched] == set()


# -- preemption, recompute, allocation failures ---------------------------------------------


def test_events_in_a_step_are_labelled_with_that_steps_phase(metrics):
    victim = req(40, 41)  # had computed tokens: a recompute event
    fresh = req(0, 5)  # preempted before computing anything: no recompute
    decode_req = req(41, 41)
    decoding = lambda requests: output(requests, cached=[("d", 1)])  # noqa: E731
    s = instrumented(
        PlannedScheduler(
            [
                ([("alloc", victim), ("preempt", victim), ("alloc", fresh), ("preempt", fresh)], decoding),
                ([], decoding),
            ]
        )
    )
    s.requests["d"] = decode_req
    s.kv_cache_manager.results = [None, None]
    s.schedule()
    attrs = dict(dp="0", role="mixed", phase="decode")
    assert metrics.value(R2W, **attrs) == 2
    assert metrics.value(RECOMPUTE, **attrs) == 1
    assert metrics.value(ALLOC, **attrs) == 2
    decode_req.num_computed_tokens += 1
    decode_req.num_tokens += 1
    s.schedule()  # a step with no events adds nothing (and creates no zero series)
    assert metrics.value(R2W, **attrs) == 2
    assert set(metrics.points()[R2W]) == {tuple(sorted(attrs.items()))}
    assert STATE.last_step_phase == "decode"


def test_successful_allocation_is_not_a_failure_and_raise_is(metrics):
    s = instrumented(PlannedScheduler([([("alloc", req(0, 1))], lambda requests: output(requests, cached=[("a", 1)]))]))
    s.requests["a"] = req(1, 1)
    s.kv_cache_manager.results = [object()]
    s.schedule()
    assert metrics.points().get(ALLOC) is None
    kv = s.kv_cache_manager
    kv.results = [ValueError("bad")]
    with pytest.raises(ValueError, match="bad"):  # re-raised unchanged, outside a step
        kv.allocate_slots(req(0, 1), 1)
    assert metrics.value(ALLOC, dp="0", role="mixed", phase="unknown") == 1


def test_reset_prefix_cache_preemptions_are_not_counted(metrics):
    s = instrumented(PlannedScheduler([]))
    s.requests = {"a": req(5, 6), "b": req(7, 8)}
    assert s.reset_prefix_cache(reset_running_requests=True) is True
    assert metrics.points().get(R2W) is None
    # …but a preemption outside any step and outside a reset still counts, with phase unknown.
    s._preempt_request(req(3, 4), 0.0)
    assert metrics.value(R2W, dp="0", role="mixed", phase="unknown") == 1
    assert metrics.value(RECOMPUTE, dp="0", role="mixed", phase="unknown") == 1


def test_schedule_that_raises_still_records_its_events(metrics):
    class Exploding(PlannedScheduler):
        def schedule(self):
            self._preempt_request(req(3, 4), 0.0)
            raise RuntimeError("scheduler bug")

    s = instrumented(Exploding([]))
    with pytest.raises(RuntimeError, match="scheduler bug"):
        s.schedule()
    assert metrics.value(R2W, dp="0", role="mixed", phase="unknown") == 1
    assert steps.CURRENT_STEP.get() is None


# -- RPC errors -------------------------------------------------------------------------------


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


# -- labels -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "parallel, model, expected",
    [
        (NS(data_parallel_index=3, data_parallel_rank=0, data_parallel_size=4), None, "3"),
        (NS(data_parallel_size=1, data_parallel_rank=0), None, "0"),
        (NS(data_parallel_size=2, data_parallel_rank=1), NS(is_moe=True), "1"),
        (NS(data_parallel_size=2, data_parallel_rank=0), NS(is_moe=False), "unknown"),
        (None, None, "unknown"),
    ],
)
def test_dp_label(parallel, model, expected):
    assert context.dp_of(NS(parallel_config=parallel, model_config=model)) == expected


@pytest.mark.parametrize(
    "kv, expected",
    [
        (NS(kv_role="kv_producer"), "prefill"),
        (NS(kv_role="kv_consumer"), "decode"),
        (NS(kv_role="kv_both"), "mixed"),
        (NS(kv_role=None), "mixed"),
        (None, "mixed"),
    ],
)
def test_role_label(kv, expected):
    assert context.role_of(NS(kv_transfer_config=kv)) == expected
