"""Scheduler handlers (schedule, update_from_output, add_request, preemptions, KV blocks and allocation
failures) and the step classification (handlers/steps.py) on plain objects shaped like vLLM's (tests/support/fakes.py), driven through the real wrappers and
recorded through the real OTel SDK. Durations come from an injected clock advanced by exact binary
fractions, so every count, sum and bucket below is hand-computed and asserted exactly."""

from collections import deque
from types import SimpleNamespace as NS

import pytest

from opentelemetry_instrumentation_vllm_ascend import state
from opentelemetry_instrumentation_vllm_ascend.handlers import scheduler, steps
from opentelemetry_instrumentation_vllm_ascend.handlers.kv_cache import AllocateSlots
from opentelemetry_instrumentation_vllm_ascend.handlers.scheduler import PreemptRequest, ResetPrefixCache, Schedule
from opentelemetry_instrumentation_vllm_ascend.handlers.steps import PHASE_ATTRIBUTE
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import SYNC, wrap
from opentelemetry_instrumentation_vllm_ascend.recording import pipeline
from opentelemetry_instrumentation_vllm_ascend.state import STATE
from tests.support.fakes import (
    ALL_LABELS,
    SC,
    F,
    FakeKV,
    FakeScheduler,
    PlannedScheduler,
    R,
    T,
    counts,
    idle_output,
    instrumented,
    key,
    name,
    output,
    req,
    step,
)
from tests.support.process import set_process
from tests.support.steps import recomputing_of, step_phase

# -- scheduler ------------------------------------------------------------------------------------------


def test_schedule_mixed_step_with_all_four_request_classes(metrics, clock, utils):
    """A new request (6 tokens, 2 prefix-cached), a resumed one (recomputes 13), a chunked-prefill
    continuation (4 of 10 done, 4 more) and a decode (1 token): 3 prefill requests / 23 tokens and
    1 decode request / 1 token, phase mixed."""
    requests = {
        "resumed": req(0, 13, prompt=10),  # preempted after 3 outputs
        "chunk": req(4, 10),
        "decode": req(12, 13, prompt=10),
    }
    out = output(
        requests, new=[("new", 6, 2)], cached=[("resumed", 13), ("chunk", 4), ("decode", 1)], resumed=["resumed"]
    )
    running = [
        req(8, 8),  # the new request: prompt done (decode)
        req(13, 13, prompt=10),  # the resumed one: caught up (decode)
        req(8, 10),  # the chunk: 8 of 10 (prefill)
        req(13, 14, prompt=10),  # the decode (decode)
        req(0, 7),  # running, nothing computed yet (prefill)
    ]
    s = instrumented()(
        clock,
        utils,
        requests,
        running=running,
        waiting=[req(0, 3), req(0, 4)],
        max_num_running_reqs=5,
        blocks=(100, 37),
    )
    s.plan = [(out, 0.0625, [("schedule: allocate_slots", 0.0625)])]
    seen_inside = []
    s.during = lambda: seen_inside.append(name("record_function_or_nullcontext") in metrics.points())
    STATE.last_step_phase = "decode"  # the previous step's: not the phase of scopes in this one

    assert s.schedule() is out
    assert seen_inside == [False]  # the scope ended inside schedule(): held until the step's phase is known
    assert getattr(out, PHASE_ATTRIBUTE) == "mixed"
    assert STATE.last_step_phase == "mixed"

    m, mixed = metrics, step("mixed")
    pre, dec = step("mixed", req_phase="prefill"), step("mixed", req_phase="decode")
    assert m.value(name("scheduler:duration"), **mixed) == (1, 0.125, counts(F, b12=1))  # (0.1, 1]
    assert m.points()[name("record_function_or_nullcontext")] == {  # with this step's phase
        key(**step("mixed", name="schedule: allocate_slots")): (1, 0.0625, counts(SC, b10=1))
    }  # (0.05, 0.1]
    assert m.value(name("scheduler:batch_size"), **mixed) == (1, 4, counts(R, b2=1))  # (1, 4]
    assert m.value(name("scheduler:phase_batch_size"), **pre) == (1, 3, counts(R, b2=1))
    assert m.value(name("scheduler:phase_batch_size"), **dec) == (1, 1, counts(R, b1=1))
    assert m.value(name("scheduler:phase_scheduled_tokens"), **pre) == (1, 23, counts(T, b3=1))  # (8, 32]
    assert m.value(name("scheduler:phase_scheduled_tokens"), **dec) == (1, 1, counts(T, b1=1))
    assert m.points()[name("scheduler:phase_scheduled_token_counter")] == {key(**pre): 23, key(**dec): 1}
    # context: 2 cached (new) + 0 + 4 + 12 computed before the step, plus the 24 scheduled
    assert m.value(name("scheduler:seqlen:sum"), **mixed) == 42
    assert m.value(name("scheduler:seqlen:avg"), **mixed) == 10.5
    assert m.value(name("scheduler:running_queue_size"), **mixed) == (1, 5, counts(R, b3=1))  # (4, 16]
    assert m.value(name("running_phase_batch_size"), **pre) == (1, 2, counts(R, b2=1))
    assert m.value(name("running_phase_batch_size"), **dec) == (1, 3, counts(R, b2=1))
    assert m.value(name("waiting_phase_batch_size"), **pre) == (1, 2, counts(R, b2=1))
    assert m.value(name("waiting_phase_batch_size"), **dec) is None  # waiting requests are all prefill
    assert m.value(name("total_kvcache_blocks"), **ALL_LABELS) == 100
    assert m.value(name("free_kvcache_blocks"), **ALL_LABELS) == 37
    assert m.value(name("allocated_kvcache_blocks"), **ALL_LABELS) == 62  # 100 - 37 - the null block
    assert m.points()[name("request_prefill_pending_nums")] == {key(**mixed): 1}  # 5 running of 5, 2 waiting


def test_schedule_zero_tokens_add_nothing_to_the_counter(metrics, clock, utils):
    requests = {"decode": req(12, 13, prompt=10), "spec": req(20, 21, prompt=10)}
    s = instrumented()(clock, utils, requests, running=[req(13, 14, prompt=10), req(21, 22, prompt=10)])
    s.plan = [
        (output(requests, cached=[("decode", 1), ("spec", 3)]), 0.0, []),  # two decodes, one with 2 drafts
        (output(requests, new=[("n", 8, 0)]), 0.0, []),  # a new request only
    ]
    s.schedule()
    s.schedule()
    m = metrics
    d_pre, d_dec = step("decode", req_phase="prefill"), step("decode", req_phase="decode")
    p_pre, p_dec = step("prefill", req_phase="prefill"), step("prefill", req_phase="decode")
    # the histograms see the zeros…
    assert m.value(name("scheduler:phase_scheduled_tokens"), **d_pre) == (1, 0, counts(T, b0=1))
    assert m.value(name("scheduler:phase_scheduled_tokens"), **d_dec) == (1, 4, counts(T, b2=1))  # (1, 8]
    assert m.value(name("scheduler:phase_batch_size"), **d_pre) == (1, 0, counts(R, b0=1))
    assert m.value(name("scheduler:phase_batch_size"), **p_dec) == (1, 0, counts(R, b0=1))
    assert m.value(name("scheduler:phase_scheduled_tokens"), **p_pre) == (1, 8, counts(T, b2=1))
    # …the counter only what was scheduled
    assert m.points()[name("scheduler:phase_scheduled_token_counter")] == {key(**d_dec): 4, key(**p_pre): 8}
    assert m.value(name("scheduler:seqlen:sum"), **step("decode")) == 12 + 20 + 4
    assert m.value(name("scheduler:seqlen:avg"), **step("decode")) == 18
    assert m.value(name("scheduler:seqlen:sum"), **step("prefill")) == 8
    assert m.value(name("scheduler:seqlen:avg"), **step("prefill")) == 8


def test_schedule_records_are_deferred_until_the_engine_waits(metrics, clock, utils, monkeypatch):
    """schedule() only classifies the step and reads the states it left; its records wait until
    FLUSH_STEPS steps do, and run when the engine asks for a step's grammar bitmask (right after
    sending execute_model), each with the values of the moment its schedule() returned even if the
    scheduler changed since."""
    monkeypatch.setattr(scheduler, "FLUSH_STEPS", 2)
    requests = {"decode": req(12, 13, prompt=10)}
    out = output(requests, cached=[("decode", 1)])
    cls = instrumented()
    cls.get_grammar_bitmask = wrap(lambda self, so: None, scheduler.GrammarBitmask(), SYNC)[0]
    s = cls(clock, utils, requests, running=[req(13, 14, prompt=10)], waiting=[req(0, 3)], blocks=(100, 37))
    s.plan = [(out, 0.125, [("schedule: allocate_slots", 0.0625)]), (out, 0.25, [])]

    assert s.schedule() is out
    assert getattr(out, PHASE_ATTRIBUTE) == "decode"  # known at once: it travels with the RPC
    assert len(STATE.deferred) == 1  # nothing recorded yet
    s.get_grammar_bitmask(out)
    assert len(STATE.deferred) == 1  # one step waits: not yet
    s.running.append(req(0, 5))  # what happens after schedule() returned is not this step's state
    s.waiting.clear()
    s.kv_cache_manager.block_pool.free = 3
    s.schedule()
    assert len(STATE.deferred) == 2
    s.get_grammar_bitmask(out)
    assert len(STATE.deferred) == 0

    dec = step("decode")
    assert metrics.value(name("scheduler:duration"), **dec) == (2, 0.4375, counts(F, b12=2))  # 0.1875, 0.25
    assert metrics.value(name("scheduler:running_queue_size"), **dec) == (2, 3, counts(R, b1=1, b2=1))
    assert metrics.value(name("waiting_phase_batch_size"), **step("decode", req_phase="prefill")) == (
        2,
        1,
        counts(R, b0=1, b1=1),
    )
    assert metrics.value(name("free_kvcache_blocks"), **step("all")) == 3
    assert metrics.points()[name("record_function_or_nullcontext")] == {
        key(**step("decode", name="schedule: allocate_slots")): (1, 0.0625, counts(SC, b10=1))
    }


@pytest.mark.parametrize(
    "queue, reported, counted",
    [
        (deque, None, 1),  # FCFS: its head is looked at whether or not the output reports preemptions
        (deque, set(), 1),
        (list, None, 1),  # a priority queue is searched for a scheduler whose output reports none
        (list, set(), 0),  # … and not for one that reports them (vLLM 0.32+: reported next step)
    ],
)
def test_a_request_preempted_inline_is_counted_whatever_its_queue(metrics, clock, utils, queue, reported, counted):
    """A scheduler that preempts without _preempt_request (vllm-ascend's SchedulerDynamicBatch) puts the request
    back in ``waiting``, status PREEMPTED. Schedule decides a step with nothing of the kind without the full
    preemption count; a step with one is counted: one preemption, one recompute event."""
    RequestStatus = pytest.importorskip("vllm.v1.request").RequestStatus

    requests = {"decode": req(12, 13, prompt=10), "victim": req(0, 9, prompt=5, request_id="victim")}
    requests["victim"].status = RequestStatus.PREEMPTED
    out = output(requests, cached=[("decode", 1)])
    out.preempted_req_ids = reported
    s = instrumented()(clock, utils, requests, running=[req(13, 14, prompt=10)])
    s.waiting = queue([requests["victim"]])
    s.plan = [(out, 0.125, [])]
    s.schedule()
    dec = step("decode")
    assert metrics.value(name("running_to_waiting_count"), **dec) == (counted or None)
    assert metrics.value(name("scheduler:recompute_events"), **dec) == (counted or None)


def test_a_load_balancing_pause_is_one_preemption_that_recomputes_nothing(metrics, clock, utils):
    """vllm-ascend's DyntraLBScheduler pauses a running request for load balancing: PREEMPTED, back in a
    waiting queue (here ``skipped_waiting``, where a step that does not admit it leaves it), its KV kept, its
    id in ``_lb_paused_req_ids`` until it resumes. Paused for two steps, then resumed (its 13 computed tokens
    kept): one preemption, no recompute event, no tokens computed again."""
    RequestStatus = pytest.importorskip("vllm.v1.request").RequestStatus

    requests = {"decode": req(12, 13, prompt=10), "paused": req(13, 14, prompt=10, request_id="paused")}
    requests["paused"].status = RequestStatus.PREEMPTED
    held = output(requests, cached=[("decode", 1)])
    resumed = output(requests, cached=[("decode", 1), ("paused", 1)])
    s = instrumented()(clock, utils, requests, running=[req(13, 14, prompt=10)])
    s._lb_paused_req_ids = {"paused"}
    s.plan = [(held, 0.125, []), (held, 0.125, []), (resumed, 0.125, [])]
    s.schedule()
    s.schedule()
    s._lb_paused_req_ids.discard("paused")  # (DyntraLB's _update_after_schedule, inside the resuming step)
    s.schedule()
    dec = step("decode")
    assert metrics.value(name("running_to_waiting_count"), **dec) == 1
    assert metrics.value(name("scheduler:recompute_events"), **dec) is None
    assert metrics.value(name("scheduler:recomputed_tokens"), **dec) is None
    assert "paused" not in scheduler._preempted_of(s)  # forgotten at its resume


def test_deferred_records_do_not_keep_the_step_output(metrics, clock, utils):
    """What a step's deferred records need is read when schedule() returns; its SchedulerOutput is
    not kept until they run (32 steps' outputs held back would keep their objects alive, and the
    garbage collector, idle on an uninstrumented scheduler, would start running)."""
    import gc
    import weakref

    class Output(NS):  # weakref-able
        pass

    requests = {"decode": req(12, 13, prompt=10)}
    s = instrumented()(clock, utils, requests, running=[req(13, 14, prompt=10)])
    s.plan = [(Output(**vars(output(requests, cached=[("decode", 1)]))), 0.125, [])]
    gone = weakref.ref(s.schedule())
    gc.collect()
    assert len(STATE.deferred) == 1  # not recorded yet…
    assert gone() is None  # …and the output is not held for it
    assert metrics.value(name("scheduler:seqlen:sum"), **step("decode")) == 13


def _varied_steps(clock, utils):
    """A scheduler and eight steps of every kind: prefill, mixed, decode (repeated: equal shapes),
    idle, one that preempts, a queue that fills up and drains (prefill-pending edges), blocks that
    change and stay, scopes in some steps."""
    requests = {"a": req(12, 13, prompt=10), "b": req(4, 10), "c": req(20, 21, prompt=10)}
    s = instrumented()(
        clock,
        utils,
        requests,
        running=[req(13, 14, prompt=10)],
        waiting=[req(0, 3)],
        max_num_running_reqs=2,
        blocks=(100, 37),
    )
    decode = output(requests, cached=[("a", 1), ("c", 1)])
    slots = [("schedule: allocate_slots", 0.0625), ("schedule: allocate_slots", 0.125)]
    s.plan = [
        (output(requests, new=[("n", 8, 0)]), 0.125, [("schedule: allocate_slots", 0.0625)]),
        (output(requests, new=[("m", 6, 2)], cached=[("a", 1), ("b", 4)]), 0.25, slots),
        (decode, 0.125, slots),
        (decode, 0.125, slots),
        (idle_output(), 0.0, []),
        (decode, 0.5, []),
        (decode, 0.125, slots),
        (output(requests, cached=[("b", 4)]), 0.0625, []),
    ]
    queues = [  # (running, waiting) left by each step; at most 2 run
        ([req(8, 8)], [req(0, 3)]),
        ([req(8, 8), req(9, 10)], []),
        ([req(8, 9), req(10, 11)], [req(0, 3)]),  # full with one waiting: an edge (decode)
        ([req(8, 9)], []),
        ([req(8, 9)], [req(0, 2)]),
        ([req(8, 9), req(5, 5)], [req(0, 2), req(0, 1)]),  # blocked again: a second edge (decode)
        ([req(8, 9), req(5, 9)], [req(0, 2)]),  # still blocked: no edge
        ([req(8, 9)], []),
    ]
    free = [37, 30, 30, 30, 28, 28, 28, 40]
    calls = iter(range(len(s.plan)))

    def after_each():
        i = next(calls)
        s.running[:], s.waiting[:] = queues[i]
        s.kv_cache_manager.block_pool.free = free[i]
        if i == 5:  # as the preemption hook counts them, inside schedule()
            steps.CURRENT_STEP.get().preemptions += 1
            steps.CURRENT_STEP.get().recomputes += 1

    s.during = after_each
    return s


def test_steps_recorded_together_equal_steps_recorded_one_by_one(metrics, clock, utils):
    """Eight steps recorded together (_record_schedules: equal values counted at once, the last gauge
    values, the pending edges in order) record exactly what the same steps record one at a time (a
    collection after each); the per-step values themselves are checked by hand in the tests above."""
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from tests.conftest import Metrics

    def run(collect_each):
        state.reset()  # a fresh process each run
        reader = Metrics(InMemoryMetricReader())
        pipeline.reset(extra_readers=[reader.reader])
        set_process("engine_core", "0", "mixed")
        s = _varied_steps(clock, utils)
        for _ in range(len(s.plan)):
            s.schedule()
            if collect_each:
                assert len(STATE.deferred) == 1
                reader.points()  # a collection records the one pending step: the per-step path
        points = reader.points()
        assert not STATE.deferred
        return points

    one_by_one = run(True)
    together = run(False)
    assert together == one_by_one
    # …and the values are the hand-computed ones (a sample of them)
    assert one_by_one[name("request_prefill_pending_nums")] == {key(**step("decode")): 2}
    assert one_by_one[name("scheduler:batch_size")][key(**step("decode"))] == (4, 8, counts(R, b2=4))
    assert one_by_one[name("free_kvcache_blocks")][key(**ALL_LABELS)] == 40


def test_deferred_records_run_at_collection_and_are_dropped_by_reset(metrics, clock, utils):
    requests = {"decode": req(12, 13, prompt=10)}
    s = instrumented()(clock, utils, requests, running=[req(13, 14, prompt=10)])
    s.plan = [
        (output(requests, cached=[("decode", 1)]), 0.125, []),
        (output(requests, cached=[("decode", 1)]), 0.125, []),
    ]
    s.schedule()
    # A collection (the periodic export, a scrape's files, OTLP) runs what is pending first.
    assert metrics.value(name("scheduler:duration"), **step("decode"))[0] == 1
    assert not STATE.deferred
    s.schedule()
    assert len(STATE.deferred) == 1
    pipeline.reset()  # its final export ran it; nothing is left over
    assert not STATE.deferred


def test_schedule_prefill_pending_counted_once_per_episode(metrics, clock, utils):
    """Idle steps (nothing scheduled): the batch shape is a zero batch, the queues still count."""
    s = instrumented()(clock, utils, running=[req(5, 5), req(1, 4)], waiting=[req(0, 2)], max_num_running_reqs=2)
    other = instrumented()(clock, utils, running=[req(5, 5)], waiting=[req(0, 2)], max_num_running_reqs=1)
    s.plan = [(idle_output(), 0.0, []) for _ in range(5)]
    other.plan = [(idle_output(), 0.0, [])]
    pending = name("request_prefill_pending_nums")
    idle = step("idle")

    s.schedule()  # running full, one waiting: the edge into blocked
    assert metrics.value(pending, **idle) == 1
    s.schedule()  # still blocked: not counted again
    assert metrics.value(pending, **idle) == 1
    other.schedule()  # another scheduler (another EngineCore) has its own episode
    assert metrics.value(pending, **idle) == 2
    s.waiting = []
    s.schedule()  # cleared
    assert metrics.value(pending, **idle) == 2
    s.waiting = [req(0, 1), req(0, 1), req(0, 1)]
    s.schedule()  # blocked again: a new episode
    assert metrics.value(pending, **idle) == 3
    s.running = s.running[:1]
    s.schedule()  # room in the running queue: not blocked
    assert metrics.value(pending, **idle) == 3

    m = metrics
    assert m.value(name("scheduler:batch_size"), **idle) == (6, 0, counts(R, b0=6))
    for seed in (
        "scheduler:phase_batch_size",
        "scheduler:phase_scheduled_tokens",
        "scheduler:phase_scheduled_token_counter",
        "scheduler:seqlen:sum",
        "scheduler:seqlen:avg",
    ):
        assert name(seed) not in m.points()
    # running sizes 2, 2, 1, 2, 2, 1; waiting 1, 1, 1, 0, 3, 3
    assert m.value(name("scheduler:running_queue_size"), **idle) == (6, 10, counts(R, b1=2, b2=4))
    assert m.value(name("running_phase_batch_size"), **step("idle", req_phase="prefill")) == (
        6,
        4,
        counts(R, b0=2, b1=4),
    )  # req(1, 4) is in its prompt in s's four two-request steps
    assert m.value(name("waiting_phase_batch_size"), **step("idle", req_phase="prefill")) == (
        6,
        9,
        counts(R, b0=1, b1=3, b2=2),
    )
    assert m.value(name("waiting_phase_batch_size"), **step("idle", req_phase="decode")) is None


def test_schedule_failing_parts_do_not_stop_the_others(metrics, clock, utils):
    requests = {"decode": req(12, 13, prompt=10)}
    out = output(requests, cached=[("decode", 1)])
    no_kv = instrumented()(clock, utils, requests, running=[req(13, 14, prompt=10)], waiting=[req(0, 1)])
    del no_kv.kv_cache_manager
    no_kv.skipped_waiting = [req(0, 2)]  # deferred waiting requests count as waiting
    no_kv.plan = [(out, 0.25, [])]
    assert no_kv.schedule() is out
    m, dec = metrics, step("decode")
    assert m.value(name("scheduler:duration"), **dec) == (1, 0.25, counts(F, b12=1))
    assert m.value(name("scheduler:batch_size"), **dec) == (1, 1, counts(R, b1=1))
    assert m.value(name("scheduler:running_queue_size"), **dec) == (1, 1, counts(R, b1=1))
    assert m.value(name("waiting_phase_batch_size"), **step("decode", req_phase="prefill")) == (1, 2, counts(R, b2=1))
    for seed in ("total_kvcache_blocks", "free_kvcache_blocks", "allocated_kvcache_blocks"):
        assert name(seed) not in m.points()
    assert getattr(out, PHASE_ATTRIBUTE) == "decode"

    # No queues: the batch shape before and the KV cache after are still recorded.
    no_queues = instrumented()(clock, utils, requests, blocks=(10, 4))
    del no_queues.running
    out2 = output(requests, cached=[("decode", 1)])
    no_queues.plan = [(out2, 0.5, [])]
    assert no_queues.schedule() is out2
    assert m.value(name("scheduler:duration"), **dec) == (2, 0.75, counts(F, b12=2))
    assert m.value(name("scheduler:batch_size"), **dec) == (2, 2, counts(R, b1=2))
    assert m.value(name("scheduler:running_queue_size"), **dec) == (1, 1, counts(R, b1=1))  # unchanged
    assert m.value(name("allocated_kvcache_blocks"), **ALL_LABELS) == 5

    # Computed tokens that are not numbers (a scheduler of another shape): no context length, the rest recorded.
    odd = instrumented()(clock, utils, requests, running=[req(13, 14, prompt=10)])
    out3 = output(requests, cached=[("decode", 1)])
    out3.scheduled_cached_reqs.num_computed_tokens = [None]
    odd.plan = [(out3, 0.25, [])]
    assert odd.schedule() is out3
    assert m.value(name("scheduler:batch_size"), **dec) == (3, 3, counts(R, b1=3))
    assert m.value(name("scheduler:running_queue_size"), **dec) == (2, 2, counts(R, b1=2))
    assert m.value(name("scheduler:seqlen:sum"), **dec) == 13  # the earlier steps' (12 computed + 1), kept


def test_a_scope_entered_once_per_request_is_one_observation_each(metrics, clock, utils):
    """vLLM's scheduler enters "schedule: allocate_slots" once per running request: a decode step of
    three requests gives three observations of it (each its own duration), recorded at once when
    schedule() returns, with the step's phase."""
    requests = {rid: req(12, 13, prompt=10) for rid in ("a", "b", "c")}
    out = output(requests, cached=[("a", 1), ("b", 1), ("c", 1)])
    s = instrumented()(clock, utils, requests, running=[req(13, 14, prompt=10)] * 3)
    s.plan = [
        (
            out,
            0.0,
            [
                ("schedule: allocate_slots", 0.0625),
                ("schedule: allocate_slots", 0.125),
                ("schedule: allocate_slots", 0.0625),
                ("schedule: update_after_schedule", 0.25),
            ],
        )
    ]
    STATE.last_step_phase = "prefill"

    s.schedule()
    assert metrics.points()[name("record_function_or_nullcontext")] == {
        key(**step("decode", name="schedule: allocate_slots")): (3, 0.25, counts(SC, b10=2, b11=1)),
        key(**step("decode", name="schedule: update_after_schedule")): (1, 0.25, counts(SC, b11=1)),
    }


def test_scopes_in_a_step_nested_or_raising_pair_up(metrics, clock, utils):
    """Inside schedule(), blocks of one name share one timer: a block nested in another of the same
    name and a block left by an exception still give each block its own duration (the exception's
    none: it is not recorded, as outside a step)."""
    rf = utils.record_function_or_nullcontext

    class Nested(FakeScheduler):
        def schedule(self):
            with rf("schedule: allocate_slots"):
                self.clock.t += 0.0625
                with rf("schedule: allocate_slots"):  # nested, same name
                    self.clock.t += 0.125
                self.clock.t += 0.0625
            with pytest.raises(KeyError):
                with rf("schedule: allocate_slots"):
                    self.clock.t += 1.0
                    raise KeyError("inside a scope")
            with rf("schedule: allocate_slots"):
                self.clock.t += 0.0625
            return output({})

    s = instrumented(Nested)(clock, utils)
    s.schedule()
    assert metrics.points()[name("record_function_or_nullcontext")] == {
        key(**step("idle", name="schedule: allocate_slots")): (3, 0.4375, counts(SC, b10=1, b11=2))
    }


def test_schedule_that_raises_records_its_scopes_with_phase_unknown(metrics, clock, utils):
    s = instrumented()(clock, utils)
    s.plan = [(RuntimeError("scheduler bug"), 0.5, [("schedule: allocate_slots", 0.125)])]
    STATE.last_step_phase = "decode"
    with pytest.raises(RuntimeError, match="scheduler bug"):
        s.schedule()
    assert STATE.last_step_phase == "unknown"
    assert metrics.points()[name("record_function_or_nullcontext")] == {
        key(**step("unknown", name="schedule: allocate_slots")): (1, 0.125, counts(SC, b11=1))
    }
    assert name("scheduler:duration") not in metrics.points()


def test_update_from_output_phase_from_the_scheduler_output(metrics, clock):
    s = instrumented()(clock)
    STATE.last_step_phase = "decode"  # the next step was already scheduled (async scheduling)
    so = NS(**{PHASE_ATTRIBUTE: "prefill"})
    assert s.update_from_output(so, 0.25) == {}
    s.update_from_output(model_runner_output=0.5, scheduler_output=NS())  # no phase stored: the last step's
    with pytest.raises(RuntimeError, match="update failed"):
        s.update_from_output(so, -1.0)  # failed: not timed
    spec = name("scheduler:update_from_output:duration")
    assert metrics.points()[spec] == {
        key(**step("prefill")): (1, 0.25, counts(F, b12=1)),
        key(**step("decode")): (1, 0.5, counts(F, b12=1)),
    }


def test_add_request_phase_all(metrics, clock):
    s = instrumented()(clock)
    STATE.last_step_phase = "prefill"
    s.add_request(0.001953125)  # 2**-9 s
    s.add_request(request=0.001953125)
    with pytest.raises(ValueError, match="bad request"):
        s.add_request(-1.0)
    assert metrics.points()[name("scheduler:add_request:duration")] == {
        key(**ALL_LABELS): (2, 0.00390625, counts(F, b7=2))
    }  # (0.001, 0.0025]


# -- phase classification -------------------------------------------------------------------

REQUESTS = {
    "new": req(0, 8),  # a new request (its NewRequestData), whatever its prefix-cache hit
    "resumed": req(0, 13, prompt=10),  # preempted after 3 outputs: recomputes 13 tokens
    "chunk": req(4, 10),  # chunked prefill: 4 of 10 prompt tokens done before this step
    "last_chunk": req(8, 10),  # the final chunk of 2 prompt tokens
    "decode": req(12, 13, prompt=10),  # 12 of 13 computed: computes the last sampled token
    "spec": req(12, 13, prompt=10),  # decode with 2 speculative drafts
    "resumed_chunk2": req(8, 13, prompt=10),  # resumed, second chunk: 8 of 13 recomputed so far
    "last_token": req(9, 10),  # a chunk of the prompt's last token: no output yet, still prefill
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
        ([], [("last_token", 1)], [], [], "prefill"),
        ([], [("decode", 1), ("last_token", 1)], [], [], "mixed"),
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
    assert step_phase(sched, output(REQUESTS, new, cached, resumed)) == expected


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
    assert step_phase(sched, out) == "prefill"  # 5 of 13 done before the step
    assert recomputing_of(sched) == {"r"}
    sched.requests["r"].num_computed_tokens = 12  # after this step: caught up (12 == 13 - 1)
    step_phase(sched, output(sched.requests, cached=[("r", 7)]))
    assert recomputing_of(sched) == set()


# -- preemption, recompute, allocation failures ---------------------------------------------

R2W = "vllm_profiling_running_to_waiting_count"
RECOMPUTE = "vllm_profiling_scheduler:recompute_events"
ALLOC = "vllm_profiling_block_allocate_failures"


def with_event_hooks(scheduler):
    """``scheduler`` (a PlannedScheduler) with the schedule, preemption, prefix-cache reset and KV
    allocation handlers wrapped around its methods."""
    cls = type(scheduler)
    sched = type("Instrumented", (cls,), {})
    sched.schedule = wrap(cls.schedule, Schedule(), SYNC)[0]
    sched._preempt_request = wrap(cls._preempt_request, PreemptRequest(), SYNC)[0]
    sched.reset_prefix_cache = wrap(cls.reset_prefix_cache, ResetPrefixCache(), SYNC)[0]
    scheduler.__class__ = sched
    kv = type("KV", (FakeKV,), {"allocate_slots": wrap(FakeKV.allocate_slots, AllocateSlots(), SYNC)[0]})
    scheduler.kv_cache_manager.__class__ = kv
    return scheduler


def test_events_in_a_step_are_labelled_with_that_steps_phase(metrics):
    victim = req(40, 41)  # had computed tokens: a recompute event
    fresh = req(0, 5)  # preempted before computing anything: no recompute
    decode_req = req(41, 42, prompt=10)  # a decode: it has outputs
    decoding = lambda requests: output(requests, cached=[("d", 1)])  # noqa: E731
    s = with_event_hooks(
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
    s = with_event_hooks(
        PlannedScheduler([([("alloc", req(0, 1))], lambda requests: output(requests, cached=[("a", 1)]))])
    )
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
    s = with_event_hooks(PlannedScheduler([]))
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

    s = with_event_hooks(Exploding([]))
    with pytest.raises(RuntimeError, match="scheduler bug"):
        s.schedule()
    assert metrics.value(R2W, dp="0", role="mixed", phase="unknown") == 1
    assert steps.CURRENT_STEP.get() is None


# -- vLLM 0.34's shapes -----------------------------------------------------------------------------


def output_034(requests, new=(), cached=()):
    """A SchedulerOutput of vLLM 0.34's shape: ``CachedRequestData`` has no ``resumed_req_ids``; a
    resumed request is re-sent in full in ``scheduled_new_reqs`` (``new``: ``(id, scheduled, computed)``)."""
    out = output(requests, new, cached)
    del out.scheduled_cached_reqs.resumed_req_ids
    return out


@pytest.mark.parametrize("path", ["fast", "exact"])
def test_classify_step_on_034_shapes(path):
    """0.34: a resumed request arrives as a new one (13 tokens recomputed, no prefix hit): prefill work,
    like the resumed cached request of 0.33 (test_classify_step_splits_requests_and_tokens_by_req_phase);
    its second chunk is a cached request still recomputing (prefill); decodes stay decodes."""
    sched = Sched(dict(REQUESTS))
    steps.mark_recomputing(sched, "resumed_chunk2")
    if path == "exact":
        sched.requests["other"] = req(3, 20, prompt=10)
        steps.mark_recomputing(sched, "other")
    out = output_034(REQUESTS, [("resumed", 13, 0)], [("decode", 1), ("spec", 3)])
    assert steps.classify_step(sched, out) == ("mixed", 1, 13, 2, 4)
    out = output_034(REQUESTS, [], [("decode", 1), ("resumed_chunk2", 5)])
    assert steps.classify_step(sched, out) == ("mixed", 1, 5, 1, 1)
    out = output_034(REQUESTS, [], [("decode", 1)])
    assert steps.classify_step(sched, out) == ("decode", 0, 0, 1, 1)
    out = output_034(REQUESTS, [("resumed", 13, 0)], [])
    assert steps.classify_step(sched, out) == ("prefill", 1, 13, 0, 0)


def test_schedule_on_a_034_step_records_every_series_with_its_phase(metrics, clock, utils):
    """The 0.34 shape through the hook: the step's phase is set (on the output and for the process) and
    its batch is split by req_phase, as on 0.33."""
    requests = {"decode": req(12, 13, prompt=10), "resumed": req(0, 13, prompt=10)}
    out = output_034(requests, new=[("resumed", 13, 0)], cached=[("decode", 1)])
    s = instrumented()(clock, utils, requests, running=[req(13, 13, prompt=10), req(13, 14, prompt=10)])
    s.plan = [(out, 0.0625, [])]
    s.schedule()
    assert getattr(out, PHASE_ATTRIBUTE) == "mixed" and STATE.last_step_phase == "mixed"
    m = metrics
    pre, dec = step("mixed", req_phase="prefill"), step("mixed", req_phase="decode")
    assert m.value(name("scheduler:phase_batch_size"), **pre) == (1, 1, counts(R, b1=1))
    assert m.value(name("scheduler:phase_scheduled_tokens"), **pre) == (1, 13, counts(T, b3=1))
    assert m.value(name("scheduler:phase_scheduled_tokens"), **dec) == (1, 1, counts(T, b1=1))
    assert m.value(name("scheduler:seqlen:sum"), **step("mixed")) == 12 + 14


def test_waiting_counts_034s_async_kv_waiting_queue(metrics, clock, utils):
    """vLLM 0.34's get_request_counts() counts waiting + kv_holding_waiting + async_kv_waiting: so does
    waiting_phase_batch_size (here 1 + 1 + 2)."""
    s = instrumented()(clock, utils, running=[req(5, 5)], waiting=[req(0, 2)])
    s.kv_holding_waiting = deque([req(3, 4)])
    s.async_kv_waiting = deque([req(0, 2), req(0, 3)])
    s.max_num_active_reqs, s.num_waiting_for_streaming_input = 8, 0
    s._admits_inflight_kv_load = lambda: True
    s.plan = [(idle_output(), 0.0, [])]
    s.schedule()
    assert metrics.value(name("waiting_phase_batch_size"), **step("idle", req_phase="prefill")) == (
        1,
        4,
        counts(R, b2=1),
    )


def test_a_full_batch_that_still_admits_async_kv_loads_is_not_blocked(metrics, clock, utils):
    """vLLM 0.34 admits async KV loads past the running limit (``loads_only``) while its in-flight load
    limit allows (``_admits_inflight_kv_load``): the scheduler is blocked only when no waiting request
    can be admitted — no async load waits, or the load limit is reached."""
    s = instrumented()(clock, utils, running=[req(5, 5), req(5, 6)], waiting=[req(0, 2)])
    s.kv_holding_waiting = deque()
    s.async_kv_waiting = deque([req(0, 2)])
    s.max_num_active_reqs, s.num_waiting_for_streaming_input = 2, 0
    admits = [True]
    s._admits_inflight_kv_load = lambda: admits[0]
    s.plan = [(idle_output(), 0.0, []) for _ in range(4)]
    pending = name("request_prefill_pending_nums")
    s.schedule()  # full, but a load can start: not blocked
    assert metrics.value(pending, **step("idle")) is None
    admits[0] = False
    s.schedule()  # the load limit reached: blocked
    assert metrics.value(pending, **step("idle")) == 1
    admits[0] = True
    s.schedule()  # a load can start again: the episode ends
    s.async_kv_waiting.clear()
    s.schedule()  # no load waits, the batch full, one waiting: a new episode
    assert metrics.value(pending, **step("idle")) == 2


def test_paused_streaming_sessions_hold_a_slot_against_max_num_running_reqs_from_vllm_030(metrics, clock, utils):
    """vLLM 0.30 (no max_num_active_reqs) admits while len(running) + num_waiting_for_streaming_input <
    max_num_running_reqs; 0.23 while len(running) < max_num_running_reqs. Two slots, one running request, one paused
    streaming session, one waiting request: blocked on 0.30's reading, not on 0.23's (the installer sets which)."""
    pending = name("request_prefill_pending_nums")
    saved = STATE.streaming_holds_a_slot
    try:
        for holds, blocked in ((False, None), (True, 1)):
            STATE.streaming_holds_a_slot = holds
            s = instrumented()(clock, utils, running=[req(5, 5)], waiting=[req(0, 2)], max_num_running_reqs=2)
            s.num_waiting_for_streaming_input = 1
            s.plan = [(idle_output(), 0.0, [])]
            s.schedule()
            assert metrics.value(pending, **step("idle")) == blocked, holds
    finally:
        STATE.streaming_holds_a_slot = saved


def test_the_installer_sets_the_streaming_slot_reading_from_the_installed_vllm(monkeypatch):
    from packaging.version import Version

    from opentelemetry_instrumentation_vllm_ascend.wiring import installer

    saved = STATE.streaming_holds_a_slot
    try:
        for version, holds in (("0.23.0", False), ("0.30.0", True), ("0.32.0+cpu", True)):
            monkeypatch.setattr(installer, "vllm_version", lambda v=version: Version(v))
            installer.Installer(table=(), ready_points=()).install()
            assert STATE.streaming_holds_a_slot is holds, version
    finally:
        STATE.streaming_holds_a_slot = saved
