"""The benchmark suite: ``tox -e bench`` (or ``python -m benchmarks.run``).

Prints, in one run, side by side on the same synthetic target:
  A. ns per hooked call (median, min–max over repeats, ratio to our timer hook): bare call, plain
     closure, wrapt, our hooks per wrapper kind, the same measurement straight through the OTel SDK,
     prometheus_client single- and multi-process, and ms-service-metric 26.0.0's own hooks;
  B. per-step phase classification at batch 16 / 256 / 1024;
  C. export cost per process (writing one process's metrics for /metrics);
  D. /metrics scrape time with 1 / 4 / 16 process contributions;
  E. RSS and series count after 10k simulated engine steps;
  F. every hook one engine step passes through, per process (benchmarks/_step.py);
  A2. what the other features add per call: a hook switched off, hook-file timers and expressions, a
     time-budget stage boundary, a KV transfer hook, each beside its own bare call;
  T. request traces: the API server's cost per request (sampled out, kept, its spans built), beside an
     OTel SDK span's (benchmarks/_traces.py).
Speed claims in docs/performance.md come from this output, never from timed tests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import timeit
from time import perf_counter
from types import SimpleNamespace as NS

from benchmarks import _targets
from opentelemetry_instrumentation_vllm_ascend import catalogue, context, environment, recording
from opentelemetry_instrumentation_vllm_ascend.handlers import steps
from opentelemetry_instrumentation_vllm_ascend.handlers.common import StepTimer
from opentelemetry_instrumentation_vllm_ascend.handlers.executor import CollectiveRpc
from opentelemetry_instrumentation_vllm_ascend.handlers.scopes import ProfilerScopes
from opentelemetry_instrumentation_vllm_ascend.hooks.handler import Handler
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import (
    ASYNC_GENERATOR,
    COROUTINE_TIMER,
    FUTURE,
    SYNC,
    SYNC_TIMER,
    wrap,
)
from opentelemetry_instrumentation_vllm_ascend.recording import pipeline
from opentelemetry_instrumentation_vllm_ascend.state import STATE
from tests.support.process import set_process
from tests.support.steps import step_phase

HERE = os.path.dirname(os.path.abspath(__file__))

TIMER = catalogue.MetricSpec(
    seed="bench:step:duration",
    kind=catalogue.HISTOGRAM,
    unit="s",
    description="benchmark timer",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
SCOPE = catalogue.MetricSpec(
    seed="bench:scope:duration",
    kind=catalogue.HISTOGRAM,
    unit="s",
    description="benchmark scope",
    labels=("dp", "role", "phase", "name"),
    buckets=TIMER.buckets,
)
BENCH_SPECS = (TIMER, SCOPE)


def ns_runs(fn, number, repeat):
    return [t / number * 1e9 for t in timeit.repeat(fn, number=number, repeat=repeat)]


class CountCalls(Handler):
    """A counter hook: +1 per call, step-labelled (as the exception counters record)."""

    name = "bench-counter"

    def after(self, state, args, kwargs, result):
        recording.add(catalogue.RUNNING_TO_WAITING, 1, context.step_labels(STATE.last_step_phase))


def scope_module():
    """A stand-in for vllm.v1.utils with the package's scope factory installed, as the installer does."""
    import types

    module = types.ModuleType("bench_vllm_utils")
    module._PROFILER_FUNC = contextlib.nullcontext
    ProfilerScopes().install(module)
    return module


def setup_pipeline():
    catalogue.CATALOGUE = catalogue.CATALOGUE + BENCH_SPECS
    # Every hook kind is measured, the opt-in profiling scopes included (timed, recorded): what they cost when on.
    os.environ[environment.ENABLED_METRICS] = "*"
    os.environ[environment.FILES_DIR] = tempfile.mkdtemp(prefix="otel_vllm_bench_")
    os.environ[environment.PROMETHEUS_INTERVAL_MS] = "3600000"
    os.environ.pop(environment.METRICS_EXPORTER, None)
    os.environ.pop(environment.PROMETHEUS_MULTIPROC_DIR, None)
    pipeline.reset()
    set_process("engine_core", "0", "mixed")
    STATE.last_step_phase = "decode"


# -- A. per call ------------------------------------------------------------------------------------


def per_call_rows(number, repeat):
    import wrapt

    t = _targets.Target()
    bare = _targets.Target.step

    def closure(f):
        def w(*a, **k):
            return f(*a, **k)

        return w

    plain = closure(bare)
    wrapt_w = wrapt.FunctionWrapper(bare, lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs))
    timer = wrap(bare, StepTimer(TIMER), SYNC_TIMER)[0]
    counter = wrap(bare, CountCalls(), SYNC)[0]
    # What ``control off`` leaves: the wrapper stays, its handler is None (recording/control.py).
    timer_off, off_hook = wrap(bare, StepTimer(TIMER), SYNC_TIMER)
    off_hook.handler = None
    # A non-blocking RPC's whole life: the call returns a pending future, vLLM completes it later.
    import concurrent.futures

    from opentelemetry_instrumentation_vllm_ascend.hooks.patches import hook_future_class

    class PlainFuture(concurrent.futures.Future):  # vLLM's FutureWrapper, uninstrumented
        pass

    class RpcFuture(concurrent.futures.Future):  # … and as our FUTURE_CLASS hook leaves it
        pass

    hook_future_class(RpcFuture, completes_later=True)

    # vLLM's MultiprocExecutor.collective_rpc signature (our wrapper takes the target's own), called as
    # the EngineCore calls it for a step: the SchedulerOutput (carrying the phase the scheduler hook
    # stored on it) in ``args``.
    def rpc_bare(
        self,
        method,
        timeout=None,
        args=(),
        kwargs=None,
        non_block=False,
        unique_reply_rank=None,
        kv_output_aggregator=None,
        ec_output_aggregator=None,
    ):
        return PlainFuture()

    def rpc_target(
        self,
        method,
        timeout=None,
        args=(),
        kwargs=None,
        non_block=False,
        unique_reply_rank=None,
        kv_output_aggregator=None,
        ec_output_aggregator=None,
    ):
        return RpcFuture()

    rpc = wrap(rpc_target, CollectiveRpc(), FUTURE)[0]
    step_output = NS(**{steps.PHASE_ATTRIBUTE: "decode"})
    rpc_args = (step_output,)

    # The same timer measurement straight through the OTel SDK (MeterProvider + the View, 1 reader).
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    provider = MeterProvider(metric_readers=[InMemoryMetricReader()], views=pipeline.views())
    sdk_hist = provider.get_meter(catalogue.SCOPE_NAME).create_histogram(TIMER.instrument_name, unit="s")

    def sdk_timer(self, x):
        start = perf_counter()
        r = bare(self, x)
        sdk_hist.record(perf_counter() - start, {"dp": "0", "role": "mixed", "phase": STATE.last_step_phase})
        return r

    from prometheus_client import CollectorRegistry, Histogram

    prom = Histogram(
        "bench_step_duration", "x", ["dp", "role", "phase"], registry=CollectorRegistry(), buckets=TIMER.buckets
    )

    def prom_timer(self, x):
        start = perf_counter()
        r = bare(self, x)
        prom.labels("0", "mixed", STATE.last_step_phase).observe(perf_counter() - start)
        return r

    from opentelemetry_instrumentation_vllm_ascend.handlers.kv_cache import AllocateSlots

    class KV:  # vLLM calls it once per running request per step, with a keyword argument
        def allocate_slots(self, request, num_new_tokens, num_new_computed_tokens=0, num_lookahead_tokens=0):
            return request

    kv = KV()
    alloc_bare = KV.allocate_slots
    alloc = wrap(KV.allocate_slots, AllocateSlots(), SYNC)[0]

    rows = [
        ("bare call", lambda: bare(t, 1)),
        ("bare allocate_slots-like call (keyword argument)", lambda: alloc_bare(kv, t, 1, num_lookahead_tokens=0)),
        ("ours: KV allocation hook on it (success)", lambda: alloc(kv, t, 1, num_lookahead_tokens=0)),
        ("plain closure wrapper", lambda: plain(t, 1)),
        ("wrapt.FunctionWrapper", lambda: wrapt_w(t, 1)),
        ("ours: sync timer -> histogram {dp,role,phase}", lambda: timer(t, 1)),
        ("ours: counter hook", lambda: counter(t, 1)),
        ("ours: sync timer while recording is off (control off)", lambda: timer_off(t, 1)),
        (
            "bare non-blocking RPC (future created, completed)",
            lambda: rpc_bare(t, "execute_model", None, rpc_args, non_block=True).set_result(1),
        ),
        (
            "ours: non-blocking RPC (future created, completed)",
            lambda: rpc(t, "execute_model", None, rpc_args, non_block=True).set_result(1),
        ),
        ("OTel SDK: same timer, Histogram.record", lambda: sdk_timer(t, 1)),
        ("prometheus_client: labels().observe()", lambda: prom_timer(t, 1)),
    ]
    results = [(name, ns_runs(fn, number, repeat)) for name, fn in rows]

    # Coroutine timer and record_function-style scope: measured against their own bare forms,
    # then reported as bare-call + added cost so all rows compare on one scale.
    bare_med = statistics.median(results[0][1])
    coro_timer = wrap(_targets.awork, StepTimer(TIMER), COROUTINE_TIMER)[0]

    def async_runs(drive, calls):
        """ns per call, per repeat: ``drive()`` is a coroutine making ``calls`` calls, run on one loop."""
        loop = asyncio.new_event_loop()
        try:
            out = []
            for _ in range(repeat):
                start = perf_counter()
                loop.run_until_complete(drive())
                out.append((perf_counter() - start) / calls * 1e9)
            return out
        finally:
            loop.close()

    async def awaits(f):
        for _ in range(number):
            await f(1)

    coro_bare = async_runs(lambda: awaits(_targets.awork), number)
    coro_ours = async_runs(lambda: awaits(coro_timer), number)
    results.append(("ours: coroutine timer", [bare_med + o - statistics.median(coro_bare) for o in coro_ours]))

    # vLLM's record_function_or_nullcontext(name) returns nullcontext() unless its profiler is on;
    # our replacement returns a timing scope instead (wrapping vLLM's own scope only when it is on).
    utils = scope_module()

    def scope_bare():
        with contextlib.nullcontext("gpu_model_runner: sample"):
            pass

    def scope_ours(_factory=utils._PROFILER_FUNC):
        with _factory("gpu_model_runner: sample"):
            pass

    sb, so = ns_runs(scope_bare, number, repeat), ns_runs(scope_ours, number, repeat)
    results.append(
        ("ours: record_function scope (instead of nullcontext)", [bare_med + o - statistics.median(sb) for o in so])
    )

    # A stream (AsyncLLM.generate): the hook is paid once per call, then per item while it is
    # consumed; this row is the added cost per item of a long stream.
    gen_hook = wrap(_targets.agen, Handler(), ASYNC_GENERATOR)[0]
    items, streams = 1000, max(1, number // 1000)

    async def drain(f):
        for _ in range(streams):
            async for _ in f(items):
                pass

    gb = async_runs(lambda: drain(_targets.agen), streams * items)
    go = async_runs(lambda: drain(gen_hook), streams * items)
    results.append(
        ("ours: async generator (a stream), per item consumed", [bare_med + o - statistics.median(gb) for o in go])
    )

    # Processes of their own: prometheus_client multiprocess mode, ms-service-metric.
    mp = _child("prom_mp", number, repeat)
    if "error" not in mp:
        results.append(("prometheus_client multiprocess: labels().observe()", mp["runs"]))
    msm = _msm(number, repeat)
    if "error" in msm:
        results.append((f"ms-service-metric 26.0.0: not measured ({msm['error']})", None))
    else:
        results.append(("ms-service-metric 26.0.0: timer hook", msm["timer"]))
        results.append(("ms-service-metric 26.0.0: counter hook", msm["counter"]))
    provider.shutdown()
    return results


def _child(mode, *args):
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--child", mode, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _msm(number, repeat):
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "_msm_hook.py"), str(number), str(repeat)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        return {"error": (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]}
    return json.loads(lines[-1])


def child_prom_mp(number, repeat):
    directory = tempfile.mkdtemp(prefix="bench_prom_mp_")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    from prometheus_client import CollectorRegistry, Histogram

    prom = Histogram(
        "bench_step_duration", "x", ["dp", "role", "phase"], registry=CollectorRegistry(), buckets=TIMER.buckets
    )
    t = _targets.Target()
    bare = _targets.Target.step

    def prom_timer(self, x):
        start = perf_counter()
        r = bare(self, x)
        prom.labels("0", "mixed", "decode").observe(perf_counter() - start)
        return r

    runs = ns_runs(lambda: prom_timer(t, 1), number, repeat)
    shutil.rmtree(directory, ignore_errors=True)
    return {"runs": runs}


# -- A2. what the other features add, beside the same run's bare call --------------------------------
USER_FILE = """\
- symbol: _targets:Target.step
  metrics:
    - name: bench:user:duration
      type: timer
- symbol: _targets:Target.tick
  metrics:
    - name: bench:user:value
      type: histogram
      expr: x * 2 + 1
      buckets: [0, 1, 2, 4, 8, 16]
"""


def feature_rows(number, repeat):
    """ns per call of: a hook while recording is switched off (control off), a hook-file timer and an
    expression histogram (OTEL_VLLM_ASCEND_CONFIG, built by the real loader), one time-budget stage
    boundary (the clock reading and the clock's bookkeeping), and ExampleConnector's per-layer store
    hook for a step storing 4 requests; each beside its own bare call, measured in the same run."""
    from opentelemetry_instrumentation_vllm_ascend.handlers import budget, kv_transfer
    from opentelemetry_instrumentation_vllm_ascend.wiring import userfile
    from opentelemetry_instrumentation_vllm_ascend.wiring.declarative import build_handler

    t = _targets.Target()
    bare_step, bare_tick = _targets.Target.step, _targets.Target.tick
    timer_off, off_hook = wrap(bare_step, StepTimer(TIMER), SYNC_TIMER)
    off_hook.handler = None
    path = os.path.join(tempfile.mkdtemp(prefix="otel_vllm_bench_"), "hooks.yaml")
    with open(path, "w") as f:
        f.write(USER_FILE)
    # The file names the benchmark's own module, which hook files may name only as an allowed root.
    saved = os.environ.get(environment.CONFIG_MODULES)
    os.environ[environment.CONFIG_MODULES] = "_targets"
    try:
        entries = {e.qualname: e for e in userfile.load([path], None, None, log=False)}
    finally:
        if saved is None:
            del os.environ[environment.CONFIG_MODULES]
        else:
            os.environ[environment.CONFIG_MODULES] = saved
    user = {}
    for qualname, function in (("Target.step", bare_step), ("Target.tick", bare_tick)):
        entry = entries[qualname]
        assert entry.status != userfile.REJECTED, entry.reason
        row = userfile.row_of(entry, function)  # the entry's declarative row, as the hook-file loader builds it
        user[qualname] = wrap(function, build_handler(row), row.kind)[0]
    user_timer, user_hist = user["Target.step"], user["Target.tick"]

    clock = budget.StageClock(catalogue.ENGINE_STAGES, catalogue.M["engine_core:stage_seconds"])
    clock.to(0, perf_counter())
    stages = len(catalogue.ENGINE_STAGES)
    state = [0]

    def boundary(_to=clock.to, _now=perf_counter):
        state[0] = (state[0] + 1) % stages
        _to(state[0], _now())

    def bare_boundary(_now=perf_counter):
        state[0] = (state[0] + 1) % stages
        _now()

    class Layer:  # a KV layer as ExampleConnector's hook reads it: kv_layer[0, :, 0].numel() * element_size()
        def __getitem__(self, key):
            return self

        def numel(self):
            return 2 * 64

        def element_size(self):
            return 2

    metadata = NS(requests=[NS(is_store=True, slot_mapping=range(100)) for _ in range(4)])

    class ExampleConnector:
        def _get_connector_metadata(self):
            return metadata

        def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
            return None

    connector, layer = ExampleConnector(), Layer()
    save_bare = ExampleConnector.save_kv_layer
    save_ours = wrap(save_bare, kv_transfer.ExampleSaveKvLayer(), SYNC)[0]
    rows = [
        ("bare call", lambda: bare_step(t, 1)),
        ("ours: sync timer while recording is off (control off)", lambda: timer_off(t, 1)),
        ("ours: hook-file timer (type: timer)", lambda: user_timer(t, 1)),
        ("ours: hook-file expression histogram (expr: x * 2 + 1)", lambda: user_hist(t, 1)),
        ("bare: a clock reading where a stage boundary is", bare_boundary),
        ("ours: one time-budget stage boundary (StageClock.to)", boundary),
        ("bare ExampleConnector.save_kv_layer-like call", lambda: save_bare(connector, "layer.0", layer, None)),
        (
            "ours: ExampleConnector save_kv_layer hook (4 storing requests)",
            lambda: save_ours(connector, "layer.0", layer, None),
        ),
    ]
    return [(name, ns_runs(fn, number, repeat)) for name, fn in rows]


# -- B. classification ----------------------------------------------------------------------------


def classification_rows(repeat):
    class Req:  # vLLM's Request: num_prompt_tokens is a plain attribute
        __slots__ = ("num_prompt_tokens",)

        def __init__(self, p):
            self.num_prompt_tokens = p

    class Sched:  # like vLLM's Scheduler: an object the phase code may keep weak state for
        def __init__(self, requests):
            self.requests = requests

    rows = []
    for batch in (16, 256, 1024):
        ids = [f"req-{i}" for i in range(batch)]
        sched = Sched({i: Req(500) for i in ids})
        for label, new in (("all decode", []), ("mixed: 1 new request", [NS(req_id="new")])):
            so = NS(
                num_scheduled_tokens=dict.fromkeys(ids, 1) | {r.req_id: 1 for r in new},
                total_num_scheduled_tokens=batch + len(new),
                scheduled_new_reqs=new,
                scheduled_cached_reqs=NS(
                    req_ids=ids,
                    resumed_req_ids=set(),
                    num_computed_tokens=[599] * batch,
                    num_output_tokens=[100] * batch,
                ),
            )
            n = max(10, 20_000 // batch)
            runs = [r / n * 1e6 for r in timeit.repeat(lambda: step_phase(sched, so), number=n, repeat=repeat)]
            rows.append((f"batch {batch}, {label}", runs))
        # A request of this scheduler is still recomputing after a preemption: the exact loop runs.
        steps.mark_recomputing(sched, "recomputing-elsewhere")
        so = NS(
            num_scheduled_tokens=dict.fromkeys(ids, 1),
            total_num_scheduled_tokens=batch,
            scheduled_new_reqs=[],
            scheduled_cached_reqs=NS(
                req_ids=ids, resumed_req_ids=set(), num_computed_tokens=[599] * batch, num_output_tokens=[100] * batch
            ),
        )
        sched.requests["recomputing-elsewhere"] = NS(num_computed_tokens=10, num_tokens=600)
        n = max(10, 20_000 // batch)
        runs = [r / n * 1e6 for r in timeit.repeat(lambda: step_phase(sched, so), number=n, repeat=repeat)]
        rows.append((f"batch {batch}, all decode, a preempted request still recomputing (exact loop)", runs))
    return rows


def step_rows(repeat):
    """A simulated engine step as vLLM's scheduler runs it: schedule() calls allocate_slots once per
    running request (with a keyword argument, like vLLM) and returns a SchedulerOutput-shaped
    object; hooked: our Schedule handler (step context, phase, batch shape per req_phase, queue and
    KV block states, scheduler:duration) and AllocateSlots, as installed."""
    from opentelemetry_instrumentation_vllm_ascend.handlers.kv_cache import AllocateSlots
    from opentelemetry_instrumentation_vllm_ascend.handlers.scheduler import Schedule

    class Req:
        __slots__ = ("num_prompt_tokens", "num_computed_tokens")

        def __init__(self, p, c):
            self.num_prompt_tokens = p
            self.num_computed_tokens = c

    class Pool:
        num_gpu_blocks = 10_000

        def get_num_free_blocks(self):
            return 1234

    class KV:
        block_pool = Pool()

        def allocate_slots(
            self,
            request,
            num_new_tokens,
            num_new_computed_tokens=0,
            new_computed_blocks=None,
            num_lookahead_tokens=0,
            delay_cache_blocks=False,
        ):
            return request

    def make(kv_cls, batch, mixed):
        ids = [f"req-{i}" for i in range(batch)]
        new = [NS(req_id="new", num_computed_tokens=0)] if mixed else []
        scheduled = dict.fromkeys(ids, 1) | ({"new": 100} if mixed else {})
        output = NS(
            num_scheduled_tokens=scheduled,
            total_num_scheduled_tokens=sum(scheduled.values()),
            scheduled_new_reqs=new,
            scheduled_cached_reqs=NS(
                req_ids=ids, resumed_req_ids=set(), num_computed_tokens=[599] * batch, num_output_tokens=[100] * batch
            ),
        )

        class Sched:
            def __init__(self):
                self.requests = {i: Req(500, 599) for i in ids}
                self.running = list(self.requests.values())
                self.waiting = []
                self.max_num_running_reqs = 2048
                self.kv_cache_manager = kv_cls()

            def schedule(self):
                kv = self.kv_cache_manager
                for rid in ids:
                    kv.allocate_slots(rid, 1, num_lookahead_tokens=0)
                return output

        return Sched

    hooked_kv = type("HookedKV", (KV,), {"allocate_slots": wrap(KV.allocate_slots, AllocateSlots(), SYNC)[0]})
    rows = []
    for batch in (16, 256, 1024):
        for mixed in (False, True):
            label = "1 new + decodes (mixed)" if mixed else "all decode"
            bare_sched = make(KV, batch, mixed)()
            cls = make(hooked_kv, batch, mixed)
            cls.schedule = wrap(cls.schedule, Schedule(), SYNC)[0]
            ours_sched = cls()
            n = max(20, 20_000 // batch)
            bare = [r / n * 1e6 for r in timeit.repeat(bare_sched.schedule, number=n, repeat=repeat)]
            ours = [r / n * 1e6 for r in timeit.repeat(ours_sched.schedule, number=n, repeat=repeat)]
            b = statistics.median(bare)
            if not mixed:
                rows.append((f"batch {batch}: bare step (allocations + schedule call)", bare))
            rows.append((f"batch {batch}, {label}: hooks added per step", [o - b for o in ours]))
    return rows


# -- C/D. export and scrape -------------------------------------------------------------------------


def _record_realistic_process(store_pipeline_recorder=None):
    """One process's worth of series: 8 timers x 4 phases, 8 scopes x 4 phases, 4 counters."""
    phases = ("prefill", "decode", "mixed", "idle")
    for phase in phases:
        labels = context.step_labels(phase)
        for i in range(8):
            recording.record(TIMER, 0.001 * (i + 1), labels)
            recording.record(SCOPE, 0.0005 * (i + 1), labels + (f"scope {i}",))
        recording.add(catalogue.RUNNING_TO_WAITING, 1, labels)
        recording.add(catalogue.BLOCK_ALLOCATE_FAILURES, 2, labels)


def export_and_scrape_rows(repeat):
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from prometheus_client import CollectorRegistry
    from prometheus_client import exposition as exposition_module
    from prometheus_client.openmetrics import exposition as openmetrics

    from opentelemetry_instrumentation_vllm_ascend.recording.exposition import FastExposition
    from opentelemetry_instrumentation_vllm_ascend.recording.files_reader import FilesCollector
    from opentelemetry_instrumentation_vllm_ascend.recording.files_writer import FilesExporter
    from opentelemetry_instrumentation_vllm_ascend.recording.openmetrics_names import KeptNames

    os.environ.pop(environment.FILES_DIR, None)

    def process_data(dp):
        reader = InMemoryMetricReader()
        pipeline.reset(extra_readers=[reader])
        set_process("engine_core", str(dp), "mixed")
        _record_realistic_process()
        return reader, reader.get_metrics_data()

    reader, data = process_data(0)
    series = sum(len(m.data.data_points) for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics)
    rows = []
    directory = tempfile.mkdtemp(prefix="bench_export_")
    exporter = FilesExporter(directory)
    first = []
    start = perf_counter()
    exporter.export(data)
    first.append((perf_counter() - start) * 1e3)
    unchanged = []
    for _ in range(repeat):
        start = perf_counter()
        exporter.export(reader.get_metrics_data())
        unchanged.append((perf_counter() - start) * 1e3)
    rows.append((f"export one process ({series} series), first write, ms", first))
    rows.append(("export one process, collect + unchanged values, ms", unchanged))
    exporter.shutdown()
    scrape_rows = []
    for processes in (1, 4, 16):
        d = tempfile.mkdtemp(prefix="bench_scrape_")
        for p in range(processes):
            e = FilesExporter(d)
            e.export(process_data(p // 2)[1])  # an EngineCore and a worker per dp rank
            e.shutdown()
            for name in os.listdir(d):  # as if written by process <fake pid>
                if name.endswith(f"_otel-{os.getpid()}.db"):
                    os.rename(
                        os.path.join(d, name),
                        os.path.join(d, name.replace(f"otel-{os.getpid()}", f"otel-{10_000_000 + p}")),
                    )
        registry = CollectorRegistry()
        collector = FilesCollector(d)
        registry.register(collector)
        fast = FastExposition(collector, registry)
        kw = {"escaping": openmetrics.UNDERSCORES, "version": "1.0.0"}  # what Prometheus' Accept header selects
        # The module attributes, looked up at each call as vLLM's /metrics does: wrapped once fast is installed.
        encoders = {
            "text": lambda r: exposition_module.generate_latest(r),
            "OpenMetrics": lambda r: openmetrics.generate_latest(r, **kw),
        }
        # prometheus_client alone (its OpenMetrics renames sample names); names kept (every instrumented process:
        # what PROMETHEUS_MULTIPROC_DIR's MultiProcessCollector is served through); the API server's whole path.
        cases = (
            ("prometheus_client formats every line", False, False),
            ("names kept, prometheus_client formats every line", True, False),
            ("cached lines (ours)", True, True),
        )
        for label, kept, wrapped in cases:
            names = KeptNames()
            if kept:
                names.install()
            if wrapped:
                fast.install()
            for fmt, encode in encoders.items():
                if fmt == "text" and kept and not wrapped:
                    continue  # the names wrapper leaves the text format alone
                runs = []
                for _ in range(repeat):
                    start = perf_counter()
                    text = encode(registry)
                    runs.append((perf_counter() - start) * 1e3)
                scrape_rows.append(
                    (f"/metrics scrape, {processes} process(es), {len(text) // 1024} KiB, {fmt}, {label}, ms", runs)
                )
            if wrapped:
                fast.remove()
            names.remove()
        shutil.rmtree(d, ignore_errors=True)
    shutil.rmtree(directory, ignore_errors=True)
    pipeline.reset()
    return rows, scrape_rows + vllm_families_rows(repeat)


def vllm_families_rows(repeat):
    """vLLM's own families (not ours) in OpenMetrics for Prometheus 2's Accept header: prometheus_client alone
    (which renames their sample names) against the names kept (recording/openmetrics_names.py). A registry shaped
    like vLLM 0.32's for one engine: 20 histograms of 20 buckets, 30 counters, 30 gauges, ``vllm:`` names with
    ``engine`` and ``model_name`` labels (two label sets each)."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    from prometheus_client import exposition as exposition_module

    from opentelemetry_instrumentation_vllm_ascend.recording.openmetrics_names import KeptNames

    registry = CollectorRegistry()
    labels = ("engine", "model_name")
    for i in range(20):
        h = Histogram(
            f"vllm:histogram_{i}_seconds", "h", labels, buckets=[0.01 * 2**b for b in range(19)], registry=registry
        )
        for engine in ("0", "1"):
            h.labels(engine, "m").observe(0.1 * i)
    for i in range(30):
        c = Counter(f"vllm:counter_{i}", "c", labels, registry=registry)
        g = Gauge(f"vllm:gauge_{i}", "g", labels, registry=registry)
        for engine in ("0", "1"):
            c.labels(engine, "m").inc(i)
            g.labels(engine, "m").set(i)
    accept = (
        "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
        "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    )
    out = []
    for label, kept in (("prometheus_client (renames sample names)", False), ("names kept (ours)", True)):
        names = KeptNames()
        if kept:
            names.install()
        encoder = exposition_module.choose_encoder(accept)[0]  # looked up per scrape, as make_asgi_app does
        samples = sum(len(m.samples) for m in registry.collect())
        runs = []
        for _ in range(repeat):
            start = perf_counter()
            text = encoder(registry)
            runs.append((perf_counter() - start) * 1e3)
        names.remove()
        out.append(
            (
                f"/metrics scrape, vLLM's families ({samples} samples, {len(text) // 1024} KiB), OpenMetrics, "
                f"{label}, ms",
                runs,
            )
        )
    return out


# -- E. memory ----------------------------------------------------------------------------------------


def child_rss(steps):
    import resource

    setup_pipeline()

    def rss_kib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024

    timer = wrap(_targets.Target.step, StepTimer(TIMER), SYNC_TIMER)[0]
    t = _targets.Target()
    scopes = scope_module()
    phases = ("prefill", "decode", "mixed", "decode")
    out = {"rss_kib": {}}
    for step in range(1, steps + 1):
        STATE.last_step_phase = phases[step % 4]
        for _ in range(8):
            timer(t, 1)
        labels = context.step_labels(STATE.last_step_phase)
        for i in range(8):
            with scopes._PROFILER_FUNC(f"scope {i}"):
                pass
        recording.add(catalogue.RUNNING_TO_WAITING, step % 2, labels)
        if step in (100, 1000, steps):
            out["rss_kib"][step] = rss_kib()
    store = pipeline.get().store
    out["series"] = sum(len(i.snapshot()) for i in store._instruments.values())
    out["max_rss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return out


# -- report -------------------------------------------------------------------------------------------


def table(title, rows, unit, ref=None):
    print(f"\n### {title}\n")
    head = f"| case | median {unit} | min–max {unit} |" + (" × ours |" if ref else "")
    print(head)
    print("|---|---:|---:|" + ("---:|" if ref else ""))
    for name, runs in rows:
        if runs is None:
            print(f"| {name} | – | – |" + (" – |" if ref else ""))
            continue
        med = statistics.median(runs)
        fmt = "{:.0f}" if unit == "ns" else "{:.2f}"
        line = f"| {name} | {fmt.format(med)} | {fmt.format(min(runs))}–{fmt.format(max(runs))} |"
        if ref:
            line += f" {med / ref:.2f} |"
        print(line)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--number", type=int, default=100_000, help="calls per repeat (section A)")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10_000, help="simulated steps (section E)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        mode, *rest = args.child
        if mode == "prom_mp":
            print(json.dumps(child_prom_mp(int(rest[0]), int(rest[1]))))
        elif mode == "rss":
            print(json.dumps(child_rss(int(rest[0]))))
        return 0

    setup_pipeline()
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    print(
        f"# opentelemetry-instrumentation-vllm-ascend benchmarks\n\nPython {platform.python_version()}, "
        f"{cpu}, {os.cpu_count()} CPUs; number={args.number}, repeat={args.repeat}. "
        "Medians with min–max over repeats; every row includes the cost of calling the target."
    )

    rows = per_call_rows(args.number, args.repeat)
    ours = statistics.median(dict(rows)["ours: sync timer -> histogram {dp,role,phase}"])
    bare = statistics.median(rows[0][1])
    table("A. Per hooked call (ns; '× ours' is relative to our sync timer hook)", rows, "ns", ref=ours)
    print(f"\nAdded cost of our sync timer hook over a bare call: {ours - bare:.0f} ns.")
    features = feature_rows(args.number, args.repeat)
    table("A2. What the other features add per call (ns; '+ bare' is added to the row's own bare call)", features, "ns")
    added = dict((name, statistics.median(runs)) for name, runs in features)
    for ours_row, bare_row in (
        ("ours: sync timer while recording is off (control off)", "bare call"),
        ("ours: hook-file timer (type: timer)", "bare call"),
        ("ours: hook-file expression histogram (expr: x * 2 + 1)", "bare call"),
        ("ours: one time-budget stage boundary (StageClock.to)", "bare: a clock reading where a stage boundary is"),
        (
            "ours: ExampleConnector save_kv_layer hook (4 storing requests)",
            "bare ExampleConnector.save_kv_layer-like call",
        ),
    ):
        print(f"- {ours_row}: +{added[ours_row] - added[bare_row]:.0f} ns over {bare_row}")
    table("B. Step phase classification (µs per step)", classification_rows(args.repeat), "µs")
    table("B2. Hooks per engine step (schedule + one allocate_slots per request), µs", step_rows(args.repeat), "µs")
    from benchmarks import _step

    whole = _step.whole_step_rows(args.repeat)
    table("F. Every hook of one engine step, by process (plain stand-ins of vLLM's classes, no work), µs", whole, "µs")
    for name, runs in whole:
        if name.endswith("added by API server hooks"):
            batch = int(name.split(":")[0].split()[1])
            print(
                f"- {name.split(':')[0]}: the API server's per-iteration work, per request: "
                f"{statistics.median(runs) / batch * 1000:.0f} ns"
            )
    table(
        "F2. The same step at batch 64 with hot and with cold caches (a 48 MiB sweep before each step), µs",
        _step.cold_step_rows(args.repeat),
        "µs",
    )
    table(
        "F2b. Where F2's cold default-set cost lies: each hook's handler switched off in turn (batch 64), µs",
        _step.cold_hook_rows(max(args.repeat, 25)),
        "µs",
    )
    print("\n### F3. What the hooks add to the step at batch 64 in calls (sys.setprofile over 64 steps; exact)\n")
    print(
        "| case | Python calls a step | C calls a step | distinct Python functions every step "
        "| distinct Python functions in 64 steps |"
    )
    print("|---|---:|---:|---:|---:|")
    for label, python, c_calls, every, distinct in _step.call_count_rows():
        print(f"| {label} | {python:.1f} | {c_calls:.1f} | {every} | {distinct} |")
    from benchmarks import _traces

    table(
        f"T. Request traces, per request ({_traces.OUTPUTS} outputs, {_traces.BATCH} requests an output batch), µs",
        _traces.trace_rows(args.repeat),
        "µs",
    )
    export_rows, scrape_rows = export_and_scrape_rows(args.repeat)
    table("C. Export cost per process", export_rows, "ms")
    table("D. /metrics scrape time", scrape_rows, "ms")
    mem = _child("rss", args.steps)
    print("\n### E. Memory after simulated steps (8 timers, 8 scopes, 1 counter per step; 4 phases)\n")
    if "error" in mem:
        print(f"not measured: {mem['error']}")
    else:
        for step, kib in sorted(mem["rss_kib"].items(), key=lambda kv: int(kv[0])):
            print(f"- RSS after {int(step):>6} steps: {kib / 1024:.1f} MiB")
        print(f"- series held: {mem['series']} (bounded by labels, not by steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
