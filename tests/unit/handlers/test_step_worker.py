"""The worker's part of a step record and of a step trace (docs/steps.md: ``worker``, ``kv_transfer``,
``gap_before_s``; recording/step_fields.py): a worker step run through the real model runner hooks (execute_model,
the profiling scopes, sample_tokens) between the scheduler hooks' own record code (``_keep_step``,
``UpdateFromOutput``), with a KV transfer recorded inside its forward, on one injected clock advanced by exact
binary fractions. Oracles: the hand-computed plan, and the worker budget's own seconds (``budget.WORKER``) over the
same step; a reply from another host's clock keeps the stage seconds and drops what needs one clock."""

from __future__ import annotations

import pickle
import threading
from types import SimpleNamespace as NS

import pytest

from opentelemetry_instrumentation_vllm_ascend import environment
from opentelemetry_instrumentation_vllm_ascend.catalogue import WORKER_STAGES
from opentelemetry_instrumentation_vllm_ascend.handlers import budget, kv_transfer, model_runner, steps
from opentelemetry_instrumentation_vllm_ascend.handlers.steps import PHASE_ATTRIBUTE
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import SYNC, SYNC_TIMER, wrap
from opentelemetry_instrumentation_vllm_ascend.recording import step_records
from opentelemetry_instrumentation_vllm_ascend.recording.step_records import EXTENSION
from opentelemetry_instrumentation_vllm_ascend.state import STATE
from tests.unit.recording import test_step_traces as traced

env = traced.env  # step traces on, into an in-memory span exporter

FORWARD, POST, SAMPLE = "gpu_model_runner: forward", "gpu_model_runner: postprocess", "gpu_model_runner: sample"
KV_BYTES = 4096


class Runner:
    """GPUModelRunner's shape, with ExampleConnector's synchronous save inside the forward (``kv``: seconds into
    the forward when it returns, after blocking 0.125 s)."""

    def __init__(self, clock, utils, reply):
        self.clock, self.utils, self.reply = clock, utils, reply

    def execute_model(self, scheduler_output, intermediate_tensors=None):
        clock, scope = self.clock, self.utils.record_function_or_nullcontext
        clock.t += 0.0625  # prepare inputs
        with scope(FORWARD):
            clock.t += 0.25
            kv_transfer.record_transfer("d2h", "ExampleConnector", KV_BYTES, 2, 0.125, 0.125)
        with scope(POST):
            clock.t += 0.125
        return None

    def sample_tokens(self, grammar_output):
        with self.utils.record_function_or_nullcontext(SAMPLE):
            self.clock.t += 0.25
        return self.reply


def instrumented(clock, utils, reply):
    cls = type(
        "InstrumentedRunner",
        (Runner,),
        {
            "execute_model": wrap(Runner.execute_model, model_runner.ExecuteModel(), SYNC)[0],
            "sample_tokens": wrap(Runner.sample_tokens, model_runner.SampleTokens(), SYNC)[0],
        },
    )
    return cls(clock, utils, reply)


@pytest.fixture
def stream(env, metrics, clock, utils, monkeypatch):
    monkeypatch, _exporter = env
    monkeypatch.setattr(kv_transfer, "perf_counter", clock)
    monkeypatch.setenv(environment.STEP_TRACES_THRESHOLD_MS, "100")  # every step of this plan is kept (1.0625 s)
    STATE.device = None  # the host timeline
    stream = step_records.configure()
    stream.started = True  # no background thread: the test drains
    yield stream


def one_step(stream, clock, utils, counter: int, runner_reply=None, scheduler=None):
    """Schedule 0.0625 s, dispatch 0.0625 s, the worker step (prepare 0.0625, forward 0.25, post-processing
    0.125, wait for sample_tokens 0.125, sample 0.25), the reply's way back 0.0625 s, update 0.0625 s. Returns
    (update_from_output's outputs, the worker's reply, the worker budget's seconds over the step)."""
    scheduler = scheduler or traced._scheduler()
    output = traced._output(new=counter == 1)
    reply = NS() if runner_reply is None else runner_reply
    runner = instrumented(clock, utils, reply)
    before = list(budget.WORKER.totals(clock.t))
    start = clock.t
    traced._keep_step(stream, output, scheduler, counter, start, start + 0.0625, steps.Step(), ("decode", 0, 0, 3, 3),
                      (3, 0, 0, 3), (16, 10))  # fmt: skip
    clock.t += 0.125
    assert runner.execute_model(NS(**{PHASE_ATTRIBUTE: "decode"})) is None
    clock.t += 0.125
    assert runner.sample_tokens(None) is reply
    spent = [a - b for a, b in zip(budget.WORKER.totals(clock.t), before)]
    clock.t += 0.0625
    update_start = clock.t
    clock.t += 0.0625
    result = {0: NS(outputs=[])}
    traced.UPDATE.after(update_start, (scheduler, output, reply), {}, result)
    return result, reply, spent


def test_the_record_has_the_workers_stages_its_kv_transfers_and_the_host_gaps(stream, clock, utils):
    _, reply, spent = one_step(stream, clock, utils, 1)
    clock.t += 0.5  # the engine's loop between two steps
    one_step(stream, clock, utils, 2)
    first, second = (stream.build(*item) for item in list(stream.queue))
    ours = first[EXTENSION]
    stages = {"prepare_inputs_s": 0.0625, "forward_s": 0.25, "wait_sample_s": 0.125, "sample_s": 0.25, "other_s": 0.125}
    assert ours["worker"] == {"rank": None, **stages, "dispatch_s": 0.0625, "reply_s": 0.0625}
    # The worker budget's own seconds over the same step, stage for stage (idle: before the step began).
    assert {f"{n}_s": s for n, s in zip(WORKER_STAGES, spent) if n != "idle"} == stages
    assert ours["kv_transfer"] == {"d2h": {"bytes": KV_BYTES, "transfers": 2, "blocking_s": 0.125}}
    # The parts tile the engine's execute wait: dispatch + the worker's step + the reply's way back.
    assert ours["execute_s"] == 0.0625 + sum(stages.values()) + 0.0625
    assert ours["gap_before_s"] is None and second[EXTENSION]["gap_before_s"] == 0.5
    assert second[EXTENSION]["worker"] == ours["worker"]


def test_a_reply_from_another_clock_keeps_the_stage_seconds_not_the_gaps_nor_the_worker_spans(stream, clock, utils):
    """A worker on another host (its ``HOST_CLOCK`` differs; the reply travels pickled): its seconds per stage are
    its own clock's differences, still true; dispatch and reply would subtract two clocks: None; no worker span."""
    _, reply, _ = one_step(stream, clock, utils, 1)
    stamp = getattr(reply, steps.READY_ATTRIBUTE)
    remote = pickle.loads(pickle.dumps(NS(**{steps.READY_ATTRIBUTE: ("another-host",) + stamp[1:]})))
    item = stream.queue.popleft()
    record = stream.build(item[0], item[1], item[2], getattr(remote, steps.READY_ATTRIBUTE), item[4])
    worker = record[EXTENSION]["worker"]
    assert (worker["forward_s"], worker["sample_s"], worker["dispatch_s"], worker["reply_s"]) == (
        0.25,
        0.25,
        None,
        None,
    )
    found = traced._exported(stream, traced_exporter(stream))
    (root,) = traced._roots(found)
    assert {s.name for s in found[root.context.trace_id]} == {"engine_step", "schedule", "execute", "update"}


def traced_exporter(stream):
    from opentelemetry_instrumentation_vllm_ascend.recording import traces

    return traces.tracing().exporters[0]


def test_a_kept_steps_trace_has_the_workers_stages_and_its_blocking_kv_transfer_under_execute(stream, clock, utils):
    one_step(stream, clock, utils, 1)
    found = traced._exported(stream, traced_exporter(stream))
    (root,) = traced._roots(found)
    spans = found[root.context.trace_id]
    by_name: dict = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    (execute,), (worker,) = by_name["execute"], by_name["worker_step"]
    assert worker.parent.span_id == execute.context.span_id
    children = sorted((s for s in spans if s.parent is not None and s.parent.span_id == worker.context.span_id),
                      key=lambda s: (s.start_time, s.name))  # fmt: skip
    # On the record's clock: the step's first boundary is 0.125 s after schedule() began.
    t0 = root.start_time + 125_000_000
    ms = 1_000_000
    got = [(s.name, round((s.start_time - t0) / ms, 3), round((s.end_time - t0) / ms, 3)) for s in children]
    assert got == [
        ("prepare_inputs", 0.0, 62.5),
        ("forward", 62.5, 312.5),
        ("kv_transfer", 187.5, 312.5),
        ("other", 312.5, 437.5),
        ("wait_sample", 437.5, 562.5),
        ("sample", 562.5, 812.5),
    ]  # (no zero-length stage: sample_tokens enters its sample scope at once here)
    assert (worker.start_time, worker.end_time) == (children[0].start_time, children[-1].end_time)
    (kv,) = by_name["kv_transfer"]
    assert dict(kv.attributes) == {
        "vllm.kv.direction": "d2h",
        "vllm.kv.connector": "ExampleConnector",
        "vllm.kv.bytes": KV_BYTES,
    }
    assert execute.start_time <= worker.start_time and worker.end_time <= execute.end_time


def test_with_no_step_record_on_the_worker_notes_nothing_and_stamps_as_before(metrics, clock, utils):
    STATE.device = None
    assert STATE.step_stream is None
    reply = NS()
    runner = instrumented(clock, utils, reply)
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "decode"}))
    assert STATE.worker_step.marks is None
    runner.sample_tokens(None)
    assert len(getattr(reply, steps.READY_ATTRIBUTE)) == 3


def test_an_async_output_carries_its_steps_part_to_the_reply_get_output_builds(stream, clock, utils):
    """Async scheduling: sample_tokens returns an async output; the output thread's get_output stamps the reply it
    builds with the step's part (its marks), as the synchronous reply has it."""
    from tests.unit.handlers.test_model_runner import AsyncOutput

    built = NS()
    pending = AsyncOutput(clock, 0.5, built)
    runner = instrumented(clock, utils, pending)
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "decode"}))
    step = STATE.worker_step
    assert runner.sample_tokens(None) is pending
    get_output = wrap(AsyncOutput.get_output, model_runner.GetOutput(), SYNC_TIMER)[0]
    thread = threading.Thread(target=get_output, args=(pending,))
    thread.start()
    thread.join(10)
    stamp = getattr(built, steps.READY_ATTRIBUTE)
    assert stamp[3] == (None, step.marks, step.kv) and len(step.marks) == 16
