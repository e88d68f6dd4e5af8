"""EngineCore loop: engine steps and the busy loop's input handling."""

from __future__ import annotations

from time import perf_counter

from .. import context, recording
from ..catalogue import ALL, M
from ..context import SCHEDULE_CALLS
from ..hooks.handler import Handler
from .budget import ENGINE_TO
from .budget import IDLE as _IDLE_STAGE
from .budget import INPUT as _INPUT_STAGE
from .budget import OTHER as _OTHER_STAGE
from .common import StepTimer

IDLE = "idle"


class _EngineStepTimer(StepTimer):
    """An engine step's duration, labelled with the phase of the step it scheduled (the scheduler hook
    set it during the call) — or ``idle`` when no ``schedule()`` ran inside it: an idle DP rank's
    step returns before scheduling (``has_requests()`` false) and a batch-queue call with a full queue
    only waits for the oldest batch; neither takes the last scheduled step's phase. ``schedule()``
    runs only inside these calls (one EngineCore thread), so a ``schedule()`` counter
    (``context.SCHEDULE_CALLS``) unchanged since this hook's previous call ended means none ran in
    this one."""

    def __init__(self, spec) -> None:
        super().__init__(spec)
        self.seen = SCHEDULE_CALLS[0]

    def timed(self, seconds, args, kwargs, result, _calls=SCHEDULE_CALLS, _record=recording.record_in_step):
        calls = _calls[0]
        if calls != self.seen:
            self.seen = calls
            _record(self.spec, seconds)
        else:
            recording.record(self.spec, seconds, context.step_labels(IDLE))


class EngineCoreStep(_EngineStepTimer):
    """``EngineCore.step`` / ``step_with_batch_queue``: one engine step (see ``_EngineStepTimer``)."""

    name = "EngineCore.step"

    def __init__(self) -> None:
        super().__init__(M["engine_core:engine_core_step:duration"])


class ProcessEngineStep(_EngineStepTimer):
    """``EngineCoreProc._process_engine_step``: a busy-loop step, queueing its outputs included."""

    name = "EngineCoreProc._process_engine_step"

    def __init__(self) -> None:
        super().__init__(M["engine_core:process_engine_step:duration"])

    def timed(self, seconds, args, kwargs, result, _to=ENGINE_TO):
        _to(_OTHER_STAGE, perf_counter())  # stage budget: the step's output stage ends
        super().timed(seconds, args, kwargs, result)


class _Pass:
    """One ``_process_input_queue`` call. While it is ``waiting`` (the engine has no work) it blocks
    on the input queue between requests: only the requests' handling counts (``spent``); once a
    request gave the engine work, everything from then on counts (from ``start``)."""

    __slots__ = ("start", "waiting", "spent", "handled")

    def __init__(self, start: float, waiting: bool) -> None:
        self.start = start
        self.waiting = waiting
        self.spent = 0.0
        self.handled = 0


CURRENT_PASS = [None]


class ProcessInputQueue(Handler):
    """``EngineCoreProc._process_input_queue``: time spent on client requests in one pass of the busy
    loop. With work in progress the pass never blocks and all of it counts. Without (``has_work()``
    false at entry) vLLM blocks on the input queue until a request arrives, handles it, and blocks
    again for as long as the engine still has no work (a utility call, an abort, a wake-up, a rejected
    add: vLLM 0.23–0.33 loop ``while not self.has_work()`` around the blocking get) — those waits are
    excluded: the requests handled while idle count (``_handle_client_request``), and from the moment
    one gave the engine work, the rest of the pass does."""

    name = "EngineCoreProc._process_input_queue"
    reads_args = 1  # self
    spec = M["engine_core:process_input_queue:duration"]

    def before(self, args, kwargs):
        engine = args[0]
        has_work = getattr(engine, "has_work", None)
        waiting = has_work is not None and not has_work()
        current = CURRENT_PASS[0] = _Pass(perf_counter(), waiting)
        ENGINE_TO(_IDLE_STAGE if waiting else _INPUT_STAGE, current.start)
        return current

    def after(self, current, args, kwargs, result):
        CURRENT_PASS[0] = None
        now = perf_counter()
        ENGINE_TO(_OTHER_STAGE, now)
        if current.waiting:
            if not current.handled:
                return  # no request was handled (shut down, or a non-blocking pass found none): nothing to time
            seconds = current.spent  # requests that gave no work, then the pass ended
        else:
            seconds = current.spent + now - current.start
        recording.record(self.spec, seconds, context.step_labels(ALL))

    def error(self, current, args, kwargs, exc):
        CURRENT_PASS[0] = None
        ENGINE_TO(_OTHER_STAGE, perf_counter())


class HandleClientRequest(Handler):
    """``EngineCoreProc._handle_client_request``: in a pass that waits idle, each request's handling
    counts; when a request leaves the engine with work (``has_work()``), the rest of the pass counts
    from its end, otherwise vLLM goes back to blocking and that wait does not count."""

    name = "EngineCoreProc._handle_client_request"
    reads_args = 1  # self

    def before(self, args, kwargs):
        current = CURRENT_PASS[0]
        if current is not None and current.waiting:
            current.start = perf_counter()
            ENGINE_TO(_INPUT_STAGE, current.start)
            return current
        return None

    def after(self, current, args, kwargs, result):
        if current is None:
            return
        now = perf_counter()
        current.spent += now - current.start
        current.handled += 1
        has_work = getattr(args[0], "has_work", None)
        if has_work is None or has_work():
            current.waiting = False
            current.start = now
        else:
            ENGINE_TO(_IDLE_STAGE, now)  # back to blocking on the input queue
