"""A real OTLP/HTTP logs receiver for tests: decodes ExportLogsServiceRequest protobufs into plain log records."""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)

from tests.support.otlp_receiver import HttpReceiver
from tests.support.otlp_traces import _attrs


@dataclass
class LogRecord:
    event_name: str
    time_unix_nano: int
    attributes: dict
    resource: dict
    scope: str
    body: object


class LogsReceiver(HttpReceiver):
    """OTLP/HTTP logs: ExportLogsServiceRequest protobufs, read back as :class:`LogRecord`."""

    REQUEST = ExportLogsServiceRequest
    RESPONSE = ExportLogsServiceResponse
    PATH = "/v1/logs"

    def logs(self) -> list[LogRecord]:
        with self.lock:
            requests = list(self.requests)
        out = []
        for request in requests:
            for rl in request.resource_logs:
                resource = _attrs(rl.resource.attributes)
                for sl in rl.scope_logs:
                    for r in sl.log_records:
                        kind = r.body.WhichOneof("value")
                        out.append(
                            LogRecord(
                                event_name=r.event_name,
                                time_unix_nano=r.time_unix_nano,
                                attributes=_attrs(r.attributes),
                                resource=resource,
                                scope=sl.scope.name,
                                body=getattr(r.body, kind) if kind else None,
                            )
                        )
        return out
