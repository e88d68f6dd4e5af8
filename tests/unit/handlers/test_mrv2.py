"""Model runner V2's worker timeline (handlers/model_runner.py: ExecuteModelV2, ForwardStartV2, SampleV2) on
``fakes.FakeRunnerV2``, whose shape and call order tests/contract/test_mrv2.py checks in every supported vLLM
release's source, wrapped by the real MRV2 rows of targets.py and recorded through the real OTel SDK. The
metrics have V1's names and meanings (paths.TRUTH says where they narrow): each value hand-computed from the
injected clock. Also the narrow degradation of the model runner family: a fault injected into one read loses that
read's metrics only, the others keep their exact values."""

import logging
from types import SimpleNamespace as NS

import pytest

from opentelemetry_instrumentation_vllm_ascend import recording
from opentelemetry_instrumentation_vllm_ascend.handlers import budget, model_runner, scopes
from opentelemetry_instrumentation_vllm_ascend.handlers.steps import PHASE_ATTRIBUTE, STEP_ATTRIBUTE
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import SYNC, SYNC_TIMER, wrap
from opentelemetry_instrumentation_vllm_ascend.state import STATE
from tests.support.fakes import FakeRunnerV2, instrumented_v2, name, patch_clock

EXECUTE = name("executor:model_runner_execute_model:duration")
INFERENCE = name("worker:model_inference:duration")
FORWARD = name("npu:forward_duration")
LAUNCH = name("npu:kernel_launch")
NON_FORWARD = name("npu:non_forward_duration")
PREPARE = name("executor:prepare_inputs:duration")
GET_OUTPUT = name("worker:model_runner_get_output:duration")
STAGES = name("worker:stage_seconds")

#: One step: host seconds of each part (exact binary fractions).
PLAN = {
    "update": 0.0625,
    "prepare": 0.125,
    "attn": 0.0625,
    "forward": 0.25,
    "finish": 0.03125,
    "result": None,
    "pre_sample": 0.03125,
    "sample": 0.25,
    "post_sample": 0.0625,
}
EXECUTE_S = 0.0625 + 0.125 + 0.0625 + 0.25 + 0.03125  # 0.53125
SAMPLE_TOKENS_S = 0.03125 + 0.25 + 0.0625  # 0.34375
FORWARD_S = 0.25 + 0.03125  # forward_start() → execute_model's return


def labels(phase):
    return {"dp": "0", "role": "mixed", "phase": phase}


def value(metrics, metric, phase):
    """(count, sum) of a histogram series, None where absent."""
    got = metrics.value(metric, **labels(phase))
    return None if got is None else got[:2]


@pytest.fixture
def clock(monkeypatch):
    monkeypatch.setattr(budget, "time", lambda: 1_700_000_000.0)
    return patch_clock(monkeypatch, model_runner, scopes, budget)


def make_runner(monkeypatch, clock, event=None, handler="model_runner:ExecuteModelV2"):
    runner_class, timing_class = instrumented_v2(monkeypatch, handler)
    runner = runner_class(clock, event)
    runner.step_timing = timing_class()
    runner.plan = dict(PLAN)
    return runner


def test_a_v2_step_on_the_host_timeline_feeds_v1s_metrics(metrics, clock, monkeypatch):
    STATE.device = None  # CPU: the host time is the computation
    runner = make_runner(monkeypatch, clock)
    assert STATE.mrv2_forward_marked  # building the forward-mark row's handler says so
    assert runner.execute_model(NS(**{PHASE_ATTRIBUTE: "prefill"})) is None
    assert STATE.worker_step.forward_start is not None and INFERENCE not in metrics.points()
    assert runner.sample_tokens(None) == "sampled"
    assert STATE.worker_step is None
    assert value(metrics, EXECUTE, "prefill") == (1, EXECUTE_S)
    assert value(metrics, INFERENCE, "prefill") == (1, EXECUTE_S + SAMPLE_TOKENS_S)
    assert value(metrics, FORWARD, "prefill") == (1, FORWARD_S)
    assert value(metrics, NON_FORWARD, "prefill") == (1, EXECUTE_S + SAMPLE_TOKENS_S - FORWARD_S)
    assert value(metrics, PREPARE, "prefill") == (1, 0.125)
    assert LAUNCH not in metrics.points()  # no post-processing mark on V2 (paths.TRUTH)


def test_a_v2_step_that_runs_no_forward_has_no_forward_time(metrics, clock, monkeypatch):
    STATE.device = None
    runner = make_runner(monkeypatch, clock)
    runner.plan = {"update": 0.0625, "no_forward": True, "result": "empty"}
    assert runner.execute_model(NS(**{PHASE_ATTRIBUTE: "decode"})) == "empty"
    assert value(metrics, EXECUTE, "decode") == (1, 0.0625)
    assert value(metrics, INFERENCE, "decode") == (1, 0.0625)
    assert FORWARD not in metrics.points() and NON_FORWARD not in metrics.points()


def test_dummy_runs_and_calls_outside_a_step_mark_no_forward(metrics, clock, monkeypatch):
    """A dummy run (DP padding, warm-up) calls forward_start() too: it is no step and marks none — not even a
    step whose execute_model returned and whose sample_tokens has not come yet."""
    STATE.device = None
    runner = make_runner(monkeypatch, clock)
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "prefill"}), None, True)
    assert STATE.worker_step is None
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "decode"}))
    forward_start = STATE.worker_step.forward_start
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "prefill"}), dummy_run=True)
    assert STATE.worker_step.forward_start == forward_start and STATE.worker_step.forward_end == forward_start + 0.28125
    runner.sample_tokens(None)
    assert value(metrics, FORWARD, "decode") == (1, FORWARD_S)
    assert value(metrics, EXECUTE, "decode") == (1, EXECUTE_S)
    assert value(metrics, EXECUTE, "prefill") is None  # the dummy runs were no steps


def make_event_class():
    class FakeEvent:
        """torch.cuda/npu.Event: stamps the device clock when recorded; done once the device got there."""

        device_ms = 1000.0
        reached = 1e9
        created = 0
        fail_query = False

        def __init__(self, enable_timing=False):
            assert enable_timing
            type(self).created += 1

        def record(self):
            self.stamp = type(self).device_ms

        def query(self):
            if type(self).fail_query:
                raise RuntimeError("device lost")
            return self.stamp <= type(self).reached

        def elapsed_time(self, end):
            return end.stamp - self.stamp

    return FakeEvent


def test_a_v2_step_on_the_device_timeline(metrics, clock, monkeypatch):
    """Device events at execute_model's start, at forward_start() and execute_model's return, and at the step's
    end: inference, forward and non-forward all on the device's clock."""
    Event = make_event_class()
    STATE.device = model_runner.DeviceTimeline(Event)
    runner = make_runner(monkeypatch, clock, event=Event)
    runner.plan.update(device_ms=125.0, device_sample_ms=62.5)
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "decode"}))
    runner.sample_tokens(None)
    assert Event.created == 4
    assert value(metrics, INFERENCE, "decode") == (1, 0.1875)
    assert value(metrics, FORWARD, "decode") == (1, 0.125)
    assert value(metrics, NON_FORWARD, "decode") == (1, 0.0625)
    assert value(metrics, EXECUTE, "decode") == (1, EXECUTE_S)  # host time


def test_the_worker_budget_on_v2(metrics, clock, monkeypatch):
    """Two V2 steps: each stage's seconds hand-computed from V2's marks, their sum the wall time since the first
    step began; the forward stage and npu:forward_duration read the same two clock readings."""
    STATE.device = None
    runner = make_runner(monkeypatch, clock)
    start = clock.t
    for _ in range(2):
        runner.execute_model(NS(**{PHASE_ATTRIBUTE: "decode"}))
        clock.t += 0.0078125  # the reply, waiting for the sample_tokens RPC
        runner.sample_tokens(None)
        clock.t += 0.5  # idle until the next execute_model
    recording.flush()
    got = {dict(k)["stage"]: v for k, v in metrics.points()[STAGES].items()}
    assert got == {
        "idle": 2 * 0.5,
        "prepare_inputs": 2 * (0.0625 + 0.125 + 0.0625),
        "forward": 2 * FORWARD_S,
        "wait_sample": 2 * 0.0078125,
        "sample": 2 * 0.25,
        "other": 2 * (0.03125 + 0.0625),
    }
    assert sum(got.values()) == clock.t - start
    assert value(metrics, FORWARD, "decode") == (2, got["forward"])


def test_without_the_forward_mark_v2_moves_no_boundary(metrics, clock, monkeypatch):
    """vLLM 0.23's V2 (vllm-ascend 0.23's V2 NPU runner) has no StepTimingCollector: the row is gated, its handler
    never built, and V2's steps leave the worker budget absent (their forward cannot be told apart)."""
    STATE.device = None
    monkeypatch.setattr(STATE, "mrv2_forward_marked", False)

    class Runner(FakeRunnerV2):
        execute_model = wrap(FakeRunnerV2.execute_model, model_runner.ExecuteModelV2(), SYNC)[0]
        sample_tokens = wrap(FakeRunnerV2.sample_tokens, model_runner.SampleTokens(), SYNC)[0]

    runner = Runner(clock)
    runner.plan = dict(PLAN)
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "decode"}))
    runner.sample_tokens(None)
    recording.flush()
    assert budget.WORKER.since is None and STAGES not in metrics.points()
    assert value(metrics, EXECUTE, "decode") == (1, EXECUTE_S) and FORWARD not in metrics.points()


def test_the_standalone_cpu_runner_has_no_forward_and_no_budget_even_where_v2s_mark_is_hooked(
    metrics, clock, monkeypatch
):
    STATE.device = None
    runner = make_runner(monkeypatch, clock, handler="model_runner:ExecuteModelStandalone")
    runner.step_timing = NS(record_batch=lambda *a: None, forward_start=lambda: None)  # it calls none
    assert STATE.mrv2_forward_marked
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "decode"}))
    runner.sample_tokens(None)
    recording.flush()
    assert budget.WORKER.since is None and STAGES not in metrics.points()
    assert value(metrics, EXECUTE, "decode") == (1, EXECUTE_S)
    assert value(metrics, INFERENCE, "decode") == (1, EXECUTE_S + SAMPLE_TOKENS_S)
    assert FORWARD not in metrics.points() and NON_FORWARD not in metrics.points()


# -- narrow degradation: one failing read loses its own metrics only ------------------------------------------


def warnings_about(caplog, where):
    return [r for r in caplog.records if r.levelno == logging.WARNING and f"failed in {where}" in r.getMessage()]


def test_a_failing_phase_read_keeps_every_duration(metrics, clock, monkeypatch, caplog):
    """The step's phase cannot be read (no phase stored, and classifying the output raises, as vLLM 0.34's did
    before the scheduler helper's fix): the step is timed in full, labelled unknown; one warning."""
    STATE.device = None
    runner = make_runner(monkeypatch, clock)

    def broken(*args):
        raise AttributeError("resumed_req_ids")

    monkeypatch.setattr(model_runner, "classify_step", broken)
    for _ in range(2):
        runner.execute_model(NS())
        runner.sample_tokens(None)
    assert value(metrics, EXECUTE, "unknown") == (2, 2 * EXECUTE_S)
    assert value(metrics, INFERENCE, "unknown") == (2, 2 * (EXECUTE_S + SAMPLE_TOKENS_S))
    assert value(metrics, FORWARD, "unknown") == (2, 2 * FORWARD_S)
    assert len(warnings_about(caplog, "phase")) == 1


def test_a_failing_device_timeline_keeps_the_host_times(metrics, clock, monkeypatch, caplog):
    Event = make_event_class()
    Event.fail_query = True
    STATE.device = model_runner.DeviceTimeline(Event)
    runner = make_runner(monkeypatch, clock, event=Event)
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "decode"}))
    runner.sample_tokens(None)
    assert value(metrics, EXECUTE, "decode") == (1, EXECUTE_S)
    assert value(metrics, PREPARE, "decode") == (1, 0.125)
    assert INFERENCE not in metrics.points() and FORWARD not in metrics.points()
    assert len(warnings_about(caplog, "device timeline")) == 1


def test_a_failing_start_event_records_no_host_time_as_device_time(metrics, clock, monkeypatch, caplog):
    """The device event at execute_model's start cannot be recorded: the step has no inference or forward time
    (the host's would not be the device's computation), its execute_model time is kept."""
    Event = make_event_class()
    STATE.device = timeline = model_runner.DeviceTimeline(Event)

    def broken():
        raise RuntimeError("no stream")

    monkeypatch.setattr(timeline, "start", broken)
    runner = make_runner(monkeypatch, clock, event=Event)
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "decode"}))
    runner.sample_tokens(None)
    assert value(metrics, EXECUTE, "decode") == (1, EXECUTE_S)
    assert INFERENCE not in metrics.points() and FORWARD not in metrics.points()
    assert len(warnings_about(caplog, "device event")) == 1


def test_a_failing_forward_event_loses_the_forward_only(metrics, clock, monkeypatch, caplog):
    Event = make_event_class()
    STATE.device = timeline = model_runner.DeviceTimeline(Event)
    real_start = timeline.start
    calls = []

    def start():
        calls.append(1)
        if len(calls) == 2:  # the forward's start event
            raise RuntimeError("no stream")
        return real_start()

    monkeypatch.setattr(timeline, "start", start)
    runner = make_runner(monkeypatch, clock, event=Event)
    runner.plan.update(device_ms=125.0, device_sample_ms=62.5)
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "decode"}))
    runner.sample_tokens(None)
    assert value(metrics, INFERENCE, "decode") == (1, 0.1875)
    assert value(metrics, EXECUTE, "decode") == (1, EXECUTE_S)
    assert FORWARD not in metrics.points() and NON_FORWARD not in metrics.points()
    assert len(warnings_about(caplog, "device event")) == 1


def test_a_failing_step_read_in_get_output_keeps_its_duration(metrics, clock, caplog):
    class Output:
        def get_output(self):
            clock.t += 0.25
            return NS()

    get_output = wrap(Output.get_output, model_runner.GetOutput(), SYNC_TIMER)[0]
    pending = Output()
    setattr(pending, STEP_ATTRIBUTE, "not a (phase, returned) pair")
    get_output(pending)
    assert value(metrics, GET_OUTPUT, "unknown") == (1, 0.25)
    assert len(warnings_about(caplog, "step")) == 1
