"""Profiling-scope handlers (vLLM's record_function_or_nullcontext) on plain objects shaped like vLLM's (tests/support/fakes.py), driven through the real wrappers and
recorded through the real OTel SDK. Durations come from an injected clock advanced by exact binary
fractions, so every count, sum and bucket below is hand-computed and asserted exactly."""

import contextlib

import pytest

from opentelemetry_instrumentation_vllm_ascend.handlers import scopes
from opentelemetry_instrumentation_vllm_ascend.state import STATE
from tests.support.fakes import (
    SC,
    FakeScheduler,
    RecordFunction,
    counts,
    fake_utils,
    instrumented,
    key,
    name,
    output,
    req,
    step,
)

SCOPES = name("record_function_or_nullcontext")


# -- profiling scopes ---------------------------------------------------------------------------------


def test_scope_names_beyond_the_limit_are_other(metrics, clock, utils):
    n = scopes.MAX_SCOPE_NAMES + 6
    for i in range(n):
        with utils.record_function_or_nullcontext(f"scope {i}"):
            clock.t += 0.0078125
    with utils.record_function_or_nullcontext("scope 0"):  # an early name keeps its own series
        clock.t += 0.0078125
    series = metrics.points()[SCOPES]
    assert len(series) == scopes.MAX_SCOPE_NAMES + 1
    unknown = step("unknown")
    assert series[key(**unknown, name="scope 0")] == (2, 0.015625, counts(SC, b8=2))  # (0.003, 0.01]
    assert series[key(**unknown, name=f"scope {scopes.MAX_SCOPE_NAMES - 1}")] == (1, 0.0078125, counts(SC, b8=1))
    assert series[key(**unknown, name="other")] == (6, 0.046875, counts(SC, b8=6))
    assert key(**unknown, name=f"scope {scopes.MAX_SCOPE_NAMES}") not in series
    # The name table is bounded too: names beyond the limit are not remembered one by one.
    for i in range(1000):
        with utils.record_function_or_nullcontext(f"dynamic {i}"):
            pass
    assert len(STATE.scope_names) == scopes.MAX_SCOPE_NAMES
    assert metrics.points()[SCOPES][key(**unknown, name="other")][0] == 1006


def test_scope_that_raises_is_not_recorded_and_the_inner_scope_still_runs(metrics, clock):
    log = []
    record_function = type("RF", (RecordFunction,), {"log": log})
    module = fake_utils(record_function)
    patch = scopes.ProfilerScopes().install(module)
    try:
        assert module._PROFILER_FUNC is not record_function  # vLLM chose record_function; we wrap it
        boom = ValueError("boom")
        with pytest.raises(ValueError) as raised:
            with module.record_function_or_nullcontext("gpu_model_runner: sample"):
                clock.t += 0.25
                raise boom
        assert raised.value is boom
        assert log == [("enter", "gpu_model_runner: sample"), ("exit", "gpu_model_runner: sample", ValueError)]
        assert SCOPES not in metrics.points()
        with module.record_function_or_nullcontext("gpu_model_runner: bookkeep") as value:
            clock.t += 0.125
        assert isinstance(value, record_function) and value.name == "gpu_model_runner: bookkeep"
        assert log[2:] == [("enter", "gpu_model_runner: bookkeep"), ("exit", "gpu_model_runner: bookkeep", None)]
        assert metrics.points()[SCOPES] == {
            key(**step("unknown", name="gpu_model_runner: bookkeep")): (1, 0.125, counts(SC, b11=1))
        }
    finally:
        patch.remove()
    assert module._PROFILER_FUNC is record_function
    assert isinstance(module.record_function_or_nullcontext("x"), record_function)


def test_scope_in_a_step_with_vllms_profiler_on_is_recorded_with_the_step(metrics, clock):
    """With vLLM's profiler on, a scope in schedule() wraps vLLM's own record_function (not the shared
    in-step timer) and is still recorded with the step's phase, when the step's records run."""
    log = []
    module = fake_utils(type("RF", (RecordFunction,), {"log": log}))
    patch = scopes.ProfilerScopes().install(module)
    try:
        requests = {"decode": req(12, 13, prompt=10)}
        s = instrumented()(clock, module, requests, running=[req(13, 14, prompt=10)])
        s.plan = [(output(requests, cached=[("decode", 1)]), 0.0, [("schedule: allocate_slots", 0.0625)] * 2)]
        STATE.last_step_phase = "prefill"
        s.schedule()
        assert [entry[0] for entry in log] == ["enter", "exit", "enter", "exit"]
        assert metrics.points()[SCOPES] == {
            key(**step("decode", name="schedule: allocate_slots")): (2, 0.125, counts(SC, b10=2))
        }
    finally:
        patch.remove()


def test_disabled_scopes_run_as_without_us_and_the_others_are_still_timed(metrics, clock, monkeypatch):
    """OTEL_VLLM_ASCEND_DISABLED_SCOPES (names or patterns): inside schedule() a disabled scope is one
    shared nullcontext (its blocks still run, once each, untimed); outside, with vLLM's profiler on,
    it is vLLM's own record_function and nothing else; the other scopes are recorded as usual."""
    monkeypatch.setenv("OTEL_VLLM_ASCEND_DISABLED_SCOPES", " schedule: alloc*, gpu_model_runner: sample ")
    utils = fake_utils()
    patch = scopes.ProfilerScopes().install(utils)
    try:
        rf = utils.record_function_or_nullcontext
        seen, ran = [], []

        class Steps(FakeScheduler):
            def schedule(self):
                for _ in range(3):
                    scope = rf("schedule: allocate_slots")
                    seen.append(scope)
                    with scope:
                        ran.append(1)
                        self.clock.t += 0.0625
                with rf("schedule: update_after_schedule"):
                    self.clock.t += 0.25
                return output({})

        instrumented(Steps)(clock, utils).schedule()
        assert ran == [1, 1, 1] and seen[0] is seen[1] is seen[2] is scopes._UNTIMED
        assert isinstance(seen[0], contextlib.nullcontext)
        assert metrics.points()[SCOPES] == {
            key(**step("idle", name="schedule: update_after_schedule")): (1, 0.25, counts(SC, b11=1))
        }
    finally:
        patch.remove()

    log = []
    record_function = type("RF", (RecordFunction,), {"log": log})
    module = fake_utils(record_function)
    patch = scopes.ProfilerScopes().install(module)
    try:
        with module.record_function_or_nullcontext("gpu_model_runner: sample") as value:
            clock.t += 0.5
        assert type(value) is record_function  # vLLM's own scope, not ours around it
        with module.record_function_or_nullcontext("gpu_model_runner: bookkeep"):
            clock.t += 0.125
        assert log == [
            ("enter", "gpu_model_runner: sample"),
            ("exit", "gpu_model_runner: sample", None),
            ("enter", "gpu_model_runner: bookkeep"),
            ("exit", "gpu_model_runner: bookkeep", None),
        ]
        assert metrics.points()[SCOPES] == {
            key(**step("idle", name="schedule: update_after_schedule")): (1, 0.25, counts(SC, b11=1)),
            key(**step("idle", name="gpu_model_runner: bookkeep")): (1, 0.125, counts(SC, b11=1)),
        }  # last step: idle
    finally:
        patch.remove()


def test_untimed_scopes_match_names_and_patterns_and_stay_bounded():
    assert scopes.untimed_scopes(()) is None  # nothing disabled: the factory checks nothing
    untimed = scopes.untimed_scopes(("schedule: *", "forward"))
    assert untimed("schedule: allocate_slots") and untimed("forward")
    assert not untimed("gpu_model_runner: forward") and not untimed(None) and not untimed(b"forward")
    for i in range(10 * scopes.MAX_SCOPE_NAMES):
        assert untimed(f"schedule: {i}") and not untimed(f"other {i}")  # decided each time past the bound


def test_install_lets_vllm_choose_its_factory_and_remove_restores_it():
    module = fake_utils()
    assert module._PROFILER_FUNC is None
    patch = scopes.ProfilerScopes().install(module)
    factory = module._PROFILER_FUNC
    assert scopes.is_factory(factory)
    scope = module.record_function_or_nullcontext("x")
    assert isinstance(scope, scopes._Scope) and scope.inner is None  # nullcontext: nothing to wrap
    with pytest.raises(RuntimeError):
        scopes.ProfilerScopes().install(module)  # already ours
    patch.remove()
    assert module._PROFILER_FUNC is contextlib.nullcontext  # vLLM's own choice
    assert isinstance(module.record_function_or_nullcontext("x"), contextlib.nullcontext)

    # Someone replaced the factory after us: removing ours leaves theirs.
    patch = scopes.ProfilerScopes().install(module)
    theirs = lambda name: contextlib.nullcontext()  # noqa: E731
    module._PROFILER_FUNC = theirs
    patch.remove()
    assert module._PROFILER_FUNC is theirs
