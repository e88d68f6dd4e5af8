"""The plain step timer's wrapper runs ``record_in_step``'s lines itself (``StepTimer.timed_inline``): it leaves
exactly what the call leaves, a failure in them is reported while the original runs once, and a subclass with its
own ``timed`` is called as before."""

import asyncio
import logging

from opentelemetry_instrumentation_vllm_ascend import context, recording
from opentelemetry_instrumentation_vllm_ascend.catalogue import M
from opentelemetry_instrumentation_vllm_ascend.handlers.common import StepTimer
from opentelemetry_instrumentation_vllm_ascend.handlers.engine import EngineStepTimer
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import COROUTINE_TIMER, SYNC_TIMER, wrap
from opentelemetry_instrumentation_vllm_ascend.state import STATE
from tests.support.fakes import name, record_waiting, step

SPEC = M["executor:prepare_inputs:duration"]


def test_the_inlined_timer_leaves_what_record_in_step_leaves(metrics, clock):
    calls = []

    def prepare(self, cost, extra=None):
        calls.append(cost)
        clock.t += cost
        return cost * 2

    timed = wrap(prepare, StepTimer(SPEC), SYNC_TIMER)[0]
    assert "_otel_append" in timed.__code__.co_names  # the lines are the wrapper's own: no ``timed`` call
    record_waiting()
    for phase, cost in (("prefill", 0.25), ("decode", 0.125), ("a phase never seen", 0.5)):
        STATE.last_step_phase = phase
        assert timed(None, cost) == cost * 2
        inlined = STATE.deferred_values.pop()
        recording.record_in_step(SPEC, cost)
        called = STATE.deferred_values.pop()
        assert inlined == called == (SPEC, cost, context.step_labels(phase))
        assert inlined[2] is called[2]  # the same cached label tuple
    assert calls == [0.25, 0.125, 0.5]


def test_a_failing_inline_record_is_reported_and_the_original_runs_once(metrics, clock, caplog):
    calls = []

    def prepare(cost):
        calls.append(cost)
        return cost

    timed = wrap(prepare, StepTimer(SPEC), SYNC_TIMER)[0]
    STATE.last_step_phase = ["not", "a", "phase"]  # unhashable: the label lookup raises
    with caplog.at_level(logging.WARNING):
        assert timed(0.5) == 0.5
    assert calls == [0.5]
    assert "timed" in caplog.text
    STATE.last_step_phase = "decode"
    assert timed(0.25) == 0.25 and calls == [0.5, 0.25]


def test_the_inlined_coroutine_timer_times_to_completion(metrics, clock):
    async def work(cost):
        clock.t += cost
        await asyncio.sleep(0)
        return cost

    timed = wrap(work, StepTimer(SPEC), COROUTINE_TIMER)[0]
    STATE.last_step_phase = "decode"
    assert asyncio.run(timed(0.125)) == 0.125
    assert list(STATE.deferred_values) == [(SPEC, 0.125, context.step_labels("decode"))]
    record_waiting()
    assert metrics.value(name("executor:prepare_inputs:duration"), **step("decode"))[:2] == (1, 0.125)


def test_a_subclass_with_its_own_timed_is_called():
    assert StepTimer(SPEC).timed_inline() is not None
    assert EngineStepTimer(M["engine_core:engine_core_step:duration"]).timed_inline() is None

    class Own(StepTimer):
        def timed(self, seconds, args, kwargs, result):
            self.seen = seconds

    assert Own(SPEC).timed_inline() is None
