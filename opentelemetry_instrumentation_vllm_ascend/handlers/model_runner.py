"""Worker / model runner: the model step in the worker, its phases and its timeline.

A step in the worker is ``execute_model(scheduler_output)`` followed, when it returned None, by
``sample_tokens(grammar_output)``. Its phase comes with its arguments: the EngineCore's scheduler
hook stored it on the SchedulerOutput, which reaches the worker pickled with its instance dict (a
worker whose EngineCore is not instrumented classifies the step itself, from the same output).

The profiling scopes themselves (vLLM's ``record_function_or_nullcontext``) are timed by the scope factory of
``handlers.scopes``, which marks the forward pass and sampling on this module's worker step.
"""

from __future__ import annotations

import collections
import sys
from time import perf_counter
from typing import Any

from .. import context, recording
from ..catalogue import M
from ..context import HOST_CLOCK
from ..hooks.handler import Handler, report
from ..state import STATE, UNKNOWN
from .budget import (
    W_FORWARD,
    W_IDLE,
    W_OTHER,
    W_PREPARE,
    W_SAMPLE,
    W_WAIT_SAMPLE,
    WORKER,
    WORKER_MARKED,
    WORKER_TO,
    off,
)
from .common import device_module
from .steps import FLUSH_STEPS, PHASE_ATTRIBUTE, READY_ATTRIBUTE, STEP_ATTRIBUTE, classify_step

_EXECUTE = M["executor:model_runner_execute_model:duration"]
_INFERENCE = M["worker:model_inference:duration"]
_FORWARD = M["npu:forward_duration"]
_LAUNCH = M["npu:kernel_launch"]
_NON_FORWARD = M["npu:non_forward_duration"]
_GET_OUTPUT = M["worker:model_runner_get_output:duration"]


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
        "sampling",
        "marks",
        "kv",
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
        #: Inside a hooked ``sample`` (``SampleV2``): a nested one (vllm-ascend's V2 NPU runner calls V2's) is no
        #: second boundary.
        self.sampling = False
        #: While step records are on: its worker budget boundaries (``budget.WORKER_MARKED``: ``[stage, now, …]``)
        #: and its KV transfers (``kv_transfer.record_transfer``), sent on its reply for its step record; else None.
        self.marks: list | None = None
        self.kv: list | None = None


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


class _ScopeHandler(Handler):
    name = "record_function_or_nullcontext scope"


#: What a failure of a profiling scope (``handlers.scopes``) or of a step's device event is counted and logged as.
SCOPE_FAILURES = _ScopeHandler()


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
    device's values; a step whose start event failed (``NO_EVENT``) records no device or host inference."""
    _state.worker_step = None
    labels = context.step_labels(step.phase)
    forward_start = step.forward_start
    post_end = step.post_end
    launch = post_end - forward_start if post_end is not None and forward_start is not None else None
    if step.start_event is not None:
        _later(labels, step.execute_seconds, launch, None, None)
        if step.start_event is not NO_EVENT:
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


def _stamp(output, returned, ready, worker=None) -> None:
    """Stamp the ModelRunnerOutput the worker replies with: (this process's clock, execute_model
    returned, the reply was ready, the step's part of its step record: ``worker_part``). It travels to the
    EngineCore pickled with the instance dict (or in-process as is). vLLM's shared empty output (vLLM copies it
    into other replies) and objects that take no attributes are left alone."""
    if output is None or output is _shared_empty():
        return
    try:
        setattr(
            output,
            READY_ATTRIBUTE,
            (HOST_CLOCK, returned, ready) if worker is None else (HOST_CLOCK, returned, ready, worker),
        )
    except Exception:
        pass


def worker_part(step: WorkerStep | None):
    """What a step's record takes from the worker (recording/step_fields.py reads it): ``(rank, marks, kv)``, or
    None where the step noted nothing (step records off, no worker budget)."""
    if step is None or step.marks is None:
        return None
    return context.PROCESS.labels.get("rank"), step.marks, step.kv


def reply(output, step: WorkerStep | None, now: float, _state=STATE, _clock=HOST_CLOCK) -> None:
    """``output`` is what the worker returns for an RPC that ends a step (``now``: it returned).
    An async output (async scheduling: it has ``get_output``, which vLLM's output thread — or the
    in-process executor, when the engine reads it — calls later) carries the step's phase and the
    moment its execute_model returned on to ``GetOutput``, which stamps the output it builds; any
    other output is stamped now (``_stamp``, inline)."""
    if output is None:
        return
    returned = step.returned if step is not None else None
    worker = worker_part(step)
    if hasattr(output.__class__, "get_output"):
        phase = step.phase if step is not None else UNKNOWN
        try:
            setattr(output, STEP_ATTRIBUTE, (phase, returned) if worker is None else (phase, returned, worker))
        except Exception:
            pass
        return
    empty = _state.empty_output
    if empty is None:
        empty = _shared_empty()
    if output is not empty:
        try:
            setattr(
                output, READY_ATTRIBUTE, (_clock, returned, now) if worker is None else (_clock, returned, now, worker)
            )
        except Exception:
            pass


class ExecuteModel(Handler):
    """The model runner's ``execute_model(scheduler_output, …)``: sets the step's phase for what the
    worker records during the step, times the call, and ends the step when no ``sample_tokens``
    follows (it returned an output itself)."""

    params: tuple[str, ...] = ("scheduler_output",)

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
    marked = to is WORKER_TO and to is not off and STATE.step_stream is not None  # step records on: note boundaries
    step = STATE.worker_step = WorkerStep(phase, start, WORKER_MARKED if marked else to)
    if marked:
        WORKER.marks = step.marks = []
    step.to(W_PREPARE, start)
    timeline = STATE.device
    if timeline is False:
        timeline = device_timeline()
    if timeline is not None:
        try:
            step.start_event = timeline.start()
        except Exception:  # the step has no device times (nor host ones: the device computes, not the host)
            step.start_event = NO_EVENT
            report(SCOPE_FAILURES, "device event")
    return step


#: A step's ``start_event`` when recording it failed: its execute_model and kernel-launch host times are recorded,
#: no inference or forward time (neither the device's nor the host's, which is not the computation on a device).
NO_EVENT = False


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
                if len(carried) == 3:
                    phase, returned, worker = carried
                else:
                    (phase, returned), worker = carried, None
            else:
                step = STATE.worker_step
                phase, returned = (step.phase, step.returned) if step is not None else (UNKNOWN, None)
                worker = worker_part(step)
        except Exception:  # the duration is still recorded, labelled unknown; the reply is not stamped
            report(self, "step")
            phase, returned, worker = UNKNOWN, None, None
        recording.record(_GET_OUTPUT, seconds, context.step_labels(phase))
        _stamp(result, returned, end, worker)


class ExecuteModelV2(ExecuteModel):
    """Model runner V2's ``execute_model(scheduler_output, intermediate_tensors=None, dummy_run=False,
    …)``: as V1, but dummy runs (warm-up, DP padding) are not steps. V2 enters no profiling scopes: its
    forward begins at ``StepTimingCollector.forward_start()`` (``ForwardStartV2``), which vLLM calls right
    before the model's forward, and ends when execute_model returns (after the KV connector's
    ``finish_forward`` and the step's bookkeeping: V2 computes the logits in ``sample``, not here).

    A subclass's execute_model hooked at its own level (vllm-ascend's V2 NPU runner, 0.30.0rc2+: NPU work before
    and after V2's) is the step; V2's inside it, called while that step is in progress (begun, not returned),
    is no second step and records nothing."""

    params = ("scheduler_output", "intermediate_tensors", "dummy_run")
    #: Whether this runner's forward is marked (``ForwardStartV2``) when the mark is hooked in this process.
    marked = True

    def before(self, args, kwargs):
        if args[3]:
            return None
        current = STATE.worker_step
        if current is not None and current.returned is None:  # inside a hooked subclass's execute_model
            return None
        try:
            phase = _phase_of(args[0], args[1])
        except Exception:  # the step is still timed, labelled unknown
            report(self, "phase")
            phase = UNKNOWN
        STATE.last_step_phase = phase
        if STATE.mrv2_forward_marked and self.marked:  # the forward mark is hooked (vLLM 0.30+)
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

    params = ("scheduler_output", "intermediate_tensors", "dummy_run")
    marked = False


class ForwardStartV2(Handler):
    """Model runner V2's ``StepTimingCollector.forward_start()`` (``vllm/v1/worker/gpu/async_utils.py``, vLLM
    0.30+): execute_model calls it once, right before running the model (``tests/contract/test_mrv2.py``
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
            if event is not None and event is not NO_EVENT:  # the step is on the device timeline
                try:
                    step.forward_event = device_timeline().start()
                except Exception:
                    report(self, "device event")


class SampleV2(Handler):
    """Model runner V2's ``sample(hidden_states, input_batch, grammar_output)``, called by sample_tokens: the
    worker budget's ``sample`` stage (V2 computes the logits and applies the grammar bitmask in it, then
    samples). Only hooked for the budget. Also vllm-ascend's V2 NPU runners' own ``sample`` (with LM-head TP it
    computes the logits itself, otherwise it calls V2's: the outer call is the stage)."""

    reads_args = 0

    def before(self, args, kwargs, _state=STATE):
        step = _state.worker_step
        if step is not None and step.returned is not None and not step.sampling:
            step.sampling = True
            step.to(W_SAMPLE, perf_counter())
            return step
        return None  # outside a step, or V2's sample inside a subclass's hooked one (vllm-ascend's V2 NPU runner)

    def after(self, step, args, kwargs, result):
        if step is not None:
            step.sampling = False
            step.to(W_OTHER, perf_counter())

    def error(self, step, args, kwargs, exc):
        if step is not None:
            step.sampling = False
            step.to(W_OTHER, perf_counter())
