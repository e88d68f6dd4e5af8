"""The spans of a kept request journey (``recording/journeys.py``), as SDK ``ReadableSpan`` objects
(docs/traces.md): the request span (SERVER) and its children (queued, prefill, decode, preempted, kv_load_wait),
or the one span of a request vLLM rejected. Built on the trace pipeline's export thread (``recording/traces.py``)."""

from __future__ import annotations

from typing import Any

from .. import catalogue, context, semconv
from ..version import __version__
from .journeys import PREEMPTED, QUEUED, SCHEDULED, Journey, kv_waits


def ns(seconds: float) -> int:
    """Seconds as integer nanoseconds (a span's times)."""
    return int(round(seconds * 1e9))


def journey_spans(journey: Journey, offset: int, resource, ids) -> list:
    """The ReadableSpans of a kept journey: the request span and its children (docs/traces.md). ``offset``: wall
    minus monotonic clock, in nanoseconds; ``resource`` and ``ids`` (an IdGenerator): the trace pipeline's."""
    from opentelemetry import trace as trace_api
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext, TraceFlags
    from opentelemetry.trace.status import Status, StatusCode

    sampled = TraceFlags(TraceFlags.SAMPLED)
    scope = InstrumentationScope(catalogue.SCOPE_NAME, __version__)
    trace_id = journey.trace_id
    root_ctx = SpanContext(trace_id, journey.span_id, is_remote=False, trace_flags=sampled)
    start = ns(journey.arrival)
    end = start + ns(journey.e2e or 0.0)
    if journey.request_id is None:
        return [_rejected(journey, root_ctx, scope, start, end, resource)]

    def wall(ts: float) -> int:
        return ns(ts) + offset

    children = []

    def child(name, begin, finish, attributes=None, span_events=()):
        ctx = SpanContext(trace_id, ids.generate_span_id(), is_remote=False, trace_flags=sampled)
        children.append(
            ReadableSpan(
                name=name,
                context=ctx,
                parent=root_ctx,
                resource=resource,
                attributes=attributes or {},
                events=span_events,
                kind=trace_api.SpanKind.INTERNAL,
                instrumentation_scope=scope,
                start_time=begin,
                end_time=max(begin, finish),
            )
        )

    events = []
    queued: Any = None
    scheduled: Any = None
    preempted_at: Any = None
    for kind, ts in journey.events:
        if kind is QUEUED:
            queued = ts
            events.append(Event("queued", {}, wall(ts)))
        elif kind is SCHEDULED:
            resumed = preempted_at is not None
            events.append(Event("scheduled", {"vllm.resumed": resumed}, wall(ts)))
            if scheduled is None:
                scheduled = ts
            if resumed:
                child("preempted", wall(preempted_at), wall(ts), {"vllm.resumed": True})
                preempted_at = None
        elif kind is PREEMPTED:
            if preempted_at is not None:  # preempted again before a resume we saw: close the first
                child("preempted", wall(preempted_at), wall(ts), {"vllm.resumed": False})
            preempted_at = ts
            events.append(Event("preempted", {}, wall(ts)))
    if preempted_at is not None:
        child("preempted", wall(preempted_at), end, {"vllm.resumed": False})

    if journey.kv_waits:
        _kv_spans(journey, child, wall, end)

    first, last = journey.first_ts, journey.last_ts
    latency = {}
    if queued is not None:
        child("queued", wall(queued), wall(scheduled) if scheduled is not None else end)
        if scheduled is not None:
            latency["gen_ai.latency.time_in_queue"] = scheduled - queued
    if scheduled is not None and first is not None:
        child("prefill", wall(scheduled), wall(first))
        latency["gen_ai.latency.time_in_model_prefill"] = first - scheduled
    if first is not None and last is not None:
        child("decode", wall(first), wall(last))
        latency["gen_ai.latency.time_in_model_decode"] = last - first
        events.append(Event("first_token", {}, wall(first)))
        if scheduled is not None:
            latency["gen_ai.latency.time_in_model_inference"] = last - scheduled
    if journey.first_latency is not None:
        latency["gen_ai.latency.time_to_first_token"] = journey.first_latency
    if journey.e2e is not None:
        latency["gen_ai.latency.e2e"] = journey.e2e
    finish: dict = {semconv.GEN_AI_RESPONSE_FINISH_REASONS: (journey.reason,)} if journey.reason else {}
    events.append(Event("finish", finish, end))
    events.sort(key=lambda event: event.timestamp)

    attributes = {
        semconv.GEN_AI_OPERATION_NAME: journey.operation,
        semconv.GEN_AI_PROVIDER_NAME: catalogue.GENAI_PROVIDER,
        "gen_ai.request.id": journey.external_id,  # vLLM's own llm_request span's name for it
        semconv.GEN_AI_RESPONSE_ID: journey.external_id,
        "vllm.request.id": journey.request_id,
        "vllm.dp_rank": journey.dp if journey.dp is not None else context.PROCESS.dp,
        "vllm.pd_role": context.PROCESS.role,
        "vllm.request.preemptions": journey.preemptions,
        semconv.GEN_AI_USAGE_OUTPUT_TOKENS: journey.tokens,
    }
    if journey.model:
        attributes[semconv.GEN_AI_REQUEST_MODEL] = journey.model
        attributes[semconv.GEN_AI_RESPONSE_MODEL] = journey.model
    attributes.update(journey.attributes)
    if journey.cached_tokens is not None:
        attributes[semconv.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] = journey.cached_tokens
    if journey.reason:
        attributes[semconv.GEN_AI_RESPONSE_FINISH_REASONS] = (journey.reason,)
    if journey.lost_events:
        attributes["vllm.request.events_dropped"] = journey.lost_events
    attributes.update(latency)
    status = Status(StatusCode.UNSET)
    if journey.error is not None:
        attributes[semconv.ERROR_TYPE] = journey.error
        status = Status(StatusCode.ERROR, journey.error)
    return [_request_span(journey, root_ctx, scope, attributes, status, start, end, resource, events), *children]


def _kv_spans(journey: Journey, child, wall, end: int) -> None:
    """One ``kv_load_wait`` span per async KV load: from its start to the ``SCHEDULED`` that took the request in
    after it (the end of the request when none did), with a ``loaded`` event when the worker reported the load
    received."""
    from opentelemetry.sdk.trace import Event

    scheduled = [ts for kind, ts in journey.events if kind is SCHEDULED]
    for index, (start, loaded) in enumerate(kv_waits(journey.kv_waits)):
        until = next((ts for ts in scheduled if ts >= start), None)
        attributes: dict = {"vllm.kv_transfer.loaded": loaded is not None}
        if index == 0 and journey.kv_tokens is not None:
            attributes["vllm.kv_transfer.tokens"] = journey.kv_tokens
        marks = (Event("loaded", {}, wall(loaded)),) if loaded is not None else ()
        child("kv_load_wait", wall(start), wall(until) if until is not None else end, attributes, marks)


def _rejected(journey: Journey, context_, scope, start: int, end: int, resource):
    """The one span of a request vLLM rejected before registering it: its OpenAI handler's call."""
    from opentelemetry.trace.status import Status, StatusCode

    attributes: dict = {
        semconv.GEN_AI_OPERATION_NAME: journey.operation,
        semconv.GEN_AI_PROVIDER_NAME: catalogue.GENAI_PROVIDER,
    }
    if journey.model:
        attributes[semconv.GEN_AI_REQUEST_MODEL] = journey.model
    attributes.update(journey.attributes)
    attributes[semconv.ERROR_TYPE] = journey.error or "error"
    if journey.status is not None:
        attributes[semconv.HTTP_RESPONSE_STATUS_CODE] = journey.status
    # A client error (4xx) is no failure of the server: status left unset, as the HTTP conventions ask of a
    # SERVER span; a server error, or a request that ended without a response, is one.
    if journey.status is not None and 400 <= journey.status < 500:
        status = Status(StatusCode.UNSET)
    else:
        status = Status(StatusCode.ERROR, attributes[semconv.ERROR_TYPE])
    return _request_span(journey, context_, scope, attributes, status, start, end, resource)


def _request_span(
    journey: Journey, context_, scope, attributes: dict, status, start: int, end: int, resource, events=()
):
    """A journey's request span (SERVER), named ``{operation} {model}``; a journey the tail rules kept says why
    (``vllm.trace.kept_by``) and links its unsampled parent."""
    from opentelemetry import trace as trace_api
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import Link, SpanContext, TraceFlags

    links: list = []
    if journey.kept_by is not None:
        attributes["vllm.trace.kept_by"] = journey.kept_by
        if journey.parent is not None:
            links.append(Link(journey.parent, {"vllm.trace.link": "unsampled parent"}))
    for trace_id, span_id in journey.step_links or ():  # the kept steps that carried it (docs/steps.md)
        step = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
        links.append(Link(step, {"vllm.trace.link": "engine step"}))
    return ReadableSpan(
        name=f"{journey.operation} {journey.model}" if journey.model else journey.operation,
        context=context_,
        parent=journey.parent_span,
        resource=resource,
        attributes=attributes,
        events=events,
        links=links,
        kind=trace_api.SpanKind.SERVER,
        instrumentation_scope=scope,
        status=status,
        start_time=start,
        end_time=end,
    )
