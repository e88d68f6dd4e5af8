"""EngineCore loop: engine steps and the busy loop's input handling."""

from __future__ import annotations

from time import perf_counter

from .. import context, recording
from ..catalogue import ALL, M
from ..wrappers import Handler
from .common import StepTimer


class EngineCoreStep(StepTimer):
    """``EngineCore.step`` / ``step_with_batch_queue``: one engine step, labelled with the phase of the
    step it scheduled (the scheduler hook set it during the call)."""

    name = "EngineCore.step"

    def __init__(self) -> None:
        super().__init__(M["engine_core:engine_core_step:duration"])


class ProcessEngineStep(StepTimer):
    """``EngineCoreProc._process_engine_step``: a busy-loop step, queueing its outputs included."""

    name = "EngineCoreProc._process_engine_step"

    def __init__(self) -> None:
        super().__init__(M["engine_core:process_engine_step:duration"])


class _Pass:
    """One ``_process_input_queue`` call: when it may block idle, the time until the first client
    request is handled is waiting, not work."""

    __slots__ = ("start", "waiting")

    def __init__(self, start: float, waiting: bool) -> None:
        self.start = start
        self.waiting = waiting


CURRENT_PASS = [None]


class ProcessInputQueue(Handler):
    """``EngineCoreProc._process_input_queue``: time spent on client requests in one pass of the busy
    loop. With work in progress the pass never blocks and all of it counts. Without (``has_work()``
    false at entry) it blocks on the input queue until a request arrives; that wait is excluded: the
    measurement starts when the first request's handling starts (``_handle_client_request``)."""

    name = "EngineCoreProc._process_input_queue"
    reads_args = 1  # self
    spec = M["engine_core:process_input_queue:duration"]

    def before(self, args, kwargs):
        engine = args[0]
        has_work = getattr(engine, "has_work", None)
        waiting = has_work is not None and not has_work()
        current = CURRENT_PASS[0] = _Pass(perf_counter(), waiting)
        return current

    def after(self, current, args, kwargs, result):
        CURRENT_PASS[0] = None
        if current.waiting:
            return  # no request was handled (shut down, or a non-blocking pass found none): nothing to time
        recording.record(self.spec, perf_counter() - current.start, context.step_labels(ALL))

    def error(self, current, args, kwargs, exc):
        CURRENT_PASS[0] = None


class HandleClientRequest(Handler):
    """``EngineCoreProc._handle_client_request``: the first request handled in a pass that waited idle
    starts that pass's measurement."""

    name = "EngineCoreProc._handle_client_request"
    reads_args = 0

    def before(self, args, kwargs):
        current = CURRENT_PASS[0]
        if current is not None and current.waiting:
            current.start = perf_counter()
            current.waiting = False
