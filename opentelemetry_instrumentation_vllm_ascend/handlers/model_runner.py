"""Worker / model runner: the model step in the worker, its phases (vLLM's profiling scopes) and its
timeline.

A step in the worker is ``execute_model(scheduler_output)`` followed, when it returned None, by
``sample_tokens(grammar_output)``. Its phase comes with its arguments: the EngineCore's scheduler
hook stored it on the SchedulerOutput, which reaches the worker pickled with its instance dict (a
worker whose EngineCore is not instrumented classifies the step itself, from the same output).

vLLM's ``record_function_or_nullcontext(name)`` returns ``vllm.v1.utils._PROFILER_FUNC(name)``,
looking the global up on every call: replacing that one global with a factory that wraps whatever
vLLM would have used reaches every caller, however and whenever it imported the function — also
when ``instrument()`` runs after vLLM's modules were imported and its objects built.
"""

from __future__ import annotations

import collections
import contextlib
import fnmatch
import sys
from time import perf_counter
from types import MappingProxyType
from typing import Any

from .. import catalogue, context, environment, recording
from ..catalogue import M
from ..context import HOST_CLOCK
from ..hooks.handler import Handler, RowParams, report
from ..state import STATE, UNKNOWN
from .budget import W_FORWARD, W_IDLE, W_OTHER, W_PREPARE, W_SAMPLE, W_WAIT_SAMPLE, WORKER_TO, off
from .common import device_module
from .steps import CURRENT_STEP, FLUSH_STEPS, PHASE_ATTRIBUTE, READY_ATTRIBUTE, STEP_ATTRIBUTE, Step, classify_step

_EXECUTE = M["executor:model_runner_execute_model:duration"]
_INFERENCE = M["worker:model_inference:duration"]
_SCOPES = M["record_function_or_nullcontext"]
_FORWARD = M["npu:forward_duration"]
_LAUNCH = M["npu:kernel_launch"]
_NON_FORWARD = M["npu:non_forward_duration"]
_GET_OUTPUT = M["worker:model_runner_get_output:duration"]

#: Scope names that open a step's forward pass / close its post-processing (vLLM GPU/CPU runner,
#: vllm-ascend NPU runner).
FORWARD_SCOPES = frozenset({"gpu_model_runner: forward", "forward"})
POSTPROCESS_SCOPES = frozenset({"gpu_model_runner: postprocess", "post process"})
#: Scope names of a step's sampling (vLLM GPU/CPU runner, vllm-ascend NPU runner): the worker budget's
#: ``sample`` stage.
SAMPLE_SCOPES = frozenset({"gpu_model_runner: sample", "sample_token"})
#: The worker budget's stage each of those scopes opens (it returns to ``other`` when the scope ends).
_SCOPE_STAGES = {**dict.fromkeys(FORWARD_SCOPES, W_FORWARD), **dict.fromkeys(SAMPLE_SCOPES, W_SAMPLE)}
#: At most this many distinct scope names get their own series; later ones are recorded as "other".
MAX_SCOPE_NAMES = catalogue.MAX_SCOPE_NAMES


class WorkerStep:
    """The timeline of the step the worker is running (one at a time per worker)."""

    __slots__ = (
        "phase",
        "start",
        "execute_seconds",
        "returned",
        "forward_start",
        "forward_end",
        "post_end",
        "device",
        "start_event",
        "end_event",
        "to",
        "forward_event",
    )

    def __init__(self, phase: str, start: float, to=off) -> None:
        self.phase = phase
        self.start = start
        #: The worker budget's boundary (``budget.WORKER_TO``; ``off`` where the budget is absent).
        self.to = to
        self.execute_seconds = 0.0
        self.returned: float | None = None  # perf_counter when execute_model returned
        self.forward_start: float | None = None
        self.forward_end: float | None = None
        self.post_end: float | None = None
        self.device: tuple | None = None  # (start event, end event) of the forward pass on the device
        # Device events (torch.cuda/npu Event) at the start of execute_model and the end of the step
        # (device timeline only).
        self.start_event: Any = None
        self.end_event: Any = None
        #: Model runner V2: the device event at its forward's start (``ForwardStartV2``), paired at execute_model's
        #: return into ``device``.
        self.forward_event: Any = None


# STATE.worker_step: the WorkerStep in progress.


# -- device events ------------------------------------------------------------------------------------


class DeviceTimeline:
    """A step's times on the device: an event recorded when execute_model starts, a pair around the
    forward scope, and one when the step ends (sample_tokens, or an execute_model that returned the
    output), all on the stream the runner computes on. A step is read once the device has passed its
    end event (``query()``), never waiting for it; steps not yet done are kept (at most ``limit``;
    the oldest is dropped beyond that)."""

    def __init__(self, event_class, limit: int = 64) -> None:
        self.event_class = event_class
        self.pending: collections.deque[WorkerStep] = collections.deque()
        self.limit = limit

    def start(self):
        event = self.event_class(enable_timing=True)
        event.record()
        return event

    def step_ended(self, step: WorkerStep) -> None:
        step.end_event = self.start()
        if len(self.pending) >= self.limit:
            self.pending.popleft()
        self.pending.append(step)

    def poll(self) -> None:
        """Record every step the device has finished: its inference time (device time from the start
        of execute_model to the end of the step), its forward time, and their difference; one clock."""
        pending = self.pending
        while pending and pending[0].end_event.query():
            step = pending.popleft()
            labels = context.step_labels(step.phase)
            inference = step.start_event.elapsed_time(step.end_event) / 1000.0
            recording.record(_INFERENCE, inference, labels)
            if step.device is not None:
                forward = step.device[0].elapsed_time(step.device[1]) / 1000.0
                recording.record(_FORWARD, forward, labels)
                recording.record(_NON_FORWARD, max(inference - forward, 0.0), labels)


def device_timeline():
    """This process's DeviceTimeline, None where there are no device events (host timeline); decided
    on first use (STATE.device: False until then)."""
    timeline = STATE.device
    if timeline is False:
        module = device_module()
        timeline = STATE.device = DeviceTimeline(module.Event) if module is not None else None
    return timeline


# -- profiling scopes ---------------------------------------------------------------------------------

_names = STATE.scope_names


def name_label(name) -> str:
    """A scope name's label value: the name, for at most MAX_SCOPE_NAMES names; ``other`` beyond."""
    label = _names.get(name)
    if label is None:
        if isinstance(name, str) and len(_names) < MAX_SCOPE_NAMES:
            label = _names[name] = name
        else:
            label = "other"  # not remembered: the table stays bounded whatever names come
    return label


class _Scope:
    """One ``with record_function_or_nullcontext(name):`` block: times it (after entering vLLM's own
    scope, before leaving it) and, in a worker step, marks the step's forward / post-processing.
    Built by the scope factory (``ProfilerScopes``), which sets ``name``, ``inner`` and ``device``."""

    __slots__ = ("name", "inner", "start", "device")
    name: Any  # vLLM passes a str; anything else is labelled "other"
    inner: Any  # vLLM's own scope (a context manager), or None
    start: float
    device: Any  # the device event at the start of a forward scope, or None

    def __enter__(self):
        value = self.inner.__enter__() if self.inner is not None else None
        self.start = perf_counter()
        stage = _SCOPE_STAGES.get(self.name)
        if stage is not None:
            step = STATE.worker_step
            if step is not None:
                step.to(stage, self.start)  # the worker budget: forward / sample begins
                if stage == W_FORWARD:
                    step.forward_start = self.start
                    if step.start_event is not None and step.start_event is not _NO_EVENT:  # device timeline
                        try:
                            self.device = device_timeline().start()
                        except Exception:
                            report(_SCOPE_HANDLER, "device event")
        return value

    def __exit__(self, exc_type, exc, tb, _step=CURRENT_STEP.get, _state=STATE):
        if exc_type is None:
            end = perf_counter()
            try:
                step = _step()
                if step is None:  # recorded now, with the phase of the step most recently scheduled
                    labels = _scope_labels.get(_state.last_step_phase, _NO_LABELS).get(self.name)
                    if labels is None:
                        labels = _labels_of(_state.last_step_phase, self.name)
                    _record(_SCOPES, end - self.start, labels)
                    if _state.worker_step is not None:
                        _worker_scope_ended(self, end)
                else:  # inside Scheduler.schedule (vLLM's profiler on): recorded with the step's records
                    _step_values(step, self.name).append(end - self.start)
            except Exception:
                report(_SCOPE_HANDLER, "scope")
        if self.inner is not None:
            return self.inner.__exit__(exc_type, exc, tb)
        return False


class _TimelineScope(_Scope):
    """A forward / post-processing / sample scope while the scope histogram is off (the default set): only
    its worker step's timeline marks and budget stages (``_worker_scope_ended``); nothing is recorded per
    scope. vLLM enters these scopes in the worker only, never inside ``Scheduler.schedule``."""

    __slots__ = ()

    def __exit__(self, exc_type, exc, tb, _state=STATE):
        if exc_type is None and _state.worker_step is not None:
            try:
                _worker_scope_ended(self, perf_counter())
            except Exception:
                report(_SCOPE_HANDLER, "scope")
        if self.inner is not None:
            return self.inner.__exit__(exc_type, exc, tb)
        return False


class _InStepScope:
    """Every ``with record_function_or_nullcontext(name):`` block of one name inside one
    ``Scheduler.schedule`` call (vLLM's profiler off): one shared object, no object per block —
    vLLM enters "schedule: allocate_slots" once per running request. Each block that ends normally
    adds its duration to the step's list for that name (recorded with the step's phase when the step
    is); starts are kept on a stack, so nested blocks of one name pair up correctly."""

    __slots__ = ("starts", "values")
    starts: list[float]
    values: list[float]

    def __enter__(self):
        self.starts.append(perf_counter())

    def __exit__(self, exc_type, exc, tb):
        end = perf_counter()
        start = self.starts.pop()
        if exc_type is None:
            self.values.append(end - start)
        return False


def _step_values(step: Step, name) -> list:
    """The step's list of durations of scopes named ``name`` (made on first use)."""
    scopes = step.scopes
    if scopes is None:
        scopes = step.scopes = {}
    label = name if name.__class__ is str else name_label(name)
    values = scopes.get(label)
    if values is None:
        values = scopes[label] = []
    return values


#: What an untimed scope (OTEL_VLLM_ASCEND_DISABLED_SCOPES) is inside a scheduling step when vLLM's
#: own choice is nullcontext: one shared instance (nullcontext is reusable and reentrant).
_UNTIMED = contextlib.nullcontext()


def _in_step_scope(step: Step, name, untimed=None):
    """The step's shared scope for ``name`` (made on its first block in this step): its timer, or,
    for a scope ``untimed(name)`` switches off, the shared nullcontext."""
    timers = step.timers
    if timers is None:
        timers = step.timers = {}
    if untimed is not None and untimed(name):
        timers[name] = _UNTIMED
        return _UNTIMED
    timer = _InStepScope()
    timer.starts = []
    timer.values = _step_values(step, name)
    timers[name] = timer
    return timer


_record = recording.record
_NO_LABELS: MappingProxyType = MappingProxyType({})
#: phase → {scope name → label tuple}; emptied when the process context changes.
_scope_labels = STATE.scope_labels


def _labels_of(phase: str, name) -> tuple:
    labels = context.step_labels_with(phase, name_label(name))
    by_name = _scope_labels.setdefault(phase, {})
    if name.__class__ is str and len(by_name) < MAX_SCOPE_NAMES:  # bounded, whatever names come
        by_name[name] = labels
    return labels


def _worker_scope_ended(
    scope: _Scope, end: float, _forward=FORWARD_SCOPES, _post=POSTPROCESS_SCOPES, _sample=SAMPLE_SCOPES
) -> None:
    """A scope ended inside a worker step: the forward / post-processing marks of its timeline, and the
    end of the worker budget's forward / sample stage."""
    worker_step = STATE.worker_step
    name = scope.name
    if name in _forward:
        worker_step.forward_end = end
        worker_step.to(W_OTHER, end)
        if scope.device is not None and worker_step.start_event is not None:
            worker_step.device = (scope.device, device_timeline().start())
    elif name in _post:
        worker_step.post_end = end
    elif name in _sample:
        worker_step.to(W_OTHER, end)


class _ScopeHandler(Handler):
    name = "record_function_or_nullcontext scope"


_SCOPE_HANDLER = _ScopeHandler()


def untimed_scopes(patterns: tuple[str, ...], only=None):
    """None when ``patterns`` is empty and ``only`` None, else ``untimed(name)``: whether a scope name matches one
    of them (shell-style) or, with ``only`` (a set of names), is not in it (decided once per name, for a bounded
    number of names)."""
    if not patterns and only is None:
        return None
    decided: dict = {}

    def untimed(name) -> bool:
        off = decided.get(name)
        if off is None:
            off = (only is not None and not (isinstance(name, str) and name in only)) or (
                isinstance(name, str) and any(fnmatch.fnmatchcase(name, p) for p in patterns)
            )
            if len(decided) < 4 * MAX_SCOPE_NAMES:
                decided[name] = off
        return off

    untimed.decided = decided  # type: ignore[attr-defined]  # the factory reads a decided name directly
    return untimed


class ProfilerScopes:
    """Installs the scope factory as ``vllm.v1.utils._PROFILER_FUNC`` (target kind SCOPE_FACTORY).
    Scopes named in OTEL_VLLM_ASCEND_DISABLED_SCOPES, and with record_function_or_nullcontext off every scope but
    the forward, post-processing and (worker budget on) sample ones, get vLLM's own choice (outside a scheduling
    step: ``inner(name)``; inside one with nullcontext: one shared nullcontext), untimed."""

    attribute = "_PROFILER_FUNC"

    def install(self, module):
        attribute = self.attribute
        inner = getattr(module, attribute)
        if inner is None:
            # What vLLM would choose on its first call (nullcontext, torch record_function, nvtx).
            module.record_function_or_nullcontext("")
            inner = getattr(module, attribute)
        if inner is None or getattr(inner, "_otel_vllm_ascend_factory", False):
            raise RuntimeError(f"{module.__name__}.{attribute} is not a scope factory ({inner!r})")
        plain = inner is contextlib.nullcontext
        # With the scope histogram off (opt-in, catalogue.OPT_IN) only the scopes the worker's forward, non-forward
        # and kernel-launch durations and its step budget's forward / sample stages are measured from are timed:
        # the rest run as without us.
        only = None
        if environment.metric_disabled(_SCOPES.seed):
            only = FORWARD_SCOPES | POSTPROCESS_SCOPES | (SAMPLE_SCOPES if WORKER_TO is not off else frozenset())
        untimed = untimed_scopes(environment.disabled_scope_patterns(), only)
        decided = untimed.decided.get if untimed is not None else None
        # With the scope histogram off the timed scopes only mark the worker step's timeline.
        cls = _TimelineScope if only is not None else _Scope

        def factory(
            name,
            _inner=inner,
            _plain=plain,
            _new=_Scope.__new__,
            _cls=cls,
            _step=CURRENT_STEP.get,
            _untimed=untimed,
            _decided=decided,
            _shared=_UNTIMED,
        ):
            if _decided is not None:
                off = _decided(name)
                if off:  # untimed (decided before), in a scheduling step or not: vLLM's own choice;
                    return _shared if _plain else _inner(name)  # its nullcontext is reusable: one shared instance
            else:
                off = False
            if _plain:
                step = _step()
                if step is not None:  # inside Scheduler.schedule: once per running request
                    try:
                        return step.timers[name]
                    except Exception:  # the first block of this name in this step (or a strange name)
                        try:
                            return _in_step_scope(step, name, _untimed)
                        except Exception:
                            report(_SCOPE_HANDLER, "scope")
            if off is None:  # a name not decided yet
                if _untimed(name):
                    return _shared if _plain else _inner(name)
            scope = _new(_cls)  # no __init__ frame
            scope.name = name
            scope.inner = None if _plain else _inner(name)
            scope.device = None
            return scope

        factory._otel_vllm_ascend_factory = True
        setattr(module, attribute, factory)
        return _ModuleGlobalPatch(module, attribute, inner, factory)


class _ModuleGlobalPatch:
    __slots__ = ("module", "attribute", "original", "replacement")

    def __init__(self, module, attribute, original, replacement) -> None:
        self.module, self.attribute, self.original, self.replacement = module, attribute, original, replacement

    def remove(self) -> None:
        if getattr(self.module, self.attribute, None) is self.replacement:
            setattr(self.module, self.attribute, self.original)


# -- the worker's step ----------------------------------------------------------------------------------


def _record_step(labels: tuple, execute, launch, inference, forward) -> None:
    """What one worker step measured on the host (None: not measured), recorded from the deferred queue:
    its execute_model time, kernel-launch time, inference time (host timeline), forward and non-forward
    times (host timeline, where the forward scope was seen)."""
    _record_steps([(labels, execute, launch, inference, forward)])


def _record_steps(calls: list) -> None:
    """``_record_step`` for many steps at once: one ``record_many`` per metric and label set, in step order."""
    by_labels: dict = {}
    for labels, execute, launch, inference, forward in calls:
        lists = by_labels.get(labels)
        if lists is None:
            lists = by_labels[labels] = ([], [], [], [], [])
        if execute is not None:
            lists[0].append(execute)
        if launch is not None:
            lists[1].append(launch)
        if inference is not None:
            lists[2].append(inference)
            if forward is not None:
                lists[3].append(forward)
                lists[4].append(max(inference - forward, 0.0))
    for labels, lists in by_labels.items():
        for spec, values in zip((_EXECUTE, _LAUNCH, _INFERENCE, _FORWARD, _NON_FORWARD), lists):
            if values:
                recording.record_many(spec, values, labels)


_record_step.many = _record_steps  # type: ignore[attr-defined]  # read by recording.run_deferred
_deferred = STATE.deferred


def _later(labels: tuple, execute, launch, inference, forward, _state=STATE) -> None:
    """Leave one step's host records for later (``recording.defer``, inline): the worker records ``FLUSH_STEPS``
    steps at a time, and every collection first records what waits."""
    _deferred.append((_record_step, (labels, execute, launch, inference, forward)))
    if len(_deferred) >= FLUSH_STEPS:
        recording.run_deferred()
    elif _state.pipeline is None:
        recording.pipeline.get()  # its collections run what waits: it must exist before the first one


def _finish(step: WorkerStep, seconds: float, handler, _state=STATE) -> None:
    """The step ended in the worker (``seconds``: its host time, execute_model + sample_tokens):
    record its execute_model time, inference time and timeline — on the device timeline where the
    step has device events (once the device has passed them), otherwise on the host (CPU: the host
    time is the computation itself). npu:kernel_launch is host time either way. Host values wait in
    the deferred queue (``_later``). A failing device timeline (``handler`` reports it) loses only the
    device's values; a step whose start event failed (``_NO_EVENT``) records no device or host inference."""
    _state.worker_step = None
    labels = context.step_labels(step.phase)
    forward_start = step.forward_start
    post_end = step.post_end
    launch = post_end - forward_start if post_end is not None and forward_start is not None else None
    if step.start_event is not None:
        _later(labels, step.execute_seconds, launch, None, None)
        if step.start_event is not _NO_EVENT:
            try:
                timeline = device_timeline()
                timeline.step_ended(step)
                timeline.poll()
            except Exception:
                report(handler, "device timeline")
        return
    forward_end = step.forward_end
    forward = forward_end - forward_start if forward_start is not None and forward_end is not None else None
    _later(labels, step.execute_seconds, launch, seconds, forward)


def _unended(step: WorkerStep) -> None:
    """A step whose execute_model returned but whose sample_tokens never ended it (it raised, or the next
    execute_model came first): only its execute_model time is recorded."""
    if step.returned is not None:
        _later(context.step_labels(step.phase), step.execute_seconds, None, None, None)


def _phase_of(runner, scheduler_output) -> str:
    phase = getattr(scheduler_output, PHASE_ATTRIBUTE, None)
    if phase is None:
        phase = classify_step(runner, scheduler_output)[0]
    return phase


def _shared_empty():
    empty = STATE.empty_output
    if empty is None:
        module = sys.modules.get("vllm.v1.outputs")
        empty = STATE.empty_output = getattr(module, "EMPTY_MODEL_RUNNER_OUTPUT", None) if module is not None else None
    return empty


def _stamp(output, returned, ready) -> None:
    """Stamp the ModelRunnerOutput the worker replies with: (this process's clock, execute_model
    returned, the reply was ready). It travels to the EngineCore pickled with the instance dict (or
    in-process as is). vLLM's shared empty output (vLLM copies it into other replies) and objects
    that take no attributes are left alone."""
    if output is None or output is _shared_empty():
        return
    try:
        setattr(output, READY_ATTRIBUTE, (HOST_CLOCK, returned, ready))
    except Exception:
        pass


def reply(output, step: WorkerStep | None, now: float, _state=STATE, _clock=HOST_CLOCK) -> None:
    """``output`` is what the worker returns for an RPC that ends a step (``now``: it returned).
    An async output (async scheduling: it has ``get_output``, which vLLM's output thread — or the
    in-process executor, when the engine reads it — calls later) carries the step's phase and the
    moment its execute_model returned on to ``GetOutput``, which stamps the output it builds; any
    other output is stamped now (``_stamp``, inline)."""
    if output is None:
        return
    returned = step.returned if step is not None else None
    if hasattr(output.__class__, "get_output"):
        try:
            setattr(output, STEP_ATTRIBUTE, (step.phase if step is not None else UNKNOWN, returned))
        except Exception:
            pass
        return
    empty = _state.empty_output
    if empty is None:
        empty = _shared_empty()
    if output is not empty:
        try:
            setattr(output, READY_ATTRIBUTE, (_clock, returned, now))
        except Exception:
            pass


class ExecuteModel(Handler):
    """The model runner's ``execute_model(scheduler_output, …)``: sets the step's phase for what the
    worker records during the step, times the call, and ends the step when no ``sample_tokens``
    follows (it returned an output itself)."""

    reads_args = RowParams()

    def before(self, args, kwargs):
        try:
            phase = _phase_of(args[0], args[1])
        except Exception:  # the step is still timed, labelled unknown
            report(self, "phase")
            phase = UNKNOWN
        STATE.last_step_phase = phase
        return begin_step(phase)

    def after(self, step, args, kwargs, result):
        end = step.returned = perf_counter()
        step.to(W_WAIT_SAMPLE if result is None else W_IDLE, end)  # the worker budget
        seconds = step.execute_seconds = end - step.start  # recorded when the step ends (_finish, _unended)
        if result is not None:
            reply(result, step, end)
            _finish(step, seconds, self)

    def error(self, step, args, kwargs, exc):
        step.to(W_IDLE, perf_counter())
        STATE.worker_step = None


def begin_step(phase: str, to=WORKER_TO) -> WorkerStep:
    """A worker step starts (execute_model was called): its timeline, with a device event at its
    start where the device offers events; the worker budget's ``prepare_inputs`` stage begins (``to``:
    its boundary, ``off`` where the budget is absent)."""
    start = perf_counter()
    previous = STATE.worker_step
    if previous is not None:  # its sample_tokens never came
        _unended(previous)
    step = STATE.worker_step = WorkerStep(phase, start, to)
    to(W_PREPARE, start)
    timeline = STATE.device
    if timeline is False:
        timeline = device_timeline()
    if timeline is not None:
        try:
            step.start_event = timeline.start()
        except Exception:  # the step has no device times (nor host ones: the device computes, not the host)
            step.start_event = _NO_EVENT
            report(_SCOPE_HANDLER, "device event")
    return step


#: A step's ``start_event`` when recording it failed: its execute_model and kernel-launch host times are recorded,
#: no inference or forward time (neither the device's nor the host's, which is not the computation on a device).
_NO_EVENT = False


class SampleTokens(Handler):
    """The model runner's ``sample_tokens(grammar_output)``: ends the step that execute_model began,
    and stamps its reply (``reply``)."""

    reads_args = 0

    def before(self, args, kwargs):
        start = perf_counter()
        step = STATE.worker_step
        if step is not None:
            step.to(W_OTHER, start)  # the worker budget: the step goes on
        return start

    def after(self, start, args, kwargs, result):
        end = perf_counter()
        step = STATE.worker_step
        reply(result, step, end)
        if step is not None:
            step.to(W_IDLE, end)
            _finish(step, step.execute_seconds + end - start, self)

    def error(self, start, args, kwargs, exc):
        step = STATE.worker_step
        if step is not None:
            step.to(W_IDLE, perf_counter())
            _unended(step)
        STATE.worker_step = None


class GetOutput(Handler):
    """An async model runner output's ``get_output()`` (MRV1 ``AsyncGPUModelRunnerOutput``, which the
    NPU runner uses too; MRV2 ``AsyncOutput``): waits for the sampled tokens to reach the host and
    builds the ModelRunnerOutput. vLLM's worker process calls it in its output thread while the main
    thread runs later steps, so the phase is the one ``reply`` carried on the object (the step whose
    output it is), not the step running now. The output it returns is stamped as the reply (ready
    now). Called inside sample_tokens (MRV2 without async scheduling): the step still running there."""

    reads_args = 1  # self

    def timed(self, seconds, args, kwargs, result):
        end = perf_counter()
        try:
            carried = getattr(args[0], STEP_ATTRIBUTE, None)
            if carried is not None:
                phase, returned = carried
            else:
                step = STATE.worker_step
                phase, returned = (step.phase, step.returned) if step is not None else (UNKNOWN, None)
        except Exception:  # the duration is still recorded, labelled unknown; the reply is not stamped
            report(self, "step")
            phase, returned = UNKNOWN, None
        recording.record(_GET_OUTPUT, seconds, context.step_labels(phase))
        _stamp(result, returned, end)


class ExecuteModelV2(ExecuteModel):
    """Model runner V2's ``execute_model(scheduler_output, intermediate_tensors=None, dummy_run=False,
    …)``: as V1, but dummy runs (warm-up, DP padding) are not steps. V2 enters no profiling scopes: its
    forward begins at ``StepTimingCollector.forward_start()`` (``ForwardStartV2``), which vLLM calls right
    before the model's forward, and ends when execute_model returns (after the KV connector's
    ``finish_forward`` and the step's bookkeeping: V2 computes the logits in ``sample``, not here)."""

    reads_args = RowParams()
    #: Whether this runner's forward is marked (``ForwardStartV2``) when the mark is hooked in this process.
    marked = True

    def before(self, args, kwargs):
        if args[3]:
            return None
        try:
            phase = _phase_of(args[0], args[1])
        except Exception:  # the step is still timed, labelled unknown
            report(self, "phase")
            phase = UNKNOWN
        STATE.last_step_phase = phase
        if STATE.mrv2_forward_marked and self.marked:  # the forward mark is hooked (vLLM 0.32+)
            return begin_step(phase)
        return begin_step(phase, off)  # no worker budget: its forward is not delimited

    def after(self, step, args, kwargs, result):
        if step is None:
            return
        end = step.returned = perf_counter()
        if step.forward_start is not None:  # the forward ends with execute_model
            step.forward_end = end
            event = step.forward_event
            if event is not None:
                try:
                    step.device = (event, device_timeline().start())
                except Exception:
                    report(self, "device event")
        step.to(W_WAIT_SAMPLE if result is None else W_IDLE, end)  # the worker budget
        seconds = step.execute_seconds = end - step.start
        if result is not None:
            reply(result, step, end)
            _finish(step, seconds, self)

    def error(self, step, args, kwargs, exc):
        if step is not None:
            super().error(step, args, kwargs, exc)


class ExecuteModelStandalone(ExecuteModelV2):
    """vLLM's ``StandaloneCPUModelRunner.execute_model`` (``vllm/v1/worker/cpu/standalone_model_runner.py``, 0.34+:
    model runner V2's CPU runner without Triton, on non-x86 CPUs; not a subclass of V2's GPUModelRunner, same
    ``execute_model`` shape). It calls no ``StepTimingCollector``: its forward is never marked, so its steps have
    no forward time and move no boundary of the worker budget, even in a process where V2's mark is hooked."""

    reads_args = RowParams()
    marked = False


class ForwardStartV2(Handler):
    """Model runner V2's ``StepTimingCollector.forward_start()`` (``vllm/v1/worker/gpu/async_utils.py``, vLLM
    0.32+): execute_model calls it once, right before running the model (``tests/contract/test_mrv2.py``
    checks the order in each version's source). In a step in progress (execute_model entered, not yet
    returned) it opens the forward: the timeline's forward start, a device event on the device timeline, the
    worker budget's ``forward`` stage. Calls outside a step (dummy runs, CUDA graph capture) are ignored."""

    reads_args = 0

    def __init__(self) -> None:
        # Without the mark (vLLM 0.23, or this row not installed) V2's steps move no boundary of the worker
        # budget: their forward could not be told from their input preparation.
        STATE.mrv2_forward_marked = True

    def before(self, args, kwargs, _state=STATE):
        step = _state.worker_step
        if step is not None and step.returned is None and step.forward_start is None:
            now = step.forward_start = perf_counter()
            step.to(W_FORWARD, now)
            event = step.start_event
            if event is not None and event is not _NO_EVENT:  # the step is on the device timeline
                try:
                    step.forward_event = device_timeline().start()
                except Exception:
                    report(self, "device event")


class SampleV2(Handler):
    """Model runner V2's ``sample(hidden_states, input_batch, grammar_output)``, called by sample_tokens: the
    worker budget's ``sample`` stage (V2 computes the logits and applies the grammar bitmask in it, then
    samples). Only hooked for the budget."""

    reads_args = 0

    def before(self, args, kwargs, _state=STATE):
        step = _state.worker_step
        if step is not None and step.returned is not None:
            step.to(W_SAMPLE, perf_counter())
            return step
        return None

    def after(self, step, args, kwargs, result):
        if step is not None:
            step.to(W_OTHER, perf_counter())

    def error(self, step, args, kwargs, exc):
        if step is not None:
            step.to(W_OTHER, perf_counter())
