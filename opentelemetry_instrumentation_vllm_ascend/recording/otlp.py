"""Push exporters (OTLP, console) named by OTEL_METRICS_EXPORTER, made fork-safe."""

from __future__ import annotations

import logging
import os

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

from .. import environment

logger = logging.getLogger(__name__)


class PidGuardedExporter(MetricExporter):
    """Delegates to ``inner`` in the process that built it; a copy inherited through fork exports
    nothing (the child builds its own pipeline), so pre-fork data is never exported twice."""

    def __init__(self, inner: MetricExporter) -> None:
        super().__init__(
            preferred_temporality=getattr(inner, "_preferred_temporality", None),
            preferred_aggregation=getattr(inner, "_preferred_aggregation", None),
        )
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


def push_exporters() -> list[MetricExporter]:
    """Exporters named by OTEL_METRICS_EXPORTER, loaded through the same entry points the SDK uses."""
    from opentelemetry.util._importlib_metadata import entry_points

    exporters = []
    for name in environment.otlp_exporter_names():
        try:
            found = list(entry_points(group="opentelemetry_metrics_exporter", name=name))
            if not found:
                environment.warn_once(
                    ("exporter", name),
                    "OTEL_METRICS_EXPORTER names %r, which is not installed: not exporting there",
                    name,
                )
                continue
            exporters.append(PidGuardedExporter(found[0].load()()))
        except Exception:
            logger.exception("could not create the %r metrics exporter; continuing without it", name)
    return exporters
