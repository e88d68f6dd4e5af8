"""Executor RPC: failures, blocking or not."""

from __future__ import annotations

from concurrent.futures import CancelledError, Future
from time import perf_counter

from .. import catalogue, recording
from ..context import HOST_CLOCK, STEP_LABELS, step_labels
from ..hooks.handler import Handler, report
from ..state import STATE, UNKNOWN
from .steps import PHASE_ATTRIBUTE, READY_ATTRIBUTE

#: RPCs that carry a scheduled step's work; their errors get that step's phase.
STEP_METHODS = frozenset({"execute_model", "sample_tokens", "execute_dummy_batch", "take_draft_token_ids"})


def exception_type(exc: BaseException | None) -> str:
    """Bounded label for an RPC failure (catalogue.RPC_EXCEPTION_TYPES):

    - ``timeout``: TimeoutError (an RPC past VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS, or a dequeue timeout);
    - ``executor_failed``: RuntimeError("Executor failed.") — a worker died earlier;
    - ``worker_failed``: RuntimeError("Worker failed with error …") and the like — the worker raised;
    - ``cancelled``: a cancelled future, or the message queue cancelled at shutdown;
    - ``other``: anything else.
    """
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, CancelledError):
        return "cancelled"
    if isinstance(exc, RuntimeError):
        message = str(exc)
        if message.startswith("Executor failed"):
            return "executor_failed"
        if message.startswith("Worker failed") or "workers failed" in message:
            return "worker_failed"
        if message == "cancelled":
            return "cancelled"
    return "other"


def _count(labels: tuple, exc: BaseException | None, step: bool = False) -> None:
    """+1 ``rpc_errors``; ``step``: the RPC carried a step's work (execute_model, sample_tokens), which failed."""
    kind = exception_type(exc)
    recording.add(catalogue.RPC_ERRORS, 1, labels + (kind,))
    stream = STATE.step_stream
    if step and stream is not None and stream.tracer is not None and stream.pending:
        # The step in flight ends here (slow-step traces' ``error`` rule, recording/step_traces.py): its record,
        # with no update, and its trace if the rule keeps it.
        now = perf_counter()
        stream.enqueue(stream.tracer.keep(stream.pending.popleft(), now, now, None, None, kind))


#: RPCs whose duration is measured.
TIMED = {
    "execute_model": catalogue.M["executor:execute_model:duration"],
    "sample_tokens": catalogue.M["executor:sample_tokens:duration"],
}
_EXECUTE, _SAMPLE = TIMED["execute_model"], TIMED["sample_tokens"]

# STATE.last_execute: the state of the execute_model RPC dispatched last (EngineCore): the
# sample_tokens that follows belongs to the same step, and its reply carries that step's execute_model
# time when the execute_model reply itself carried nothing (it was None: sampling follows).
# STATE.exec_phase: that RPC's phase.


def record_reply(
    state, reply, lazy: bool = False, _get=getattr, _host=HOST_CLOCK, _record=recording.record_later
) -> None:
    """A timed RPC's reply arrived: record what the worker's stamp on it says.

    The worker stamps the ModelRunnerOutput that ends a step with (its clock, the moment its
    execute_model returned, the moment the reply was ready: sample_tokens returned, or its async
    output's get_output did). Durations run from this RPC's dispatch to those moments, on one
    monotonic clock (see ``context.HOST_CLOCK``), whenever the engine reads the reply. No stamp (a
    None reply, an uninstrumented worker, vLLM's shared empty output), another clock (a worker on
    another machine), or a moment outside [dispatch, now]: nothing is recorded. ``lazy``: the reply
    was produced only when the engine asked for it (UniProcExecutor's AsyncOutputFuture runs
    get_output then), so its ready moment says nothing about the worker: sample_tokens is not
    recorded. The values wait for the scheduler hook's records (``recording.record_later``): the engine
    reads replies on its critical path."""
    stamp = _get(reply, READY_ATTRIBUTE, None)
    if stamp is None or stamp[0] != _host:
        return
    labels, spec, start, execute = state
    now = perf_counter()
    if spec is _SAMPLE:
        ready = stamp[2]
        if not lazy and start <= ready <= now:
            _record(_SAMPLE, ready - start, labels)
    elif spec is _EXECUTE:
        execute = state
    else:
        return
    returned = stamp[1]
    if execute is not None and returned is not None and execute[2] <= returned <= now:
        _record(_EXECUTE, returned - execute[2], execute[0])


class CollectiveRpc(Handler):
    """``collective_rpc(method, timeout, args, …, non_block=…)`` of the multiprocess and in-process
    executors: +1 ``rpc_errors`` per failed call, and the duration of ``execute_model`` /
    ``sample_tokens`` RPCs. A blocking call ends when it returns or raises. A non-blocking one
    returns a future that vLLM completes when it reads the workers' reply: a failure is counted then,
    once. Durations are not "until the engine read the reply" (with the batch queue the engine reads
    step N's replies only after scheduling and dispatching step N+1): they run from the dispatch to
    the moments the worker stamped on its reply (``record_reply``).

    Phase: an ``execute_model`` RPC carries its step's SchedulerOutput, on which the scheduler hook
    stored the step's phase; ``sample_tokens`` follows the ``execute_model`` of the same step. Where that
    read fails (the RPC's arguments changed shape), the phase is the step most recently scheduled and the
    failure is reported (``hook_errors``): the RPC's errors and durations are still recorded."""

    params = ("method", "timeout", "args")

    def before(
        self,
        args,
        kwargs,
        _step_methods=STEP_METHODS,
        _state=STATE,
        _timed=TIMED.get,
        _cached=STEP_LABELS.get,
        _labels=step_labels,
        _execute=_EXECUTE,
        _sample=_SAMPLE,
    ):
        """State: (step labels, duration spec or None, dispatch time, the step's execute_model state)."""
        try:
            method = args[1]
        except IndexError:
            method = (kwargs or {}).get("method")
        if method == "execute_model":  # the two RPCs of every step first
            try:  # the SchedulerOutput, first of the RPC's args: a shape that moved costs only the exact phase
                rpc_args = args[3] if len(args) > 3 else None
                phase = getattr(rpc_args[0], PHASE_ATTRIBUTE, None) if rpc_args else None
            except Exception:
                report(self, "scheduler_output phase")
                phase = None
            phase = _state.exec_phase = phase or _state.last_step_phase
            state = _state.last_execute = (_cached(phase) or _labels(phase), _execute, perf_counter(), None)
            return state
        if method == "sample_tokens":
            phase = _state.exec_phase
            execute = _state.last_execute
            _state.last_execute = None
            return _cached(phase) or _labels(phase), _sample, perf_counter(), execute
        if method.__class__ is not str:
            method = getattr(method, "__name__", "")
        phase = _state.last_step_phase if method in _step_methods else UNKNOWN
        return _labels(phase), _timed(method), perf_counter(), None

    def error(self, state, args, kwargs, exc):
        _count(state[0], exc, state[1] is not None)

    def after(self, state, args, kwargs, result):
        """A blocking RPC returned its reply."""
        if state[1] is not None:
            record_reply(state, result)

    def future_result(self, state, args, kwargs, future):
        """vLLM's FutureWrapper completed with the reply (whenever the engine read it)."""
        if state[1] is not None:
            record_reply(state, future._result)

    def future_done(self, state, args, kwargs, future, _plain=Future):
        """Any other future (UniProcExecutor's): a plain Future is done at once (the worker ran in
        this thread); any other class is taken as completed when the engine asked for its result
        (UniProcExecutor's AsyncOutputFuture runs get_output then: lazy). A FutureWrapper comes
        through ``future_result``."""
        if future.cancelled():
            _count(state[0], CancelledError(), state[1] is not None)
            return
        exc = future.exception()
        if exc is not None:
            _count(state[0], exc, state[1] is not None)
        elif state[1] is not None:
            record_reply(state, future.result(), lazy=future.__class__ is not _plain)
