"""Push exporters (OTLP, console) named by OTEL_METRICS_EXPORTER, chosen as the OTel SDK's configurator chooses
them (``otlp`` over the protocol OTEL_EXPORTER_OTLP_[METRICS_]PROTOCOL names), made fork-safe. Each exporter reads its
own endpoint, headers, timeout, compression and certificate settings (per signal, else general) when it is built."""

from __future__ import annotations

import logging
import os
from types import MappingProxyType

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

from .. import environment
from . import private_otel

logger = logging.getLogger(__name__)


class PidGuardedExporter(MetricExporter):
    """Delegates to ``inner`` in the process that built it; a copy inherited through fork exports
    nothing (the child builds its own pipeline), so pre-fork data is never exported twice."""

    def __init__(self, inner: MetricExporter, preferences: tuple = (None, None)) -> None:
        super().__init__(preferred_temporality=preferences[0], preferred_aggregation=preferences[1])
        self.inner = inner
        self.pid = os.getpid()

    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        if os.getpid() != self.pid:
            return MetricExportResult.SUCCESS
        return self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        if os.getpid() != self.pid:
            return True
        return self.inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        if os.getpid() == self.pid:
            self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)


#: The metrics exporter entry point each OTLP protocol selects for ``otlp`` (the SDK configurator's map).
BY_PROTOCOL = MappingProxyType({"grpc": "otlp_proto_grpc", "http/protobuf": "otlp_proto_http"})
OTLP = "otlp"


def entry_point_name(name: str, signal: str = "metrics") -> str:
    """The entry point OTEL_METRICS_EXPORTER's (``signal="traces"``: OTEL_TRACES_EXPORTER's; ``"logs"``: the step
    records' log exporter's) ``name`` loads, by the
    SDK configurator's rule: ``otlp`` follows OTEL_EXPORTER_OTLP_METRICS_PROTOCOL (…_TRACES_PROTOCOL), else
    OTEL_EXPORTER_OTLP_PROTOCOL (gRPC when neither is set); an explicit ``otlp_proto_grpc`` / ``otlp_proto_http`` is
    kept even where the protocol disagrees (with a warning). Raises ValueError for a protocol the SDK does not know."""
    if name not in (OTLP, *BY_PROTOCOL.values()):
        return name
    own = {"traces": environment.OTLP_TRACES_PROTOCOL, "logs": environment.OTLP_LOGS_PROTOCOL}.get(
        signal, environment.OTLP_METRICS_PROTOCOL
    )
    protocol = os.environ.get(own) or os.environ.get(environment.OTLP_PROTOCOL)
    if not protocol:
        return BY_PROTOCOL["grpc"] if name == OTLP else name
    protocol = protocol.strip()
    if name == OTLP:
        if protocol not in BY_PROTOCOL:
            raise ValueError(f"unsupported OTLP protocol {protocol!r} (supported: {', '.join(BY_PROTOCOL)})")
        return BY_PROTOCOL[protocol]
    if BY_PROTOCOL.get(protocol, name) != name:
        environment.warn_once(
            ("otlp protocol", signal, name, protocol),
            "OTEL_%s_EXPORTER names %s, the OTLP protocol setting says %r: using %s",
            signal.upper(),
            name,
            protocol,
            name,
        )
    return name


def push_exporters() -> list[MetricExporter]:
    """Exporters named by OTEL_METRICS_EXPORTER, loaded through the same entry points the SDK uses."""
    return [fork_guarded(e) for e in load_exporters(environment.otlp_exporter_names(), "metrics")]


def fork_guarded(inner: MetricExporter) -> MetricExporter:
    """``inner`` behind a PidGuardedExporter that carries its temporality and aggregation preferences; where the
    SDK does not hold them where private_otel reads them, ``inner`` itself with its methods guarded in place (the
    reader then reads its preferences, whatever their shape)."""
    preferences = private_otel.exporter_preferences(inner)
    if preferences is not None:
        return PidGuardedExporter(inner, preferences)
    pid = os.getpid()
    export, force_flush, shutdown = inner.export, inner.force_flush, inner.shutdown

    def guarded_export(metrics_data, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        if os.getpid() != pid:
            return MetricExportResult.SUCCESS
        return export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def guarded_force_flush(timeout_millis: float = 10_000) -> bool:
        return True if os.getpid() != pid else force_flush(timeout_millis=timeout_millis)

    def guarded_shutdown(timeout_millis: float = 30_000, **kwargs) -> None:
        if os.getpid() == pid:
            shutdown(timeout_millis=timeout_millis, **kwargs)

    inner.export = guarded_export
    inner.force_flush = guarded_force_flush
    inner.shutdown = guarded_shutdown
    return inner


def load_exporters(names, signal: str) -> list:
    """One exporter per name of OTEL_METRICS_EXPORTER (``signal="metrics"``) or OTEL_TRACES_EXPORTER (``"traces"``),
    created from the entry point the SDK's configurator would load (:func:`entry_point_name`); the names that cannot
    be loaded are one warning together (one that raises while created, a logged error) and no exporter."""
    from importlib.metadata import entry_points

    variable = f"OTEL_{signal.upper()}_EXPORTER"
    exporters, problems = [], []
    for name in names:
        try:
            try:
                chosen = entry_point_name(name, signal)
            except ValueError as exc:
                problems.append(f"{name!r}: {exc}")
                continue
            found = list(entry_points(group=f"opentelemetry_{signal}_exporter", name=chosen))
            if not found:
                problems.append(f"{name!r} (exporter {chosen!r}) is not installed")
                continue
            exporters.append(found[0].load()())
        except Exception:
            logger.exception("could not create the %r %s exporter; continuing without it", name, signal)
    if problems:
        environment.warn_once(
            (signal, "exporter", tuple(problems)), "%s: %s; not exporting there", variable, "; ".join(problems)
        )
    return exporters
