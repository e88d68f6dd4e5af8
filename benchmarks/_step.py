"""Section F of the benchmark suite: every hook one engine step passes through, side by side with the
same step unhooked. Plain-Python stand-ins shaped like vLLM's classes (same method signatures, same
call pattern per step) are wrapped by the real handlers with the real wrappers:

- EngineCore: the busy loop's ``_process_input_queue`` (with work: no wait; its ``has_work()`` goes through the
  scheduler's request counts as vLLM 0.32's does, which the busy-loop hook calls once more) and ``_process_engine_step``
  → ``step`` → ``schedule`` (per running request one ``allocate_slots`` inside its own
  "schedule: allocate_slots" profiling scope, as vLLM does; two more scopes per step) →
  non-blocking ``execute_model`` RPC (a FutureWrapper-like future completed in ``result()``) →
  blocking ``sample_tokens`` RPC → ``update_from_output``;
- worker: the worker's ``execute_model`` (memory late-capture check) → the runner's ``execute_model``
  (phase, ``_prepare_inputs``, 7 profiling scopes incl. forward/postprocess timeline) → ``sample_tokens``;
- API server: ``process_outputs`` for the step's outputs, ``IterationStats.update_from_output`` per
  request, ``StatLoggerManager.record`` with the iteration's stats.
The bodies do no work, so the difference is what the hooks add per step.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import queue
import timeit
import types
from time import perf_counter
from types import SimpleNamespace as NS

from opentelemetry_instrumentation_vllm_ascend import targets
from opentelemetry_instrumentation_vllm_ascend.handlers import (
    api,
    engine,
    executor,
    kv_cache,
    memory,
    model_runner,
    scopes,
)
from opentelemetry_instrumentation_vllm_ascend.handlers import scheduler as sched_handlers
from opentelemetry_instrumentation_vllm_ascend.handlers.steps import FLUSH_STEPS, PHASE_ATTRIBUTE
from opentelemetry_instrumentation_vllm_ascend.hooks.patches import hook_future_class, patch_method
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import FUTURE, SYNC, SYNC_TIMER
from opentelemetry_instrumentation_vllm_ascend.wiring import declarative, installer
from tests.support.process import set_process

SCHED_SCOPES = ("schedule: allocate_slots", "schedule: make_cached_request_data", "schedule: update_after_schedule")
RUNNER_SCOPES = (
    "gpu_model_runner: preprocess",
    "gpu_model_runner: forward",
    "gpu_model_runner: postprocess",
    "gpu_model_runner: sample",
    "gpu_model_runner: bookkeep",
    "gpu_model_runner: eplb",
    "gpu_model_runner: ModelRunnerOutput",
)


PROCESSES = ("engine_core", "worker", "api_server")
#: Each process as the tables name it, with the hooks ``build`` installs for it alone.
PROCESS_LABELS = (("EngineCore", ("engine_core",)), ("worker", ("worker",)), ("API server", ("api_server",)))
#: The metric sets F2 and F3 compare (``metric_set``'s values: every metric, and the default set a server runs).
METRIC_SETS = (("every metric", "*"), ("default set", ""))


def build(batch: int, hooked=PROCESSES, phased: bool = False):
    """One simulated deployment (EngineCore + worker + API); returns a zero-argument step function.
    ``hooked``: the processes whose hooks are installed. ``phased``: the step's SchedulerOutput carries its
    phase as an instrumented EngineCore stores it (else a hooked worker without a hooked EngineCore classifies
    the step itself)."""
    # vllm.v1.utils as each process has it (the EngineCore's and the worker's are separate processes).
    ec_utils, worker_utils = types.ModuleType("ec_vllm_utils"), types.ModuleType("worker_vllm_utils")
    ec_utils._PROFILER_FUNC = worker_utils._PROFILER_FUNC = contextlib.nullcontext

    def ec_scope(name):
        return ec_utils._PROFILER_FUNC(name)

    def scope(name):
        return worker_utils._PROFILER_FUNC(name)

    class Req:
        __slots__ = ("num_prompt_tokens", "num_computed_tokens")

        def __init__(self):
            self.num_prompt_tokens, self.num_computed_tokens = 500, 599

    ids = [f"req-{i}" for i in range(batch)]
    output = NS(
        num_scheduled_tokens=dict.fromkeys(ids, 1),
        total_num_scheduled_tokens=batch,
        scheduled_new_reqs=[],
        scheduled_cached_reqs=NS(
            req_ids=ids, resumed_req_ids=set(), num_computed_tokens=[599] * batch, num_output_tokens=[100] * batch
        ),
    )
    if phased and "engine_core" not in hooked:
        setattr(output, PHASE_ATTRIBUTE, "decode")

    class Future(concurrent.futures.Future):  # FutureWrapper: completed in result()
        def result(self, timeout=None):
            if not self.done():
                self.set_result("model output")
            return super().result()

    class KVCacheManager:
        block_pool = NS(num_gpu_blocks=10_000, get_num_free_blocks=lambda: 1234)

        def allocate_slots(
            self, request, num_new_tokens, num_new_computed_tokens=0, new_computed_blocks=None, num_lookahead_tokens=0
        ):
            return request

    class Runner:
        requests = {}

        def _prepare_inputs(self, scheduler_output, num_scheduled_tokens=None):
            return None

        def execute_model(self, scheduler_output, intermediate_tensors=None):
            for name in RUNNER_SCOPES[:4]:
                with scope(name):
                    if name == "gpu_model_runner: preprocess":
                        self._prepare_inputs(scheduler_output)
            return None

        def sample_tokens(self, grammar_output):
            for name in RUNNER_SCOPES[4:]:
                with scope(name):
                    pass
            return "model output"

    class Worker:
        rank = 0
        cache_config = NS(gpu_memory_utilization=0.9)

        def __init__(self):
            self.model_runner = Runner()

        def execute_model(self, scheduler_output):
            return self.model_runner.execute_model(scheduler_output)

    worker = Worker()

    class Executor:
        def collective_rpc(self, method, timeout=None, args=(), kwargs=None, non_block=False):
            if method == "execute_model":
                worker.execute_model(*args)
                future = Future()
                return future if non_block else future.result()
            return worker.model_runner.sample_tokens(*args)

        def execute_model(self, scheduler_output, non_block=False):
            return self.collective_rpc("execute_model", args=(scheduler_output,), non_block=non_block)

        def sample_tokens(self, grammar_output, non_block=False):
            return self.collective_rpc("sample_tokens", args=(grammar_output,), non_block=non_block)

    class FCFSRequestQueue(collections.deque):  # vLLM's waiting queue: a deque subclass whose len() is Python
        def __len__(self):
            return super().__len__()

    class Scheduler:
        def __init__(self):
            self.requests = {i: Req() for i in ids}
            self.running = list(self.requests.values())
            self.waiting, self.kv_holding_waiting = FCFSRequestQueue(), FCFSRequestQueue()
            self.num_waiting_for_streaming_input = 0
            self.finished_req_ids: set = set()
            self.paused = False
            self.max_num_running_reqs = 2048
            self.kv_cache_manager = KVCacheManager()

        # What EngineCore.has_work() calls, as vLLM 0.32 does (no KV connector): five Python calls and two
        # Python len()s of the waiting queues.
        def get_request_counts(self):
            return len(self.running), len(self.waiting) + len(self.kv_holding_waiting)

        def get_num_unfinished_requests(self):
            if self.paused:
                return 0
            num_running, num_waiting = self.get_request_counts()
            return num_waiting - self.num_waiting_for_streaming_input + num_running

        def has_unfinished_requests(self):
            return self.get_num_unfinished_requests() > 0

        def has_finished_requests(self):
            return bool(self.finished_req_ids)

        def has_requests(self):
            return self.has_unfinished_requests() or self.has_finished_requests()

        def schedule(self):
            kv = self.kv_cache_manager
            for rid in ids:  # vLLM (0.32) enters this scope once per running request
                with ec_scope(SCHED_SCOPES[0]):
                    kv.allocate_slots(rid, 1, num_lookahead_tokens=0)
            for name in SCHED_SCOPES[1:]:
                with ec_scope(name):
                    pass
            return output

        def get_grammar_bitmask(self, scheduler_output):
            return None

        def update_from_output(self, scheduler_output, model_runner_output):
            return {0: "outputs"}

    class EngineCore:
        def __init__(self):
            self.scheduler = Scheduler()
            self.model_executor = Executor()
            self.engines_running = False
            self.batch_queue = None
            self.input_queue: queue.Queue = queue.Queue()

        def has_work(self):
            return self.engines_running or self.scheduler.has_requests() or bool(self.batch_queue)

        def is_running(self):
            return True

        def _process_input_queue(self):  # as vLLM 0.32's, with work (no wait) and no request queued
            while not self.has_work() and self.is_running():
                self.input_queue.get()
            while not self.input_queue.empty():
                self.input_queue.get_nowait()

        def step(self):
            scheduler_output = self.scheduler.schedule()
            future = self.model_executor.execute_model(scheduler_output, non_block=True)
            grammar_output = self.scheduler.get_grammar_bitmask(scheduler_output)
            model_output = future.result()
            model_output = self.model_executor.sample_tokens(grammar_output)
            return self.scheduler.update_from_output(scheduler_output, model_output), True

        def _process_engine_step(self):
            outputs, executed = self.step()
            return executed

    # API side
    outputs = [NS(new_token_ids=[7], finish_reason=None) for _ in range(batch)]
    req_stats = NS(num_generation_tokens=50, first_token_ts=1.0, last_token_ts=2.0)

    class IterationStats:
        def __init__(self):
            self.num_generation_tokens = 0
            self.time_to_first_tokens_iter = []
            self.inter_token_latencies_iter = []
            self.finished_requests = []
            self.prompt_token_stats = NS(total=0)
            self.num_prompt_tokens = 0

        def update_from_output(
            self, output, engine_core_timestamp, is_prefilling, req_stats, lora_states=None, lora_name=None
        ):
            self.num_generation_tokens += 1
            self.inter_token_latencies_iter.append(0.01)

    class OutputProcessor:
        def process_outputs(self, engine_core_outputs, engine_core_timestamp=None, iteration_stats=None):
            for out in engine_core_outputs:
                iteration_stats.update_from_output(out, 2.5, False, req_stats)
            return None

    class StatLoggerManager:
        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
            return None

    patches = []

    def timer(cls, attribute, symbol):
        """A declarative timer row's hook, installed as the installer does: not when every metric it feeds is
        disabled in this metric set (opt-in)."""
        target = next(t for t in targets.TARGETS if t.symbol == symbol)
        if installer.gate_of(target, None, None) == installer.DISABLED:
            return []
        return [
            patch_method(
                cls,
                attribute,
                declarative.load_handler(next(t for t in targets.TARGETS if t.symbol == symbol)),
                SYNC_TIMER,
            )
        ]

    if "engine_core" in hooked:
        patches += [
            patch_method(Scheduler, "schedule", sched_handlers.Schedule(), SYNC),
            patch_method(Scheduler, "get_grammar_bitmask", sched_handlers.GrammarBitmask(), SYNC),
            patch_method(Scheduler, "update_from_output", sched_handlers.UpdateFromOutput(), SYNC),
            patch_method(KVCacheManager, "allocate_slots", kv_cache.AllocateSlots(), SYNC),
            patch_method(EngineCore, "_process_input_queue", engine.ProcessInputQueue(), SYNC),
            patch_method(Executor, "collective_rpc", executor.CollectiveRpc(), FUTURE),
        ]
        patches += timer(EngineCore, "step", "vllm.v1.engine.core:EngineCore.step")
        patches += timer(EngineCore, "_process_engine_step", "vllm.v1.engine.core:EngineCoreProc._process_engine_step")
        patches += hook_future_class(Future, completes_later=True)
        patches.append(scopes.ProfilerScopes().install(ec_utils))
    if "worker" in hooked:
        patches += [
            patch_method(Worker, "execute_model", memory.LateCapture(), SYNC),
            patch_method(Runner, "execute_model", model_runner.ExecuteModel(), SYNC),
            patch_method(Runner, "sample_tokens", model_runner.SampleTokens(), SYNC),
        ]
        patches += timer(Runner, "_prepare_inputs", "vllm.v1.worker.gpu_model_runner:GPUModelRunner._prepare_inputs")
        patches.append(scopes.ProfilerScopes().install(worker_utils))
    if "api_server" in hooked:
        patches += [
            patch_method(IterationStats, "update_from_output", api.SecondTokenLatency(), SYNC),
            patch_method(OutputProcessor, "process_outputs", api.ProcessOutputs(), SYNC),
            patch_method(StatLoggerManager, "record", api.RecordStats(), SYNC_TIMER),
        ]
    core, processor, loggers = EngineCore(), OutputProcessor(), StatLoggerManager()
    # The switchable hooks, each named by the method it wraps (cold_hook_rows switches them off).
    hooks = {
        f"{p.owner.__name__}.{p.attribute}": p.hook
        for p in patches
        if getattr(p, "hook", None) is not None and p.hook.handler is not None
    }
    scheduler_stats = NS(
        num_running_reqs=batch, num_waiting_reqs=0, num_skipped_waiting_reqs=0, spec_decoding_stats=None
    )

    def one_step():
        core._process_input_queue()
        core._process_engine_step()
        stats = IterationStats()
        processor.process_outputs(outputs, 2.5, stats)
        loggers.record(scheduler_stats=scheduler_stats, iteration_stats=stats, engine_idx=0)

    one_step.hooks = hooks  # type: ignore[attr-defined]
    return one_step


def whole_step_rows(repeat: int):
    rows = []
    set_process("engine_core", "0", "mixed")
    variants = (
        ("EngineCore hooks (incl. its scheduler scopes)", ("engine_core",)),
        ("worker hooks (incl. its runner scopes)", ("worker",)),
        ("API server hooks", ("api_server",)),
        ("all hooks", PROCESSES),
    )
    for batch in (16, 256):
        # Whole batches of the scheduler hook's 32 steps recorded at once (FLUSH_STEPS): every repeat
        # pays for the same number of them.
        n = FLUSH_STEPS * max(1, 4_000 // batch // FLUSH_STEPS)
        steps = {"bare": build(batch, ())} | {label: build(batch, hooked) for label, hooked in variants}
        runs = interleaved({key: (step, None) for key, step in steps.items()}, repeat, lambda step: _timed(step, n))
        rows.append((f"batch {batch}: bare step (the three processes' code, no work)", runs["bare"]))
        for label, _ in variants:
            rows.append((f"batch {batch}: added by {label}", paired(runs[label], runs["bare"])))
    return rows


def _timed(step, n: int) -> float:
    """µs per call of ``step`` over ``n`` calls back to back."""
    return timeit.timeit(step, number=n) / n * 1e6


def interleaved(variants: dict, repeat: int, measure) -> dict:
    """``measure(step)`` of every variant ({key: (step, metric set or None to leave it)}) in turn, ``repeat``
    times: {key: [one value per repeat]}. The machines drift from second to second (a shared VM's neighbours),
    so each repeat measures every variant within a few seconds of the others, and ``paired`` compares them
    within the repeat. After a variant's metric set is switched in, ``FLUSH_STEPS`` untimed steps let the
    recording facade look its instruments up again."""
    runs: dict = {key: [] for key in variants}
    for _ in range(repeat):
        for key, (step, enabled) in variants.items():
            with contextlib.nullcontext() if enabled is None else metric_set(enabled):
                if enabled is not None:
                    for _ in range(FLUSH_STEPS):
                        step()
                runs[key].append(measure(step))
    return runs


def mean_step(step, steps: int, sweep=None) -> float:
    """µs per call of ``step``, the mean over ``steps`` calls, each after ``sweep()`` (untimed) when one is given."""
    spent = 0.0
    for _ in range(steps):
        if sweep is not None:
            sweep()
        start = perf_counter()
        step()
        spent += perf_counter() - start
    return spent / steps * 1e6


def paired(runs: list, bare: list) -> list:
    """Each repeat's value less the same repeat's ``bare`` value."""
    return [value - base for value, base in zip(runs, bare)]


#: Bytes read and written between two steps in the cold rows: more than this machine's last-level cache, as
#: the worker's forward pass sweeps it between two engine steps of a real server.
SWEEP_BYTES = 48 * 2**20


def cache_sweep():
    """A function that leaves the caches cold: it copies ``SWEEP_BYTES`` into a buffer of as many, in place, as a
    forward pass streams its weights. Both buffers are written once here, so the copy reads real pages (not the
    kernel's one shared zero page) and allocates nothing (no page faults: the kernel stays out of the sweep, which
    takes ~2.5 ms instead of the ~22 ms a fresh ``bytes`` copy took)."""
    source, target = bytearray(b"\x01") * SWEEP_BYTES, bytearray(b"\x02") * SWEEP_BYTES

    def sweep() -> None:
        target[:] = source

    return sweep


@contextlib.contextmanager
def metric_set(enabled: str):
    """OTEL_VLLM_ASCEND_ENABLED_METRICS = ``enabled`` ("*": every metric, "": the default set) while hooks are
    built and run: the recording facade looks each instrument up again (``recording.control_changed``)."""
    import os

    from opentelemetry_instrumentation_vllm_ascend import environment, recording

    saved = os.environ.get(environment.ENABLED_METRICS)
    os.environ[environment.ENABLED_METRICS] = enabled
    recording.control_changed()
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(environment.ENABLED_METRICS, None)
        else:
            os.environ[environment.ENABLED_METRICS] = saved
        recording.control_changed()


def cold_step_rows(repeat: int, batch: int = 64, steps: int = 64):
    """Section F's step at ``batch``, back to back (hot caches) and with a sweep of ``SWEEP_BYTES`` before each
    step (cold caches, as on a server, where a step's hooks run once among milliseconds of other work): mean µs
    per step over ``steps`` steps (two of the scheduler hook's flushes), the sweep not timed. Each process's hooks
    with every metric (as section F) and with the default set (what a server runs); the worker's scheduler
    output carries its phase, as an instrumented EngineCore's does."""
    sweep = cache_sweep()
    rows = []
    set_process("engine_core", "0", "mixed")
    for cold in (False, True):
        caches = "cold caches" if cold else "hot caches"
        built = {("bare", "*"): (build(batch, (), phased=True), "*")}
        for label, hooked in PROCESS_LABELS:
            for _, enabled in METRIC_SETS:
                with metric_set(enabled):
                    step = build(batch, hooked, phased=True)
                    for _ in range(FLUSH_STEPS * 2):  # warm: series created, code run
                        step()
                built[(label, enabled)] = (step, enabled)
        runs = interleaved(built, repeat, lambda step, cold=cold: mean_step(step, steps, sweep if cold else None))
        rows.append((f"batch {batch}, {caches}: bare step", runs[("bare", "*")]))
        for label, _ in PROCESS_LABELS:
            for name, enabled in METRIC_SETS:
                rows.append(
                    (
                        f"batch {batch}, {caches}: added by {label} hooks, {name}",
                        paired(runs[(label, enabled)], runs[("bare", "*")]),
                    )
                )
    return rows


def count_calls(step, steps: int, key):
    """Run ``step`` ``steps`` times under ``sys.setprofile``: a Counter of the profile events by ``key(event, frame,
    arg)`` (None: not counted)."""
    import collections
    import gc
    import sys

    calls: collections.Counter = collections.Counter()

    def profile(frame, event, arg):
        counted = key(event, frame, arg)
        if counted is not None:
            calls[counted] += 1

    # The collector off while counting: a collection runs gc.callbacks' Python code (hypothesis installs one) in
    # whichever step allocates past the threshold, which would count as the step's calls.
    enabled = gc.isenabled()
    gc.disable()
    sys.setprofile(profile)
    try:
        for _ in range(steps):
            step()
    finally:
        sys.setprofile(None)
        if enabled:
            gc.enable()
    return calls


def call_count_rows(batch: int = 64, steps: int = 2 * FLUSH_STEPS):
    """Section F3: what each process's hooks add to section F's step in calls, counted with ``sys.setprofile``
    over ``steps`` steps (two of the scheduler hook's flushes, so the deferred records count at their share)
    against the same steps unhooked. Deterministic: a count, not a time, so it compares code changes on any
    machine. A function counts with what it is called more often than unhooked; one called less (vLLM's
    ``nullcontext.__init__``, which the scope factory's shared instance saves) is not subtracted. Rows: (label,
    Python calls a step, C calls a step, distinct Python functions run every step, distinct Python functions run
    at least once)."""

    def key(event, frame, arg):
        if event == "call":
            return frame.f_code
        if event == "c_call":
            return ("C", getattr(arg, "__qualname__", repr(arg)))
        return None

    def count(step):
        return count_calls(step, steps, key)

    set_process("engine_core", "0", "mixed")
    rows = []
    with metric_set("*"):
        bare = build(batch, (), phased=True)
        for _ in range(steps):
            bare()
        bare_calls = count(bare)
    for label, hooked in PROCESS_LABELS:
        for name, enabled in METRIC_SETS:
            with metric_set(enabled):
                step = build(batch, hooked, phased=True)
                for _ in range(steps):  # warm: series created, caches filled
                    step()
                calls = count(step)
            added = {k: n - bare_calls.get(k, 0) for k, n in calls.items() if n > bare_calls.get(k, 0)}
            python = {k: n for k, n in added.items() if not isinstance(k, tuple)}
            rows.append(
                (
                    f"batch {batch}, {label} hooks, {name}",
                    sum(python.values()) / steps,
                    sum(n for k, n in added.items() if isinstance(k, tuple)) / steps,
                    sum(1 for n in python.values() if n >= steps),
                    len(python),
                )
            )
    return rows


def cold_hook_rows(repeat: int, batch: int = 64, steps: int = 64):
    """Where section F2's cold default-set cost lies, per process: the step with every hook's handler switched off
    (``Hook.handler = None``: the generated wrappers call straight through, as after runtime control turned a hook
    off; the scope factory and the future class stay installed), and what switching off each hook's handler alone
    saves. Every variant is built and warmed as in ``cold_step_rows``; each repeat runs them all in turn, and a
    saving is the difference to the same repeat's step with every handler on (paired: the machine's minute-to-minute
    drift cancels). Handlers share data (the stage clock, the deferred queue), so the savings are not additive."""
    sweep = cache_sweep()
    set_process("engine_core", "0", "mixed")
    with metric_set("*"):
        bare = build(batch, (), phased=True)
    rows = []
    for label, hooked in PROCESS_LABELS:
        with metric_set(""):
            variants = {"all": build(batch, hooked, phased=True), "none": build(batch, hooked, phased=True)}
            for hook in variants["none"].hooks.values():
                hook.handler = None
            names = list(variants["all"].hooks)
            for name in names:
                step = variants[name] = build(batch, hooked, phased=True)
                step.hooks[name].handler = None
            for step in (bare, *variants.values()):
                for _ in range(FLUSH_STEPS * 2):
                    step()
            runs = interleaved(
                {"bare": (bare, None)} | {k: (v, None) for k, v in variants.items()},
                repeat,
                lambda step: mean_step(step, steps, sweep),
            )
        rows.append(
            (f"batch {batch}, cold caches, {label} hooks, default set: added", paired(runs["all"], runs["bare"]))
        )
        rows.append(
            (
                f"batch {batch}, cold caches, {label} hooks, every handler switched off (the wrappers alone): added",
                paired(runs["none"], runs["bare"]),
            )
        )
        for name in names:
            rows.append(
                (
                    f"batch {batch}, cold caches, {label} hooks: saved by switching off the hook of {name}",
                    paired(runs["all"], runs[name]),
                )
            )
    return rows
