"""EngineCore loop handlers (engine step, busy-loop pass, input queue) on plain objects shaped like vLLM's (tests/support/fakes.py), driven through the real wrappers and
recorded through the real OTel SDK. Durations come from an injected clock advanced by exact binary
fractions, so every count, sum and bucket below is hand-computed and asserted exactly."""

import threading
from collections import deque
from types import SimpleNamespace as NS

import pytest

from opentelemetry_instrumentation_vllm_ascend.handlers import engine
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import SYNC, SYNC_TIMER, wrap
from opentelemetry_instrumentation_vllm_ascend.state import STATE
from tests.support.fakes import ALL_LABELS, F, S, counts, handler_of, key, name, record_waiting, step, waiting

# -- engine core loop ---------------------------------------------------------------------------------


def scheduled(phase):
    """What the scheduler hook leaves behind when schedule() ran: one more call, and its step's phase."""
    STATE.schedule_calls += 1
    STATE.last_step_phase = phase


class FakeEngineCore:
    def __init__(self, clock):
        self.clock = clock
        self.work = False
        self.queue = deque()  # (idle wait before it arrives, request type, seconds to handle it)
        self.overhead = 0.0

    def step(self):
        self.clock.t += 0.25
        scheduled("prefill")  # the scheduler hook, during the call
        return {}, True

    def step_with_batch_queue(self):
        self.clock.t += 0.5
        scheduled("mixed")
        return None, True

    def _process_engine_step(self):
        outputs, executed = self.step()
        self.clock.t += 0.125  # queueing the outputs
        return executed

    def has_work(self):
        return self.work

    def _process_input_queue(self):
        """vLLM's shape: block for requests while idle, then drain what is queued without blocking."""
        self.clock.t += self.overhead
        while not self.has_work():
            if not self.queue:  # non-blocking get found nothing (or shutting down)
                break
            wait, request_type, seconds = self.queue.popleft()
            self.clock.t += wait  # blocked in input_queue.get()
            self._handle_client_request(request_type, seconds)
        while self.queue:
            _wait, request_type, seconds = self.queue.popleft()
            self._handle_client_request(request_type, seconds)

    def _handle_client_request(self, request_type, request):
        if request_type == "BOOM":
            raise RuntimeError("bad request")
        self.clock.t += request
        if request_type == "ADD":
            self.work = True


def instrumented_engine():
    cls = FakeEngineCore
    return type(
        "InstrumentedEngineCore",
        (cls,),
        {
            "step": wrap(cls.step, handler_of("vllm.v1.engine.core:EngineCore.step"), SYNC_TIMER)[0],
            "step_with_batch_queue": wrap(
                cls.step_with_batch_queue, handler_of("vllm.v1.engine.core:EngineCore.step"), SYNC_TIMER
            )[0],
            "_process_engine_step": wrap(
                cls._process_engine_step,
                handler_of("vllm.v1.engine.core:EngineCoreProc._process_engine_step"),
                SYNC_TIMER,
            )[0],
            "_process_input_queue": wrap(cls._process_input_queue, engine.ProcessInputQueue(), SYNC)[0],
            "_handle_client_request": wrap(cls._handle_client_request, engine.HandleClientRequest(), SYNC)[0],
        },
    )


def test_engine_steps_get_the_phase_set_during_the_call(metrics, clock):
    core = instrumented_engine()(clock)
    STATE.last_step_phase = "decode"
    assert core.step() == ({}, True)
    assert core.step_with_batch_queue() == (None, True)
    assert core._process_engine_step() is True  # runs a (timed) step inside
    assert metrics.points()[name("engine_core:engine_core_step:duration")] == {
        key(**step("prefill")): (2, 0.5, counts(S, b8=2)),
        key(**step("mixed")): (1, 0.5, counts(S, b9=1)),
    }
    assert metrics.points()[name("engine_core:process_engine_step:duration")] == {
        key(**step("prefill")): (1, 0.375, counts(S, b9=1))
    }  # 0.25 + 0.125


def _real_engine_loop():
    """vLLM's own EngineCore.step and EngineCoreProc._process_engine_step (and _process_input_queue),
    instrumented, on a stand-in engine: a scheduler with no requests (an idle DP rank's), a real
    input queue."""
    import queue

    core = pytest.importorskip("vllm.v1.engine.core")

    class IdleEngine:
        def __init__(self):
            self.scheduler = NS(has_requests=lambda: False)
            self.output_queue = queue.Queue()
            self.input_queue = queue.Queue()
            self.aborts_queue = queue.Queue()
            self.process_input_queue_block = True
            self._idle_state_callbacks = []
            self.work = False
            self.handled = []

        @property
        def step_fn(self):
            return self.step

        def post_step(self, model_executed):
            pass

        def has_work(self):
            return self.work

        def is_running(self):
            return True

        def _notify_idle_state_callbacks(self):
            pass

        def _handle_client_request(self, request_type, request):
            self.handled.append(request_type)
            if request_type == "ADD":
                self.work = True

    IdleEngine._handle_client_request = wrap(IdleEngine._handle_client_request, engine.HandleClientRequest(), SYNC)[0]
    IdleEngine.step = wrap(core.EngineCore.step, handler_of("vllm.v1.engine.core:EngineCore.step"), SYNC_TIMER)[0]
    IdleEngine._process_engine_step = wrap(
        core.EngineCoreProc._process_engine_step,
        handler_of("vllm.v1.engine.core:EngineCoreProc._process_engine_step"),
        SYNC_TIMER,
    )[0]
    IdleEngine._process_input_queue = wrap(core.EngineCoreProc._process_input_queue, engine.ProcessInputQueue(), SYNC)[
        0
    ]
    return IdleEngine()


def test_an_engine_step_that_scheduled_nothing_is_idle(metrics):
    """An idle DP rank's busy loop runs vLLM's _process_engine_step, whose step() returns before
    scheduling: those steps are phase idle, not the phase of the last step the rank scheduled."""
    idle = _real_engine_loop()
    STATE.last_step_phase = "decode"  # the rank's last real step
    for _ in range(3):
        assert idle._process_engine_step() is False
    points = metrics.points()
    for seed in ("engine_core:engine_core_step:duration", "engine_core:process_engine_step:duration"):
        series = points[name(seed)]
        assert set(series) == {key(**step("idle"))}, seed  # no decode value
        assert series[key(**step("idle"))][0] == 3


def test_process_input_queue_excludes_idle_waits_after_requests_that_gave_no_work(metrics):
    """vLLM's _process_input_queue on an idle engine: a utility call arrives, vLLM handles it and,
    still without work, blocks again; half a second later a request arrives. Only the handling counts,
    not the 0.5 s the engine waited between the two."""
    import time

    idle = _real_engine_loop()

    def client():
        time.sleep(0.05)
        idle.input_queue.put(("UTILITY", None))
        time.sleep(0.5)
        idle.input_queue.put(("ADD", None))

    thread = threading.Thread(target=client)
    start = time.perf_counter()  # before the client's first sleep begins: the 0.55 s lie after it
    thread.start()
    idle._process_input_queue()
    elapsed = time.perf_counter() - start
    thread.join()
    assert idle.handled == ["UTILITY", "ADD"] and elapsed >= 0.55
    count, seconds, _ = metrics.value(name("engine_core:process_input_queue:duration"), **ALL_LABELS)
    assert count == 1
    assert seconds < 0.25  # handling two requests, not the 0.5 s wait (a margin for a loaded machine)


def test_process_input_queue_excludes_the_idle_wait(metrics, clock):
    core = instrumented_engine()(clock)
    spec = name("engine_core:process_input_queue:duration")
    core.overhead = 0.0625

    # Busy: timed from entry (overhead included), both requests.
    core.work = True
    core.queue.extend([(0.0, "ADD", 0.125), (0.0, "ABORT", 0.125)])
    core._process_input_queue()
    assert metrics.value(spec, **ALL_LABELS) == (1, 0.3125, counts(F, b12=1))

    # Idle: blocks 5 s for the first request; timed from its handling: 0.125 + 0.0625.
    core.work = False
    core.queue.extend([(5.0, "ADD", 0.125), (0.0, "ADD", 0.0625)])
    core._process_input_queue()
    assert metrics.value(spec, **ALL_LABELS) == (2, 0.5, counts(F, b12=2))

    # Idle: a utility request (no work) after 5 s, then 2 s more of waiting until the ADD: only the two
    # requests' handling and what follows the ADD count: 0.125 + 0.0625 + 0.0625.
    core.work = False
    core.queue.extend([(5.0, "UTILITY", 0.125), (2.0, "ADD", 0.0625), (0.0, "ABORT", 0.0625)])
    core._process_input_queue()
    assert metrics.value(spec, **ALL_LABELS) == (3, 0.75, counts(F, b12=3))
    metrics_before = metrics.value(spec, **ALL_LABELS)

    # Idle and nothing arrived: nothing to time.
    core.work = False
    core._process_input_queue()
    assert metrics.value(spec, **ALL_LABELS) == metrics_before

    # Busy and nothing queued: the pass itself is timed.
    core.work = True
    core._process_input_queue()
    assert metrics.value(spec, **ALL_LABELS) == (4, 0.8125, counts(F, b11=1, b12=3))
    assert STATE.current_pass is None

    # A request handled outside any pass (vLLM 0.34: while a step waits) waits for the next pass; a pass
    # that raises is not timed (the request's seconds with it).
    core._handle_client_request("ADD", 0.25)
    assert STATE.input_in_step == 0.25
    core.work = False
    core.queue.extend([(1.0, "BOOM", 0.0)])
    with pytest.raises(RuntimeError, match="bad request"):
        core._process_input_queue()
    assert STATE.current_pass is None
    assert metrics.points()[spec] == {key(**ALL_LABELS): (4, 0.8125, counts(F, b11=1, b12=3))}


def test_a_busy_loop_s_values_wait_for_the_scheduler_s_records_and_an_idle_one_s_do_not(metrics, clock):
    """A busy pass and a step that scheduled leave their durations for later (``recording.record_later``): they
    reach their series at the next ``run_deferred`` (the scheduler hook's flush, or a collection), each series in
    one go; an idle engine's pass and step are recorded at once."""

    core = instrumented_engine()(clock)
    piq, engine_step = name("engine_core:process_input_queue:duration"), name("engine_core:engine_core_step:duration")
    core.work = True
    for _ in range(3):
        core._process_input_queue()  # busy, nothing queued: 0 s each
        core.step()  # schedules: 0.25 s each
    assert (
        waiting()
        == [
            ("engine_core:process_input_queue:duration", 0.0, "all"),
            ("engine_core:engine_core_step:duration", 0.25, "prefill"),
        ]
        * 3
    )
    record_waiting()
    points = metrics.points()
    assert points[piq] == {key(**ALL_LABELS): (3, 0.0, counts(F, b0=3))}
    assert points[engine_step] == {key(**step("prefill")): (3, 0.75, counts(S, b8=3))}

    core.work = False
    core.queue.append((1.0, "UTILITY", 0.125))  # idle: the handling only, recorded at once
    core._process_input_queue()
    assert not STATE.deferred_values
    assert metrics.value(piq, **ALL_LABELS)[:2] == (4, 0.125)


def test_values_left_for_later_are_recorded_once_too_many_wait(metrics, monkeypatch):
    """With nothing running ``run_deferred`` (the scheduler's hook switched off), ``MAX_VALUES`` waiting values
    are recorded at once: the queue stays bounded."""
    from opentelemetry_instrumentation_vllm_ascend import context, recording
    from opentelemetry_instrumentation_vllm_ascend.recording import deferred

    monkeypatch.setattr(deferred, "MAX_VALUES", 4)
    spec = name("scheduler:update_from_output:duration")
    for _ in range(3):
        recording.record_later(spec_of("scheduler:update_from_output:duration"), 0.5, context.step_labels("decode"))
    assert len(STATE.deferred_values) == 3
    recording.record_later(spec_of("scheduler:update_from_output:duration"), 0.5, context.step_labels("decode"))
    assert not STATE.deferred_values
    assert metrics.value(spec, **step("decode"))[:2] == (4, 2.0)


def spec_of(seed):
    from opentelemetry_instrumentation_vllm_ascend.catalogue import M

    return M[seed]


def test_a_step_timer_s_values_wait_with_the_phase_of_their_call(metrics, clock, monkeypatch):
    """A timer with the step's phase (``common.StepTimer``: the worker's ``_prepare_inputs``, a hook file's
    ``phase: step`` timer) leaves its value for later, labelled with the phase scheduled when the call ran; the
    next ``run_deferred`` records each series in one go, and ``MAX_VALUES`` waiting values are recorded at once."""
    from opentelemetry_instrumentation_vllm_ascend.handlers.common import StepTimer
    from opentelemetry_instrumentation_vllm_ascend.recording import deferred

    def prepare(cost):
        clock.t += cost

    timed = wrap(prepare, StepTimer(spec_of("executor:prepare_inputs:duration")), SYNC_TIMER)[0]
    timer = name("executor:prepare_inputs:duration")
    for phase, cost in (("prefill", 0.25), ("decode", 0.125), ("decode", 0.125)):
        STATE.last_step_phase = phase
        timed(cost)
    STATE.last_step_phase = "mixed"  # the phase now does not relabel what waits
    assert waiting() == [
        ("executor:prepare_inputs:duration", 0.25, "prefill"),
        ("executor:prepare_inputs:duration", 0.125, "decode"),
        ("executor:prepare_inputs:duration", 0.125, "decode"),
    ]
    record_waiting()
    assert metrics.points()[timer] == {
        key(**step("prefill")): (1, 0.25, counts(S, b8=1)),
        key(**step("decode")): (2, 0.25, counts(S, b8=2)),
    }

    monkeypatch.setattr(deferred, "MAX_VALUES", 2)
    timed(0.5)
    assert len(STATE.deferred_values) == 1
    timed(0.5)
    assert not STATE.deferred_values
    assert metrics.value(timer, **step("mixed"))[:2] == (2, 1.0)


def test_a_has_work_that_cannot_be_read_loses_only_the_input_pass_timing(metrics, clock, monkeypatch, caplog):
    """Narrow degradation: vLLM renames ``has_work`` (here ``has_pending_work``; its own loop uses the new name).
    The passes are not timed (whether they blocked idle is unknown: no plausible wrong number) and move no budget
    boundary; the engine steps' durations and their stages stay exact; one warning names the read."""
    import logging

    from opentelemetry_instrumentation_vllm_ascend.handlers import budget

    class Renamed(FakeEngineCore):
        has_pending_work = FakeEngineCore.has_work
        has_work = None

        def _process_input_queue(self):
            while not self.has_pending_work():
                if not self.queue:
                    break
                wait, request_type, seconds = self.queue.popleft()
                self.clock.t += wait
                self._handle_client_request(request_type, seconds)

    base = instrumented_engine()
    Core = type("RenamedCore", (Renamed,), {k: v for k, v in vars(base).items() if not k.startswith("__")})
    Core._process_input_queue = wrap(Renamed._process_input_queue, engine.ProcessInputQueue(), SYNC)[0]
    core = Core(clock)
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            core.queue.append((1.0, "ADD", 0.125))
            core.work = False
            core._process_input_queue()  # blocks 1 s, then an ADD
            core.step()  # 0.25 s
    record_waiting()
    points = metrics.points()
    assert name("engine_core:process_input_queue:duration") not in points
    assert points[name("engine_core:engine_core_step:duration")] == {key(**step("prefill")): (2, 0.5, counts(S, b8=2))}
    warnings = [r.getMessage() for r in caplog.records if "ProcessInputQueue" in r.getMessage()]
    assert len(warnings) == 1 and "has_work" in warnings[0]
    assert STATE.current_pass is None
    assert budget.ENGINE.since is None  # no boundary moved by the passes (the budget's clock never started)
