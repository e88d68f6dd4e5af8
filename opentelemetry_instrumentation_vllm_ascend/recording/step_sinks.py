"""The step records' sinks (docs/steps.md), each made and driven by the stream's one background thread
(``step_records.Stream``): ``ZmqSink`` (a PUB socket, msgpack, wire-compatible with NVIDIA Dynamo's forward-pass
metrics v1), ``FileSink`` (JSON lines, rotated, size-bounded) and ``OtlpLogsSink`` (one OTLP log record per step,
event ``vllm_ascend.step``, through the OpenTelemetry logs SDK's ``BatchLogRecordProcessor`` and the OTLP log
exporter the standard ``OTEL_EXPORTER_OTLP_[LOGS_]*`` variables choose). A sink's ``send`` takes one built record
(a dict); ``batch_done`` (optional) runs after each drain, ``flush`` (optional) on a flush request, ``close`` once.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from .. import catalogue, context, environment

#: A ``step_records.Stream`` (not imported: step_records imports this module).
Stream = Any

logger = logging.getLogger(__name__)

#: The event name of each step's OTLP log record.
EVENT_NAME = "vllm_ascend.step"
#: The SDK's default for ``OTEL_BLRP_MAX_QUEUE_SIZE``.
DEFAULT_BLRP_QUEUE = 2048
BLRP_MAX_QUEUE_SIZE = "OTEL_BLRP_MAX_QUEUE_SIZE"


def _port_plus(endpoint: str, dp: int) -> str:
    """``tcp://host:PORT`` → ``tcp://host:PORT+dp`` (Dynamo's rule: one port per DP rank); ``{dp}`` in any
    endpoint is replaced by the rank."""
    if "{dp}" in endpoint:
        return endpoint.replace("{dp}", str(max(dp, 0)))
    if endpoint.startswith("tcp://"):
        head, _, port = endpoint.rpartition(":")
        if port.isdigit():
            return f"{head}:{int(port) + max(dp, 0)}"
    return endpoint


def _file_path(template: str) -> str:
    """``{dp}`` and ``{pid}`` replaced; a path with neither gets ``-<pid>`` before its extension (several
    EngineCores never share a file)."""
    if "{dp}" in template or "{pid}" in template:
        return template.replace("{dp}", context.PROCESS.dp).replace("{pid}", str(os.getpid()))
    root, ext = os.path.splitext(template)
    return f"{root}-{os.getpid()}{ext}"


class ZmqSink:
    def __init__(self, stream: Stream, endpoint: str, hwm: int) -> None:
        import msgspec
        import zmq

        self.zmq = zmq
        self.encode = msgspec.msgpack.Encoder().encode
        self.context = zmq.Context()
        sock = self.context.socket(zmq.XPUB)
        sock.setsockopt(zmq.XPUB_NODROP, 1)  # a full subscriber pipe raises Again: counted, never silent
        sock.setsockopt(zmq.SNDHWM, hwm)
        sock.bind(endpoint)
        self.socket = sock
        self.endpoint = endpoint
        self.stream = stream
        self.seq = 0

    def poll_subscriptions(self) -> None:
        zmq = self.zmq
        while True:
            try:
                message = self.socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if message[:1] == b"\x01":
                self.stream.subscribers += 1
            elif message[:1] == b"\x00":
                self.stream.subscribers -= 1

    def send(self, record: dict) -> None:
        payload = self.encode(record)
        try:
            # Dynamo's frames: topic (empty), an 8-byte big-endian sequence number, the msgpack payload.
            self.socket.send_multipart((b"", self.seq.to_bytes(8, "big"), payload), flags=self.zmq.NOBLOCK)
        except self.zmq.Again:
            self.stream.dropped["zmq_full"] += 1
            return
        self.seq += 1
        self.stream.sent += 1

    def close(self, linger_ms: int) -> None:
        try:
            self.socket.close(linger=linger_ms)
            self.context.term()
        except Exception:
            logger.debug("step records: closing the ZMQ socket failed", exc_info=True)


class FileSink:
    """JSON lines, rotated past ``max_bytes`` (``path.1`` … ``path.<backups>``): at most
    ``max_bytes * (backups + 1)`` bytes on disk."""

    def __init__(self, stream: Stream, path: str, max_bytes: int, backups: int) -> None:
        self.stream = stream
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self.file: Any = open(path, "a", encoding="utf-8")  # noqa: SIM115 (kept open; closed by close())
        self.size = self.file.tell()

    def _rotate(self) -> None:
        self.file.close()
        if self.backups:
            for n in range(self.backups - 1, 0, -1):
                older = f"{self.path}.{n}"
                if os.path.exists(older):
                    os.replace(older, f"{self.path}.{n + 1}")
            os.replace(self.path, f"{self.path}.1")
        else:
            os.remove(self.path)
        self.file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self.size = 0

    def send(self, record: dict) -> None:
        line = json.dumps(record, separators=(",", ":")) + "\n"
        try:
            if self.size and self.size + len(line) > self.max_bytes:
                self._rotate()
            self.file.write(line)
            self.size += len(line)
        except Exception:
            self.stream.dropped["file_error"] += 1
            environment.warn_once(
                ("step records file", self.path),
                "opentelemetry-instrumentation-vllm-ascend: step records: writing %s failed",
                self.path,
            )

    def batch_done(self) -> None:
        try:
            self.file.flush()
        except Exception:
            pass

    def close(self, linger_ms: int) -> None:
        try:
            self.file.close()
        except Exception:
            pass


def flatten(record: dict, prefix: str = "") -> dict:
    """A record's fields as OTLP attributes: nested maps flattened with dotted keys
    (``scheduled_requests.num_prefill_requests``, ``otel_vllm_ascend.phase``); a None value (a field the step
    could not read) is left out, never a made-up value."""
    out: dict = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        elif value is not None:
            out[name] = value
    return out


def otlp_log_exporter():
    """The OTLP log exporter the standard variables choose: OTEL_EXPORTER_OTLP_LOGS_PROTOCOL, else
    OTEL_EXPORTER_OTLP_PROTOCOL (gRPC when neither is set, the SDK configurator's rule for ``otlp``), loaded from
    the ``opentelemetry_logs_exporter`` entry point the SDK uses; it reads its own endpoint, headers, timeout,
    compression and certificates (``OTEL_EXPORTER_OTLP_LOGS_*``, else ``OTEL_EXPORTER_OTLP_*``). Raises when the
    protocol is unknown or its exporter is not installed."""
    from importlib.metadata import entry_points

    from .otlp import OTLP, entry_point_name

    name = entry_point_name(OTLP, "logs")
    found = list(entry_points(group="opentelemetry_logs_exporter", name=name))
    if not found:
        raise RuntimeError(f"the {name} log exporter is not installed (pip install opentelemetry-exporter-otlp)")
    return found[0].load()()


class _CountingExporter:
    """The exporter, counting what it was handed: ``seen`` records (the batch processor's thread writes it), of
    which ``failed`` the exporter reported as not exported (``step_record_dropped{reason="otlp_error"}``)."""

    def __init__(self, inner, stream: Stream) -> None:
        self.inner = inner
        self.stream = stream
        self.seen = 0

    def export(self, batch):
        try:
            result = self.inner.export(batch)
        except Exception:
            logger.debug("step records: the OTLP log export raised", exc_info=True)
            result = None
        if getattr(result, "name", None) != "SUCCESS":
            self.stream.dropped["otlp_error"] += len(batch)
        self.seen += len(batch)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))


class OtlpLogsSink:
    """One OTLP log record per step record: event ``vllm_ascend.step``, timestamped at the step's start, its
    attributes the record's fields (``flatten``), on the process's metrics resource. The SDK's batch processor
    exports them on its own thread; its queue (``OTEL_BLRP_MAX_QUEUE_SIZE``) never drops one unseen: a record is
    emitted only while fewer than that many are in the processor (emitted, not yet exported), else it is dropped
    here and counted (``otlp_full``)."""

    def __init__(self, stream: Stream, exporter=None, resource=None) -> None:
        from ..version import __version__
        from .private_otel import logs_sdk

        LoggerProvider, BatchLogRecordProcessor = logs_sdk()

        if resource is None:
            from . import pipeline

            resource = pipeline.get().resource
        self.stream = stream
        self.limit = environment.positive_int(BLRP_MAX_QUEUE_SIZE, DEFAULT_BLRP_QUEUE)
        self.exporter = _CountingExporter(exporter if exporter is not None else otlp_log_exporter(), stream)
        self.provider = LoggerProvider(resource=resource, shutdown_on_exit=False)
        self.provider.add_log_record_processor(BatchLogRecordProcessor(self.exporter, max_queue_size=self.limit))
        self.logger = self.provider.get_logger(catalogue.SCOPE_NAME, __version__)
        self.emitted = 0

    def send(self, record: dict) -> None:
        if self.emitted - self.exporter.seen >= self.limit:
            self.stream.dropped["otlp_full"] += 1
            return
        extension = record.get("otel_vllm_ascend") or {}
        start = extension.get("start_time_unix")
        self.logger.emit(
            timestamp=int(start * 1e9) if start is not None else None,
            event_name=EVENT_NAME,
            attributes=flatten(record),
        )
        self.emitted += 1

    def flush(self, timeout_s: float) -> None:
        self.provider.force_flush(int(timeout_s * 1000))

    def close(self, linger_ms: int) -> None:
        try:
            self.provider.shutdown()
        except Exception:
            logger.debug("step records: shutting the OTLP logs down failed", exc_info=True)


def open_sinks(stream: Stream) -> None:
    """The sinks ``stream`` turns on, made in its background thread (the EngineCore's dp is known by then); one
    that cannot be made is one log line, and the others go on."""
    dp = context.PROCESS.dp
    rank = int(dp) if dp.isdigit() else 0
    if stream.zmq_endpoint:
        try:
            stream.sinks.append(ZmqSink(stream, _port_plus(stream.zmq_endpoint, rank), stream.zmq_hwm))
        except Exception as exc:
            logger.warning(
                "opentelemetry-instrumentation-vllm-ascend: step records: no ZMQ sink on %s (%s: %s)",
                stream.zmq_endpoint,
                type(exc).__name__,
                exc,
            )
    if stream.file_path:
        try:
            path = _file_path(stream.file_path)
            stream.sinks.append(FileSink(stream, path, stream.file_max_bytes, stream.file_backups))
        except Exception as exc:
            logger.warning(
                "opentelemetry-instrumentation-vllm-ascend: step records: no file sink at %s (%s: %s)",
                stream.file_path,
                type(exc).__name__,
                exc,
            )
    if stream.otlp_logs:
        try:
            stream.sinks.append(OtlpLogsSink(stream))
        except Exception as exc:
            logger.warning(
                "opentelemetry-instrumentation-vllm-ascend: step records: no OTLP logs sink (%s: %s)",
                type(exc).__name__,
                exc,
            )
