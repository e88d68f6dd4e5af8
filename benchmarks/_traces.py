"""T. Request traces: what following a request costs the API server (µs per request), beside an OTel SDK span.

A request here: added, 16 outputs (the first with QUEUED and SCHEDULED events), finished, among 64 requests that
share every process_outputs call, as vLLM's output loop hands them over. Plain stand-ins of vLLM's objects (the
handlers read attributes only); the handlers and the trace pipeline are the real ones, the exporter discards."""

from __future__ import annotations

import time
from types import SimpleNamespace as NS

BATCH = 64
OUTPUTS = 16


class _NullExporter:
    def export(self, spans):
        from opentelemetry.sdk.trace.export import SpanExportResult

        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass

    def force_flush(self, timeout_millis=30000):
        return True


def _requests(round_):
    now = time.time()
    return [
        NS(
            request_id=f"cmpl-{round_}-{i}-0a1b2c3d",
            external_req_id=f"cmpl-{round_}-{i}",
            arrival_time=now,
            trace_headers=None,
            sampling_params=NS(max_tokens=16, temperature=0.0, top_p=1.0, top_k=None, seed=None, n=1),
            prompt_token_ids=list(range(32)),
        )
        for i in range(BATCH)
    ]


def _prepared(round_):
    """A batch's requests, processor and every output batch, built before the clock starts."""
    requests = _requests(round_)
    processor = NS(tracing_enabled=False, request_states={})
    t = time.monotonic()
    events = [NS(type=1, timestamp=t), NS(type=2, timestamp=t + 0.001)]
    steps = []
    for step in range(OUTPUTS):
        last = step == OUTPUTS - 1
        outputs = [
            NS(
                request_id=req.request_id,
                new_token_ids=[1],
                events=events if step == 0 else None,
                finish_reason="length" if last else None,
                prefill_stats=None,
                num_cached_tokens=0,
            )
            for req in requests
        ]
        steps.append((outputs, t + 0.002 * (step + 1), NS(iteration_timestamp=time.time()), last))
    states = [NS(stats=NS(first_token_latency=0.01), request_id=req.request_id) for req in requests]
    return requests, processor, steps, states


def _lifecycle(tracker, prepared):
    """Every request of a batch, from add to finish, through the handlers' entry points."""
    requests, processor, steps, states = prepared
    for req, state in zip(requests, states):
        processor.request_states[req.request_id] = state
        tracker.start(processor, req)
    for outputs, timestamp, iteration, last in steps:
        tracker.outputs(outputs, timestamp, iteration)
        if last:
            for req in requests:
                tracker.finished(processor.request_states.pop(req.request_id))


def _per_request_us(fn, repeat, prepare=lambda r: r):
    runs = []
    for r in range(repeat):
        prepared = prepare(r)
        start = time.perf_counter()
        fn(prepared)
        runs.append((time.perf_counter() - start) / BATCH * 1e6)
    return runs


def trace_rows(repeat):
    from opentelemetry import trace as trace_api
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

    from opentelemetry_instrumentation_vllm_ascend.handlers.traces import Tracker
    from opentelemetry_instrumentation_vllm_ascend.recording.traces import Tracing

    resource = Resource.create({})
    repeat = max(repeat, 5)
    rows = []

    def tracing(sampler):
        t = Tracing(exporters=[_NullExporter()], resource=resource, sampler=sampler)
        t.max_queue = 10**9
        t.batch_size = 10**9
        t.delay = 3600.0
        t.keep = frozenset()  # no tail rule: the head decision alone
        return t

    dropped = tracing(ALWAYS_OFF)
    tracker = Tracker(on=True, limit=10**6, tracing=dropped)
    rows.append(
        (
            "API server, output loop: a request sampling drops",
            _per_request_us(lambda p: _lifecycle(tracker, p), repeat, _prepared),
        )
    )
    kept = tracing(ALWAYS_ON)
    tracker = Tracker(on=True, limit=10**6, tracing=kept)
    rows.append(
        (
            "API server, output loop: a request kept (queued for export)",
            _per_request_us(lambda p: _lifecycle(tracker, p), repeat, lambda r: _prepared(100 + r)),
        )
    )
    builds = []
    for r in range(repeat):
        _lifecycle(tracker, _prepared(1000 + r))
        start = time.perf_counter()
        kept.export_queued()  # its 4 spans (request, queued, prefill, decode) built, handed to the null exporter
        builds.append((time.perf_counter() - start) / BATCH * 1e6)
    rows.append(("API server, export thread: a kept request's spans built and exported", builds))
    dropped.shutdown()
    kept.shutdown()

    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    provider.add_span_processor(
        BatchSpanProcessor(_NullExporter(), max_queue_size=10**6, schedule_delay_millis=3600_000)
    )
    tracer = provider.get_tracer("bench")
    attributes = {f"a{i}": i for i in range(8)}

    def sdk_span(_r):
        for _ in range(BATCH):
            with tracer.start_as_current_span("request", attributes=attributes):
                pass

    def sdk_span_children(_r):
        for _ in range(BATCH):
            with tracer.start_as_current_span("request", attributes=attributes, kind=trace_api.SpanKind.SERVER):
                for name in ("queued", "prefill", "decode"):
                    with tracer.start_as_current_span(name):
                        pass

    rows.append(
        ("OTel SDK: one span with 8 attributes (BatchSpanProcessor, null exporter)", _per_request_us(sdk_span, repeat))
    )
    rows.append(("OTel SDK: that span with 3 children", _per_request_us(sdk_span_children, repeat)))
    provider.shutdown()
    return rows
