"""Request traces (handlers/traces.py, recording/traces.py) on a real vLLM OutputProcessor fed real EngineCoreRequests
and EngineCoreOutputs (with real EngineCoreEvents), through the real wrappers, into the real OTel SDK's
InMemorySpanExporter. The oracle is vLLM's own accounting of the same requests: its RequestStateStats, its
FinishedRequestStats and the per-request metrics it would return (``build_per_request_timing_metrics``)."""

from __future__ import annotations

import time
from types import SimpleNamespace as NS

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind, StatusCode
from packaging.version import Version

from opentelemetry_instrumentation_vllm_ascend import catalogue, context, environment, supported
from opentelemetry_instrumentation_vllm_ascend.handlers import api, traces
from opentelemetry_instrumentation_vllm_ascend.hooks.patches import patch_method
from opentelemetry_instrumentation_vllm_ascend.kinds import SYNC
from opentelemetry_instrumentation_vllm_ascend.recording import otlp, pipeline
from opentelemetry_instrumentation_vllm_ascend.recording import traces as recording_traces
from opentelemetry_instrumentation_vllm_ascend.state import STATE
from tests.conftest import Metrics
from tests.support.process import set_process

pytest.importorskip("vllm")

from vllm.entrypoints.generate.base.serving import build_per_request_timing_metrics  # noqa: E402
from vllm.sampling_params import RequestOutputKind, SamplingParams  # noqa: E402
from vllm.v1.engine import (  # noqa: E402
    EngineCoreEvent,
    EngineCoreEventType,
    EngineCoreOutput,
    EngineCoreRequest,
    FinishReason,
)
from vllm.v1.engine.output_processor import OutputProcessor  # noqa: E402
from vllm.v1.metrics.stats import IterationStats  # noqa: E402

Q, S, P = EngineCoreEventType.QUEUED, EngineCoreEventType.SCHEDULED, EngineCoreEventType.PREEMPTED
TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
PARENT_SPAN = 0xB7AD6B7169203331


@pytest.fixture
def hooks():
    """The trace rows' handlers, ProcessOutputs and FinishedRequest wrapped around the real vLLM methods."""
    patches = [
        patch_method(OutputProcessor, "process_outputs", api.ProcessOutputs(), SYNC),
        patch_method(OutputProcessor, "add_request", traces.AddRequest(), SYNC),
        patch_method(OutputProcessor, "_finish_request", traces.FinishRequest(), SYNC),
        patch_method(OutputProcessor, "abort_requests", traces.AbortRequests(), SYNC),
        patch_method(IterationStats, "update_from_finished_request", api.FinishedRequest(), SYNC),
    ]
    yield
    for patch in reversed(patches):
        setattr(patch.owner, patch.attribute, patch.original)


@pytest.fixture
def metrics(monkeypatch):
    for name in (environment.PROMETHEUS_MULTIPROC_DIR, environment.FILES_DIR, environment.METRICS_EXPORTER):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(environment.RECORDER, "fast")
    reader = InMemoryMetricReader()
    pipeline.reset(extra_readers=[reader])
    saved = (context.PROCESS.process, context.PROCESS.dp, context.PROCESS.role)
    set_process("api_server", "0", "mixed")
    api.set_served_model(NS(model_config=NS(served_model_name="tiny")))
    yield reader
    pipeline.reset()
    set_process(*saved)
    api.set_served_model(None)


def make_tracing(monkeypatch, sampler=None, **env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    exporter = InMemorySpanExporter()
    tracing = recording_traces.Tracing(
        exporters=[exporter], resource=Resource.create({"service.name": "t"}), sampler=sampler
    )
    return tracing, exporter


@pytest.fixture
def tracked(monkeypatch, metrics, hooks):
    """TRACKER on, exporting into an in-memory exporter; returns a function (re)building the pipeline."""
    tracker = traces.TRACKER
    saved = (tracker.on, tracker._tracing, tracker.limit)
    tracker.on, tracker.limit = True, 1000
    tracker.inflight.clear()

    def build(sampler=None, **env):
        tracing, exporter = make_tracing(monkeypatch, sampler, **env)
        tracker._tracing = tracing
        return tracing, exporter

    yield build
    tracker.on, tracker._tracing, tracker.limit = saved
    tracker.inflight.clear()
    tracker.last_finished = (None, None)
    traces.INBOUND.set(None)


def request(request_id="cmpl-7", arrival=None, headers=None, max_tokens=8):
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=0.5,
        top_p=0.875,
        detokenize=False,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )
    req = EngineCoreRequest(
        request_id=f"{request_id}-0a1b2c3d",
        prompt_token_ids=[1, 2, 3, 4, 5],
        mm_features=None,
        sampling_params=params,
        pooling_params=None,
        arrival_time=time.time() if arrival is None else arrival,
        lora_request=None,
        cache_salt=None,
        data_parallel_rank=None,
        trace_headers=headers,
    )
    req.external_req_id = request_id
    return req


def run(processor, req, steps, log_stats=True):
    """Feed ``steps``: [(engine timestamp, new tokens, events, finish reason)] as one output per step. Returns
    vLLM's RequestStateStats of the request (before it finished) and the finishing IterationStats."""
    processor.add_request(req, None)
    stats = processor.request_states[req.request_id].stats
    iteration = None
    for timestamp, tokens, events, reason in steps:
        output = EngineCoreOutput(
            request_id=req.request_id,
            new_token_ids=list(range(tokens)),
            events=[EngineCoreEvent(kind, ts) for kind, ts in events] or None,
            finish_reason=reason,
        )
        iteration = IterationStats() if log_stats else None
        processor.process_outputs([output], timestamp, iteration)
    return stats, iteration


def spans_by_name(exporter):
    out: dict = {}
    for span in exporter.get_finished_spans():
        out.setdefault(span.name, []).append(span)
    return out


def ns(seconds):
    return seconds * 1e9


def test_spans_agree_with_vllms_own_per_request_numbers(tracked):
    tracing, exporter = tracked(sampler=ParentBased(TraceIdRatioBased(1.0)))
    processor = OutputProcessor(None, log_stats=True)
    t = time.monotonic() - 1.0  # engine times in the past, as real ones are when the request ends
    req = request()
    stats, iteration = run(
        processor,
        req,
        [
            (t + 0.125, 1, [(Q, t), (S, t + 0.0625)], None),
            (t + 0.25, 2, [], None),
            (t + 0.5, 1, [], FinishReason.LENGTH),
        ],
    )
    tracing.flush()
    by_name = spans_by_name(exporter)
    (root,) = by_name["text_completion tiny"]
    (queued,), (prefill,), (decode,) = by_name["queued"], by_name["prefill"], by_name["decode"]
    oracle = build_per_request_timing_metrics(stats, stats.num_generation_tokens)
    assert abs((queued.end_time - queued.start_time) / 1e6 - oracle.queue_time_ms) < 1e-3
    assert abs((prefill.end_time - prefill.start_time) / 1e6 - oracle.time_to_first_token_ms) < 1e-3
    assert abs((decode.end_time - decode.start_time) / 1e6 - oracle.generation_time_ms) < 1e-3
    (finished,) = iteration.finished_requests
    assert root.end_time - root.start_time == round(ns(finished.e2e_latency))
    assert root.start_time == round(ns(req.arrival_time))
    assert root.kind is SpanKind.SERVER and root.parent is None
    assert all(s.parent.span_id == root.context.span_id for s in (queued, prefill, decode))
    assert {s.context.trace_id for s in exporter.get_finished_spans()} == {root.context.trace_id}
    a = root.attributes
    assert a["gen_ai.operation.name"] == "text_completion" and a["gen_ai.provider.name"] == "vllm"
    assert a["gen_ai.request.model"] == "tiny" and a["gen_ai.request.id"] == "cmpl-7"
    assert a["gen_ai.response.finish_reasons"] == ("length",)
    assert (
        a["gen_ai.usage.input_tokens"] == 5 and a["gen_ai.usage.output_tokens"] == finished.num_generation_tokens == 4
    )
    assert (a["gen_ai.request.max_tokens"], a["gen_ai.request.temperature"], a["gen_ai.request.top_p"]) == (
        8,
        0.5,
        0.875,
    )
    assert a["gen_ai.latency.time_in_queue"] == finished.queued_time
    assert a["gen_ai.latency.time_in_model_prefill"] == finished.prefill_time
    assert a["gen_ai.latency.time_in_model_decode"] == finished.decode_time
    assert a["gen_ai.latency.time_to_first_token"] == stats.first_token_latency
    assert a["gen_ai.latency.e2e"] == finished.e2e_latency
    assert a["vllm.request.preemptions"] == 0 and "error.type" not in a
    assert [e.name for e in root.events] == ["queued", "scheduled", "first_token", "finish"]
    assert root.events[-1].attributes["gen_ai.response.finish_reasons"] == ("length",)
    assert not any("prompt" in key or "completion" in key for key in a)  # never text, never its names
    assert not traces.TRACKER.inflight


def test_each_choice_of_n_is_a_request_span_that_says_which_of_how_many(tracked):
    """n > 1: vLLM's AsyncLLM fans the request out into n engine requests (ParentRequest.get_child_info, each with
    n = 1 in its own params), registered one by one: a request span each, same gen_ai.request.id, its index and the
    client's n."""
    from vllm.v1.engine.parallel_sampling import ParentRequest

    tracing, exporter = tracked()
    processor = OutputProcessor(None, log_stats=True)
    parent = request("cmpl-9")
    parent.sampling_params.n = 3
    parent_request = ParentRequest(parent)
    t = time.monotonic() - 1.0
    for index in range(3):
        child_id, child_params = parent_request.get_child_info(index)
        child = request("cmpl-9")
        child.request_id, child.sampling_params = child_id, child_params
        processor.add_request(child, None, parent_request, index)
        output = EngineCoreOutput(
            request_id=child_id,
            new_token_ids=[7],
            events=[EngineCoreEvent(Q, t), EngineCoreEvent(S, t + 0.0625)],
            finish_reason=FinishReason.LENGTH,
        )
        processor.process_outputs([output], t + 0.125, IterationStats())
    tracing.flush()
    roots = sorted(spans_by_name(exporter)["text_completion tiny"], key=lambda s: s.attributes["vllm.request.id"])
    assert [r.attributes["vllm.request.id"] for r in roots] == [f"{i}_cmpl-9-0a1b2c3d" for i in range(3)]
    assert [r.attributes["vllm.request.choice_index"] for r in roots] == [0, 1, 2]
    assert {(r.attributes["gen_ai.request.id"], r.attributes["gen_ai.request.choice.count"]) for r in roots} == {
        ("cmpl-9", 3)
    }


def test_each_preemption_is_a_span_ending_at_its_resume(tracked):
    tracing, exporter = tracked()
    processor = OutputProcessor(None, log_stats=True)
    t = time.monotonic() - 1.0  # engine times in the past, as real ones are when the request ends
    stats, iteration = run(
        processor,
        request(),
        [
            (t + 0.25, 1, [(Q, t), (S, t + 0.125), (P, t + 0.1875), (S, t + 0.21875)], None),
            (t + 0.5, 1, [(P, t + 0.3125), (S, t + 0.375)], None),
            (t + 0.625, 1, [], FinishReason.STOP),
        ],
    )
    tracing.flush()
    by_name = spans_by_name(exporter)
    preempted = sorted(by_name["preempted"], key=lambda s: s.start_time)
    (finished,) = iteration.finished_requests
    assert len(preempted) == finished.num_preemptions == 2
    assert all(s.attributes["vllm.resumed"] is True for s in preempted)
    offset = preempted[0].start_time - round(ns(t + 0.1875))
    got = [t for s in preempted for t in (s.start_time - offset, s.end_time - offset)]
    want = [round(ns(t + x)) for x in (0.1875, 0.21875, 0.3125, 0.375)]
    assert all(abs(a - b) <= 1 for a, b in zip(got, want))
    (root,) = by_name["text_completion tiny"]
    assert root.attributes["vllm.request.preemptions"] == 2
    resumes = [e.attributes["vllm.resumed"] for e in root.events if e.name == "scheduled"]
    assert resumes == [False, True, True]
    # The prefill span runs from the first scheduling, as vLLM's prefill_time does.
    (prefill,) = by_name["prefill"]
    assert abs((prefill.end_time - prefill.start_time) / 1e9 - finished.prefill_time) < 1e-6


def test_an_inbound_traceparent_is_continued(tracked):
    tracing, exporter = tracked()
    processor = OutputProcessor(None, log_stats=True)
    header = {"traceparent": f"00-{TRACE_ID:032x}-{PARENT_SPAN:016x}-01"}
    t = time.monotonic() - 1.0  # engine times in the past, as real ones are when the request ends
    run(processor, request(headers=header), [(t, 1, [(Q, t)], FinishReason.STOP)])
    # vLLM dropped the headers (its own tracing off): the request's task kept them (BaseServing._get_trace_headers).
    traces.INBOUND.set(header)
    run(processor, request("chatcmpl-2"), [(t, 1, [(Q, t)], FinishReason.STOP)])
    tracing.flush()
    roots = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER]
    assert len(roots) == 2
    for root in roots:
        assert root.context.trace_id == TRACE_ID and root.parent.span_id == PARENT_SPAN
        assert root.parent.is_remote


def test_an_unsampled_parent_is_dropped_unless_a_tail_rule_keeps_it_as_a_linked_root(tracked):
    unsampled = {"traceparent": f"00-{TRACE_ID:032x}-{PARENT_SPAN:016x}-00"}
    tracing, exporter = tracked(**{environment.TRACES_TTFT_THRESHOLD_MS: "100"})
    processor = OutputProcessor(None, log_stats=True)
    t = time.monotonic() - 1.0  # engine times in the past, as real ones are when the request ends
    now = time.time()
    run(processor, request("cmpl-fast", arrival=now, headers=unsampled), [(t, 1, [(Q, t)], FinishReason.STOP)])
    run(processor, request("cmpl-slow", arrival=now - 0.5, headers=unsampled), [(t, 1, [(Q, t)], FinishReason.STOP)])
    tracing.flush()
    (root,) = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER]
    assert root.attributes["gen_ai.request.id"] == "cmpl-slow"
    assert root.attributes["vllm.trace.kept_by"] == "ttft"
    assert root.attributes["gen_ai.latency.time_to_first_token"] > 0.1
    assert root.parent is None and root.context.trace_id != TRACE_ID
    (link,) = root.links
    assert (link.context.trace_id, link.context.span_id) == (TRACE_ID, PARENT_SPAN)


def test_head_sampling_off_keeps_errors_aborts_and_preemptions(tracked):
    tracing, exporter = tracked(sampler=ALWAYS_OFF)
    processor = OutputProcessor(None, log_stats=True)
    t = time.monotonic() - 1.0  # engine times in the past, as real ones are when the request ends
    run(processor, request("cmpl-ok"), [(t, 1, [(Q, t), (S, t)], FinishReason.STOP)])
    run(processor, request("cmpl-err"), [(t, 0, [(Q, t)], FinishReason.ERROR)])
    run(processor, request("cmpl-pre"), [(t, 1, [(Q, t), (S, t), (P, t), (S, t)], FinishReason.STOP)])
    aborted = request("cmpl-gone")
    processor.add_request(aborted, None)
    assert processor.abort_requests([aborted.request_id], internal=True) == [aborted.request_id]
    tracing.flush()
    roots = {s.attributes["gen_ai.request.id"]: s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER}
    assert sorted(roots) == ["cmpl-err", "cmpl-gone", "cmpl-pre"]
    assert roots["cmpl-err"].attributes["error.type"] == "error"
    assert roots["cmpl-err"].status.status_code is StatusCode.ERROR
    gone = roots["cmpl-gone"]
    assert (gone.attributes["error.type"], gone.attributes["vllm.trace.kept_by"]) == ("abort", "abort")
    assert gone.attributes["gen_ai.response.finish_reasons"] == ("abort",)
    assert roots["cmpl-pre"].attributes["vllm.trace.kept_by"] == "preempted"
    # Only the requests' own spans: an aborted request that never ran has no child.
    assert [
        s.name for s in exporter.get_finished_spans() if s.parent and s.parent.span_id == gone.context.span_id
    ] == []


def test_with_step_traces_the_request_span_ids_go_to_the_engine_and_a_kept_step_links_back(tracked):
    """Slow-step traces (docs/steps.md): the request span's ids are chosen at registration and sent in the request's
    trace_headers (beside the client's traceparent); an output noting a kept step keeps the request (head sampling
    off: the tail rule ``step``), and its request span, with exactly the ids sent, links to that step."""
    from opentelemetry_instrumentation_vllm_ascend.recording import step_traces

    tracing, exporter = tracked(sampler=ALWAYS_OFF)
    tracker = traces.TRACKER
    saved, tracker.step_traces = tracker.step_traces, True
    try:
        processor = OutputProcessor(None, log_stats=True)
        t = time.monotonic() - 1.0
        parent = {"traceparent": f"00-{TRACE_ID:032x}-{PARENT_SPAN:016x}-00"}
        plain, carried = request("cmpl-plain", headers=dict(parent)), request("cmpl-carried", headers=dict(parent))
        processor.add_request(plain, None)
        processor.add_request(carried, None)
        sent = {
            r.external_req_id: step_traces.decode(r.trace_headers[step_traces.REQUEST_KEY]) for r in (plain, carried)
        }
        assert plain.trace_headers["traceparent"] == parent["traceparent"]  # the client's headers stay
        assert len({ids[1] for ids in sent.values()}) == 2 and TRACE_ID not in {ids[0] for ids in sent.values()}
        step = step_traces.encode(0xABC, 0xDEF)
        for req, headers in ((plain, None), (carried, {step_traces.STEP_KEY: step})):
            output = EngineCoreOutput(
                request_id=req.request_id,
                new_token_ids=[1],
                events=[EngineCoreEvent(Q, t)],
                finish_reason=FinishReason.STOP,
                trace_headers=headers,
            )
            processor.process_outputs([output], t + 0.1, IterationStats())
        tracing.flush()
    finally:
        tracker.step_traces = saved
    (root,) = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER]
    assert root.attributes["gen_ai.request.id"] == "cmpl-carried" and root.attributes["vllm.trace.kept_by"] == "step"
    assert (root.context.trace_id, root.context.span_id) == sent["cmpl-carried"]
    links = {(li.context.trace_id, li.context.span_id): li.attributes["vllm.trace.link"] for li in root.links}
    assert links == {(TRACE_ID, PARENT_SPAN): "unsampled parent", (0xABC, 0xDEF): "engine step"}


def test_without_log_stats_it_degrades_to_what_the_outputs_tell(tracked):
    tracing, exporter = tracked()
    processor = OutputProcessor(None, log_stats=False)
    t = time.monotonic() - 1.0  # engine times in the past, as real ones are when the request ends
    stats, _ = run(processor, request(), [(t, 1, [], None), (t + 0.25, 2, [], FinishReason.STOP)], log_stats=False)
    assert stats is None
    tracing.flush()
    by_name = spans_by_name(exporter)
    assert sorted(by_name) == ["decode", "text_completion tiny"]
    (decode,) = by_name["decode"]
    assert abs(decode.end_time - decode.start_time - ns(0.25)) < 1000
    (root,) = by_name["text_completion tiny"]
    assert root.attributes["gen_ai.usage.output_tokens"] == 3
    assert root.end_time > root.start_time


def test_vllms_own_request_span_is_replaced_by_ours(tracked):
    tracing, exporter = tracked()
    processor = OutputProcessor(None, log_stats=True, tracing_enabled=True)
    t = time.monotonic() - 1.0  # engine times in the past, as real ones are when the request ends
    run(processor, request(), [(t, 1, [(Q, t), (S, t)], FinishReason.STOP)])
    assert processor.tracing_enabled is False  # vLLM's do_tracing (llm_request) no longer runs
    tracing.flush()
    assert len([s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER]) == 1


def test_request_duration_carries_the_exported_traces_exemplar(tracked, metrics):
    tracing, exporter = tracked(sampler=ParentBased(ALWAYS_OFF), **{environment.TRACES_E2E_THRESHOLD_MS: "200"})
    processor = OutputProcessor(None, log_stats=True)
    t = time.monotonic() - 1.0  # engine times in the past, as real ones are when the request ends
    now = time.time()
    run(processor, request("cmpl-slow", arrival=now - 0.5), [(t, 1, [(Q, t), (S, t)], FinishReason.STOP)])
    run(processor, request("cmpl-fast", arrival=now), [(t, 1, [(Q, t), (S, t)], FinishReason.STOP)])
    tracing.flush()
    (root,) = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER]
    data = metrics.get_metrics_data()
    points = [
        p
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "gen_ai.server.request.duration"
        for p in m.data.data_points
    ]
    assert sum(p.count for p in points) == 2
    exemplars = [e for p in points for e in p.exemplars]
    (exemplar,) = exemplars  # the kept (slow) request only: the other trace was not exported
    assert (exemplar.trace_id, exemplar.span_id) == (root.context.trace_id, root.context.span_id)
    assert exemplar.value == pytest.approx((root.end_time - root.start_time) / 1e9, abs=1e-9)


def test_a_full_queue_drops_and_counts(tracked, metrics):
    tracing, exporter = tracked(**{environment.BSP_MAX_QUEUE_SIZE: "2", environment.BSP_SCHEDULE_DELAY: "100000"})
    processor = OutputProcessor(None, log_stats=True)
    t = time.monotonic() - 1.0  # engine times in the past, as real ones are when the request ends
    for i in range(5):
        run(processor, request(f"cmpl-{i}"), [(t, 1, [(Q, t)], FinishReason.STOP)])
    assert tracing.dropped == {"queue_full": 3}
    STATE.tracing, saved = tracing, STATE.tracing
    try:
        recording_traces.export_drops()
    finally:
        STATE.tracing = saved
    tracing.flush()
    assert len([s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER]) == 2
    # Exemplars (one per bucket: the latest observation's) name traces sent, never one of the three dropped, which
    # came last (read first: a reader gets each exemplar once).
    sent = {s.context.trace_id for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER}
    exemplars = [
        e
        for rm in metrics.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "gen_ai.server.request.duration"
        for p in m.data.data_points
        for e in p.exemplars
    ]
    assert exemplars and {e.trace_id for e in exemplars} <= sent
    values = Metrics(metrics).points()["vllm_profiling_traces_dropped"]
    assert values == {(("dp", "0"), ("reason", "queue_full"), ("role", "mixed")): 3}


def test_at_most_the_inflight_limit_is_followed(tracked):
    tracing, exporter = tracked()
    traces.TRACKER.limit = 2
    processor = OutputProcessor(None, log_stats=True)
    for i in range(4):
        processor.add_request(request(f"cmpl-{i}"), None)
    assert len(traces.TRACKER.inflight) == 2 and tracing.dropped == {"inflight_full": 2}
    # Requests whose end was never seen (runtime control switched the hooks off meanwhile) give their room back.
    processor.request_states.clear()
    processor.add_request(request("cmpl-next"), None)
    assert list(traces.TRACKER.inflight) == ["cmpl-next-0a1b2c3d"]


def test_off_follows_nothing(tracked):
    tracing, exporter = tracked()
    traces.TRACKER.on = False
    processor = OutputProcessor(None, log_stats=True)
    t = time.monotonic() - 1.0  # engine times in the past, as real ones are when the request ends
    run(processor, request(), [(t, 1, [(Q, t)], FinishReason.STOP)])
    tracing.flush()
    assert not traces.TRACKER.inflight and exporter.get_finished_spans() == ()


def test_the_trace_exporter_follows_the_traces_protocol(monkeypatch):
    monkeypatch.setenv(environment.OTLP_PROTOCOL, "grpc")
    monkeypatch.setenv(environment.OTLP_TRACES_PROTOCOL, "http/protobuf")
    monkeypatch.setenv(environment.OTLP_METRICS_PROTOCOL, "grpc")
    assert otlp.entry_point_name("otlp", "traces") == "otlp_proto_http"
    assert otlp.entry_point_name("otlp") == "otlp_proto_grpc"
    monkeypatch.setenv(environment.TRACES_EXPORTER, "otlp")
    (exporter,) = recording_traces.Tracing._exporters()
    assert type(exporter).__module__.startswith("opentelemetry.exporter.otlp.proto.http")
    exporter.shutdown()
    monkeypatch.setenv(environment.TRACES_EXPORTER, "none")
    assert recording_traces.Tracing._exporters() == []


def test_the_drop_metric_is_in_the_catalogue():
    spec = catalogue.TRACES_DROPPED
    assert spec.kind == catalogue.COUNTER and spec.labels == ("dp", "role", "reason")


_TRACE_HANDLERS = ("TraceHeaders", "Rejections", "AddRequest", "FinishRequest", "AbortRequests", "Unparsed")


def test_trace_rows_are_installed_only_with_traces_on_and_keep_the_output_loop_hook(monkeypatch):
    from opentelemetry_instrumentation_vllm_ascend import targets
    from opentelemetry_instrumentation_vllm_ascend.wiring.installer import (
        DISABLED,
        TRACES_OFF,
        gate_of,
        in_range,
        vllm_version,
    )

    version = vllm_version()
    every = [t for t in targets.TARGETS if t.traces]
    # vLLM 0.23 has the serving helpers on OpenAIServing and registers the validation handler from api_server.py
    # (0.30 has its _get_trace_headers on GenerateBaseServing, PoolingBaseServing and the generative scoring server):
    # rows of their own, one per symbol and release; it has no admission limits.
    assert sorted(t.qualname for t in every) == sorted(
        [
            "BaseServing._get_trace_headers",
            "GenerateBaseServing._get_trace_headers",  # vLLM 0.30 (no BaseServing._get_trace_headers there)
            "PoolingBaseServing._get_trace_headers",
            "OpenAIServing._get_trace_headers",
            "ServingGenerativeScoring._get_trace_headers",
            "GenerateBaseServing._with_kv_transfer_rejection_cleanup",
            "OpenAIServing._with_kv_transfer_rejection_cleanup",
            "OutputProcessor.add_request",
            "OutputProcessor._finish_request",
            "OutputProcessor.abort_requests",
            "validation_exception_handler",
            "validation_exception_handler",
            "AsyncLLM.check_admission",
        ]
    )
    for release in supported.VLLM:  # each release installs each hook once
        here = [t for t in every if in_range(Version(release), t.vllm)]
        handlers = _TRACE_HANDLERS + (("Admission",) if Version(release) >= Version("0.30.0") else ())
        assert {t.handler for t in here} == {f"traces:{h}" for h in handlers}, release
        assert len({t.symbol for t in here}) == len(here), release
    rows = [t for t in every if in_range(version, t.vllm)]
    assert {t.module for t in rows if "Serving" in t.qualname or "validation" in t.qualname} == {
        "vllm.entrypoints.serve.engine.serving",
        "vllm.entrypoints.generate.base.serving",
        "vllm.entrypoints.serve.exception_handling.register",
    }
    # The output loop's hook, AsyncLLM.add_request's (the inbound trace headers in the registering task), and the
    # scheduler's init (which watches a KV connector's loads: test_kv_wait_traces.py)
    needed = [t for t in targets.TARGETS if t.feeds_traces]
    assert [t.qualname for t in needed] == [
        "AsyncLLM.add_request",
        "OutputProcessor.process_outputs",
        "Scheduler.__init__",
    ]
    monkeypatch.setenv(environment.DISABLED_METRICS, ",".join(f for t in needed for f in t.feeds))
    monkeypatch.delenv(environment.TRACES, raising=False)
    assert [gate_of(t, version, None) for t in rows] == [TRACES_OFF] * 7
    assert [gate_of(t, version, None, checking=True) for t in rows] == [None] * 7  # `check` resolves them
    assert [gate_of(t, version, None) for t in needed] == [DISABLED] * 3
    monkeypatch.setenv(environment.TRACES, "true")
    assert [gate_of(t, version, None) for t in rows] == [None] * 7
    assert [gate_of(t, version, None) for t in needed] == [None] * 3  # metrics off, the traces need them


def test_the_final_export_waits_at_most_the_shutdown_timeout(monkeypatch):
    import threading

    release = threading.Event()

    class Stuck(InMemorySpanExporter):  # a collector that never answers
        def export(self, spans):
            release.wait(30)
            return super().export(spans)

    monkeypatch.setenv(environment.SHUTDOWN_TIMEOUT_MS, "200")
    tracing = recording_traces.Tracing(exporters=[Stuck()], resource=Resource.create({}))
    journey = recording_traces.Journey("r-1", "cmpl-1", "text_completion", "tiny", time.time())
    journey.e2e = 0.5
    assert tracing.decide(journey)
    tracing.submit(journey)
    start = time.monotonic()
    tracing.shutdown()
    assert time.monotonic() - start < 2.0
    release.set()


# -- requests vLLM rejected before registering them: the real OpenAI serving classes' create_* and their helper ----


@pytest.fixture
def serving(tracked):
    """Real OpenAIServingCompletion / OpenAIServingChat objects (their create_* and the helper they await their work
    through, hooked with the Rejections handler) whose inner ``_create_*`` each test replaces: what vLLM does there
    (rendering, validation, the engine) is each test's scenario."""
    from vllm.entrypoints.generate.base.serving import GenerateBaseServing
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
    from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion

    from opentelemetry_instrumentation_vllm_ascend.kinds import COROUTINE

    patch = patch_method(GenerateBaseServing, "_with_kv_transfer_rejection_cleanup", traces.Rejections(), COROUTINE)

    def make(cls, inner):
        obj = object.__new__({"completion": OpenAIServingCompletion, "chat": OpenAIServingChat}[cls])
        obj.has_kv_connector = False  # what __init__ sets without a KV connector
        setattr(obj, "_create_completion" if cls == "completion" else "_create_chat_completion", inner)
        return obj

    yield make
    setattr(patch.owner, patch.attribute, patch.original)
    traces.HANDLING.set(None)


def http_request(headers=None):
    from starlette.requests import Request

    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    return Request({"type": "http", "method": "POST", "path": "/v1/completions", "headers": raw})


def call(serving_obj, request, raw_request):
    import asyncio

    chat = type(serving_obj).__name__ == "OpenAIServingChat"
    method = serving_obj.create_chat_completion if chat else serving_obj.create_completion

    async def go():
        before = time.time_ns()
        try:
            return await method(request, raw_request), before, None
        except BaseException as exc:  # noqa: BLE001 - the scenario's outcome
            return None, before, exc
        finally:
            go.after = time.time_ns()

    result, before, exc = asyncio.run(go())
    return result, exc, before, go.after


def roots_of(exporter):
    return [s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER]


def test_an_error_response_before_registration_is_one_span_with_its_error_type_and_status(tracked, serving):
    from http import HTTPStatus

    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    tracing, exporter = tracked()

    async def unknown_model(request, raw_request):  # as BaseServing._check_model answers an unknown model
        return obj.create_error_response("no such model", err_type="NotFoundError", status_code=HTTPStatus.NOT_FOUND)

    obj = serving("completion", unknown_model)
    header = {"traceparent": f"00-{TRACE_ID:032x}-{PARENT_SPAN:016x}-01"}
    request = CompletionRequest(prompt="a secret prompt", model="nope", max_tokens=7, temperature=0.25)
    result, exc, before, after = call(obj, request, http_request(header))
    assert exc is None and result.error.code == 404
    tracing.flush()
    (root,) = exporter.get_finished_spans()
    assert root.name == "text_completion nope" and root.kind is SpanKind.SERVER
    assert (root.context.trace_id, root.parent.span_id) == (TRACE_ID, PARENT_SPAN) and root.parent.is_remote
    assert before <= root.start_time <= root.end_time <= after
    assert dict(root.attributes) == {
        "gen_ai.operation.name": "text_completion",
        "gen_ai.provider.name": "vllm",
        "gen_ai.request.model": "nope",
        "gen_ai.request.max_tokens": 7,
        "gen_ai.request.temperature": 0.25,
        "error.type": result.error.type,  # NotFoundError: what vLLM answered
        "http.response.status_code": 404,
    }
    assert root.status.status_code is StatusCode.UNSET  # a client error is no failure of the server
    assert root.events == () and root.links == ()
    assert not any("secret" in str(v) for v in root.attributes.values())


def test_an_exception_before_registration_is_kept_by_the_error_rule_with_vllms_answer(tracked, serving):
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    tracing, exporter = tracked(sampler=ALWAYS_OFF)

    async def invalid(request, raw_request):  # the real validation: temperature < 0
        request.to_sampling_params(16, {})

    obj = serving("chat", invalid)
    request = ChatCompletionRequest(
        messages=[{"role": "user", "content": "hi"}], model="tiny", temperature=-1.0, max_completion_tokens=5
    )
    _, exc, _, _ = call(obj, request, http_request())
    oracle = obj.create_error_response(exc).error  # what vLLM's exception handlers send for it
    assert (oracle.type, oracle.code) == ("BadRequestError", 400)
    tracing.flush()
    (root,) = exporter.get_finished_spans()
    assert root.name == "chat tiny" and root.parent is None
    a = root.attributes
    assert (a["error.type"], a["http.response.status_code"]) == (oracle.type, oracle.code)
    assert (a["gen_ai.operation.name"], a["gen_ai.request.max_tokens"]) == ("chat", 5)
    assert a["vllm.trace.kept_by"] == "error"  # head sampling said no


def test_a_server_error_or_a_cancelled_call_before_registration_is_an_error_span(tracked, serving):
    import asyncio

    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    tracing, exporter = tracked()

    async def broken(request, raw_request):
        raise RuntimeError("boom")

    async def cancelled(request, raw_request):  # with_cancellation cancels the handler when the client goes away
        raise asyncio.CancelledError

    for inner in (broken, cancelled):
        call(serving("completion", inner), CompletionRequest(prompt="p", model=None), http_request())
    tracing.flush()
    got = {s.attributes["error.type"]: s for s in roots_of(exporter)}
    assert sorted(got) == ["InternalServerError", "abort"]
    assert got["InternalServerError"].attributes["http.response.status_code"] == 500
    assert "http.response.status_code" not in got["abort"].attributes  # no response was sent
    assert all(s.status.status_code is StatusCode.ERROR for s in got.values())
    assert all(s.attributes["gen_ai.request.model"] == "tiny" for s in got.values())  # no model given: the served one


def test_a_client_gone_before_registration_is_an_abort_whatever_vllm_answered(tracked, serving):
    """vLLM's with_cancellation cancels the handler's task when the client goes away; the completion handler catches
    the CancelledError and answers "Client disconnected" (a 400 nobody receives): that request was aborted."""
    import asyncio

    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    tracing, exporter = tracked()

    async def tokenizing(request, raw_request):
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return obj.create_error_response("Client disconnected")

    obj = serving("completion", tokenizing)

    async def go():
        task = asyncio.ensure_future(obj.create_completion(CompletionRequest(prompt="p", model="tiny"), http_request()))
        await asyncio.sleep(0.01)
        task.cancel()
        return await task

    assert asyncio.run(go()).error.message == "Client disconnected"
    tracing.flush()
    (root,) = exporter.get_finished_spans()
    assert root.attributes["error.type"] == "abort" and "http.response.status_code" not in root.attributes
    assert root.status.status_code is StatusCode.ERROR


def test_an_error_after_registration_or_a_success_gives_no_rejection_span(tracked, serving):
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    tracing, exporter = tracked()
    processor = OutputProcessor(None, log_stats=True)
    req = request("cmpl-9")

    async def disconnected(request, raw_request):  # registered, aborted, then answered with an error
        processor.add_request(req, None)
        processor.abort_requests([req.request_id], internal=True)
        return obj.create_error_response("Client disconnected")

    async def streaming(request, raw_request):
        async def chunks():
            yield "data: {}"

        return chunks()

    obj = serving("completion", disconnected)
    result, _, _, _ = call(obj, CompletionRequest(prompt="p", model="tiny"), http_request())
    assert result.error.code == 400
    call(serving("completion", streaming), CompletionRequest(prompt="p", model="tiny", stream=True), http_request())
    tracing.flush()
    (root,) = roots_of(exporter)  # the registered request's own journey, ended by its abort
    assert root.attributes["gen_ai.request.id"] == "cmpl-9" and root.attributes["error.type"] == "abort"


def test_with_traces_off_a_rejection_is_not_followed(tracked, serving):
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    tracing, exporter = tracked()
    traces.TRACKER.on = False

    async def invalid(request, raw_request):
        return obj.create_error_response("bad")

    obj = serving("completion", invalid)
    call(obj, CompletionRequest(prompt="p", model="tiny"), http_request())
    tracing.flush()
    assert exporter.get_finished_spans() == ()


# -- a body that never parsed: vLLM's own app wiring (its routers, init_exception_handler) with the hook installed ----


@pytest.fixture
def unparsed_app(tracked):
    """A FastAPI app with vLLM's real OpenAI and tokenize routers and vLLM's real ``init_exception_handler``, run
    after the ``Unparsed`` row hooked the name ``register.py`` registers (as the installer does when register.py is
    imported, before the app is built). A body that does not parse never reaches vLLM's handler: no state needed."""
    from fastapi import FastAPI
    from starlette.testclient import TestClient
    from vllm.entrypoints.openai.chat_completion import api_router as chat_router
    from vllm.entrypoints.openai.completion import api_router as completion_router
    from vllm.entrypoints.openai.responses import api_router as responses_router
    from vllm.entrypoints.serve.exception_handling import register
    from vllm.entrypoints.serve.tokenize import api_router as tokenize_router

    from opentelemetry_instrumentation_vllm_ascend.kinds import COROUTINE

    original = register.validation_exception_handler
    patch = patch_method(register, "validation_exception_handler", traces.Unparsed(), COROUTINE)
    app = FastAPI()
    app.state.args = NS(log_error_stack=False)
    for router in (chat_router, completion_router, responses_router, tokenize_router):
        router.attach_router(app)
    register.init_exception_handler(app)
    yield TestClient(app), tracked
    patch.remove()
    assert register.validation_exception_handler is original


def test_a_body_that_never_parsed_is_one_span_named_by_its_path_with_the_clients_parent(unparsed_app):
    client, tracked = unparsed_app
    tracing, exporter = tracked()
    header = {"traceparent": f"00-{TRACE_ID:032x}-{PARENT_SPAN:016x}-01"}
    before = time.time_ns()
    invalid_json = client.post("/v1/completions", content=b'{"prompt": "a secret', headers=header)
    not_json = client.post("/v1/chat/completions", content=b"model=tiny", headers={"Content-Type": "text/plain"})
    unknown_field_type = client.post("/v1/responses", json={"input": "hi", "max_output_tokens": "many"})
    other_path = client.post("/tokenize", content=b"{oops", headers={"Content-Type": "application/json"})
    after = time.time_ns()
    for response in (invalid_json, not_json, unknown_field_type, other_path):
        assert response.status_code == 400 and response.json()["error"]["type"] == "Bad Request"
    tracing.flush()
    spans = {s.name: s for s in roots_of(exporter)}
    assert sorted(spans) == ["_OTHER tiny", "chat tiny", "text_completion tiny"]  # nothing for /tokenize
    completion = spans["text_completion tiny"]
    assert (completion.context.trace_id, completion.parent.span_id) == (TRACE_ID, PARENT_SPAN)
    assert completion.parent.is_remote and spans["chat tiny"].parent is None
    assert dict(completion.attributes) == {
        "gen_ai.operation.name": "text_completion",
        "gen_ai.provider.name": "vllm",
        "gen_ai.request.model": "tiny",  # the served model: the body named none that parsed
        "error.type": "Bad Request",  # what vLLM's validation_exception_handler answered
        "http.response.status_code": 400,
    }
    assert all(s.status.status_code is StatusCode.UNSET for s in spans.values())  # client errors
    assert all(before <= s.start_time <= s.end_time <= after for s in spans.values())
    assert not any("secret" in str(v) for v in completion.attributes.values())


def test_a_failing_unparsed_handler_leaves_vllms_answer_alone(unparsed_app, monkeypatch, caplog):
    client, tracked = unparsed_app
    tracing, exporter = tracked()

    def broken(*args, **kwargs):
        raise RuntimeError("handler bug")

    monkeypatch.setattr(traces.TRACKER, "rejected", broken)
    with caplog.at_level("WARNING"):
        for _ in range(2):
            response = client.post("/v1/completions", content=b"{", headers={"Content-Type": "application/json"})
            assert response.status_code == 400 and response.json()["error"]["code"] == 400
    tracing.flush()
    assert exporter.get_finished_spans() == ()
    assert len([r for r in caplog.records if "handler bug" in r.getMessage() or "Unparsed" in r.getMessage()]) == 1


def test_once_uninstalled_the_handler_the_app_registered_calls_straight_through(tracked):
    from fastapi import FastAPI
    from starlette.testclient import TestClient
    from vllm.entrypoints.openai.completion import api_router as completion_router
    from vllm.entrypoints.serve.exception_handling import register

    from opentelemetry_instrumentation_vllm_ascend.kinds import COROUTINE

    tracing, exporter = tracked()
    patch = patch_method(register, "validation_exception_handler", traces.Unparsed(), COROUTINE)
    app = FastAPI()
    app.state.args = NS(log_error_stack=False)
    completion_router.attach_router(app)
    register.init_exception_handler(app)  # the app keeps the wrapper
    patch.remove()
    response = TestClient(app).post("/v1/completions", content=b"{")
    assert response.status_code == 400 and response.json()["error"]["type"] == "Bad Request"
    tracing.flush()
    assert exporter.get_finished_spans() == ()


def test_with_traces_off_a_body_that_never_parsed_is_not_followed(unparsed_app):
    client, tracked = unparsed_app
    tracing, exporter = tracked()
    traces.TRACKER.on = False
    assert client.post("/v1/completions", content=b"{").status_code == 400
    tracing.flush()
    assert exporter.get_finished_spans() == ()


# -- a request the admission limits refuse where vLLM registers it: the real AsyncLLM.check_admission --------------


@pytest.fixture
def admission(tracked):
    """The real ``AsyncLLM.check_admission`` hooked with ``Admission``, on an AsyncLLM holding only what it reads:
    the scheduler's limits and a real OutputProcessor with one registered request (1 unfinished, 5 prompt tokens
    in prefill)."""
    from vllm.v1.engine.async_llm import AsyncLLM

    patch = patch_method(AsyncLLM, "check_admission", traces.Admission(), SYNC)
    engine = object.__new__(AsyncLLM)
    engine.admission_stats = None
    engine.logger_manager = None
    engine.output_processor = OutputProcessor(None, log_stats=True)
    engine.output_processor.add_request(request("cmpl-1"), None)
    traces.TRACKER.inflight.clear()  # that request's own journey is not under test

    def limits(reqs=None, tokens=None):
        engine.scheduler_config = NS(max_num_queued_reqs=reqs, max_num_queued_tokens=tokens)
        return engine

    yield limits
    setattr(patch.owner, patch.attribute, patch.original)
    traces.HANDLING.set(None)


def refused(engine, *args, **kwargs):
    try:
        engine.check_admission(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the refusal under test
        return exc
    return None


def test_a_refusal_where_vllm_registers_a_request_outside_a_handler_call_is_one_span(tracked, admission):
    from vllm.exceptions import MaxQueuedTokensError, QueueOverflowError

    tracing, exporter = tracked()
    before = time.time_ns()
    # A stream's body (no handler call in its task): 1 unfinished + 1 > 1 allowed; 5 queued tokens >= 5 allowed.
    full = refused(admission(reqs=1), request_id="cmpl-abc-0-1a2b3c4d")
    backlog = refused(admission(tokens=5), 1, "chatcmpl-def-5e6f7a8b")
    after = time.time_ns()
    assert isinstance(full, QueueOverflowError) and isinstance(backlog, MaxQueuedTokensError)
    tracing.flush()
    spans = {s.name: s for s in roots_of(exporter)}
    assert sorted(spans) == ["chat tiny", "text_completion tiny"]
    for span in spans.values():
        assert dict(span.attributes) == {
            "gen_ai.operation.name": span.name.split()[0],
            "gen_ai.provider.name": "vllm",
            "gen_ai.request.model": "tiny",
            "error.type": "Service Unavailable",  # create_error_response: HTTPStatus(exc.http_status).phrase
            "http.response.status_code": 503,
        }
        assert span.status.status_code is StatusCode.ERROR and span.parent is None
        assert before <= span.start_time <= span.end_time <= after


def test_a_refusal_its_handler_answers_or_an_admitted_request_gives_no_admission_span(tracked, admission):
    tracing, exporter = tracked()
    engine = admission(reqs=1)
    assert refused(engine, 1) is not None  # GenerateBaseServing._preflight: no request id, its handler answers it
    handling = traces.Handling(time.time())
    traces.HANDLING.set(handling)  # an OpenAI handler call under way in this task (Rejections.before)
    assert refused(engine, request_id="cmpl-x-0-1") is not None
    assert refused(admission(reqs=2), request_id="cmpl-y-0-1") is None  # admitted
    tracing.flush()
    assert exporter.get_finished_spans() == ()
    handling.ended = True  # the handler returned a stream: its body runs in a task that inherited the call
    assert refused(admission(reqs=1), request_id="cmpl-z-0-1") is not None
    traces.TRACKER.on = False
    assert refused(admission(reqs=1), request_id="cmpl-w-0-1") is not None  # traces off: nothing followed
    tracing.flush()
    (span,) = exporter.get_finished_spans()
    assert span.attributes["error.type"] == "Service Unavailable"


def test_the_rejections_hook_marks_its_call_ended_for_what_runs_after_it(tracked, serving):
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    tracked()
    seen = {}

    async def streaming(request, raw_request):
        seen["during"] = traces.HANDLING.get()
        seen["ended_during"] = seen["during"].ended

        async def chunks():
            yield "data: {}"

        return chunks()

    call(serving("completion", streaming), CompletionRequest(prompt="p", model="tiny", stream=True), http_request())
    assert seen["ended_during"] is False and seen["during"].ended is True


def test_the_inbound_headers_are_kept_when_vllm_023_returns_none_for_them(tracked):
    """vLLM 0.23's ``OpenAIServing._get_trace_headers`` returns None unless vLLM's own tracing is on: TraceHeaders
    then reads traceparent / tracestate from the request's (case-insensitive) headers itself."""
    from starlette.datastructures import Headers

    handler = traces.TraceHeaders()
    parent = f"00-{TRACE_ID:032x}-{PARENT_SPAN:016x}-01"
    inbound = Headers(headers={"Traceparent": parent, "tracestate": "k=v", "x-other": "1"})
    handler.after(None, (object(), inbound), {}, None)
    assert traces.INBOUND.get() == {"traceparent": parent, "tracestate": "k=v"}
    handler.after(None, (object(), Headers(headers={"x-other": "1"})), {}, None)
    assert traces.INBOUND.get() is None
    given = {"traceparent": parent}  # vLLM's answer (0.32+, or 0.23 with its tracing on) is kept as it is
    handler.after(None, (object(), inbound), {}, given)
    assert traces.INBOUND.get() is given


def test_a_request_handed_back_for_recompute_is_marked(tracked):
    """vllm-ascend's RecomputeScheduler finishes a request it hands back to the P/D proxy as a stop with
    ``stop_reason="recomputed"`` (tests/contract/test_scheduler.py): its trace says so; a plain stop does not."""
    tracing, exporter = tracked()
    processor = OutputProcessor(None, log_stats=True)
    t = time.monotonic() - 1.0
    for name, stop_reason in (("cmpl-back", traces.RECOMPUTED), ("cmpl-done", None)):
        req = request(name)
        processor.add_request(req, None)
        output = EngineCoreOutput(
            request_id=req.request_id,
            new_token_ids=[7],
            events=[EngineCoreEvent(Q, t), EngineCoreEvent(S, t + 0.01)],
            finish_reason=FinishReason.STOP,
            stop_reason=stop_reason,
        )
        processor.process_outputs([output], t + 0.02, IterationStats())
    tracing.flush()
    roots = {s.attributes["gen_ai.request.id"]: s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER}
    assert roots["cmpl-back"].attributes["vllm.request.recomputed"] is True
    assert roots["cmpl-back"].attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert "vllm.request.recomputed" not in roots["cmpl-done"].attributes
