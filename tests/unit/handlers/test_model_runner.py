"""Model runner handlers (execute_model, sample_tokens, get_output, the device timeline) on plain objects shaped like vLLM's (tests/support/fakes.py), driven through the real wrappers and
recorded through the real OTel SDK. Durations come from an injected clock advanced by exact binary
fractions, so every count, sum and bucket below is hand-computed and asserted exactly."""

import threading
from types import SimpleNamespace as NS

import pytest

from opentelemetry_instrumentation_vllm_ascend import context, recording
from opentelemetry_instrumentation_vllm_ascend.handlers import model_runner, scopes, steps
from opentelemetry_instrumentation_vllm_ascend.handlers.steps import PHASE_ATTRIBUTE
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import SYNC, SYNC_TIMER, wrap
from opentelemetry_instrumentation_vllm_ascend.state import STATE
from tests.support.fakes import SC, S, counts, key, name, output, req, step

# -- model runner -------------------------------------------------------------------------------------

FORWARD, POST = "gpu_model_runner: forward", "gpu_model_runner: postprocess"


class FakeRunner:
    """GPUModelRunner's shape: execute_model's forward and post-processing scopes, then (when it
    returned None) sample_tokens. ``plan``: host seconds of each part; ``device_ms``: the forward's
    time on the device (advances FakeEvent's device clock)."""

    def __init__(self, clock, utils, event=None):
        self.clock = clock
        self.utils = utils
        self.event = event
        self.requests = {}
        self.plan = {}

    def execute_model(self, scheduler_output, intermediate_tensors=None):
        p, scope = self.plan, self.utils.record_function_or_nullcontext
        self.clock.t += p.get("prepare", 0.0)
        if p.get("no_forward"):  # e.g. kv_connector_no_forward: the step returns before any forward
            return p.get("result")
        with scope(FORWARD):
            self.clock.t += p["forward"]
            if self.event is not None:
                self.event.device_ms += p["device_ms"]
        with scope(POST):
            self.clock.t += p.get("post", 0.0)
        self.clock.t += p.get("tail", 0.0)
        return p.get("result")

    def sample_tokens(self, grammar_output):
        with self.utils.record_function_or_nullcontext("gpu_model_runner: sample"):
            self.clock.t += self.plan["sample"]
            if self.event is not None:
                self.event.device_ms += self.plan.get("device_sample_ms", 0.0)
        return self.plan.get("sampled", "sampled")


def instrumented_runner():
    cls = FakeRunner
    return type(
        "InstrumentedRunner",
        (cls,),
        {
            "execute_model": wrap(cls.execute_model, model_runner.ExecuteModel(), SYNC)[0],
            "sample_tokens": wrap(cls.sample_tokens, model_runner.SampleTokens(), SYNC)[0],
        },
    )


EXECUTE, INFERENCE = name("executor:model_runner_execute_model:duration"), name("worker:model_inference:duration")
NPU_FORWARD, LAUNCH, NON_FORWARD = (
    name("npu:forward_duration"),
    name("npu:kernel_launch"),
    name("npu:non_forward_duration"),
)
SCOPES = name("record_function_or_nullcontext")


def test_worker_step_execute_then_sample_on_the_host_timeline(metrics, clock, utils):
    STATE.device = None  # no device events
    runner = instrumented_runner()(clock, utils)
    runner.plan = {"prepare": 0.0625, "forward": 0.25, "post": 0.125, "tail": 0.0625, "result": None, "sample": 0.25}
    STATE.last_step_phase = "decode"
    assert runner.execute_model(NS(**{PHASE_ATTRIBUTE: "prefill"})) is None
    assert STATE.last_step_phase == "prefill"
    assert INFERENCE not in metrics.points()  # the step goes on in sample_tokens
    assert runner.sample_tokens(None) == "sampled"
    assert STATE.worker_step is None

    m, pre = metrics.points(), step("prefill")
    assert m[EXECUTE] == {key(**pre): (1, 0.5, counts(S, b9=1))}
    assert m[INFERENCE] == {key(**pre): (1, 0.75, counts(S, b10=1))}  # 0.5 + 0.25
    assert m[NPU_FORWARD] == {key(**pre): (1, 0.25, counts(S, b8=1))}
    assert m[LAUNCH] == {key(**pre): (1, 0.375, counts(S, b9=1))}  # forward start 100.0625 → post end 100.4375
    assert m[NON_FORWARD] == {key(**pre): (1, 0.5, counts(S, b9=1))}  # 0.75 - 0.25
    assert m[SCOPES] == {
        key(**step("prefill", name=FORWARD)): (1, 0.25, counts(SC, b11=1)),
        key(**step("prefill", name=POST)): (1, 0.125, counts(SC, b11=1)),
        key(**step("prefill", name="gpu_model_runner: sample")): (1, 0.25, counts(SC, b11=1)),
    }


def test_worker_step_that_returns_its_output_and_classifies_itself(metrics, clock, utils):
    STATE.device = None
    runner = instrumented_runner()(clock, utils)
    runner.plan = {"forward": 0.125, "post": 0.0625, "result": "output", "sample": 1.0}
    requests = {"d": req(12, 13, prompt=10)}
    so = output(requests, cached=[("d", 1)])  # from an uninstrumented EngineCore: no phase stored
    assert runner.execute_model(so) == "output"
    assert STATE.worker_step is None
    runner.sample_tokens(None)  # not part of a step any more: no second inference value
    m, dec = metrics.points(), step("decode")
    assert m[EXECUTE] == {key(**dec): (1, 0.1875, counts(S, b8=1))}
    assert m[INFERENCE] == {key(**dec): (1, 0.1875, counts(S, b8=1))}  # execute_model only
    assert m[NPU_FORWARD] == {key(**dec): (1, 0.125, counts(S, b8=1))}
    assert m[LAUNCH] == {key(**dec): (1, 0.1875, counts(S, b8=1))}
    assert m[NON_FORWARD] == {key(**dec): (1, 0.0625, counts(S, b7=1))}


class FakeRunnerV2:
    def __init__(self, clock):
        self.clock = clock
        self.requests = {}

    def execute_model(
        self, scheduler_output, intermediate_tensors=None, dummy_run=False, skip_attn_for_dummy_run=False
    ):
        self.clock.t += 0.25
        return "output"


def test_model_runner_v2_skips_dummy_runs(metrics, clock):
    STATE.device = None
    run = wrap(FakeRunnerV2.execute_model, model_runner.ExecuteModelV2(), SYNC)[0]
    runner = FakeRunnerV2(clock)
    so = NS(**{PHASE_ATTRIBUTE: "prefill"})
    STATE.last_step_phase = "decode"
    run(runner, so, None, True)
    run(runner, so, dummy_run=True)
    run(runner, so, dummy_run=True, skip_attn_for_dummy_run=True)
    assert STATE.worker_step is None and STATE.last_step_phase == "decode"
    assert EXECUTE not in metrics.points() and INFERENCE not in metrics.points()
    assert run(runner, so) == "output"
    assert run(runner, so, None, False) == "output"
    pre = step("prefill")
    assert metrics.points()[EXECUTE] == {key(**pre): (2, 0.5, counts(S, b8=2))}
    assert metrics.points()[INFERENCE] == {key(**pre): (2, 0.5, counts(S, b8=2))}


def make_event_class():
    class FakeEvent:
        """torch.npu/cuda.Event: stamps the device clock when recorded; done once the device got there."""

        device_ms = 1000.0  # where the device clock is when work is enqueued
        reached = 0.0  # how far the device has executed
        created = 0

        def __init__(self, enable_timing=False):
            assert enable_timing
            type(self).created += 1

        def record(self):
            self.stamp = type(self).device_ms

        def query(self):
            return self.stamp <= type(self).reached

        def elapsed_time(self, end):
            return end.stamp - self.stamp

    return FakeEvent


def test_step_times_from_device_events_recorded_once_they_are_done(metrics, clock, utils):
    """Where the device offers events, a step's inference, forward and non-forward times all come
    from the device timeline (events at execute_model's start, around the forward scope and at the
    step's end), read once the device has passed them; npu:kernel_launch stays host time."""
    Event = make_event_class()
    timeline = STATE.device = model_runner.DeviceTimeline(Event)  # reset by the autouse state.reset()
    runner = instrumented_runner()(clock, utils, event=Event)

    # Step 1 (prefill): device forward 125 ms, device sampling 62.5 ms; the device is not there yet.
    runner.plan = {
        "prepare": 0.0625,
        "forward": 0.25,
        "device_ms": 125.0,
        "post": 0.125,
        "tail": 0.0625,
        "result": None,
        "sample": 0.25,
        "device_sample_ms": 62.5,
    }
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "prefill"}))
    runner.sample_tokens(None)
    m = metrics.points()
    assert m[LAUNCH] == {key(**step("prefill")): (1, 0.375, counts(S, b9=1))}  # host timeline
    assert INFERENCE not in m and NPU_FORWARD not in m and NON_FORWARD not in m  # not waited for
    assert len(timeline.pending) == 1 and Event.created == 4

    # Step 2 (decode): the device finished step 1 (1000 → 1187.5 ms), not step 2 (2000 → 2250 ms).
    Event.reached, Event.device_ms = 1187.5, 2000.0
    runner.plan = {"forward": 0.5, "device_ms": 250.0, "result": "output"}
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "decode"}))
    m = metrics.points()
    assert m[INFERENCE] == {key(**step("prefill")): (1, 0.1875, counts(S, b8=1))}  # device: 1000 → 1187.5
    assert m[NPU_FORWARD] == {key(**step("prefill")): (1, 0.125, counts(S, b8=1))}
    assert m[NON_FORWARD] == {key(**step("prefill")): (1, 0.0625, counts(S, b7=1))}  # sampling, on the device
    assert len(timeline.pending) == 1

    # Step 3 (mixed): the device is past both (3000 → 3062.5 ms).
    Event.reached, Event.device_ms = 3062.5, 3000.0
    runner.plan = {"forward": 0.125, "device_ms": 62.5, "result": "output"}
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "mixed"}))
    m = metrics.points()
    assert m[NPU_FORWARD] == {
        key(**step("prefill")): (1, 0.125, counts(S, b8=1)),
        key(**step("decode")): (1, 0.25, counts(S, b8=1)),
        key(**step("mixed")): (1, 0.0625, counts(S, b7=1)),
    }
    assert m[INFERENCE] == {
        key(**step("prefill")): (1, 0.1875, counts(S, b8=1)),
        key(**step("decode")): (1, 0.25, counts(S, b8=1)),
        key(**step("mixed")): (1, 0.0625, counts(S, b7=1)),
    }
    assert m[NON_FORWARD] == {
        key(**step("prefill")): (1, 0.0625, counts(S, b7=1)),
        key(**step("decode")): (1, 0.0, counts(S, b0=1)),
        key(**step("mixed")): (1, 0.0, counts(S, b0=1)),
    }
    assert not timeline.pending


def test_non_forward_time_is_on_one_clock_when_the_host_only_launches(metrics, clock, utils):
    """Async scheduling on a device: execute_model and sample_tokens return at once (they only launch
    work); the device computes the forward for 20 ms and samples for 10 ms. Inference is the device's
    30 ms and non-forward its 10 ms — not host launch time minus device forward time (clamped to 0)."""
    Event = make_event_class()
    STATE.device = model_runner.DeviceTimeline(Event)
    runner = instrumented_runner()(clock, utils, event=Event)
    runner.plan = {"forward": 0.0, "device_ms": 20.0, "result": None, "sample": 0.0, "device_sample_ms": 10.0}
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "decode"}))
    runner.sample_tokens(None)
    Event.reached = 1030.0
    runner.plan = {"no_forward": True, "result": "output"}  # a later step end reads the finished one
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "prefill"}))
    m, dec = metrics.points(), key(**step("decode"))
    assert m[INFERENCE][dec][:2] == (1, pytest.approx(0.030))
    assert m[NPU_FORWARD][dec][:2] == (1, pytest.approx(0.020))
    assert m[NON_FORWARD][dec][:2] == (1, pytest.approx(0.010))


def test_pending_device_step_is_recorded_at_the_end_of_a_later_step_without_forward(metrics, clock, utils):
    """A step without a forward scope (KV connector without forward) still ends a step: earlier steps
    that the device has finished are recorded then, not held back until the next forward step."""
    Event = make_event_class()
    timeline = STATE.device = model_runner.DeviceTimeline(Event)
    runner = instrumented_runner()(clock, utils, event=Event)
    runner.plan = {"forward": 0.25, "device_ms": 125.0, "result": "output"}
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "prefill"}))  # 0.25 s on the host
    assert NPU_FORWARD not in metrics.points() and len(timeline.pending) == 1
    Event.reached = 1125.0
    runner.plan = {"no_forward": True, "prepare": 0.0625, "result": "output"}
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "decode"}))
    m = metrics.points()
    assert m[NPU_FORWARD] == {key(**step("prefill")): (1, 0.125, counts(S, b8=1))}
    assert m[NON_FORWARD] == {key(**step("prefill")): (1, 0.0, counts(S, b0=1))}  # the step was its forward
    assert m[INFERENCE] == {
        key(**step("prefill")): (1, 0.125, counts(S, b8=1)),
        key(**step("decode")): (1, 0.0, counts(S, b0=1)),
    }  # no device work
    assert LAUNCH not in m or key(**step("decode")) not in m[LAUNCH]
    assert not timeline.pending


class AsyncOutput:
    """An async model runner output (async scheduling): get_output() waits for the sampled tokens."""

    def __init__(self, clock, wait, output):
        self.clock, self.wait, self.output = clock, wait, output

    def get_output(self):
        self.clock.t += self.wait
        return self.output


def test_get_output_in_the_output_thread_gets_its_own_steps_phase_and_stamps_the_reply(metrics, clock, utils):
    """vLLM's worker process runs get_output() in its output thread while the main thread already
    runs the next step: a prefill step's get_output that ends after the decode step's execute_model
    began is labelled prefill, and the reply it returns carries the prefill step's moments."""
    STATE.device = None
    runner = instrumented_runner()(clock, utils)
    get_output = wrap(AsyncOutput.get_output, model_runner.GetOutput(), SYNC_TIMER)[0]
    reply = NS()
    runner.plan = {"forward": 0.25, "result": None, "sample": 0.125, "sampled": AsyncOutput(clock, 0.5, reply)}
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "prefill"}))  # returns at 100.25
    pending = runner.sample_tokens(None)  # 100.375: handed to the output thread
    started = threading.Event()
    decoding = threading.Event()

    def output_thread():
        started.set()
        decoding.wait(10)  # the main thread is in the decode step now
        assert get_output(pending) is reply

    thread = threading.Thread(target=output_thread)
    thread.start()
    started.wait(10)
    runner.plan = {"forward": 0.0625, "result": None, "sample": 0.0, "sampled": None}
    step_before = model_runner.ExecuteModel().before((runner, NS(**{PHASE_ATTRIBUTE: "decode"})), None)
    assert STATE.worker_step is step_before and STATE.last_step_phase == "decode"
    decoding.set()
    thread.join(10)
    m = metrics.points()
    assert m[name("worker:model_runner_get_output:duration")] == {key(**step("prefill")): (1, 0.5, counts(S, b9=1))}
    assert getattr(reply, steps.READY_ATTRIBUTE) == (context.HOST_CLOCK, 100.25, 100.875)


# -- the worker's records wait, FLUSH_STEPS steps at a time -----------------------------------------------


def test_worker_step_records_wait_in_the_deferred_queue_until_flush_steps_or_a_collection(metrics, clock, utils):
    """Each step leaves one entry (its five host values) in the deferred queue; the step that makes
    FLUSH_STEPS entries records them all, and a collection records what waits before it reads."""
    STATE.device = None
    runner = instrumented_runner()(clock, utils)
    runner.plan = {"forward": 0.25, "post": 0.125, "result": None, "sample": 0.125}
    for _ in range(3):
        runner.execute_model(NS(**{PHASE_ATTRIBUTE: "decode"}))
        runner.sample_tokens(None)
    assert len(STATE.deferred) == 3
    m, dec = metrics.points(), step("decode")  # the collection records the three steps first
    assert not STATE.deferred
    assert m[EXECUTE] == {key(**dec): (3, 1.125, counts(S, b9=3))}  # 0.375 each
    assert m[INFERENCE] == {key(**dec): (3, 1.5, counts(S, b9=3))}  # 0.5 each
    for _ in range(steps.FLUSH_STEPS - 1):
        runner.execute_model(NS(**{PHASE_ATTRIBUTE: "decode"}))
        runner.sample_tokens(None)
    assert len(STATE.deferred) == steps.FLUSH_STEPS - 1
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "decode"}))
    runner.sample_tokens(None)
    assert not STATE.deferred  # the 32nd step recorded them, in the worker's own thread
    n = 3 + steps.FLUSH_STEPS
    m = metrics.points()
    assert m[EXECUTE] == {key(**dec): (n, 0.375 * n, counts(S, b9=n))}
    assert m[NPU_FORWARD] == {key(**dec): (n, 0.25 * n, counts(S, b8=n))}
    assert m[NON_FORWARD] == {key(**dec): (n, 0.25 * n, counts(S, b8=n))}


def test_a_step_whose_sample_tokens_raised_records_its_execute_model_time_only(metrics, clock, utils):
    STATE.device = None
    runner = instrumented_runner()(clock, utils)
    runner.plan = {"forward": 0.25, "result": None}  # no "sample": sample_tokens raises KeyError
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "prefill"}))
    with pytest.raises(KeyError):
        runner.sample_tokens(None)
    assert STATE.worker_step is None
    m = metrics.points()
    assert m[EXECUTE] == {key(**step("prefill")): (1, 0.25, counts(S, b8=1))}
    assert INFERENCE not in m and NPU_FORWARD not in m


def test_a_step_left_without_sample_tokens_records_its_execute_model_time_when_the_next_begins(metrics, clock, utils):
    """execute_model returned None but the next execute_model came first (no sample_tokens): the left step's
    execute_model time is recorded once, with its own phase; the next step is whole."""
    STATE.device = None
    runner = instrumented_runner()(clock, utils)
    runner.plan = {"forward": 0.25, "result": None, "sample": 0.125}
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "prefill"}))
    runner.plan = {"forward": 0.5, "result": None, "sample": 0.125}
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "decode"}))
    runner.sample_tokens(None)
    m = metrics.points()
    assert m[EXECUTE] == {
        key(**step("prefill")): (1, 0.25, counts(S, b8=1)),
        key(**step("decode")): (1, 0.5, counts(S, b9=1)),
    }
    assert m[INFERENCE] == {key(**step("decode")): (1, 0.625, counts(S, b10=1))}


def test_deferred_calls_of_each_function_are_handed_over_together_however_they_interleave(metrics):
    """An in-process worker's step records interleave with the scheduler's in one queue: each function with
    ``many`` gets all its waiting calls at once, oldest first."""
    seen = []

    def other(value):
        seen.append([value])

    other.many = lambda calls: seen.append([args[0] for args in calls])
    labels = context.step_labels("decode")
    for i in range(3):
        recording.defer(other, i)
        model_runner._later(labels, 0.25, None, None, None)
    recording.run_deferred()
    assert seen == [[0, 1, 2]]
    assert metrics.points()[EXECUTE] == {key(**step("decode")): (3, 0.75, counts(S, b8=3))}


def test_with_the_scope_histogram_off_untimed_scopes_share_one_nullcontext_and_timed_ones_only_mark_the_step(
    monkeypatch, metrics, clock
):
    """The default set: the forward / post-processing / sample scopes mark the worker step's timeline (its
    forward and kernel-launch times come out exact) and record no scope series; any other scope gets one
    shared nullcontext — vLLM's own choice, without a new object per block."""
    from opentelemetry_instrumentation_vllm_ascend import environment
    from tests.conftest import fake_utils

    monkeypatch.delenv(environment.ENABLED_METRICS, raising=False)
    module = fake_utils()
    patch = scopes.ProfilerScopes().install(module)
    try:
        factory = module._PROFILER_FUNC
        assert factory("gpu_model_runner: preprocess") is factory("gpu_model_runner: bookkeep")
        assert type(factory(FORWARD)) is scopes._TimelineScope
        STATE.device = None
        runner = instrumented_runner()(clock, module)
        runner.plan = {"prepare": 0.0625, "forward": 0.25, "post": 0.125, "result": None, "sample": 0.25}
        runner.execute_model(NS(**{PHASE_ATTRIBUTE: "decode"}))
        runner.sample_tokens(None)
    finally:
        patch.remove()
    m, dec = metrics.points(), step("decode")
    assert SCOPES not in m
    assert m[NPU_FORWARD] == {key(**dec): (1, 0.25, counts(S, b8=1))}
    assert m[LAUNCH] == {key(**dec): (1, 0.375, counts(S, b9=1))}
    assert m[INFERENCE] == {key(**dec): (1, 0.6875, counts(S, b10=1))}
