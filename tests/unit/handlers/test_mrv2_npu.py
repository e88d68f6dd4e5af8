"""vllm-ascend's V2 NPU runner (paths.py "npu_v2") on ``fakes.FakeNPURunnerV2``, whose call order
tests/contract/test_mrv2_npu.py checks in vllm-ascend 0.30.0rc2's source: model runner V2's rows wrap the V2 base, the
NPU runner's own rows (execute_model, prepare_inputs, sample) wrap its overrides, as the installer patches both
classes. The worker timeline keeps V2's names; each value is hand-computed from the injected clock: one step, not
two (V2's execute_model inside vllm-ascend's records nothing), prepare inputs once (its own, never V2's), and the
budget's sample stage around its own sample with LM-head TP as around V2's without."""

from types import SimpleNamespace as NS

import pytest

from opentelemetry_instrumentation_vllm_ascend import recording
from opentelemetry_instrumentation_vllm_ascend.handlers import budget, model_runner, scopes
from opentelemetry_instrumentation_vllm_ascend.handlers.steps import PHASE_ATTRIBUTE
from opentelemetry_instrumentation_vllm_ascend.state import STATE
from tests.support.fakes import instrumented_npu_v2, name, patch_clock
from tests.unit.handlers.test_mrv2 import PLAN, value

EXECUTE = name("executor:model_runner_execute_model:duration")
INFERENCE = name("worker:model_inference:duration")
FORWARD = name("npu:forward_duration")
NON_FORWARD = name("npu:non_forward_duration")
PREPARE = name("executor:prepare_inputs:duration")
STAGES = name("worker:stage_seconds")

NPU = {"npu_pre": 0.015625, "npu_post": 0.046875, "npu_pre_sample": 0.0234375}
V2_EXECUTE = 0.0625 + 0.125 + 0.0625 + 0.25 + 0.03125  # V2's execute_model with the NPU's own prepare_inputs
EXECUTE_S = NPU["npu_pre"] + V2_EXECUTE + NPU["npu_post"]
SAMPLE_TOKENS_S = 0.03125 + 0.25 + 0.0625  # V2's sample_tokens (the NPU's work before it is not in the step)
FORWARD_S = 0.25 + 0.03125 + NPU["npu_post"]  # forward_start() → vllm-ascend's execute_model return


@pytest.fixture
def clock(monkeypatch):
    monkeypatch.setattr(budget, "time", lambda: 1_700_000_000.0)
    return patch_clock(monkeypatch, model_runner, scopes, budget)


def make_runner(monkeypatch, clock, **plan):
    runner_class, timing_class = instrumented_npu_v2(monkeypatch)
    runner = runner_class(clock)
    runner.step_timing = timing_class()
    runner.plan = dict(PLAN, **NPU, **plan)
    return runner


def test_a_v2_npu_step_is_one_step_from_vllm_ascends_execute_model(metrics, clock, monkeypatch):
    STATE.device = None  # the host timeline: the host time is the computation
    runner = make_runner(monkeypatch, clock)
    assert runner.execute_model(NS(**{PHASE_ATTRIBUTE: "prefill"})) is None
    step = STATE.worker_step
    assert step is not None and step.forward_start is not None and step.returned is not None
    assert runner.sample_tokens(None) == "sampled"
    assert STATE.worker_step is None
    assert value(metrics, EXECUTE, "prefill") == (1, EXECUTE_S)  # once: V2's inside it is no second step
    assert value(metrics, INFERENCE, "prefill") == (1, EXECUTE_S + SAMPLE_TOKENS_S)
    assert value(metrics, FORWARD, "prefill") == (1, FORWARD_S)
    assert value(metrics, NON_FORWARD, "prefill") == (1, EXECUTE_S + SAMPLE_TOKENS_S - FORWARD_S)
    assert value(metrics, PREPARE, "prefill") == (1, 0.125)  # its own prepare_inputs, once


@pytest.mark.parametrize("lmhead_tp", [False, True])
def test_the_worker_budget_on_the_v2_npu_runner(metrics, clock, monkeypatch, lmhead_tp):
    """Two steps: each stage hand-computed; with LM-head TP the NPU runner's own sample (no V2 sample inside) is the
    sample stage, without it V2's sample inside the NPU's is one stage, not two boundaries; stages sum to the wall
    time since the first step began."""
    STATE.device = None
    runner = make_runner(monkeypatch, clock, lmhead_tp=lmhead_tp)
    start = clock.t
    for _ in range(2):
        runner.execute_model(NS(**{PHASE_ATTRIBUTE: "decode"}))
        clock.t += 0.0078125  # the reply, waiting for the sample_tokens RPC
        runner.sample_tokens(None)
        clock.t += 0.5
    recording.flush()
    got = {dict(k)["stage"]: v for k, v in metrics.points()[STAGES].items()}
    assert got == {
        "idle": 2 * 0.5,
        "prepare_inputs": 2 * (NPU["npu_pre"] + 0.0625 + 0.125 + 0.0625),
        "forward": 2 * FORWARD_S,
        "wait_sample": 2 * (0.0078125 + NPU["npu_pre_sample"]),  # the NPU's sample_tokens before V2's
        "sample": 2 * 0.25,
        "other": 2 * (0.03125 + 0.0625),
    }
    assert sum(got.values()) == clock.t - start
    assert value(metrics, FORWARD, "decode") == (2, got["forward"])


def test_a_dummy_run_through_the_v2_npu_runner_is_no_step(metrics, clock, monkeypatch):
    STATE.device = None
    runner = make_runner(monkeypatch, clock)
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "prefill"}), None, True)
    assert STATE.worker_step is None
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "decode"}))
    runner.sample_tokens(None)
    assert value(metrics, EXECUTE, "decode") == (1, EXECUTE_S) and value(metrics, EXECUTE, "prefill") is None


def test_a_failing_v2_execute_model_inside_the_npu_runners_ends_the_step(metrics, clock, monkeypatch):
    """V2's execute_model raising inside vllm-ascend's: the NPU row's error ends the step (no execute time, no
    forward), and the next step is whole."""
    STATE.device = None
    runner = make_runner(monkeypatch, clock)

    def broken(self, scheduler_output):
        raise RuntimeError("prepare failed")

    monkeypatch.setattr(type(runner).__mro__[1], "prepare_inputs", broken)
    with pytest.raises(RuntimeError):
        runner.execute_model(NS(**{PHASE_ATTRIBUTE: "decode"}))
    assert STATE.worker_step is None and EXECUTE not in metrics.points()
    runner = make_runner(monkeypatch, clock)  # classes of their own: prepare_inputs whole again
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "decode"}))
    runner.sample_tokens(None)
    assert value(metrics, EXECUTE, "decode") == (1, EXECUTE_S) and value(metrics, FORWARD, "decode") == (1, FORWARD_S)
