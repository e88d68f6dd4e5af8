"""Test doubles shaped like vLLM's objects (requests, SchedulerOutputs, schedulers, executors, the
``vllm.v1.utils`` profiling-scope module, torch's record_function) and an injectable clock, shared by
the handler tests; plus the helpers that spell expected series (label keys, bucket counts)."""

import concurrent.futures
import types
from types import SimpleNamespace as NS

from opentelemetry_instrumentation_vllm_ascend import catalogue
from opentelemetry_instrumentation_vllm_ascend.handlers import scheduler
from opentelemetry_instrumentation_vllm_ascend.hooks import codegen, targets
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import SYNC, SYNC_TIMER, wrap

S, R, T = catalogue.STEP_SECONDS, catalogue.REQUESTS, catalogue.TOKENS
F = catalogue.FINE_SECONDS  # µs-scale timers: scheduler calls, add_request, the input queue
SC = catalogue.SCOPE_SECONDS  # vLLM's profiling scopes
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
    """perf_counter stand-in: tests advance ``t`` by exact binary fractions, so every duration, sum and
    bucket is hand-computable. ``reads`` counts the readings taken."""

    def __init__(self, t: float = 100.0):
        self.t = t
        self.reads = 0

    def __call__(self):
        self.reads += 1
        return self.t


class Boundaries:
    """Stands in for a time budget's boundary function (``budget.ENGINE_TO`` & co.): calls the real one and
    notes the clock's read count at each boundary, so that a test can check what each boundary cost in clock
    readings (``reads_per_boundary``: the readings since the previous boundary, the first since ``start``) and
    that the boundary itself reads no clock (``inside``)."""

    def __init__(self, clock: Clock, to):
        self.clock = clock
        self.to = to
        self.start = clock.reads
        self.marks: list[int] = []
        self.stages: list[int] = []
        self.inside = 0

    def __call__(self, stage, now):
        before = self.clock.reads
        self.to(stage, now)
        self.inside += self.clock.reads - before
        self.marks.append(self.clock.reads)
        self.stages.append(stage)

    def reads_per_boundary(self) -> list[int]:
        return [mark - previous for previous, mark in zip([self.start] + self.marks, self.marks)]


def patch_clock(monkeypatch, *modules) -> Clock:
    """A Clock read as ``perf_counter`` by the timer wrappers (``codegen``: bound when wrapped) and by
    the handler ``modules`` that read the clock themselves."""
    c = Clock()
    monkeypatch.setattr(codegen, "perf_counter", c)
    for module in modules:
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


def req(computed, num_tokens, prompt=None, request_id=None):
    """A Request: tokens computed so far, tokens known (prompt + outputs), prompt length."""
    return NS(
        num_computed_tokens=computed,
        num_tokens=num_tokens,
        request_id=request_id,
        num_prompt_tokens=num_tokens if prompt is None else prompt,
    )


def output(requests, new=(), cached=(), resumed=()):
    """A SchedulerOutput. ``new``: new requests, each an id (1 token scheduled), ``(id, scheduled)``
    or ``(id, scheduled, computed before the step)`` (computed: the prefix-cache hit, 0 unless given);
    ``cached``: ``(id, scheduled)``, whose CachedRequestData numbers are taken from ``requests`` as
    they were *before* the step; ``resumed``: ids of cached requests resumed after a preemption."""
    new = [(n, 1, 0) if isinstance(n, str) else (n[0], n[1], n[2] if len(n) > 2 else 0) for n in new]
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


# -- schedulers --------------------------------------------------------------------------------------


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
    """``cls`` with the scheduler handlers wrapped around schedule, update_from_output and add_request."""
    return type(
        "Instrumented" + cls.__name__,
        (cls,),
        {
            "schedule": wrap(cls.schedule, scheduler.Schedule(), SYNC)[0],
            "update_from_output": wrap(cls.update_from_output, scheduler.UpdateFromOutput(), SYNC)[0],
            "add_request": wrap(
                cls.add_request, targets.handler_of("vllm.v1.core.sched.scheduler:Scheduler.add_request"), SYNC_TIMER
            )[0],
        },
    )


class FakeKV:
    def __init__(self, results):
        self.results = list(results)

    def allocate_slots(self, request, num_new_tokens, **kw):
        r = self.results.pop(0)
        if isinstance(r, Exception):
            raise r
        return r


class PlannedScheduler:
    """The parts of vllm.v1.core.sched.scheduler.Scheduler the handlers touch."""

    def __init__(self, plan):
        # plan: list of steps; each: (events, output builder called with self.requests)
        self.plan = list(plan)
        self.requests = {}
        self.kv_cache_manager = FakeKV([])

    def _preempt_request(self, request, timestamp, drop_stale_output=False):
        request.num_computed_tokens = 0

    def reset_prefix_cache(self, reset_running_requests=False):
        for r in list(self.requests.values()):
            self._preempt_request(r, 0.0, drop_stale_output=True)
        return True

    def schedule(self):
        events, build = self.plan.pop(0)
        for kind, arg in events:
            if kind == "preempt":
                self._preempt_request(arg, 0.0)
            elif kind == "alloc":
                self.kv_cache_manager.allocate_slots(arg, 1)
        return build(self.requests)


# -- executors ---------------------------------------------------------------------------------------


class FakeExecutor:
    """collective_rpc of vLLM's executors. Each call takes ``cost`` seconds of ``clock`` to dispatch,
    then raises ``fail`` if set, or "Executor failed." for method ``dead`` (vLLM's message when the
    executor died). Non-blocking: a plain Future (kept in ``futures``) the test completes. Blocking:
    ``replies[method]``, or for a method in ``times_out`` the TimeoutError vLLM's RPC raises."""

    def __init__(self, clock=None, cost=0.0, times_out=()):
        self.clock = clock
        self.cost = cost
        self.times_out = set(times_out)
        self.calls = 0
        self.futures = []
        self.fail = None
        self.replies = {}

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None, non_block=False, unique_reply_rank=None):
        self.calls += 1
        if self.clock is not None:
            self.clock.t += self.cost
        if self.fail is not None:
            raise self.fail
        if method == "dead":
            raise RuntimeError("Executor failed.")
        if non_block:
            future = concurrent.futures.Future()
            self.futures.append(future)
            return future
        if method in self.times_out:
            raise TimeoutError(f"RPC call to {method} timed out.")
        return self.replies.get(method)
