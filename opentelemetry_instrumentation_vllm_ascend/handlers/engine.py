"""EngineCore loop: engine steps and the busy loop's input handling."""

from __future__ import annotations

from time import perf_counter

from .. import context, recording
from ..catalogue import ALL, M
from ..hooks.handler import Handler, report
from ..state import STATE
from .budget import ENGINE, ENGINE_TO
from .budget import IDLE as _IDLE_STAGE
from .budget import INPUT as _INPUT_STAGE
from .budget import OTHER as _OTHER_STAGE
from .budget import WAIT_WORKERS as _WAIT_STAGE
from .common import StepTimer

IDLE = "idle"


class EngineStepTimer(StepTimer):
    """A declarative timer with ``phase="engine_step"`` (``EngineCore.step``, ``step_with_batch_queue``,
    ``EngineCoreProc._process_engine_step``): an engine step's duration, labelled with the phase of
    the step it scheduled (the scheduler hook set it during the call) — or ``idle`` when no
    ``schedule()`` ran inside it: an idle DP rank's step returns before scheduling (``has_requests()``
    false) and a batch-queue call with a full queue only waits for the oldest batch; neither takes the
    last scheduled step's phase. ``schedule()`` runs only inside these calls (one EngineCore thread),
    so a ``schedule()`` counter (``STATE.schedule_calls``) unchanged since this hook's previous call
    ended means none ran in this one."""

    def __init__(self, spec) -> None:
        super().__init__(spec)
        self.seen = STATE.schedule_calls

    def timed(
        self, seconds, args, kwargs, result, _state=STATE, _labels=context.STEP_LABELS, _later=recording.record_later
    ):
        calls = _state.schedule_calls
        if calls != self.seen:  # a step that scheduled: recorded with the scheduler hook's records
            self.seen = calls
            phase = _state.last_step_phase
            _later(self.spec, seconds, _labels.get(phase) or context.step_labels(phase))
        else:
            recording.record(self.spec, seconds, context.step_labels(IDLE))


class WaitForWorkers(Handler):
    """``EngineCore.capture_iteration_details`` (vLLM 0.32+) / ``log_iteration_details`` (0.23): the context
    manager ``step`` and ``step_with_batch_queue`` open right before ``future.result()`` (and the DP engine
    around its dummy batch): the stage budget's ``wait_workers`` begins at its call. On the batch queue it is
    the one moment that says the engine now waits: a step that scheduled nothing, or none at all, goes from
    dispatching (or the loop) straight to the oldest step's output."""

    reads_args = 0

    def before(self, args, kwargs):
        ENGINE_TO(_WAIT_STAGE, perf_counter())


class PostStep(Handler):
    """``EngineCore.post_step(model_executed)``: ``_process_engine_step`` calls it once the step's outputs
    are queued to the clients: the stage budget's ``output`` stage ends (what follows, the short sleep of a
    step that ran no model while the scheduler has work, is ``other``)."""

    reads_args = 0

    def before(self, args, kwargs):
        ENGINE_TO(_OTHER_STAGE, perf_counter())


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


# STATE.current_pass: the _Pass in progress.


class ProcessInputQueue(Handler):
    """``EngineCoreProc._process_input_queue``: time spent on client requests in one pass of the busy
    loop. With work in progress the pass never blocks and all of it counts. Without (``has_work()``
    false at entry) vLLM blocks on the input queue until a request arrives, handles it, and blocks
    again for as long as the engine still has no work (a utility call, an abort, a wake-up, a rejected
    add: vLLM 0.23–0.34 loop ``while not self.has_work()`` around the blocking get) — those waits are
    excluded: the requests handled while idle count (``_handle_client_request``), and from the moment
    one gave the engine work, the rest of the pass does.

    vLLM 0.34+ also handles adds, aborts, wake-ups and executor failures while a step waits for the
    workers' output (``EngineCoreProc._wait_for_output``, outside any pass): their handling
    (``HandleClientRequest``, ``STATE.input_in_step``) is added to the next pass's duration, so the
    metric's sum is all the time the loop spent on client requests, one observation per pass.

    Whether the pass may block is ``has_work()``: where it cannot be read (renamed, raising) the pass is not
    timed and moves no boundary of the budget (its time stays in the stage in progress, ``other``); logged
    once. The engine steps, the other stages and the other engine hooks are unaffected."""

    reads_args = 1  # self
    spec = M["engine_core:process_input_queue:duration"]

    def __init__(self) -> None:
        #: The one _Pass this hook's busy loop reuses (passes never overlap: one EngineCore thread).
        self.reused = _Pass(0.0, False)

    def before(self, args, kwargs, _state=STATE):
        _current = self.reused
        _state.current_pass = _current
        has_work = getattr(args[0], "has_work", None)
        try:
            _current.waiting = waiting = not has_work()
        except Exception:  # None (gone) or raising: idle waits cannot be told from handling
            report(self, "has_work")
            _current.waiting = False  # HandleClientRequest leaves this pass alone
            return None
        _current.start = start = perf_counter()
        _current.spent = _state.input_in_step  # vLLM 0.34+: requests handled while the last step waited
        _state.input_in_step = 0.0
        _current.handled = 0
        ENGINE_TO(_IDLE_STAGE if waiting else _INPUT_STAGE, start)
        return _current

    def after(self, current, args, kwargs, result, _state=STATE, _labels=context.STEP_LABELS):
        _state.current_pass = None
        if current is None:
            return  # has_work() could not be read: not timed
        now = perf_counter()
        ENGINE_TO(_OTHER_STAGE, now)
        if current.waiting:
            if not current.handled and not current.spent:
                return  # no request was handled (shut down, or a non-blocking pass found none): nothing to time
            # Requests that gave no work, then the pass ended (the engine was idle: recorded now).
            recording.record(self.spec, current.spent, context.step_labels(ALL))
        else:  # a pass of a busy loop: recorded with the scheduler hook's records
            labels = _labels.get(ALL) or context.step_labels(ALL)
            recording.record_later(self.spec, current.spent + now - current.start, labels)

    def error(self, current, args, kwargs, exc):
        STATE.current_pass = None
        if current is not None:
            ENGINE_TO(_OTHER_STAGE, perf_counter())


class HandleClientRequest(Handler):
    """``EngineCoreProc._handle_client_request``: in a pass that waits idle, each request's handling
    counts; when a request leaves the engine with work (``has_work()``), the rest of the pass counts
    from its end, otherwise vLLM goes back to blocking and that wait does not count.

    Outside a pass (vLLM 0.34+: ``_wait_for_output`` handles adds, aborts, wake-ups and executor failures
    while the step waits for the workers' output): the handling is the budget's ``input`` stage, then the
    stage it interrupted (``wait_workers``) resumes; its seconds go to the next pass's duration
    (``STATE.input_in_step``). On 0.23–0.33 vLLM calls it only inside a pass."""

    reads_args = 1  # self

    def before(self, args, kwargs, _state=STATE, _clock=ENGINE):
        current = _state.current_pass
        if current is None:  # vLLM 0.34+: handled while the step waits for its output
            start = perf_counter()
            stage = _clock.stage
            ENGINE_TO(_INPUT_STAGE, start)
            return (start, stage)
        if current.waiting:
            current.start = perf_counter()
            ENGINE_TO(_INPUT_STAGE, current.start)
            return current
        return None

    def after(self, current, args, kwargs, result, _state=STATE):
        if current is None:
            return
        now = perf_counter()
        if current.__class__ is tuple:
            start, stage = current
            _state.input_in_step += now - start
            ENGINE_TO(stage, now)
            return
        current.spent += now - current.start
        current.handled += 1
        try:
            work = args[0].has_work()
        except Exception:  # the pass goes on counting only its requests' handling
            report(self, "has_work")
            work = False
        if work:
            current.waiting = False
            current.start = now
        else:
            ENGINE_TO(_IDLE_STAGE, now)  # back to blocking on the input queue

    def error(self, current, args, kwargs, exc, _state=STATE):
        if current.__class__ is tuple:  # the request failed while the step waited: the wait resumes
            now = perf_counter()
            _state.input_in_step += now - current[0]
            ENGINE_TO(current[1], now)
