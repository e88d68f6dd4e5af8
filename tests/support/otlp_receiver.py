"""A real OTLP/HTTP metrics receiver for tests: decodes ExportMetricsServiceRequest protobufs."""

from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)


def _value(v):
    return getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None


class HttpReceiver:
    """A real OTLP/HTTP receiver on a free local port: decodes each POST as ``REQUEST`` (a protobuf message class)
    and answers ``RESPONSE``; ``PATH`` is the signal's path (``/v1/metrics``, ``/v1/traces``)."""

    REQUEST = ExportMetricsServiceRequest
    RESPONSE = ExportMetricsServiceResponse
    PATH = "/v1/metrics"

    def __init__(self):
        self.requests: list = []
        #: Each request's HTTP headers (lower-case names), in arrival order.
        self.headers: list[dict[str, str]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = receiver.REQUEST()
                request.ParseFromString(body)
                with receiver.lock:
                    receiver.requests.append(request)
                    receiver.headers.append({k.lower(): v for k, v in self.headers.items()})
                payload = receiver.RESPONSE().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{self.PATH}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


class Receiver(HttpReceiver):
    """OTLP/HTTP metrics: ExportMetricsServiceRequest protobufs."""

    def env(self, interval_ms: int) -> dict:
        """A server's environment settings that make each of its processes push to this receiver, and write
        its /metrics files, every ``interval_ms``."""
        return {
            "OTEL_METRICS_EXPORTER": "otlp_proto_http",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": self.endpoint,
            "OTEL_METRIC_EXPORT_INTERVAL": str(interval_ms),
            "OTEL_VLLM_ASCEND_PROMETHEUS_INTERVAL_MS": str(interval_ms),
        }

    def _metrics(self, metric_name: str):
        """(resource attrs dict, metric) of every received metric named ``metric_name``, in arrival order."""
        with self.lock:
            requests = list(self.requests)
        for request in requests:
            for rm in request.resource_metrics:
                resource = {kv.key: _value(kv.value) for kv in rm.resource.attributes}
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        if m.name == metric_name:
                            yield resource, m

    def points(self, metric_name: str):
        """Every received number data point of ``metric_name``:
        (resource attrs dict, point attrs dict, value, temporality, start_time, time)."""
        out = []
        for resource, m in self._metrics(metric_name):
            data = getattr(m, m.WhichOneof("data"))
            temporality = getattr(data, "aggregation_temporality", 0)
            for p in data.data_points:
                attrs = {kv.key: _value(kv.value) for kv in p.attributes}
                value = p.as_int if p.WhichOneof("value") == "as_int" else p.as_double
                out.append((resource, attrs, value, temporality, p.start_time_unix_nano, p.time_unix_nano))
        return out

    def _histograms(self, metric_name: str, by: str) -> dict:
        """{(resource attribute ``by``, sorted point attribute items): (time, count, sum)} of a cumulative
        histogram: each series' latest point."""
        latest: dict = {}
        for resource, m in self._metrics(metric_name):
            if m.WhichOneof("data") != "histogram":
                continue
            for p in m.histogram.data_points:
                key = (resource.get(by), tuple(sorted((kv.key, _value(kv.value)) for kv in p.attributes)))
                if key not in latest or latest[key][0] <= p.time_unix_nano:
                    latest[key] = (p.time_unix_nano, p.count, p.sum)
        return latest

    def histogram_counts(self, metric_name: str, by: str = "process.pid") -> dict:
        """{(resource attribute ``by``, sorted point attribute items): count} of a cumulative histogram."""
        return {key: count for key, (_, count, _) in self._histograms(metric_name, by).items()}

    def histogram_sums(self, metric_name: str, by: str = "process.pid") -> dict:
        """{(resource attribute ``by``, sorted point attribute items): sum} of a cumulative histogram."""
        return {key: total for key, (_, _, total) in self._histograms(metric_name, by).items()}

    def counter_totals(self, metric_name: str, by: str = "service.instance.id") -> dict:
        """Per process (resource attribute ``by``) total of a counter, whatever the temporality:
        delta points are summed, cumulative ones take each series' latest value."""
        delta: dict = {}
        latest: dict = {}
        for resource, attrs, value, temporality, _start, t in self.points(metric_name):
            proc = resource.get(by)
            if temporality == 1:  # DELTA
                delta[proc] = delta.get(proc, 0) + value
            else:
                key = (proc, tuple(sorted(attrs.items())))
                if key not in latest or latest[key][0] <= t:
                    latest[key] = (t, value)
        totals = dict(delta)
        for (proc, _), (_, value) in latest.items():
            totals[proc] = totals.get(proc, 0) + value
        return totals

    def resources(self) -> list[dict]:
        with self.lock:
            requests = list(self.requests)
        seen = {}
        for request in requests:
            for rm in request.resource_metrics:
                attrs = {kv.key: _value(kv.value) for kv in rm.resource.attributes}
                seen[attrs.get("service.instance.id")] = attrs
        return list(seen.values())
