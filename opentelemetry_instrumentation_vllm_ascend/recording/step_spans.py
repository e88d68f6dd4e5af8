"""The spans of a kept step (``recording/step_traces.py``; docs/steps.md#slow-step-traces), as SDK ``ReadableSpan``
objects built on the trace pipeline's export thread from the step's record (``recording/step_records.py``): the
step span (``engine_step``, a root) and its three children, ``schedule``, ``execute`` and ``update``, which tile it;
under ``execute`` the worker's step (``worker_step``, its rank) with a span per stage of its budget
(``prepare_inputs``, ``forward``, ``wait_sample``, ``sample``, ``other``) and one per blocking KV transfer
(``kv_transfer``), where the worker's clock is the EngineCore's (``step_fields.worker_timeline``)."""

from __future__ import annotations

from .. import catalogue, semconv
from ..version import __version__
from .spans import ns
from .step_traces import ERROR


class StepTrace:
    """A kept step waiting for export: its record and the record's own fields (``ours``: its ``otel_vllm_ascend``
    part), ``(trace id, span id, kept_by, error)``, and the request spans of the requests it carried,
    ``[(vLLM's request id, (trace id, span id))]``."""

    __slots__ = ("record", "ours", "trace", "carried", "timeline")
    request_id = None  # (the trace pipeline's log line names a journey's request; a step has none)

    def __init__(self, record: dict, ours: dict, trace: tuple, carried: list, timeline=None) -> None:
        self.record, self.ours, self.trace, self.carried = record, ours, trace, carried
        #: The worker's stages and blocking KV transfers on the system clock (``step_fields.worker_timeline``), or None.
        self.timeline = timeline

    def spans(self, offset: int, resource, ids) -> list:
        """The step span and its children (``offset``: unused, the record's times are wall-clock already)."""
        from opentelemetry import trace as trace_api
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import Link, SpanContext, TraceFlags
        from opentelemetry.trace.status import Status, StatusCode

        record, (trace_id, span_id, kept_by, error) = self.record, self.trace
        ours = self.ours
        sampled = TraceFlags(TraceFlags.SAMPLED)
        scope = InstrumentationScope(catalogue.SCOPE_NAME, __version__)
        root = SpanContext(trace_id, span_id, is_remote=False, trace_flags=sampled)
        start = ns(ours["start_time_unix"])
        scheduled, queued = record["scheduled_requests"], record["queued_requests"]
        attributes = {
            "vllm.dp_rank": ours["dp"],
            "vllm.pd_role": ours["role"],
            "vllm.engine.id": ours["engine_id"],
            "vllm.step": ours["step"],
            "vllm.step.phase": ours["phase"],
            "vllm.trace.kept_by": kept_by,
            "vllm.step.requests": scheduled["num_prefill_requests"] + scheduled["num_decode_requests"],
            "vllm.step.prefill_requests": scheduled["num_prefill_requests"],
            "vllm.step.decode_requests": scheduled["num_decode_requests"],
            "vllm.step.prefill_tokens": scheduled["sum_prefill_tokens"],
            "vllm.step.decode_tokens": ours["sum_decode_tokens"],
            "vllm.step.preemptions": ours["preemptions"],
            "vllm.step.recomputed_tokens": ours["recomputed_tokens"],
            "vllm.step.queued_requests": queued["num_prefill_requests"] + queued["num_decode_requests"],
        }
        for key in ("running", "waiting", "kv_blocks_free", "kv_blocks_used"):
            if ours.get(key) is not None:
                attributes[f"vllm.step.{key}"] = ours[key]
        status = Status(StatusCode.UNSET)
        if kept_by == ERROR:
            attributes[semconv.ERROR_TYPE] = error or "other"
            status = Status(StatusCode.ERROR, error or "other")
        links = [
            Link(SpanContext(t, s, is_remote=True, trace_flags=sampled), {"vllm.request.id": request_id})
            for request_id, (t, s) in self.carried
        ]
        spans = []
        unset = Status(StatusCode.UNSET)

        def span(name, parent, begin, finish, attributes=None, status=unset):
            context = SpanContext(trace_id, ids.generate_span_id(), is_remote=False, trace_flags=sampled)
            spans.append(
                ReadableSpan(
                    name=name,
                    context=context,
                    parent=parent,
                    resource=resource,
                    attributes=attributes,
                    kind=trace_api.SpanKind.INTERNAL,
                    instrumentation_scope=scope,
                    status=status,
                    start_time=begin,
                    end_time=finish,
                )
            )
            return context

        begin = start
        execute = None
        for name, key in (("schedule", "schedule_s"), ("execute", "execute_s"), ("update", "update_s")):
            finish = begin + max(ns(ours[key]), 0)
            context = span(name, root, begin, finish, status=status if name == "execute" else unset)
            if name == "execute":
                execute = context
            begin = finish
        if self.timeline is not None and (worker := ours.get("worker")) is not None:
            stages, waits = self.timeline
            rank = {"vllm.worker.rank": worker["rank"]} if worker["rank"] is not None else None
            parent = span("worker_step", execute, ns(stages[0][1]), ns(stages[-1][2]), rank)
            for name, begin_s, end_s in stages:
                span(name, parent, ns(begin_s), ns(end_s))
            for direction, connector, nbytes, begin_s, end_s in waits:
                kv = {"vllm.kv.direction": direction, "vllm.kv.connector": connector, "vllm.kv.bytes": nbytes}
                span("kv_transfer", parent, ns(begin_s), ns(end_s), kv)
        spans.insert(
            0,
            ReadableSpan(
                name="engine_step",
                context=root,
                parent=None,
                resource=resource,
                attributes=attributes,
                links=links,
                kind=trace_api.SpanKind.INTERNAL,
                instrumentation_scope=scope,
                status=status,
                start_time=start,
                end_time=start + ns(record["wall_time"]),
            ),
        )
        return spans
