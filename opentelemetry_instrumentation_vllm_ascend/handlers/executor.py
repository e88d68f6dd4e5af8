"""Executor RPC: failures, blocking or not."""

from __future__ import annotations

from concurrent.futures import CancelledError

from .. import catalogue, recording
from time import perf_counter

from ..context import EXEC_PHASE, LAST_STEP_PHASE, PHASE_ATTRIBUTE, UNKNOWN, _step_labels, step_labels
from ..wrappers import Handler

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


def _count(labels: tuple, exc: BaseException | None) -> None:
    recording.add(catalogue.RPC_ERRORS, 1, labels + (exception_type(exc),))


#: RPCs whose duration is measured (dispatch until the reply was read).
TIMED = {"execute_model": catalogue.M["executor:execute_model:duration"],
         "sample_tokens": catalogue.M["executor:sample_tokens:duration"]}


class CollectiveRpc(Handler):
    """``collective_rpc(method, timeout, args, …, non_block=…)`` of the multiprocess and in-process
    executors: +1 ``rpc_errors`` per failed call, and the duration of ``execute_model`` /
    ``sample_tokens`` RPCs. A blocking call ends when it returns or raises. A non-blocking one
    returns a future that vLLM completes when it reads the workers' reply: the future's completion
    ends the measurement (a failure is counted then, once), so the duration is the model step as the
    engine sees it, not the time to enqueue the request.

    Phase: an ``execute_model`` RPC carries its step's SchedulerOutput, on which the scheduler hook
    stored the step's phase; ``sample_tokens`` follows the ``execute_model`` of the same step."""

    name = "collective_rpc"
    reads_args = 4  # self, method, timeout, args

    def before(self, args, kwargs, _step_methods=STEP_METHODS, _phase=LAST_STEP_PHASE, _exec=EXEC_PHASE,
               _timed=TIMED.get, _cached=_step_labels.get, _labels=step_labels,
               _execute=TIMED["execute_model"], _sample=TIMED["sample_tokens"]):
        """State: (step labels, duration spec or None, start)."""
        try:
            method = args[1]
        except IndexError:
            method = (kwargs or {}).get("method")
        if method == "execute_model":  # the two RPCs of every step first
            rpc_args = args[3] if len(args) > 3 else None
            phase = _exec[0] = (getattr(rpc_args[0], PHASE_ATTRIBUTE, None) if rpc_args else None) or _phase[0]
            return _cached(phase) or _labels(phase), _execute, perf_counter()
        if method == "sample_tokens":
            phase = _exec[0]
            return _cached(phase) or _labels(phase), _sample, perf_counter()
        if method.__class__ is not str:
            method = getattr(method, "__name__", "")
        phase = _phase[0] if method in _step_methods else UNKNOWN
        return _labels(phase), _timed(method), perf_counter()

    def error(self, state, args, kwargs, exc):
        _count(state[0], exc)

    def future_result(self, state, args, kwargs, future, _record=recording.record):
        spec = state[1]
        if spec is not None:
            _record(spec, perf_counter() - state[2], state[0])

    after = future_result  # a blocking RPC returned: the same measurement, ended now

    def future_done(self, state, args, kwargs, future):
        if future.cancelled():
            _count(state[0], CancelledError())
            return
        exc = future.exception()
        if exc is not None:
            _count(state[0], exc)
        else:
            self.future_result(state, args, kwargs, future)
