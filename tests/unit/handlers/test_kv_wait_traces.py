"""Request traces' KV-load waits (docs/traces.md, ``kv_load_wait``): the EngineCore's notes
(``handlers/traces.py:KvFetchStage`` on one real vLLM Scheduler with a real KV connector, ``AsyncLoadConnector``,
driven through ``schedule`` / ``update_from_output``), carried back on the real EngineCoreOutputs' ``trace_headers``
into a real OutputProcessor, built into spans by the real pipeline (``recording/traces.py``). Oracles: the
EngineCore's own event timestamps and vLLM's PrefillStats of the same request, and hand-computed values."""

from __future__ import annotations

import logging
import time

import pytest

from opentelemetry_instrumentation_vllm_ascend import environment
from opentelemetry_instrumentation_vllm_ascend.handlers import kv_transfer, traces
from opentelemetry_instrumentation_vllm_ascend.recording import control, journeys
from opentelemetry_instrumentation_vllm_ascend.recording.journeys import KV_WAIT_KEY, MAX_KV_MARKS, kv_waits
from opentelemetry_instrumentation_vllm_ascend.state import STATE
from tests.unit.handlers import test_traces as base

pytest.importorskip("vllm")

# The request-trace fixtures (the trace rows' hooks, the metrics pipeline, TRACKER exporting in memory).
hooks, metrics, tracked = base.hooks, base.metrics, base.tracked
Q, S = base.Q, base.S

from vllm.v1.engine import EngineCoreEvent, EngineCoreOutput, FinishReason  # noqa: E402
from vllm.v1.engine.output_processor import OutputProcessor  # noqa: E402
from vllm.v1.metrics.stats import KV_FETCH_COMPLETED_WAITING, KV_FETCH_IN_PROGRESS, KV_FETCH_STAGES  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

from tests.support.async_load_connector import LOADED, build_scheduler, engine_request  # noqa: E402
from tests.support.real_scheduler_run import model_output  # noqa: E402


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from opentelemetry_instrumentation_vllm_ascend.cli.demo import tiny_model

    return tiny_model.build(str(tmp_path_factory.mktemp("tiny-llama")))


def drive(scheduler, processor, ids):
    """Add ``ids`` to the scheduler and the OutputProcessor; schedule; report every load received; run until all
    finished, feeding each step's outputs to the processor (as the API server's output loop does)."""
    for request_id in ids:
        ecr = engine_request(request_id)
        processor.add_request(ecr, None)
        scheduler.add_request(Request.from_engine_core_request(ecr, None))
    waiting = {}
    for _ in range(12):
        out = scheduler.schedule()
        runner = model_output(scheduler, out)
        loading = {r for r, q in scheduler.requests.items() if q.status == RequestStatus.WAITING_FOR_REMOTE_KVS}
        for request_id in loading:
            waiting.setdefault(request_id, scheduler.requests[request_id])
        if loading:
            runner.kv_connector_output = KVConnectorOutput(finished_recving=set(loading))
        for outputs in scheduler.update_from_output(out, runner).values():
            processor.process_outputs(outputs.outputs, time.monotonic(), None)
        if not scheduler.requests:
            break
    return waiting


def test_an_async_load_is_a_kv_load_wait_span_inside_queued_ending_at_scheduled(tracked, model, monkeypatch):
    """One request the connector loads asynchronously, one it does not: the first has one ``kv_load_wait`` span,
    from the load's start to the SCHEDULED that took it in (the EngineCore's own event), its ``loaded`` event
    between, inside ``queued``, with vLLM's count of loaded tokens; the second has none."""
    tracing, exporter = tracked()
    scheduler = build_scheduler(model)
    assert traces.watch_kv_loads(scheduler)
    processor = OutputProcessor(None, log_stats=True)
    seen: dict = {}
    original = processor.process_outputs  # bound: the hooked method

    def keep(outputs, *rest):  # what the EngineCore sent: the oracle's event timestamps
        for output in outputs:
            seen.setdefault(output.request_id, []).append(output)
        return original(outputs, *rest)

    processor.process_outputs = keep
    waiting = drive(scheduler, processor, ["cmpl-load-a1", "cmpl-plain-b2"])
    assert list(waiting) == ["cmpl-load-a1"]
    tracing.flush()
    spans = exporter.get_finished_spans()
    by_trace: dict = {}
    for span in spans:
        by_trace.setdefault(span.context.trace_id, []).append(span)
    roots = {s.attributes["gen_ai.request.id"]: s for s in spans if s.parent is None}
    loading = {s.name: s for s in by_trace[roots["cmpl-load"].context.trace_id]}
    plain = [s.name for s in by_trace[roots["cmpl-plain"].context.trace_id]]
    assert "kv_load_wait" not in plain and "queued" in plain

    first = seen["cmpl-load-a1"][0]
    start, loaded = (float(note[1:]) for note in first.trace_headers[KV_WAIT_KEY].rstrip(";").split(";"))
    queued_ts = next(e.timestamp for e in first.events if e.type == Q)
    scheduled_ts = next(e.timestamp for e in first.events if e.type == S)
    assert queued_ts < start < loaded < scheduled_ts
    wait, queued = loading["kv_load_wait"], loading["queued"]
    offset = queued.start_time - round(queued_ts * 1e9)  # the export's wall - monotonic offset
    assert wait.start_time == round(start * 1e9) + offset
    assert wait.end_time == round(scheduled_ts * 1e9) + offset == queued.end_time
    assert queued.start_time <= wait.start_time and wait.end_time <= queued.end_time
    (event,) = wait.events
    assert (event.name, event.timestamp) == ("loaded", round(loaded * 1e9) + offset)
    assert dict(wait.attributes) == {"vllm.kv_transfer.loaded": True, "vllm.kv_transfer.tokens": LOADED}
    assert first.prefill_stats.num_external_cached_tokens == LOADED
    assert wait.parent.span_id == roots["cmpl-load"].context.span_id
    # vLLM's own stage accounting ran exactly as without the wrapper: every stage left when the request ran.
    assert scheduler._kv_fetch_counts == dict.fromkeys(KV_FETCH_STAGES, 0)


def test_a_synchronous_load_has_no_wait_and_counts_in_the_cached_tokens(tracked, model):
    """A load inside the step (ExampleConnector's way): the request never waits for it, so no ``kv_load_wait``; the
    loaded tokens are in ``gen_ai.usage.cache_read.input_tokens`` (vLLM's PrefillStats: local plus external; prefix
    caching is off here), the load's time in ``prefill``."""
    tracing, exporter = tracked()
    scheduler = build_scheduler(model)
    traces.watch_kv_loads(scheduler)
    processor = OutputProcessor(None, log_stats=True)
    assert drive(scheduler, processor, ["cmpl-sync-e5"]) == {}
    tracing.flush()
    spans = exporter.get_finished_spans()
    assert {s.name for s in spans} == {"text_completion tiny", "queued", "prefill", "decode"}
    (root,) = [s for s in spans if s.parent is None]
    assert root.attributes["gen_ai.usage.cache_read.input_tokens"] == LOADED


def test_a_scheduler_without_a_connector_gets_no_wrapper(model):
    scheduler = build_scheduler(model, connector=False)
    assert not traces.watch_kv_loads(scheduler)
    assert "_set_kv_fetch_stage" not in vars(scheduler)


def test_the_scheduler_init_hook_watches_only_with_traces_on(model, monkeypatch):
    for on, expected in (("false", False), ("true", True)):
        monkeypatch.setenv(environment.TRACES, on)
        scheduler = build_scheduler(model)
        kv_transfer.SchedulerInit().after(
            None, (scheduler, scheduler.vllm_config, scheduler.kv_cache_config), None, None
        )
        assert ("_set_kv_fetch_stage" in vars(scheduler)) is expected


def test_a_failing_note_is_one_log_line_and_vllm_runs_on(model, caplog):
    scheduler = build_scheduler(model)
    traces.watch_kv_loads(scheduler)
    request = Request.from_engine_core_request(engine_request("cmpl-load-c3"), None)
    request.trace_headers = 5  # not a mapping: the note cannot be made
    with caplog.at_level(logging.WARNING):
        scheduler._set_kv_fetch_stage(request, KV_FETCH_IN_PROGRESS)
        scheduler._set_kv_fetch_stage(request, KV_FETCH_COMPLETED_WAITING)
    assert scheduler._kv_fetch_counts[KV_FETCH_COMPLETED_WAITING] == 1  # vLLM's part ran, once per call
    assert scheduler._kv_fetch_counts[KV_FETCH_IN_PROGRESS] == 0
    assert STATE.failures == {("Scheduler._set_kv_fetch_stage", "after"): 2}
    assert len([r for r in caplog.records if "_set_kv_fetch_stage" in r.getMessage()]) == 1
    assert request.trace_headers == 5


def test_notes_keep_other_headers_stop_at_the_cap_and_stop_with_runtime_control(model):
    scheduler = build_scheduler(model)
    traces.watch_kv_loads(scheduler)
    request = Request.from_engine_core_request(engine_request("cmpl-load-d4"), None)
    inbound = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    request.trace_headers = inbound
    before = time.monotonic()
    scheduler._set_kv_fetch_stage(request, KV_FETCH_IN_PROGRESS)
    after = time.monotonic()
    assert inbound == {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}  # not changed
    assert request.trace_headers["traceparent"] == inbound["traceparent"]
    ((start, loaded),) = kv_waits(request.trace_headers[KV_WAIT_KEY])
    assert before <= start <= after and loaded is None
    for _ in range(MAX_KV_MARKS):
        scheduler._set_kv_fetch_stage(request, KV_FETCH_COMPLETED_WAITING)
    assert request.trace_headers[KV_WAIT_KEY].count(";") == MAX_KV_MARKS
    control.set_state(False)
    try:
        request.trace_headers = None
        scheduler._set_kv_fetch_stage(request, KV_FETCH_IN_PROGRESS)
        assert request.trace_headers is None
    finally:
        control.set_state(True)


def test_kv_waits_parse_hand_written_notes():
    assert kv_waits("s1.5;l2.25;s3.0;l3.5;s4;") == [(1.5, 2.25), (3.0, 3.5), (4.0, None)]
    assert kv_waits("l1;s2;x3;sabc;;l2.5;l9;") == [(2.0, 2.5)]  # a loaded without a start, junk: skipped
    assert kv_waits(None) == [] and kv_waits("") == []


def _output(request_id, ts_events, notes=None, reason=None, tokens=1):
    return EngineCoreOutput(
        request_id=request_id,
        new_token_ids=list(range(tokens)),
        events=[EngineCoreEvent(kind, ts) for kind, ts in ts_events] or None,
        finish_reason=reason,
        trace_headers={KV_WAIT_KEY: notes} if notes is not None else None,
    )


def test_a_wait_after_a_preemption_is_a_second_span_and_an_unfinished_one_ends_with_the_request(tracked):
    """Hand-written notes and events (seconds from t): a load 0.125-0.25 (loaded 0.1875) before the first
    SCHEDULED at 0.25; preempted at 0.375, a second load 0.4375-0.5625 (loaded 0.5) before the resume at 0.625.
    A second request's load never ends (no SCHEDULED after it; vLLM failed the request): its span ends with the
    request, not loaded."""
    from vllm.v1.engine import EngineCoreEventType

    tracing, exporter = tracked()
    processor = OutputProcessor(None, log_stats=True)
    t = time.monotonic() - 1.0
    P = EngineCoreEventType.PREEMPTED
    ids = ("cmpl-1-aa", "cmpl-2-bb")
    for request_id in ids:
        processor.add_request(engine_request(request_id), None)
    first = f"s{t + 0.125!r};l{t + 0.1875!r};"
    both = f"{first}s{t + 0.4375!r};l{t + 0.5!r};"
    processor.process_outputs([_output(ids[0], [(Q, t), (S, t + 0.25)], first)], t + 0.3125, None)
    processor.process_outputs([_output(ids[0], [(P, t + 0.375), (S, t + 0.625)], both)], t + 0.6875, None)
    processor.process_outputs([_output(ids[0], [], both, FinishReason.LENGTH)], t + 0.75, None)
    processor.process_outputs(
        [_output(ids[1], [(Q, t)], f"s{t + 0.0625!r};", FinishReason.ERROR, tokens=0)], t + 0.8125, None
    )
    tracing.flush()
    spans = exporter.get_finished_spans()
    roots = {s.attributes["gen_ai.request.id"]: s for s in spans if s.parent is None}

    def of(request):
        root = roots[request]
        return sorted(
            (s for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id),
            key=lambda s: (s.start_time, s.name),
        )

    kids = of("cmpl-1")
    queued = next(s for s in kids if s.name == "queued")
    offset = queued.start_time - round(t * 1e9)
    waits = [
        (
            (s.start_time - offset) / 1e9 - t,
            (s.end_time - offset) / 1e9 - t,
            [(e.timestamp - offset) / 1e9 - t for e in s.events],
            dict(s.attributes),
        )
        for s in kids
        if s.name == "kv_load_wait"
    ]
    rounded = [(round(a, 6), round(b, 6), [round(x, 6) for x in e], attrs) for a, b, e, attrs in waits]
    assert rounded == [
        (0.125, 0.25, [0.1875], {"vllm.kv_transfer.loaded": True}),
        (0.4375, 0.625, [0.5], {"vllm.kv_transfer.loaded": True}),
    ]
    (preempted,) = [s for s in kids if s.name == "preempted"]
    second = [s for s in kids if s.name == "kv_load_wait"][1]
    assert preempted.start_time < second.start_time and second.end_time == preempted.end_time  # inside it
    (unfinished,) = [s for s in of("cmpl-2") if s.name == "kv_load_wait"]
    assert unfinished.end_time == roots["cmpl-2"].end_time and not unfinished.events
    assert dict(unfinished.attributes) == {"vllm.kv_transfer.loaded": False}
    assert journeys.MAX_KV_MARKS == MAX_KV_MARKS
