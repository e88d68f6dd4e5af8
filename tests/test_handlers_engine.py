"""EngineCore and worker handlers (scheduler, engine loop, executor RPC, model runner, profiling
scopes) on plain objects shaped like vLLM's, driven through the real wrappers and recorded through
the real OTel SDK. Durations come from an injected clock advanced by exact binary fractions, so every
count, sum and bucket below is hand-computed and asserted exactly."""

import concurrent.futures
import contextlib
import threading
import types
from collections import deque
from types import SimpleNamespace as NS

import pytest

from opentelemetry_instrumentation_vllm_ascend import catalogue, context, recording
from opentelemetry_instrumentation_vllm_ascend.context import PHASE_ATTRIBUTE
from opentelemetry_instrumentation_vllm_ascend.handlers import budget, engine, executor, model_runner, scheduler
from opentelemetry_instrumentation_vllm_ascend.hooks import codegen, patches
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import FUTURE, SYNC, SYNC_TIMER, wrap
from opentelemetry_instrumentation_vllm_ascend.recording import pipeline

S, R, T = catalogue.STEP_SECONDS, catalogue.REQUESTS, catalogue.TOKENS
F = catalogue.FINE_SECONDS  # µs-scale timers: scheduler calls, scopes, add_request, the input queue
ALL_LABELS = {"dp": "0", "role": "mixed", "phase": "all"}


def name(seed):
    return catalogue.PREFIX + seed


def counts(bounds, **hits):
    """Bucket counts of a histogram with ``bounds``: ``b3=2`` puts 2 in bucket 3, (bounds[2], bounds[3]]."""
    out = [0] * (len(bounds) + 1)
    for key, n in hits.items():
        out[int(key[1:])] = n
    return tuple(out)


def step(phase, **extra):
    return {"dp": "0", "role": "mixed", "phase": phase, **extra}


def key(**attrs):
    return tuple(sorted(attrs.items()))


class Clock:
    """perf_counter stand-in."""

    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


@pytest.fixture(autouse=True)
def reset_state():
    def reset():
        model_runner.CURRENT[0] = None
        model_runner._DEVICE[0] = False
        model_runner._names.clear()
        scheduler._BLOCKED.clear()
        engine.CURRENT_PASS[0] = None
        context.EXEC_PHASE[0] = context.UNKNOWN
        executor.LAST_EXECUTE[0] = None

    reset()
    yield
    reset()


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(codegen, "perf_counter", c)  # timer kinds: bound when wrapped
    for module in (scheduler, engine, executor, model_runner, budget):  # handlers reading the clock themselves
        monkeypatch.setattr(module, "perf_counter", c)
    return c


# -- a stand-in for vllm.v1.utils: vLLM's own record_function_or_nullcontext --------------------------

_UTILS_SOURCE = """
import contextlib

CUSTOM_SCOPES = False  # envs.VLLM_CUSTOM_SCOPES_FOR_PROFILING
record_function = None  # torch.profiler.record_function
_PROFILER_FUNC = None


def record_function_or_nullcontext(name):
    global _PROFILER_FUNC

    # fast path assume it is set
    if _PROFILER_FUNC is not None:
        return _PROFILER_FUNC(name)

    func = contextlib.nullcontext
    if CUSTOM_SCOPES:
        func = record_function

    _PROFILER_FUNC = func
    return func(name)
"""


def fake_utils(record_function=None):
    module = types.ModuleType("fake_vllm_v1_utils")
    exec(_UTILS_SOURCE, module.__dict__)
    if record_function is not None:
        module.CUSTOM_SCOPES = True
        module.record_function = record_function
    return module


@pytest.fixture
def utils():
    module = fake_utils()
    patch = model_runner.ProfilerScopes().install(module)
    yield module
    patch.remove()


class RecordFunction:
    """torch.profiler.record_function stand-in: logs what it is entered and exited with."""

    log = None

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        self.log.append(("enter", self.name))
        return self

    def __exit__(self, exc_type, exc, tb):
        self.log.append(("exit", self.name, exc_type))
        return False


# -- SchedulerOutput-shaped objects ---------------------------------------------------------------------


def req(computed, num_tokens, prompt=None):
    return NS(
        num_computed_tokens=computed, num_tokens=num_tokens, num_prompt_tokens=num_tokens if prompt is None else prompt
    )


def output(requests, new=(), cached=(), resumed=()):
    """``new``: (id, scheduled, computed before the step); ``cached``: (id, scheduled), their
    CachedRequestData numbers taken from ``requests`` as they were before the step."""
    ids = [rid for rid, _ in cached]
    scheduled = {rid: n for rid, n, _ in new} | dict(cached)
    return NS(
        num_scheduled_tokens=scheduled,
        total_num_scheduled_tokens=sum(scheduled.values()),
        scheduled_new_reqs=[NS(req_id=rid, num_computed_tokens=computed) for rid, _, computed in new],
        scheduled_cached_reqs=NS(
            req_ids=ids,
            resumed_req_ids=set(resumed),
            num_computed_tokens=[requests[rid].num_computed_tokens for rid in ids],
            num_output_tokens=[requests[rid].num_tokens - requests[rid].num_prompt_tokens for rid in ids],
        ),
    )


def idle_output():
    return output({})


# -- scheduler ------------------------------------------------------------------------------------------


class BlockPool:
    def __init__(self, total, free):
        self.num_gpu_blocks = total
        self.free = free

    def get_num_free_blocks(self):
        return self.free


class FakeScheduler:
    """The parts of vllm.v1.core.sched.scheduler.Scheduler the handlers read."""

    def __init__(
        self, clock, utils=None, requests=None, running=(), waiting=(), max_num_running_reqs=8, blocks=(100, 37)
    ):
        self.clock = clock
        self.utils = utils
        self.requests = requests or {}
        self.running = list(running)
        self.waiting = list(waiting)
        self.max_num_running_reqs = max_num_running_reqs
        self.kv_cache_manager = NS(block_pool=BlockPool(*blocks))
        self.plan = []
        self.during = None

    def schedule(self):
        out, seconds, scopes = self.plan.pop(0)
        for scope, scope_seconds in scopes:
            with self.utils.record_function_or_nullcontext(scope):
                self.clock.t += scope_seconds
        self.clock.t += seconds
        if self.during is not None:
            self.during()
        if isinstance(out, BaseException):
            raise out
        return out

    def update_from_output(self, scheduler_output, model_runner_output):
        self.clock.t += model_runner_output
        if model_runner_output < 0:
            raise RuntimeError("update failed")
        return {}

    def add_request(self, request):
        self.clock.t += request
        if request < 0:
            raise ValueError("bad request")


def instrumented(cls=FakeScheduler):
    return type(
        "Instrumented" + cls.__name__,
        (cls,),
        {
            "schedule": wrap(cls.schedule, scheduler.Schedule(), SYNC)[0],
            "update_from_output": wrap(cls.update_from_output, scheduler.UpdateFromOutput(), SYNC)[0],
            "add_request": wrap(cls.add_request, scheduler.AddRequest(), SYNC_TIMER)[0],
        },
    )


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
    context.LAST_STEP_PHASE[0] = "decode"  # the previous step's: not the phase of scopes in this one

    assert s.schedule() is out
    assert seen_inside == [False]  # the scope ended inside schedule(): held until the step's phase is known
    assert getattr(out, PHASE_ATTRIBUTE) == "mixed"
    assert context.LAST_STEP_PHASE[0] == "mixed"

    m, mixed = metrics, step("mixed")
    pre, dec = step("mixed", req_phase="prefill"), step("mixed", req_phase="decode")
    assert m.value(name("scheduler:duration"), **mixed) == (1, 0.125, counts(F, b16=1))  # (0.1, 0.25]
    assert m.points()[name("record_function_or_nullcontext")] == {  # with this step's phase
        key(**step("mixed", name="schedule: allocate_slots")): (1, 0.0625, counts(F, b15=1))
    }  # (0.05, 0.1]
    assert m.value(name("scheduler:batch_size"), **mixed) == (1, 4, counts(R, b3=1))  # (2, 4]
    assert m.value(name("scheduler:phase_batch_size"), **pre) == (1, 3, counts(R, b3=1))
    assert m.value(name("scheduler:phase_batch_size"), **dec) == (1, 1, counts(R, b1=1))
    assert m.value(name("scheduler:phase_scheduled_tokens"), **pre) == (1, 23, counts(T, b4=1))  # (16, 32]
    assert m.value(name("scheduler:phase_scheduled_tokens"), **dec) == (1, 1, counts(T, b1=1))
    assert m.points()[name("scheduler:phase_scheduled_token_counter")] == {key(**pre): 23, key(**dec): 1}
    # context: 2 cached (new) + 0 + 4 + 12 computed before the step, plus the 24 scheduled
    assert m.value(name("scheduler:seqlen:sum"), **mixed) == 42
    assert m.value(name("scheduler:seqlen:avg"), **mixed) == 10.5
    assert m.value(name("scheduler:running_queue_size"), **mixed) == (1, 5, counts(R, b4=1))  # (4, 8]
    assert m.value(name("running_phase_batch_size"), **pre) == (1, 2, counts(R, b2=1))
    assert m.value(name("running_phase_batch_size"), **dec) == (1, 3, counts(R, b3=1))
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
    assert len(recording._deferred) == 1  # nothing recorded yet
    s.get_grammar_bitmask(out)
    assert len(recording._deferred) == 1  # one step waits: not yet
    s.running.append(req(0, 5))  # what happens after schedule() returned is not this step's state
    s.waiting.clear()
    s.kv_cache_manager.block_pool.free = 3
    s.schedule()
    assert len(recording._deferred) == 2
    s.get_grammar_bitmask(out)
    assert len(recording._deferred) == 0

    dec = step("decode")
    assert metrics.value(name("scheduler:duration"), **dec) == (2, 0.4375, counts(F, b16=2))  # 0.1875, 0.25
    assert metrics.value(name("scheduler:running_queue_size"), **dec) == (2, 3, counts(R, b1=1, b2=1))
    assert metrics.value(name("waiting_phase_batch_size"), **step("decode", req_phase="prefill")) == (
        2,
        1,
        counts(R, b0=1, b1=1),
    )
    assert metrics.value(name("free_kvcache_blocks"), **step("all")) == 3
    assert metrics.points()[name("record_function_or_nullcontext")] == {
        key(**step("decode", name="schedule: allocate_slots")): (1, 0.0625, counts(F, b15=1))
    }


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
    assert len(recording._deferred) == 1  # not recorded yet…
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
            context.CURRENT_STEP.get().preemptions += 1
            context.CURRENT_STEP.get().recomputes += 1

    s.during = after_each
    return s


def test_steps_recorded_together_equal_steps_recorded_one_by_one(metrics, clock, utils):
    """Eight steps recorded together (_record_schedules: equal values counted at once, the last gauge
    values, the pending edges in order) record exactly what the same steps record one at a time (a
    collection after each); the per-step values themselves are checked by hand in the tests above."""
    from conftest import Metrics
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    def run(collect_each):
        scheduler._BLOCKED.clear()
        scheduler._BLOCKS.clear()
        reader = Metrics(InMemoryMetricReader())
        pipeline.reset(extra_readers=[reader.reader])
        context.set_process("engine_core", "0", "mixed")
        s = _varied_steps(clock, utils)
        for _ in range(len(s.plan)):
            s.schedule()
            if collect_each:
                assert len(recording._deferred) == 1
                reader.points()  # a collection records the one pending step: the per-step path
        points = reader.points()
        assert not recording._deferred
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
    assert not recording._deferred
    s.schedule()
    assert len(recording._deferred) == 1
    pipeline.reset()  # its final export ran it; nothing is left over
    assert not recording._deferred


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
        counts(R, b0=1, b1=3, b3=2),
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
    assert m.value(name("scheduler:duration"), **dec) == (1, 0.25, counts(F, b16=1))
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
    assert m.value(name("scheduler:duration"), **dec) == (2, 0.75, counts(F, b16=1, b17=1))
    assert m.value(name("scheduler:batch_size"), **dec) == (2, 2, counts(R, b1=2))
    assert m.value(name("scheduler:running_queue_size"), **dec) == (1, 1, counts(R, b1=1))  # unchanged
    assert m.value(name("allocated_kvcache_blocks"), **ALL_LABELS) == 5


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
    context.LAST_STEP_PHASE[0] = "prefill"

    s.schedule()
    assert metrics.points()[name("record_function_or_nullcontext")] == {
        key(**step("decode", name="schedule: allocate_slots")): (3, 0.25, counts(F, b15=2, b16=1)),
        key(**step("decode", name="schedule: update_after_schedule")): (1, 0.25, counts(F, b16=1)),
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
        key(**step("idle", name="schedule: allocate_slots")): (3, 0.4375, counts(F, b15=1, b16=2))
    }


def test_schedule_that_raises_records_its_scopes_with_phase_unknown(metrics, clock, utils):
    s = instrumented()(clock, utils)
    s.plan = [(RuntimeError("scheduler bug"), 0.5, [("schedule: allocate_slots", 0.125)])]
    context.LAST_STEP_PHASE[0] = "decode"
    with pytest.raises(RuntimeError, match="scheduler bug"):
        s.schedule()
    assert context.LAST_STEP_PHASE[0] == "unknown"
    assert metrics.points()[name("record_function_or_nullcontext")] == {
        key(**step("unknown", name="schedule: allocate_slots")): (1, 0.125, counts(F, b16=1))
    }
    assert name("scheduler:duration") not in metrics.points()


def test_update_from_output_phase_from_the_scheduler_output(metrics, clock):
    s = instrumented()(clock)
    context.LAST_STEP_PHASE[0] = "decode"  # the next step was already scheduled (async scheduling)
    so = NS(**{PHASE_ATTRIBUTE: "prefill"})
    assert s.update_from_output(so, 0.25) == {}
    s.update_from_output(model_runner_output=0.5, scheduler_output=NS())  # no phase stored: the last step's
    with pytest.raises(RuntimeError, match="update failed"):
        s.update_from_output(so, -1.0)  # failed: not timed
    spec = name("scheduler:update_from_output:duration")
    assert metrics.points()[spec] == {
        key(**step("prefill")): (1, 0.25, counts(F, b16=1)),
        key(**step("decode")): (1, 0.5, counts(F, b17=1)),
    }


def test_add_request_phase_all(metrics, clock):
    s = instrumented()(clock)
    context.LAST_STEP_PHASE[0] = "prefill"
    s.add_request(0.001953125)  # 2**-9 s
    s.add_request(request=0.001953125)
    with pytest.raises(ValueError, match="bad request"):
        s.add_request(-1.0)
    assert metrics.points()[name("scheduler:add_request:duration")] == {
        key(**ALL_LABELS): (2, 0.00390625, counts(F, b10=2))
    }  # (0.001, 0.0025]


# -- executor RPC timing ----------------------------------------------------------------------------------


class FakeExecutor:
    """collective_rpc taking ``cost`` seconds to dispatch; it replies ``replies[method]`` (a blocking
    call) or a plain Future the test completes."""

    def __init__(self, clock, cost):
        self.clock = clock
        self.cost = cost
        self.futures = []
        self.fail = None
        self.replies = {}

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None, non_block=False, unique_reply_rank=None):
        self.clock.t += self.cost
        if self.fail is not None:
            raise self.fail
        if non_block:
            future = concurrent.futures.Future()
            self.futures.append(future)
            return future
        return self.replies.get(method)


def rpc_fn():
    return wrap(FakeExecutor.collective_rpc, executor.CollectiveRpc(), FUTURE)[0]


def stamped(returned, ready, host=context.HOST_CLOCK):
    """A worker's reply that ends a step: stamped by the worker's hooks (see model_runner.reply)."""
    return NS(**{context.READY_ATTRIBUTE: (host, returned, ready)})


EXEC, SAMPLE, RPC = (
    name("executor:execute_model:duration"),
    name("executor:sample_tokens:duration"),
    name("rpc_errors"),
)


def test_blocking_rpcs_are_timed_to_the_moments_the_worker_stamped(metrics, clock):
    ex, rpc = FakeExecutor(clock, 0.25), rpc_fn()
    context.LAST_STEP_PHASE[0] = "decode"  # async scheduling: the next step is already scheduled
    so = NS(**{PHASE_ATTRIBUTE: "prefill"})
    assert rpc(ex, "execute_model", args=(so,)) is None  # sampling follows: its reply will say
    assert EXEC not in metrics.points()
    ex.cost = 0.125
    context.LAST_STEP_PHASE[0] = "mixed"
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
        key(**step("prefill")): (1, 0.1875, counts(S, b11=1)),
        key(**step("mixed")): (1, 0.25, counts(S, b11=1)),
    }
    assert metrics.points()[SAMPLE] == {
        key(**step("prefill")): (1, 0.0625, counts(S, b10=1)),
        key(**step("mixed")): (1, 0.125, counts(S, b11=1)),
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
    assert metrics.points()[EXEC] == {key(**step("decode")): (1, 0.25, counts(S, b11=1))}
    assert metrics.points()[SAMPLE] == {key(**step("decode")): (1, 0.3671875, counts(S, b12=1))}

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
    assert metrics.points()[EXEC][key(**step("prefill"))] == (1, 0.5, counts(S, b12=1))
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
        key(**step("decode")): (1, 0.125, counts(S, b11=1)),
        key(**step("prefill")): (1, 0.125, counts(S, b11=1)),
    }
    assert metrics.points()[SAMPLE] == {key(**step("decode")): (1, 0.25, counts(S, b11=1))}
    assert metrics.points()[RPC] == {key(**step("mixed", exception_type="worker_failed")): 1}


# -- engine core loop ---------------------------------------------------------------------------------


def scheduled(phase):
    """What the scheduler hook leaves behind when schedule() ran: one more call, and its step's phase."""
    context.SCHEDULE_CALLS[0] += 1
    context.LAST_STEP_PHASE[0] = phase


class FakeEngineCore:
    def __init__(self, clock):
        self.clock = clock
        self.work = False
        self.queue = deque()  # (idle wait before it arrives, request type, seconds to handle it)
        self.overhead = 0.0

    def step(self):
        self.clock.t += 0.25
        scheduled("prefill")  # the scheduler hook, during the call
        return {}, True

    def step_with_batch_queue(self):
        self.clock.t += 0.5
        scheduled("mixed")
        return None, True

    def _process_engine_step(self):
        outputs, executed = self.step()
        self.clock.t += 0.125  # queueing the outputs
        return executed

    def has_work(self):
        return self.work

    def _process_input_queue(self):
        """vLLM's shape: block for requests while idle, then drain what is queued without blocking."""
        self.clock.t += self.overhead
        while not self.has_work():
            if not self.queue:  # non-blocking get found nothing (or shutting down)
                break
            wait, request_type, seconds = self.queue.popleft()
            self.clock.t += wait  # blocked in input_queue.get()
            self._handle_client_request(request_type, seconds)
        while self.queue:
            _wait, request_type, seconds = self.queue.popleft()
            self._handle_client_request(request_type, seconds)

    def _handle_client_request(self, request_type, request):
        if request_type == "BOOM":
            raise RuntimeError("bad request")
        self.clock.t += request
        if request_type == "ADD":
            self.work = True


def instrumented_engine():
    cls = FakeEngineCore
    return type(
        "InstrumentedEngineCore",
        (cls,),
        {
            "step": wrap(cls.step, engine.EngineCoreStep(), SYNC_TIMER)[0],
            "step_with_batch_queue": wrap(cls.step_with_batch_queue, engine.EngineCoreStep(), SYNC_TIMER)[0],
            "_process_engine_step": wrap(cls._process_engine_step, engine.ProcessEngineStep(), SYNC_TIMER)[0],
            "_process_input_queue": wrap(cls._process_input_queue, engine.ProcessInputQueue(), SYNC)[0],
            "_handle_client_request": wrap(cls._handle_client_request, engine.HandleClientRequest(), SYNC)[0],
        },
    )


def test_engine_steps_get_the_phase_set_during_the_call(metrics, clock):
    core = instrumented_engine()(clock)
    context.LAST_STEP_PHASE[0] = "decode"
    assert core.step() == ({}, True)
    assert core.step_with_batch_queue() == (None, True)
    assert core._process_engine_step() is True  # runs a (timed) step inside
    assert metrics.points()[name("engine_core:engine_core_step:duration")] == {
        key(**step("prefill")): (2, 0.5, counts(S, b11=2)),
        key(**step("mixed")): (1, 0.5, counts(S, b12=1)),
    }
    assert metrics.points()[name("engine_core:process_engine_step:duration")] == {
        key(**step("prefill")): (1, 0.375, counts(S, b12=1))
    }  # 0.25 + 0.125


def _real_engine_loop():
    """vLLM's own EngineCore.step and EngineCoreProc._process_engine_step (and _process_input_queue),
    instrumented, on a stand-in engine: a scheduler with no requests (an idle DP rank's), a real
    input queue."""
    import queue

    core = pytest.importorskip("vllm.v1.engine.core")

    class IdleEngine:
        def __init__(self):
            self.scheduler = NS(has_requests=lambda: False)
            self.output_queue = queue.Queue()
            self.input_queue = queue.Queue()
            self.aborts_queue = queue.Queue()
            self.process_input_queue_block = True
            self._idle_state_callbacks = []
            self.work = False
            self.handled = []

        @property
        def step_fn(self):
            return self.step

        def post_step(self, model_executed):
            pass

        def has_work(self):
            return self.work

        def is_running(self):
            return True

        def _notify_idle_state_callbacks(self):
            pass

        def _handle_client_request(self, request_type, request):
            self.handled.append(request_type)
            if request_type == "ADD":
                self.work = True

    IdleEngine._handle_client_request = wrap(IdleEngine._handle_client_request, engine.HandleClientRequest(), SYNC)[0]
    IdleEngine.step = wrap(core.EngineCore.step, engine.EngineCoreStep(), SYNC_TIMER)[0]
    IdleEngine._process_engine_step = wrap(
        core.EngineCoreProc._process_engine_step, engine.ProcessEngineStep(), SYNC_TIMER
    )[0]
    IdleEngine._process_input_queue = wrap(core.EngineCoreProc._process_input_queue, engine.ProcessInputQueue(), SYNC)[
        0
    ]
    return IdleEngine()


def test_an_engine_step_that_scheduled_nothing_is_idle(metrics):
    """An idle DP rank's busy loop runs vLLM's _process_engine_step, whose step() returns before
    scheduling: those steps are phase idle, not the phase of the last step the rank scheduled."""
    idle = _real_engine_loop()
    context.LAST_STEP_PHASE[0] = "decode"  # the rank's last real step
    for _ in range(3):
        assert idle._process_engine_step() is False
    points = metrics.points()
    for seed in ("engine_core:engine_core_step:duration", "engine_core:process_engine_step:duration"):
        series = points[name(seed)]
        assert set(series) == {key(**step("idle"))}, seed  # no decode value
        assert series[key(**step("idle"))][0] == 3


def test_process_input_queue_excludes_idle_waits_after_requests_that_gave_no_work(metrics):
    """vLLM's _process_input_queue on an idle engine: a utility call arrives, vLLM handles it and,
    still without work, blocks again; half a second later a request arrives. Only the handling counts,
    not the 0.5 s the engine waited between the two."""
    import threading
    import time

    idle = _real_engine_loop()

    def client():
        time.sleep(0.05)
        idle.input_queue.put(("UTILITY", None))
        time.sleep(0.5)
        idle.input_queue.put(("ADD", None))

    thread = threading.Thread(target=client)
    thread.start()
    start = time.perf_counter()
    idle._process_input_queue()
    elapsed = time.perf_counter() - start
    thread.join()
    assert idle.handled == ["UTILITY", "ADD"] and elapsed >= 0.55
    count, seconds, _ = metrics.value(name("engine_core:process_input_queue:duration"), **ALL_LABELS)
    assert count == 1
    assert seconds < 0.05  # handling two requests, not the 0.5 s wait


def test_process_input_queue_excludes_the_idle_wait(metrics, clock):
    core = instrumented_engine()(clock)
    spec = name("engine_core:process_input_queue:duration")
    core.overhead = 0.0625

    # Busy: timed from entry (overhead included), both requests.
    core.work = True
    core.queue.extend([(0.0, "ADD", 0.125), (0.0, "ABORT", 0.125)])
    core._process_input_queue()
    assert metrics.value(spec, **ALL_LABELS) == (1, 0.3125, counts(F, b17=1))

    # Idle: blocks 5 s for the first request; timed from its handling: 0.125 + 0.0625.
    core.work = False
    core.queue.extend([(5.0, "ADD", 0.125), (0.0, "ADD", 0.0625)])
    core._process_input_queue()
    assert metrics.value(spec, **ALL_LABELS) == (2, 0.5, counts(F, b16=1, b17=1))

    # Idle: a utility request (no work) after 5 s, then 2 s more of waiting until the ADD: only the two
    # requests' handling and what follows the ADD count: 0.125 + 0.0625 + 0.0625.
    core.work = False
    core.queue.extend([(5.0, "UTILITY", 0.125), (2.0, "ADD", 0.0625), (0.0, "ABORT", 0.0625)])
    core._process_input_queue()
    assert metrics.value(spec, **ALL_LABELS) == (3, 0.75, counts(F, b16=2, b17=1))
    metrics_before = metrics.value(spec, **ALL_LABELS)

    # Idle and nothing arrived: nothing to time.
    core.work = False
    core._process_input_queue()
    assert metrics.value(spec, **ALL_LABELS) == metrics_before

    # Busy and nothing queued: the pass itself is timed.
    core.work = True
    core._process_input_queue()
    assert metrics.value(spec, **ALL_LABELS) == (4, 0.8125, counts(F, b15=1, b16=2, b17=1))
    assert engine.CURRENT_PASS[0] is None

    # A request handled outside any pass changes nothing; a pass that raises is not timed.
    core._handle_client_request("ADD", 0.25)
    core.work = False
    core.queue.extend([(1.0, "BOOM", 0.0)])
    with pytest.raises(RuntimeError, match="bad request"):
        core._process_input_queue()
    assert engine.CURRENT_PASS[0] is None
    assert metrics.points()[spec] == {key(**ALL_LABELS): (4, 0.8125, counts(F, b15=1, b16=2, b17=1))}


# -- model runner -------------------------------------------------------------------------------------

FORWARD, POST = "gpu_model_runner: forward", "gpu_model_runner: postprocess"


class FakeRunner:
    """GPUModelRunner's shape: execute_model's forward and post-processing scopes, then (when it
    returned None) sample_tokens. ``plan``: host seconds of each part; ``device_ms``: the forward's
    time on the device (advances FakeEvent's device clock)."""

    def __init__(self, clock, utils, event=None):
        self.clock = clock
        self.utils = utils
        self.event = event
        self.requests = {}
        self.plan = {}

    def execute_model(self, scheduler_output, intermediate_tensors=None):
        p, scope = self.plan, self.utils.record_function_or_nullcontext
        self.clock.t += p.get("prepare", 0.0)
        if p.get("no_forward"):  # e.g. kv_connector_no_forward: the step returns before any forward
            return p.get("result")
        with scope(FORWARD):
            self.clock.t += p["forward"]
            if self.event is not None:
                self.event.device_ms += p["device_ms"]
        with scope(POST):
            self.clock.t += p.get("post", 0.0)
        self.clock.t += p.get("tail", 0.0)
        return p.get("result")

    def sample_tokens(self, grammar_output):
        with self.utils.record_function_or_nullcontext("gpu_model_runner: sample"):
            self.clock.t += self.plan["sample"]
            if self.event is not None:
                self.event.device_ms += self.plan.get("device_sample_ms", 0.0)
        return self.plan.get("sampled", "sampled")


def instrumented_runner():
    cls = FakeRunner
    return type(
        "InstrumentedRunner",
        (cls,),
        {
            "execute_model": wrap(cls.execute_model, model_runner.ExecuteModel(), SYNC)[0],
            "sample_tokens": wrap(cls.sample_tokens, model_runner.SampleTokens(), SYNC)[0],
        },
    )


EXECUTE, INFERENCE = name("executor:model_runner_execute_model:duration"), name("worker:model_inference:duration")
NPU_FORWARD, LAUNCH, NON_FORWARD = (
    name("npu:forward_duration"),
    name("npu:kernel_launch"),
    name("npu:non_forward_duration"),
)
SCOPES = name("record_function_or_nullcontext")


def test_worker_step_execute_then_sample_on_the_host_timeline(metrics, clock, utils):
    model_runner._DEVICE[0] = None  # no device events
    runner = instrumented_runner()(clock, utils)
    runner.plan = {"prepare": 0.0625, "forward": 0.25, "post": 0.125, "tail": 0.0625, "result": None, "sample": 0.25}
    context.LAST_STEP_PHASE[0] = "decode"
    assert runner.execute_model(NS(**{PHASE_ATTRIBUTE: "prefill"})) is None
    assert context.LAST_STEP_PHASE[0] == "prefill"
    assert INFERENCE not in metrics.points()  # the step goes on in sample_tokens
    assert runner.sample_tokens(None) == "sampled"
    assert model_runner.CURRENT[0] is None

    m, pre = metrics.points(), step("prefill")
    assert m[EXECUTE] == {key(**pre): (1, 0.5, counts(S, b12=1))}
    assert m[INFERENCE] == {key(**pre): (1, 0.75, counts(S, b13=1))}  # 0.5 + 0.25
    assert m[NPU_FORWARD] == {key(**pre): (1, 0.25, counts(S, b11=1))}
    assert m[LAUNCH] == {key(**pre): (1, 0.375, counts(S, b12=1))}  # forward start 100.0625 → post end 100.4375
    assert m[NON_FORWARD] == {key(**pre): (1, 0.5, counts(S, b12=1))}  # 0.75 - 0.25
    assert m[SCOPES] == {
        key(**step("prefill", name=FORWARD)): (1, 0.25, counts(F, b16=1)),
        key(**step("prefill", name=POST)): (1, 0.125, counts(F, b16=1)),
        key(**step("prefill", name="gpu_model_runner: sample")): (1, 0.25, counts(F, b16=1)),
    }


def test_worker_step_that_returns_its_output_and_classifies_itself(metrics, clock, utils):
    model_runner._DEVICE[0] = None
    runner = instrumented_runner()(clock, utils)
    runner.plan = {"forward": 0.125, "post": 0.0625, "result": "output", "sample": 1.0}
    requests = {"d": req(12, 13, prompt=10)}
    so = output(requests, cached=[("d", 1)])  # from an uninstrumented EngineCore: no phase stored
    assert runner.execute_model(so) == "output"
    assert model_runner.CURRENT[0] is None
    runner.sample_tokens(None)  # not part of a step any more: no second inference value
    m, dec = metrics.points(), step("decode")
    assert m[EXECUTE] == {key(**dec): (1, 0.1875, counts(S, b11=1))}
    assert m[INFERENCE] == {key(**dec): (1, 0.1875, counts(S, b11=1))}  # execute_model only
    assert m[NPU_FORWARD] == {key(**dec): (1, 0.125, counts(S, b11=1))}
    assert m[LAUNCH] == {key(**dec): (1, 0.1875, counts(S, b11=1))}
    assert m[NON_FORWARD] == {key(**dec): (1, 0.0625, counts(S, b10=1))}


class FakeRunnerV2:
    def __init__(self, clock):
        self.clock = clock
        self.requests = {}

    def execute_model(
        self, scheduler_output, intermediate_tensors=None, dummy_run=False, skip_attn_for_dummy_run=False
    ):
        self.clock.t += 0.25
        return "output"


def test_model_runner_v2_skips_dummy_runs(metrics, clock):
    model_runner._DEVICE[0] = None
    run = wrap(FakeRunnerV2.execute_model, model_runner.ExecuteModelV2(), SYNC)[0]
    runner = FakeRunnerV2(clock)
    so = NS(**{PHASE_ATTRIBUTE: "prefill"})
    context.LAST_STEP_PHASE[0] = "decode"
    run(runner, so, None, True)
    run(runner, so, dummy_run=True)
    run(runner, so, dummy_run=True, skip_attn_for_dummy_run=True)
    assert model_runner.CURRENT[0] is None and context.LAST_STEP_PHASE[0] == "decode"
    assert EXECUTE not in metrics.points() and INFERENCE not in metrics.points()
    assert run(runner, so) == "output"
    assert run(runner, so, None, False) == "output"
    pre = step("prefill")
    assert metrics.points()[EXECUTE] == {key(**pre): (2, 0.5, counts(S, b11=2))}
    assert metrics.points()[INFERENCE] == {key(**pre): (2, 0.5, counts(S, b11=2))}


def make_event_class():
    class FakeEvent:
        """torch.npu/cuda.Event: stamps the device clock when recorded; done once the device got there."""

        device_ms = 1000.0  # where the device clock is when work is enqueued
        reached = 0.0  # how far the device has executed
        created = 0

        def __init__(self, enable_timing=False):
            assert enable_timing
            type(self).created += 1

        def record(self):
            self.stamp = type(self).device_ms

        def query(self):
            return self.stamp <= type(self).reached

        def elapsed_time(self, end):
            return end.stamp - self.stamp

    return FakeEvent


def test_step_times_from_device_events_recorded_once_they_are_done(metrics, clock, utils):
    """Where the device offers events, a step's inference, forward and non-forward times all come
    from the device timeline (events at execute_model's start, around the forward scope and at the
    step's end), read once the device has passed them; npu:kernel_launch stays host time."""
    Event = make_event_class()
    timeline = model_runner._DEVICE[0] = model_runner.DeviceTimeline(Event)  # reset by reset_state
    runner = instrumented_runner()(clock, utils, event=Event)

    # Step 1 (prefill): device forward 125 ms, device sampling 62.5 ms; the device is not there yet.
    runner.plan = {
        "prepare": 0.0625,
        "forward": 0.25,
        "device_ms": 125.0,
        "post": 0.125,
        "tail": 0.0625,
        "result": None,
        "sample": 0.25,
        "device_sample_ms": 62.5,
    }
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "prefill"}))
    runner.sample_tokens(None)
    m = metrics.points()
    assert m[LAUNCH] == {key(**step("prefill")): (1, 0.375, counts(S, b12=1))}  # host timeline
    assert INFERENCE not in m and NPU_FORWARD not in m and NON_FORWARD not in m  # not waited for
    assert len(timeline.pending) == 1 and Event.created == 4

    # Step 2 (decode): the device finished step 1 (1000 → 1187.5 ms), not step 2 (2000 → 2250 ms).
    Event.reached, Event.device_ms = 1187.5, 2000.0
    runner.plan = {"forward": 0.5, "device_ms": 250.0, "result": "output"}
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "decode"}))
    m = metrics.points()
    assert m[INFERENCE] == {key(**step("prefill")): (1, 0.1875, counts(S, b11=1))}  # device: 1000 → 1187.5
    assert m[NPU_FORWARD] == {key(**step("prefill")): (1, 0.125, counts(S, b11=1))}
    assert m[NON_FORWARD] == {key(**step("prefill")): (1, 0.0625, counts(S, b10=1))}  # sampling, on the device
    assert len(timeline.pending) == 1

    # Step 3 (mixed): the device is past both (3000 → 3062.5 ms).
    Event.reached, Event.device_ms = 3062.5, 3000.0
    runner.plan = {"forward": 0.125, "device_ms": 62.5, "result": "output"}
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "mixed"}))
    m = metrics.points()
    assert m[NPU_FORWARD] == {
        key(**step("prefill")): (1, 0.125, counts(S, b11=1)),
        key(**step("decode")): (1, 0.25, counts(S, b11=1)),
        key(**step("mixed")): (1, 0.0625, counts(S, b10=1)),
    }
    assert m[INFERENCE] == {
        key(**step("prefill")): (1, 0.1875, counts(S, b11=1)),
        key(**step("decode")): (1, 0.25, counts(S, b11=1)),
        key(**step("mixed")): (1, 0.0625, counts(S, b10=1)),
    }
    assert m[NON_FORWARD] == {
        key(**step("prefill")): (1, 0.0625, counts(S, b10=1)),
        key(**step("decode")): (1, 0.0, counts(S, b0=1)),
        key(**step("mixed")): (1, 0.0, counts(S, b0=1)),
    }
    assert not timeline.pending


def test_non_forward_time_is_on_one_clock_when_the_host_only_launches(metrics, clock, utils):
    """Async scheduling on a device: execute_model and sample_tokens return at once (they only launch
    work); the device computes the forward for 20 ms and samples for 10 ms. Inference is the device's
    30 ms and non-forward its 10 ms — not host launch time minus device forward time (clamped to 0)."""
    Event = make_event_class()
    model_runner._DEVICE[0] = model_runner.DeviceTimeline(Event)
    runner = instrumented_runner()(clock, utils, event=Event)
    runner.plan = {"forward": 0.0, "device_ms": 20.0, "result": None, "sample": 0.0, "device_sample_ms": 10.0}
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "decode"}))
    runner.sample_tokens(None)
    Event.reached = 1030.0
    runner.plan = {"no_forward": True, "result": "output"}  # a later step end reads the finished one
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "prefill"}))
    m, dec = metrics.points(), key(**step("decode"))
    assert m[INFERENCE][dec][:2] == (1, pytest.approx(0.030))
    assert m[NPU_FORWARD][dec][:2] == (1, pytest.approx(0.020))
    assert m[NON_FORWARD][dec][:2] == (1, pytest.approx(0.010))


def test_pending_device_step_is_recorded_at_the_end_of_a_later_step_without_forward(metrics, clock, utils):
    """A step without a forward scope (KV connector without forward) still ends a step: earlier steps
    that the device has finished are recorded then, not held back until the next forward step."""
    Event = make_event_class()
    timeline = model_runner._DEVICE[0] = model_runner.DeviceTimeline(Event)
    runner = instrumented_runner()(clock, utils, event=Event)
    runner.plan = {"forward": 0.25, "device_ms": 125.0, "result": "output"}
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "prefill"}))  # 0.25 s on the host
    assert NPU_FORWARD not in metrics.points() and len(timeline.pending) == 1
    Event.reached = 1125.0
    runner.plan = {"no_forward": True, "prepare": 0.0625, "result": "output"}
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "decode"}))
    m = metrics.points()
    assert m[NPU_FORWARD] == {key(**step("prefill")): (1, 0.125, counts(S, b11=1))}
    assert m[NON_FORWARD] == {key(**step("prefill")): (1, 0.0, counts(S, b0=1))}  # the step was its forward
    assert m[INFERENCE] == {
        key(**step("prefill")): (1, 0.125, counts(S, b11=1)),
        key(**step("decode")): (1, 0.0, counts(S, b0=1)),
    }  # no device work
    assert LAUNCH not in m or key(**step("decode")) not in m[LAUNCH]
    assert not timeline.pending


class AsyncOutput:
    """An async model runner output (async scheduling): get_output() waits for the sampled tokens."""

    def __init__(self, clock, wait, output):
        self.clock, self.wait, self.output = clock, wait, output

    def get_output(self):
        self.clock.t += self.wait
        return self.output


def test_get_output_in_the_output_thread_gets_its_own_steps_phase_and_stamps_the_reply(metrics, clock, utils):
    """vLLM's worker process runs get_output() in its output thread while the main thread already
    runs the next step: a prefill step's get_output that ends after the decode step's execute_model
    began is labelled prefill, and the reply it returns carries the prefill step's moments."""
    model_runner._DEVICE[0] = None
    runner = instrumented_runner()(clock, utils)
    get_output = wrap(AsyncOutput.get_output, model_runner.GetOutput(), SYNC_TIMER)[0]
    reply = NS()
    runner.plan = {"forward": 0.25, "result": None, "sample": 0.125, "sampled": AsyncOutput(clock, 0.5, reply)}
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "prefill"}))  # returns at 100.25
    pending = runner.sample_tokens(None)  # 100.375: handed to the output thread
    started = threading.Event()
    decoding = threading.Event()

    def output_thread():
        started.set()
        decoding.wait(10)  # the main thread is in the decode step now
        assert get_output(pending) is reply

    thread = threading.Thread(target=output_thread)
    thread.start()
    started.wait(10)
    runner.plan = {"forward": 0.0625, "result": None, "sample": 0.0, "sampled": None}
    step_before = model_runner.ExecuteModel().before((runner, NS(**{PHASE_ATTRIBUTE: "decode"})), None)
    assert model_runner.CURRENT[0] is step_before and context.LAST_STEP_PHASE[0] == "decode"
    decoding.set()
    thread.join(10)
    m = metrics.points()
    assert m[name("worker:model_runner_get_output:duration")] == {key(**step("prefill")): (1, 0.5, counts(S, b12=1))}
    assert getattr(reply, context.READY_ATTRIBUTE) == (context.HOST_CLOCK, 100.25, 100.875)


# -- profiling scopes ---------------------------------------------------------------------------------


def test_scope_names_beyond_the_limit_are_other(metrics, clock, utils):
    n = model_runner.MAX_SCOPE_NAMES + 6
    for i in range(n):
        with utils.record_function_or_nullcontext(f"scope {i}"):
            clock.t += 0.0078125
    with utils.record_function_or_nullcontext("scope 0"):  # an early name keeps its own series
        clock.t += 0.0078125
    series = metrics.points()[SCOPES]
    assert len(series) == model_runner.MAX_SCOPE_NAMES + 1
    unknown = step("unknown")
    assert series[key(**unknown, name="scope 0")] == (2, 0.015625, counts(F, b12=2))  # (0.005, 0.01]
    assert series[key(**unknown, name=f"scope {model_runner.MAX_SCOPE_NAMES - 1}")] == (1, 0.0078125, counts(F, b12=1))
    assert series[key(**unknown, name="other")] == (6, 0.046875, counts(F, b12=6))
    assert key(**unknown, name=f"scope {model_runner.MAX_SCOPE_NAMES}") not in series
    # The name table is bounded too: names beyond the limit are not remembered one by one.
    for i in range(1000):
        with utils.record_function_or_nullcontext(f"dynamic {i}"):
            pass
    assert len(model_runner._names) == model_runner.MAX_SCOPE_NAMES
    assert metrics.points()[SCOPES][key(**unknown, name="other")][0] == 1006


def test_scope_that_raises_is_not_recorded_and_the_inner_scope_still_runs(metrics, clock):
    log = []
    record_function = type("RF", (RecordFunction,), {"log": log})
    module = fake_utils(record_function)
    patch = model_runner.ProfilerScopes().install(module)
    try:
        assert module._PROFILER_FUNC is not record_function  # vLLM chose record_function; we wrap it
        boom = ValueError("boom")
        with pytest.raises(ValueError) as raised:
            with module.record_function_or_nullcontext("gpu_model_runner: sample"):
                clock.t += 0.25
                raise boom
        assert raised.value is boom
        assert log == [("enter", "gpu_model_runner: sample"), ("exit", "gpu_model_runner: sample", ValueError)]
        assert SCOPES not in metrics.points()
        with module.record_function_or_nullcontext("gpu_model_runner: bookkeep") as value:
            clock.t += 0.125
        assert isinstance(value, record_function) and value.name == "gpu_model_runner: bookkeep"
        assert log[2:] == [("enter", "gpu_model_runner: bookkeep"), ("exit", "gpu_model_runner: bookkeep", None)]
        assert metrics.points()[SCOPES] == {
            key(**step("unknown", name="gpu_model_runner: bookkeep")): (1, 0.125, counts(F, b16=1))
        }
    finally:
        patch.remove()
    assert module._PROFILER_FUNC is record_function
    assert isinstance(module.record_function_or_nullcontext("x"), record_function)


def test_scope_in_a_step_with_vllms_profiler_on_is_recorded_with_the_step(metrics, clock):
    """With vLLM's profiler on, a scope in schedule() wraps vLLM's own record_function (not the shared
    in-step timer) and is still recorded with the step's phase, when the step's records run."""
    log = []
    module = fake_utils(type("RF", (RecordFunction,), {"log": log}))
    patch = model_runner.ProfilerScopes().install(module)
    try:
        requests = {"decode": req(12, 13, prompt=10)}
        s = instrumented()(clock, module, requests, running=[req(13, 14, prompt=10)])
        s.plan = [(output(requests, cached=[("decode", 1)]), 0.0, [("schedule: allocate_slots", 0.0625)] * 2)]
        context.LAST_STEP_PHASE[0] = "prefill"
        s.schedule()
        assert [entry[0] for entry in log] == ["enter", "exit", "enter", "exit"]
        assert metrics.points()[SCOPES] == {
            key(**step("decode", name="schedule: allocate_slots")): (2, 0.125, counts(F, b15=2))
        }
    finally:
        patch.remove()


def test_disabled_scopes_run_as_without_us_and_the_others_are_still_timed(metrics, clock, monkeypatch):
    """OTEL_VLLM_ASCEND_DISABLED_SCOPES (names or patterns): inside schedule() a disabled scope is one
    shared nullcontext (its blocks still run, once each, untimed); outside, with vLLM's profiler on,
    it is vLLM's own record_function and nothing else; the other scopes are recorded as usual."""
    monkeypatch.setenv("OTEL_VLLM_ASCEND_DISABLED_SCOPES", " schedule: alloc*, gpu_model_runner: sample ")
    utils = fake_utils()
    patch = model_runner.ProfilerScopes().install(utils)
    try:
        rf = utils.record_function_or_nullcontext
        seen, ran = [], []

        class Steps(FakeScheduler):
            def schedule(self):
                for _ in range(3):
                    scope = rf("schedule: allocate_slots")
                    seen.append(scope)
                    with scope:
                        ran.append(1)
                        self.clock.t += 0.0625
                with rf("schedule: update_after_schedule"):
                    self.clock.t += 0.25
                return output({})

        instrumented(Steps)(clock, utils).schedule()
        assert ran == [1, 1, 1] and seen[0] is seen[1] is seen[2] is model_runner._UNTIMED
        assert isinstance(seen[0], contextlib.nullcontext)
        assert metrics.points()[SCOPES] == {
            key(**step("idle", name="schedule: update_after_schedule")): (1, 0.25, counts(F, b16=1))
        }
    finally:
        patch.remove()

    log = []
    record_function = type("RF", (RecordFunction,), {"log": log})
    module = fake_utils(record_function)
    patch = model_runner.ProfilerScopes().install(module)
    try:
        with module.record_function_or_nullcontext("gpu_model_runner: sample") as value:
            clock.t += 0.5
        assert type(value) is record_function  # vLLM's own scope, not ours around it
        with module.record_function_or_nullcontext("gpu_model_runner: bookkeep"):
            clock.t += 0.125
        assert log == [
            ("enter", "gpu_model_runner: sample"),
            ("exit", "gpu_model_runner: sample", None),
            ("enter", "gpu_model_runner: bookkeep"),
            ("exit", "gpu_model_runner: bookkeep", None),
        ]
        assert metrics.points()[SCOPES] == {
            key(**step("idle", name="schedule: update_after_schedule")): (1, 0.25, counts(F, b16=1)),
            key(**step("idle", name="gpu_model_runner: bookkeep")): (1, 0.125, counts(F, b16=1)),
        }  # last step: idle
    finally:
        patch.remove()


def test_untimed_scopes_match_names_and_patterns_and_stay_bounded():
    assert model_runner.untimed_scopes(()) is None  # nothing disabled: the factory checks nothing
    untimed = model_runner.untimed_scopes(("schedule: *", "forward"))
    assert untimed("schedule: allocate_slots") and untimed("forward")
    assert not untimed("gpu_model_runner: forward") and not untimed(None) and not untimed(b"forward")
    for i in range(10 * model_runner.MAX_SCOPE_NAMES):
        assert untimed(f"schedule: {i}") and not untimed(f"other {i}")  # decided each time past the bound


def test_install_lets_vllm_choose_its_factory_and_remove_restores_it():
    module = fake_utils()
    assert module._PROFILER_FUNC is None
    patch = model_runner.ProfilerScopes().install(module)
    factory = module._PROFILER_FUNC
    assert factory._otel_vllm_ascend_factory is True
    scope = module.record_function_or_nullcontext("x")
    assert isinstance(scope, model_runner._Scope) and scope.inner is None  # nullcontext: nothing to wrap
    with pytest.raises(RuntimeError):
        model_runner.ProfilerScopes().install(module)  # already ours
    patch.remove()
    assert module._PROFILER_FUNC is contextlib.nullcontext  # vLLM's own choice
    assert isinstance(module.record_function_or_nullcontext("x"), contextlib.nullcontext)

    # Someone replaced the factory after us: removing ours leaves theirs.
    patch = model_runner.ProfilerScopes().install(module)
    theirs = lambda name: contextlib.nullcontext()  # noqa: E731
    module._PROFILER_FUNC = theirs
    patch.remove()
    assert module._PROFILER_FUNC is theirs
