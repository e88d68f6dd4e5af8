"""Slow-step traces (recording/step_traces.py, recording/step_spans.py), through the scheduler hooks' own record
code (``handlers.scheduler._keep_step`` / ``UpdateFromOutput``) and the executor hook's failure path, into the
real OTel SDK's InMemorySpanExporter: which steps each rule keeps, the spans of a kept step (they tile its wall
time, as its record says), its links to the request spans its requests brought, and the notes that link back."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from opentelemetry_instrumentation_vllm_ascend import environment
from opentelemetry_instrumentation_vllm_ascend.handlers import executor
from opentelemetry_instrumentation_vllm_ascend.handlers.scheduler import UpdateFromOutput, _keep_step
from opentelemetry_instrumentation_vllm_ascend.handlers.steps import Step
from opentelemetry_instrumentation_vllm_ascend.recording import step_records, step_traces, traces
from opentelemetry_instrumentation_vllm_ascend.recording.step_records import EXTENSION
from opentelemetry_instrumentation_vllm_ascend.recording.step_traces import REQUEST_KEY, STEP_KEY, decode, encode

UPDATE = UpdateFromOutput()
IDS = ["r0", "r1", "r2"]
#: The request spans the API server sent for each request (trace id, span id).
SPANS = {rid: (0x1000 + i, 0x2000 + i) for i, rid in enumerate(IDS)}


@pytest.fixture
def env(monkeypatch):
    for name in (environment.STEPS_ZMQ, environment.STEPS_FILE, environment.STEPS_OTLP_LOGS):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(environment.STEP_TRACES, "true")
    monkeypatch.setenv(environment.STEP_TRACES_P99_FACTOR, "0")
    monkeypatch.setenv(environment.STEP_TRACES_PER_S, "1000")
    exporter = InMemorySpanExporter()
    traces.install(traces.Tracing(exporters=[exporter], resource=Resource.create({"service.name": "t"})))
    yield monkeypatch, exporter
    step_records.close()
    traces.install(None)


def _scheduler():
    requests = {
        rid: SimpleNamespace(num_prompt_tokens=8, trace_headers={REQUEST_KEY: encode(*SPANS[rid])}) for rid in IDS
    }
    return SimpleNamespace(requests=requests, waiting=[])


def _output(new: bool):
    """The three requests: new (8-token prompts, all scheduled), or decoding one token each."""
    if new:
        news = [SimpleNamespace(req_id=rid, prompt_token_ids=[1] * 8, num_computed_tokens=0) for rid in IDS]
        cached = SimpleNamespace(req_ids=[], num_computed_tokens=[], num_output_tokens=[])
        tokens = dict.fromkeys(IDS, 8)
    else:
        news = []
        cached = SimpleNamespace(req_ids=IDS, num_computed_tokens=[9] * 3, num_output_tokens=[1] * 3)
        tokens = dict.fromkeys(IDS, 1)
    return SimpleNamespace(
        num_scheduled_tokens=tokens,
        total_num_scheduled_tokens=sum(tokens.values()),
        scheduled_new_reqs=news,
        scheduled_cached_reqs=cached,
        finished_req_ids=set(),
    )


def _step(stream, scheduler, counter, seconds, new=False, preemptions=0, with_output=("r0", "r1")):
    """One step of ``seconds`` through both hooks' record code; returns update_from_output's outputs."""
    output = _output(new)
    step = Step()
    step.preemptions = preemptions
    start = time.perf_counter() - seconds
    phase = ("prefill", 3, 24, 0, 0) if new else ("decode", 0, 0, 3, 3)
    _keep_step(stream, output, scheduler, counter, start, start + seconds / 4, step, phase, (3, 0, 0, 3), (16, 10))
    outs = [SimpleNamespace(request_id=rid, trace_headers=scheduler.requests[rid].trace_headers) for rid in with_output]
    result = {0: SimpleNamespace(outputs=outs)}
    UPDATE.after(time.perf_counter(), (scheduler, output, None), {}, result)
    return result


def _exported(stream, exporter) -> dict:
    stream.drain()
    traces.tracing().flush()
    out: dict = {}
    for span in exporter.get_finished_spans():
        out.setdefault(span.context.trace_id, []).append(span)
    return out


def _roots(found: dict) -> list:
    return [span for spans in found.values() for span in spans if span.name == "engine_step"]


def test_a_step_over_the_threshold_is_a_trace_linked_both_ways(env):
    monkeypatch, exporter = env
    monkeypatch.setenv(environment.STEP_TRACES_THRESHOLD_MS, "100")
    stream = step_records.configure()
    stream.started = True  # no background thread: the test drains
    scheduler = _scheduler()
    _step(stream, scheduler, 1, 0.001, new=True)  # fast: not kept
    assert _exported(stream, exporter) == {}
    # The requests' span ids were taken out of their headers (no later output carries them).
    assert all(scheduler.requests[rid].trace_headers is None for rid in IDS)
    result = _step(stream, scheduler, 2, 0.25)  # slow; r2 produced no output this step
    found = _exported(stream, exporter)
    (root,) = _roots(found)
    spans = {s.name: s for s in found[root.context.trace_id]}
    assert set(spans) == {"engine_step", "schedule", "execute", "update"}
    schedule, execute, update = spans["schedule"], spans["execute"], spans["update"]
    assert all(s.parent.span_id == root.context.span_id for s in (schedule, execute, update))
    assert root.parent is None
    # The children tile the step, as its record's parts do (rounding: a nanosecond each).
    assert schedule.start_time == root.start_time
    assert schedule.end_time == execute.start_time and execute.end_time == update.start_time
    assert abs(update.end_time - root.end_time) <= 3
    assert 0.25e9 <= root.end_time - root.start_time < 0.35e9
    assert abs((schedule.end_time - schedule.start_time) - 0.0625e9) < 1e3
    a = root.attributes
    assert a["vllm.trace.kept_by"] == "threshold" and a["vllm.step"] == 2 and a["vllm.step.phase"] == "decode"
    assert (a["vllm.step.requests"], a["vllm.step.decode_requests"], a["vllm.step.decode_tokens"]) == (3, 3, 3)
    assert (a["vllm.step.kv_blocks_free"], a["vllm.step.kv_blocks_used"]) == (10, 5)
    # Links to the request spans of the three requests it carried.
    assert {(li.context.trace_id, li.context.span_id): li.attributes["vllm.request.id"] for li in root.links} == {
        SPANS[rid]: rid for rid in IDS
    }
    # And back: the outputs it produced, and the request that produced none (its next output carries it).
    note = encode(root.context.trace_id, root.context.span_id)
    assert [o.trace_headers[STEP_KEY] for o in result[0].outputs] == [note, note]
    assert scheduler.requests["r2"].trace_headers == {STEP_KEY: note}
    assert scheduler.requests["r0"].trace_headers is None  # its output got a copy: later ones stay small


def test_preemptions_errors_and_the_rate_limit(env):
    monkeypatch, exporter = env
    monkeypatch.setenv(environment.STEP_TRACES_PER_S, "2")
    stream = step_records.configure()
    stream.started = True
    scheduler = _scheduler()
    _step(stream, scheduler, 1, 0.001, new=True)
    for counter in range(2, 7):  # five preempting steps in one second: two kept
        _step(stream, scheduler, counter, 0.001, preemptions=1)
    kept = _roots(_exported(stream, exporter))
    assert sorted(s.attributes["vllm.step"] for s in kept) == [2, 3]
    assert {s.attributes["vllm.trace.kept_by"] for s in kept} == {"preempted"}
    assert [s.attributes["vllm.step.preemptions"] for s in kept] == [1, 1]
    assert stream.tracer.rate_limited == 3


def test_a_failed_executor_call_ends_its_step_in_an_error_trace(env):
    _monkeypatch, exporter = env
    stream = step_records.configure()
    stream.started = True
    scheduler = _scheduler()
    _step(stream, scheduler, 1, 0.001, new=True)
    output = _output(False)
    _keep_step(stream, output, scheduler, 2, time.perf_counter(), time.perf_counter(), Step(), None, None, None)
    executor._count(("0", "mixed", "decode"), TimeoutError(), step=True)
    assert not stream.pending
    records: list = []
    stream.sinks.append(SimpleNamespace(send=records.append, close=lambda timeout_ms: None))
    (root,) = _roots(_exported(stream, exporter))
    assert root.attributes["vllm.trace.kept_by"] == "error" and root.attributes["error.type"] == "timeout"
    assert root.status.status_code is StatusCode.ERROR
    assert [r[EXTENSION].get("error") for r in records] == [None, "timeout"]  # the first step's, the failed one's
    assert records[1][EXTENSION]["update_s"] == 0.0


def test_the_p99_rule_follows_the_recent_steps(env):
    monkeypatch, exporter = env
    monkeypatch.setenv(environment.STEP_TRACES_P99_FACTOR, "3")
    stream = step_records.configure()
    stream.started = True
    scheduler = _scheduler()
    _step(stream, scheduler, 0, 0.001, new=True)
    assert stream.tracer.slow_s == float("inf")  # fewer than MIN_STEPS steps: no p99 yet
    for counter in range(1, step_traces.MIN_STEPS):
        _step(stream, scheduler, counter, 0.01)
    assert _roots(_exported(stream, exporter)) == []
    assert 0.03 <= stream.tracer.slow_s < 0.04  # 3 x p99 of ~10 ms steps
    _step(stream, scheduler, 200, 0.02)  # 2 x: not kept
    _step(stream, scheduler, 201, 0.05)  # 5 x: kept
    (root,) = _roots(_exported(stream, exporter))
    assert root.attributes["vllm.step"] == 201 and root.attributes["vllm.trace.kept_by"] == "p99"


def test_off_there_is_no_tracer_and_no_stream(env):
    monkeypatch, _exporter = env
    monkeypatch.delenv(environment.STEP_TRACES)
    assert step_records.configure() is None


def test_the_notes_round_trip():
    assert decode(encode(5, 7)) == (5, 7)
    assert decode("nonsense") is None and decode(None) is None and decode(encode(0, 7)) is None
    value = ""
    for i in range(1, 12):
        value = step_traces.with_step({STEP_KEY: value} if value else None, encode(i, i))[STEP_KEY]
    assert step_traces.decode_all(value) == [(i, i) for i in range(4, 12)]  # the last MAX_STEP_LINKS
