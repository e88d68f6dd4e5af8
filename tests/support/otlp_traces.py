"""A real OTLP/HTTP traces receiver for tests: decodes ExportTraceServiceRequest protobufs into plain spans."""

from __future__ import annotations

from dataclasses import dataclass, field

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.support.otlp_receiver import HttpReceiver


def _value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(x) for x in v.array_value.values)
    return getattr(v, kind) if kind else None


def _attrs(kvs) -> dict:
    return {kv.key: _value(kv.value) for kv in kvs}


@dataclass
class Span:
    name: str
    trace_id: int
    span_id: int
    parent_span_id: int  # 0: a root
    start: int  # ns
    end: int
    kind: int
    attributes: dict
    resource: dict
    events: list = field(default_factory=list)  # [(name, time ns, attributes)]
    links: list = field(default_factory=list)  # [(trace id, span id, attributes)]
    status_code: int = 0

    @property
    def duration(self) -> int:
        return self.end - self.start


class TraceReceiver(HttpReceiver):
    """OTLP/HTTP traces: ExportTraceServiceRequest protobufs, read back as :class:`Span`."""

    REQUEST = ExportTraceServiceRequest
    RESPONSE = ExportTraceServiceResponse
    PATH = "/v1/traces"

    def spans(self) -> list[Span]:
        with self.lock:
            requests = list(self.requests)
        out = []
        for request in requests:
            for rs in request.resource_spans:
                resource = _attrs(rs.resource.attributes)
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        out.append(
                            Span(
                                name=s.name,
                                trace_id=int.from_bytes(s.trace_id, "big"),
                                span_id=int.from_bytes(s.span_id, "big"),
                                parent_span_id=int.from_bytes(s.parent_span_id, "big") if s.parent_span_id else 0,
                                start=s.start_time_unix_nano,
                                end=s.end_time_unix_nano,
                                kind=s.kind,
                                attributes=_attrs(s.attributes),
                                resource=resource,
                                events=[(e.name, e.time_unix_nano, _attrs(e.attributes)) for e in s.events],
                                links=[
                                    (
                                        int.from_bytes(li.trace_id, "big"),
                                        int.from_bytes(li.span_id, "big"),
                                        _attrs(li.attributes),
                                    )
                                    for li in s.links
                                ],
                                status_code=s.status.code,
                            )
                        )
        return out

    def traces(self) -> dict:
        """{request id (gen_ai.request.id): (root span, [its children])} of every received request trace with a
        request id (a request vLLM rejected before registering it has none: its one span is in ``spans()``)."""
        spans = self.spans()
        roots = {s.span_id: s for s in spans if s.kind == 2}  # SPAN_KIND_SERVER
        children: dict = {}
        for s in spans:
            if s.parent_span_id in roots and s.kind != 2:
                children.setdefault(s.parent_span_id, []).append(s)
        out = {}
        for span_id, root in roots.items():
            request_id = root.attributes.get("gen_ai.request.id")
            if request_id is None:
                continue
            assert request_id not in out, f"two request spans for {request_id}"
            out[request_id] = (root, children.get(span_id, []))
        return out
