"""This process's mutable state, in one object: ``STATE``.

Everything the package remembers between hooked calls lives in the fields of ``STATE`` (a class with
``__slots__``: a field is one plain attribute load). Containers are emptied and scalars reassigned IN
PLACE by :func:`reset`, so a hot-path function may bind ``STATE`` (or one of its containers, or a
container's bound method) once, at import or as a default argument, and that binding stays valid.

:func:`reset` is the one way back to a fresh process: a forked child calls it (``os.register_at_fork``,
in ``recording.pipeline``: a parent's pending records, caches and steps are not the child's), and the
tests' autouse fixture calls it before every test. What it does not reset:

- the process identity (``context.PROCESS``: kind, dp, role, rank): a forked child inherits its
  parent's, and a hook's ``claim`` changes it (clearing the label caches, ``clear_label_caches``);
- registrations (``observers``, ``utilization_observed``, ``extra_metrics``, ``neighbour_patches``): an
  observable gauge registered once is observed by every pipeline the process builds, a forked child's included;
  a metric a user's hook file declared keeps its View; the installer's patches stay installed in a forked child.
  ``reset(registrations=True)`` drops them too (tests that count registrations);
- the installer's reading of the installed vLLM (``streaming_holds_a_slot``): a forked child runs the same vLLM;
- the runtime control (``control``: on/off, patterns, installed hooks, the poller), which follows the
  server's control file for the process's lifetime: ``recording.control.teardown`` resets it;
- the pipeline (``pipeline``, ``extra_readers``, the user's providers ``meter_provider`` and ``tracer_provider``,
  ``pipeline_lock``, ``collect_lock``) and its registered steps
  (``pre_collect``, ``after_fork``): ``recording.pipeline.reset()``
  closes it (its final export), and the fork handler abandons a parent's (its readers are not ours);
- the flush listener (``flush_listener``, ``flush_env``) and whether it and the control poller run
  (``services``), which follow the first load of a hooked module and ``uninstrument()``
  (``recording.services.start`` / ``stop``); the fork handler starts a child's own;
- the future classes whose completions are hooked (``completion_hooked``, ``completes_later``): they
  follow the installed class patches, which a forked child inherits; removing a patch removes its class.

The fork handler is ``recording.pipeline``'s, the only one the package registers (its registered steps start a
child's own flush listener and control poller).

ContextVars (``handlers.steps.CURRENT_STEP``, ``IN_PREFIX_CACHE_RESET``) are not state to reset: each
call sets and restores its own value.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

UNKNOWN = "unknown"


class State:
    __slots__ = (
        # -- label caches (context): emptied whenever the process identity changes --
        "step_labels",
        "extra_labels",
        "scope_labels",
        # -- step classification (handlers.steps, handlers.scheduler) --
        "last_step_phase",
        "schedule_calls",
        "exec_phase",
        "streaming_holds_a_slot",
        # -- handlers --
        "last_execute",
        "current_pass",
        "input_in_step",
        "current_engine",
        "served_model",
        "tracing",
        "step_stream",
        "genai_labels",
        "memory_captured",
        "blocked",
        "blocks",
        "status_preempted",
        "worker_step",
        "device",
        "scope_names",
        "empty_output",
        "engine_stages",
        "api_stages",
        "worker_stages",
        "kv_bytes_per_token",
        "kv_job_phases",
        "kv_labels",
        # -- recording layer (caches of the current pipeline, pending records) --
        "instruments",
        "real_instruments",
        "process_labels",
        "generation",
        "deferred",
        "deferred_values",
        # -- log-once memories --
        "reported",
        "failures",
        "failures_exported",
        "failures_lock",
        "on_new_failure",
        "warned",
        "neighbours_reported",
        "neighbours_rechecked",
        # -- registrations (kept by reset() unless registrations=True) --
        "observers",
        "utilization_observed",
        "extra_metrics",
        "neighbour_patches",
        "stand_ins",
        "mrv2_forward_marked",
        # -- the pipeline (recording.pipeline: reset() there closes it; kept by reset()) --
        "pipeline",
        "extra_readers",
        "meter_provider",
        "tracer_provider",
        "pipeline_lock",
        "collect_lock",
        "pre_collect",
        "after_fork",
        # -- the flush listener (recording.shutdown: setup / teardown; kept by reset()) --
        "flush_listener",
        "flush_env",
        # -- whether this process's services run (recording.services: start / stop; kept by reset()) --
        "services",
        # -- future classes hooked by installed patches (hooks.patches, hooks.futures; kept by reset()) --
        "completion_hooked",
        "completes_later",
        # -- runtime control (recording.control; reset by its teardown) --
        "control",
    )

    def __init__(self) -> None:
        #: phase -> (dp, role, phase): label values of step-scoped series (context.step_labels).
        self.step_labels: dict[str, tuple] = {}
        #: (phase, extra) -> (dp, role, phase, extra) (context.step_labels_with).
        self.extra_labels: dict[tuple, tuple] = {}
        #: phase -> {scope name: labels} of profiling scopes (handlers.scopes).
        self.scope_labels: dict[str, dict] = {}
        #: Phase of the step most recently scheduled in this process (read by executor RPC handlers,
        #: which dispatch that step's work right after ``schedule()`` returned).
        self.last_step_phase: str = UNKNOWN
        #: ``schedule()`` calls so far in this process (outermost calls, raised ones included): an engine
        #: step during which it did not change scheduled nothing (phase ``idle``).
        self.schedule_calls: int = 0
        #: Phase of the step whose execute_model RPC was dispatched last (EngineCore): its sample_tokens
        #: follows.
        self.exec_phase: str = UNKNOWN
        #: Whether paused streaming sessions hold a slot against ``max_num_running_reqs`` (a scheduler without
        #: ``max_num_active_reqs``): the installer's reading of the installed vLLM (``targets.STREAMING_HOLDS_A_SLOT``;
        #: True, vLLM 0.30's, until it is read). Not reset: a forked child runs the same vLLM.
        self.streaming_holds_a_slot: bool = True
        #: The state of the execute_model RPC dispatched last (EngineCore, handlers.executor).
        self.last_execute: tuple | None = None
        #: The engine-core busy-loop pass in progress (handlers.engine).
        self.current_pass: Any = None
        #: Seconds of client requests handled while a step waited for its output (vLLM 0.34+
        #: ``_wait_for_output``), added to the next busy-loop pass's duration (handlers.engine).
        self.input_in_step: float = 0.0
        #: The API server's engine index of the output being processed (handlers.api), None: unknown.
        self.current_engine: str | None = None
        #: The API server's served model name (``gen_ai.request.model``, handlers.api), None: not known.
        self.served_model: str | None = None
        #: The request traces' pipeline (recording.traces.Tracing) of this process, None: not built.
        self.tracing: Any = None
        #: The per-step records' stream (recording.step_records.Stream) of this process, None: no sink on.
        self.step_stream: Any = None
        #: (operation, error type) -> the gen_ai.server.* label tuples (handlers.api).
        self.genai_labels: dict[tuple, tuple] = {}
        #: ids of workers whose memory was recorded (handlers.memory).
        self.memory_captured: set = set()
        #: Per KV cache manager (by id): whether the last allocation was refused (handlers.scheduler).
        self.blocked: dict[int, bool] = {}
        #: Per scheduler (by id): (total, free, pipeline generation) last recorded (handlers.scheduler).
        self.blocks: dict[int, tuple] = {}
        #: vllm.v1.request.RequestStatus.PREEMPTED, once a scheduler was seen (handlers.scheduler).
        self.status_preempted: Any = None
        #: The WorkerStep in progress (handlers.model_runner).
        self.worker_step: Any = None
        #: The device timeline (handlers.model_runner): False: not decided yet; None: no device events.
        self.device: Any = False
        #: Scope name -> its label value, at most MAX_SCOPE_NAMES (handlers.scopes).
        self.scope_names: dict[str, str] = {}
        #: vLLM's shared EMPTY_MODEL_RUNNER_OUTPUT, once vllm.v1.outputs is imported (handlers.model_runner).
        self.empty_output: Any = None
        #: The exclusive time budgets (handlers.budget ``StageClock``s, set there at import): the EngineCore
        #: busy loop's and the API server output loop's. Reset in place (``StageClock.reset``) whenever
        #: the pipeline closes: the seconds so far were the old pipeline's.
        self.engine_stages: Any = None
        self.api_stages: Any = None
        self.worker_stages: Any = None  # the worker step's (handlers.budget.WORKER)
        #: KV bytes one scheduled token writes in this EngineCore (handlers.kv_transfer; 0: unknown).
        self.kv_bytes_per_token: int = 0
        #: OffloadingConnector job id -> phase of the worker step that submitted it (handlers.kv_transfer).
        self.kv_job_phases: dict = {}
        #: (phase, direction, connector) -> KV transfer label values (handlers.kv_transfer).
        self.kv_labels: dict[tuple, tuple] = {}
        #: seed -> the recording layer's instrument in the current pipeline.
        self.instruments: dict[str, Any] = {}
        #: seed -> the current pipeline's instrument, also while runtime control switched it off
        #: (``instruments`` then holds a no-op for it).
        self.real_instruments: dict[str, Any] = {}
        #: The (process, dp, role) counted in instrumented_processes, None: not yet.
        self.process_labels: tuple | None = None
        #: Changes whenever the pipeline is rebuilt (reset, fork) or this state is reset: values cached as
        #: "already recorded" must be recorded again then. Only ever increases.
        self.generation: int = 0
        #: Records a hook left for later: (function, arguments), oldest first (recording.defer).
        self.deferred: deque = deque()
        #: Histogram observations a hook left for later: (spec, value, labels), oldest first (recording.record_later).
        self.deferred_values: deque = deque()
        #: (handler name, phase) pairs whose failure was logged (hooks.handler.report).
        self.reported: set = set()
        #: (handler name, place) -> handler failures in this process so far, each one counted
        #: (hooks.handler.report, under ``failures_lock``): what ``hook_errors`` exports and status lists.
        self.failures: dict[tuple, int] = {}
        #: (handler name, place) -> how many of ``failures`` the current pipeline's ``hook_errors`` counter has
        #: (recording.export_failures, at each collection); emptied when the pipeline changes.
        self.failures_exported: dict[tuple, int] = {}
        #: Held while ``failures`` is updated or read (handler failures in several threads at once); a forked
        #: child gets a new one (recording.pipeline's fork handler).
        self.failures_lock = threading.Lock()
        #: Called (no arguments) at the first failure of each (handler, place): the recording layer's
        #: (recording.failures), which makes sure a pipeline exists to export the count. A registration: kept
        #: by reset().
        self.on_new_failure: Any = None
        #: Configuration warnings already logged (environment).
        self.warned: set = set()
        #: What the neighbours warning named (neighbours): (neighbour names, {symbol: neighbour names}); None: no
        #: warning yet.
        self.neighbours_reported: tuple | None = None
        #: Whether the one later re-check (at the first collection) ran (neighbours.recheck).
        self.neighbours_rechecked: bool = False
        #: (spec, callback) of this process's observable gauges (recording.observe).
        self.observers: list = []
        #: Whether the device utilization gauge was registered (handlers.memory).
        self.utilization_observed: bool = False
        #: Metrics declared at run time (users' hook files: wiring.userfile), seed -> MetricSpec:
        #: ``catalogue.EXTRA``.
        self.extra_metrics: dict[str, Any] = {}
        #: This process's pipeline (recording.pipeline.Pipeline), None: not built yet.
        self.pipeline: Any = None
        #: Readers every pipeline this process builds gets besides its own (tests' in-memory readers).
        self.extra_readers: tuple = ()
        #: ``instrument(meter_provider=…)``: a user's MeterProvider that gets this process's metrics too; None: none.
        self.meter_provider: Any = None
        #: ``instrument(tracer_provider=…)``: a user's TracerProvider that gets the request traces instead of the
        #: OTEL_TRACES_EXPORTER exporters (recording.traces); None: none.
        self.tracer_provider: Any = None
        #: Held while the pipeline is built or replaced (a new one in a forked child).
        self.pipeline_lock = threading.Lock()
        #: Held through the pre-collection step (recording.pipeline): each reader collects in its own thread,
        #: and two stage clock flushes at once would both add what the clock gained since its last one.
        self.collect_lock = threading.RLock()
        #: The pipeline's pre-collection steps, (place, step) in the order they run (recording.pipeline
        #: ``add_pre_collect``: the recording facade's and ``instrument()``'s). A registration: kept by reset().
        self.pre_collect: list[tuple[int, Any]] = []
        #: What the fork handler (recording.pipeline) runs in a child once its state is reset (``add_after_fork``:
        #: the recording facade's flush listener and control poller). A registration: kept by reset().
        self.after_fork: list = []
        #: (pid, socket, thread) of this process's shutdown-flush listener (recording.shutdown), None:
        #: not listening.
        self.flush_listener: tuple | None = None
        #: Environment variables recording.shutdown set for its children (removed at its teardown).
        self.flush_env: list[str] = []
        #: Whether this process's flush listener and control poller were started (recording.services): at the
        #: first load of a module a hook targets; a forked child inherits it (its fork handler starts its own).
        self.services: bool = False
        #: Future classes that deliver their completion to the FUTURE hook (hooks.patches.hook_future_class).
        self.completion_hooked: set = set()
        #: …and are only ever completed after the call that made them returned.
        self.completes_later: set = set()
        #: The installer's list of patches, for the neighbours re-check (neighbours.check stores it).
        self.neighbour_patches: list | None = None
        #: Objects of vLLM's that hooks replaced on the instance holding them (hooks.patches.stand_in): what
        #: ``uninstrument()`` puts back.
        self.stand_ins: list = []
        #: Whether model runner V2's forward mark (``StepTimingCollector.forward_start``) is hooked in this process
        #: (handlers.model_runner.ForwardStartV2): V2's steps then move the worker budget's boundaries.
        self.mrv2_forward_marked = False
        #: The runtime control's state in this process (recording.control).
        self.control = ControlState()


class ControlState:
    """What ``recording.control`` applied and holds in this process."""

    __slots__ = (
        "on",
        "patterns",
        "serial",
        "reload",
        "hooks",
        "last_export",
        "status_written",
        "poller",
        "seen",
        "warned_dirs",
        "reloaders",
        "summaries",
        "set_env",
        "lock",
    )

    def __init__(self) -> None:
        #: Held while the state is applied (the poller thread and the instrumenting thread); a forked child
        #: gets a new one (a parent's thread may have held it at the fork).
        self.lock = threading.RLock()
        self.clear()

    def clear(self) -> None:
        #: Recording on; metric patterns switched off; the control file's serial and reload counter
        #: last applied (reload None: no control file read yet).
        self.on: bool = True
        self.patterns: tuple = ()
        self.serial: int = 0
        self.reload: int | None = None
        #: Installed hooks: Hook -> (handler, feeds, provides_context).
        self.hooks: dict = {}
        #: Unix time of the last collection (status' ``last_export``), 0: none yet.
        self.last_export: float = 0.0
        #: The status last written: ((its content without the time stamps, whether it had exported), the monotonic
        #: time it was written), None: not yet.
        self.status_written: tuple | None = None
        #: The polling thread: (pid, thread, stop event), None: not started in this process.
        self.poller: tuple | None = None
        #: (inode, mtime, size) of the control file last applied.
        self.seen: tuple | None = None
        #: Control directories already reported as not private.
        self.warned_dirs: set = set()
        #: Callbacks run on ``reload`` (the user hook files' reloader), from the polling thread.
        self.reloaders: list = []
        #: Callbacks giving this process's hook-file summary for status: () -> dict.
        self.summaries: list = []
        #: Environment variables this process set for its children (removed at teardown).
        self.set_env: list = []


STATE = State()


def clear_label_caches() -> None:
    """Empty the caches of label tuples derived from the process identity (it changed)."""
    STATE.step_labels.clear()
    STATE.extra_labels.clear()
    STATE.scope_labels.clear()
    STATE.kv_labels.clear()


def forget_pipeline(closed: bool) -> None:
    """The pipeline changed: the recording layer's caches of instruments and recorded values are
    stale. ``closed``: no pipeline now (reset after its final export, or fork): pending records are
    dropped (a parent's are not ours; a closed pipeline ran them)."""
    s = STATE
    s.instruments.clear()
    s.real_instruments.clear()
    s.process_labels = None
    s.generation += 1
    s.failures_exported.clear()  # a new pipeline's counter starts at 0: it gets the whole count
    if closed:
        s.deferred.clear()
        s.deferred_values.clear()
        for clock in (s.engine_stages, s.api_stages, s.worker_stages):
            if clock is not None:
                clock.reset()


def reset(*, registrations: bool = False) -> None:
    """Back to a fresh process's state, in place (see the module docstring for what stays)."""
    s = STATE
    clear_label_caches()
    s.last_step_phase = UNKNOWN
    s.schedule_calls = 0
    s.exec_phase = UNKNOWN
    s.last_execute = None
    s.current_pass = None
    s.input_in_step = 0.0
    s.current_engine = None
    s.served_model = None
    if s.step_stream is not None:  # a forked child's own (the parent's thread and sockets are not its)
        s.step_stream = s.step_stream.forked()
    s.genai_labels.clear()
    s.memory_captured.clear()
    s.blocked.clear()
    s.blocks.clear()
    s.status_preempted = None
    s.worker_step = None
    s.device = False
    s.scope_names.clear()
    s.empty_output = None
    s.kv_bytes_per_token = 0
    s.kv_job_phases.clear()
    forget_pipeline(closed=True)
    s.reported.clear()
    s.failures.clear()
    s.warned.clear()
    s.neighbours_reported = None
    s.neighbours_rechecked = False
    if registrations:
        s.observers.clear()
        s.utilization_observed = False
        s.extra_metrics.clear()
        s.neighbour_patches = None
        s.stand_ins.clear()
        s.mrv2_forward_marked = False
