"""Executor RPC: failures, blocking or not."""

from __future__ import annotations

from concurrent.futures import CancelledError

from .. import catalogue, recording
from ..context import LAST_STEP_PHASE, UNKNOWN, step_labels
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


def _count(phase: str, exc: BaseException | None) -> None:
    recording.add(catalogue.RPC_ERRORS, 1, step_labels(phase) + (exception_type(exc),))


class CollectiveRpc(Handler):
    """``MultiprocExecutor.collective_rpc(method, …, non_block=…)``: +1 per failed call. A blocking
    call fails by raising; a non-blocking one returns a future whose failure arrives later, when
    vLLM reads the reply — the future's done-callback counts it then (each failure once)."""

    name = "MultiprocExecutor.collective_rpc"
    failures_only = True
    reads_args = 2  # self, method

    def before(self, args, kwargs, _step_methods=STEP_METHODS, _phase=LAST_STEP_PHASE):
        method = args[1] if len(args) > 1 else (kwargs or {}).get("method")
        if method.__class__ is not str:
            method = getattr(method, "__name__", "")
        return _phase[0] if method in _step_methods else UNKNOWN

    def error(self, state, args, kwargs, exc):
        _count(state, exc)

    def future_done(self, state, args, kwargs, future):
        # Fast path for the common case, without taking the future's lock: a concurrent.futures
        # Future that finished normally has _state FINISHED and _exception None.
        if getattr(future, "_state", None) == "FINISHED" and getattr(future, "_exception", True) is None:
            return
        if future.cancelled():
            _count(state, CancelledError())
            return
        exc = future.exception()
        if exc is not None:
            _count(state, exc)
