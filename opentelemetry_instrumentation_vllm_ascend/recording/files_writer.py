"""Per-process metrics → prometheus_client multiprocess files → vLLM's own ``/metrics``.

Every instrumented process (API server, EngineCore, workers, a forked EPLB child) periodically
writes its cumulative OTel data into mmap files of prometheus_client's multiprocess format in one
shared directory: ``counter_otel-<pid>.db``, ``histogram_otel-<pid>.db``, ``gauge_<mode>_otel-<pid>.db``.
The ``otel-`` token keeps them apart from prometheus_client's own per-pid files.

- With ``PROMETHEUS_MULTIPROC_DIR`` set (vLLM sets it itself when ``--api-server-count > 1``), the
  files go there and vLLM's ``get_prometheus_registry()`` merges them with no help from us.
- Without it, the first instrumented process creates a directory, passes it to its children in the
  environment and registers :class:`FilesCollector` on ``prometheus_client.REGISTRY``, which vLLM's
  ``/metrics`` serves.

Counters and histograms of processes that exited stay in the sum (their files remain); ``live*``
gauges of dead processes are dropped (the process removes its gauge file at exit; FilesCollector
also skips files of pids that no longer run).

Histogram exemplars (``recording.record_exemplar``), which prometheus_client's multiprocess files cannot hold,
go into a side file per process, ``exemplars_otel-<pid>.json``: the latest exemplar of each bucket of each series,
rewritten whole (to a temporary file, then renamed) when an export brings new ones. ``files_reader`` attaches
them to the bucket samples, which the OpenMetrics format shows and the text format leaves out.

This module writes the files; ``files_reader`` reads and merges them, ``identity`` tells whose they are.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import re
import time
from bisect import bisect_left
from types import MappingProxyType
from typing import Any

from opentelemetry.sdk.metrics import (
    Counter,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
)
from opentelemetry.sdk.metrics import (
    Histogram as HistogramInstrument,
)
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    MetricExporter,
    MetricExportResult,
    Sum,
)

from .. import catalogue, environment
from .identity import EXEMPLARS_FILE, FILE_TOKEN, files, forget_identity, remove_dead_live_gauges, write_identity

logger = logging.getLogger(__name__)

_NAME_RE = re.compile(r"[^a-zA-Z0-9_:]")
_LABEL_RE = re.compile(r"[^a-zA-Z0-9_]")

_CUMULATIVE = MappingProxyType(
    {
        cls: AggregationTemporality.CUMULATIVE
        for cls in (
            Counter,
            UpDownCounter,
            HistogramInstrument,
            ObservableCounter,
            ObservableUpDownCounter,
            ObservableGauge,
        )
    }
)


def metric_name(name: str) -> str:
    name = _NAME_RE.sub("_", name)
    return "_" + name if name[:1].isdigit() else name


def label_name(key: str) -> str:
    key = _LABEL_RE.sub("_", key)
    return "_" + key if key[:1].isdigit() else key


def _help(description: str, unit: str) -> str:
    return f"{description} Unit: {unit}." if unit else description


def _go_float(value: float) -> str:
    from prometheus_client.utils import floatToGoString

    return floatToGoString(value)


class FilesExporter(MetricExporter):
    """Writes cumulative points into this process's multiprocess files (no-op in any other pid)."""

    def __init__(self, directory: str, gauge_modes: dict[str, str] | None = None, genai: bool | None = None) -> None:
        """``genai``: write the explicitly named (GenAI semantic-convention) metrics too, under their
        OTel→Prometheus names (default: ``environment.genai_prometheus_enabled()``)."""
        super().__init__(preferred_temporality=_CUMULATIVE)
        self._dir = directory
        self._pid = os.getpid()
        self._gauge_modes = (
            gauge_modes if gauge_modes is not None else {s.exposed_name: s.gauge_mode for s in catalogue.CATALOGUE}
        )
        named = {s.exposed_name: s.prometheus_name for s in catalogue.CATALOGUE if s.name}
        if genai is None:
            genai = environment.genai_prometheus_enabled()
        #: Metric names written under another name than their sanitised OTel name.
        self._names = named if genai else {}
        #: Metric names not written at all.
        self._skip = frozenset() if genai else frozenset(named)
        self._files: dict[str, _File] = {}  # file type -> its prometheus_client MmapedDict and what it holds
        #: Per series (kind, OTel name, attribute items): its file keys and the values last written.
        #: series key -> a histogram's or counter's [keys, values written] list, a gauge's (key, file type)
        self._series: dict[tuple, Any] = {}
        #: Per histogram series (family name, sorted label items): {le: [value, time s, trace id hex, span id hex]}.
        self._exemplars: dict[tuple, dict[str, list]] = {}
        self._closed = False
        self._failed_once = False

    # -- files ------------------------------------------------------------------------------
    def _path(self, typ: str) -> str:
        return os.path.join(self._dir, f"{typ}_{FILE_TOKEN}{self._pid}.db")

    def _file(self, typ: str) -> _File:
        f = self._files.get(typ)
        if f is None:
            if not self._files:
                write_identity(self._dir, self._pid)
            path = self._path(typ)
            _allocate(path, _INITIAL_SIZE)
            f = self._files[typ] = _File(path)
        return f

    def _write(self, typ: str, key: str, value: float, timestamp: float) -> None:
        f = self._files.get(typ) or self._file(typ)
        if key not in f.keys:
            _reserve(f, key)
        f.write_value(key, value, timestamp)

    # -- export -----------------------------------------------------------------------------
    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        if self._closed or os.getpid() != self._pid:
            # An exporter inherited through fork must never re-export the parent's data.
            return MetricExportResult.SUCCESS
        try:
            self._export(metrics_data)
        except OSError as exc:  # the disk is full (or gone): stop writing, once
            self._closed = True
            logger.error(
                "opentelemetry-instrumentation-vllm-ascend: cannot write metrics for /metrics into %s "
                "(%s); this process stops writing them (its series on /metrics stop updating), vLLM "
                "runs on",
                self._dir,
                exc,
            )
            return MetricExportResult.FAILURE
        except Exception:  # never let /metrics plumbing hurt the host
            if not self._failed_once:
                self._failed_once = True
                logger.exception(
                    "opentelemetry-instrumentation-vllm-ascend: writing metrics for /metrics failed "
                    "(further failures are logged at debug level)"
                )
            else:
                logger.debug("writing metrics for /metrics failed", exc_info=True)
            return MetricExportResult.FAILURE
        return MetricExportResult.SUCCESS

    def _export(self, metrics_data) -> None:
        """Writes what changed since the last export: a counter or a histogram series whose values are
        those already written is skipped (a histogram compares its bucket counts and sum at once),
        and only the buckets that changed are rewritten. Gauges are always written (their timestamp
        decides between processes). File keys are built once per series."""
        now = time.time()
        exemplars_changed = False
        series_of = self._series
        skip = self._skip
        for resource_metrics in metrics_data.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    if metric.name in skip:
                        continue
                    data = metric.data
                    if isinstance(data, Histogram):
                        kind = "h"
                    elif isinstance(data, Sum) and data.is_monotonic:
                        kind = "c"
                    elif isinstance(data, (Sum, Gauge)):
                        kind = "g"
                    else:  # exponential histograms never reach this exporter: Views fix explicit buckets
                        continue
                    for point in data.data_points:
                        attributes = point.attributes
                        series_key = (kind, metric.name, tuple(attributes.items()) if attributes else ())
                        series = series_of.get(series_key)
                        if kind == "h":
                            counts = tuple(point.bucket_counts)
                            if series is None or series[2] != tuple(point.explicit_bounds):
                                series = series_of[series_key] = self._new_histogram(metric, point)
                            if point.exemplars:
                                exemplars_changed = self._take_exemplars(series, point) or exemplars_changed
                            if series[3] == counts and series[4] == point.sum:
                                continue
                            self._write_histogram(series, counts, float(point.sum))
                        elif kind == "c":
                            if series is None:
                                series = series_of[series_key] = self._new_counter(metric, point)
                            value = float(point.value)
                            if series[1] != value:
                                self._write("counter", series[0], value, 0.0)
                                series[1] = value
                        else:
                            if series is None:
                                series = series_of[series_key] = self._new_gauge(metric, point)
                            self._write(series[1], series[0], float(point.value), now)
        if exemplars_changed:
            self._write_exemplars()

    def _new_histogram(self, metric, point) -> list:
        """[bucket keys, sum key, bounds, counts written, sum written, (family name, label items), le per bucket]"""
        from prometheus_client.mmap_dict import mmap_key

        name, help_text = self._name(metric.name), _help(metric.description or "", metric.unit or "")
        keys, values = self._labels(point.attributes)
        bounds = tuple(point.explicit_bounds)
        les = [_go_float(bound) for bound in bounds + (math.inf,)]
        bucket_keys = [mmap_key(name, name + "_bucket", keys + ["le"], values + [le], help_text) for le in les]
        sum_key = mmap_key(name, name + "_sum", keys, values, help_text)
        return [bucket_keys, sum_key, bounds, None, None, (name, tuple(zip(keys, values))), les]

    def _take_exemplars(self, series: list, point) -> bool:
        """Keep each exemplar of ``point`` as its bucket's latest; whether any was new."""
        bounds, les = series[2], series[6]
        per = self._exemplars.get(series[5])
        if per is None:
            per = self._exemplars[series[5]] = {}
        changed = False
        for exemplar in point.exemplars:
            if exemplar.trace_id is None or exemplar.span_id is None:
                continue
            entry = [
                float(exemplar.value),
                exemplar.time_unix_nano / 1e9,
                format(exemplar.trace_id, "032x"),
                format(exemplar.span_id, "016x"),
            ]
            le = les[bisect_left(bounds, exemplar.value)]
            if per.get(le) != entry:
                per[le] = entry
                changed = True
        return changed

    def _write_exemplars(self) -> None:
        """This process's exemplars file, whole: ``[[family, [[label, value], …], le, value, time s, trace id,
        span id], …]``, written aside and renamed over the previous one (a reader never sees half of it)."""
        rows = [
            [name, [list(item) for item in labels], le, *entry]
            for (name, labels), per in self._exemplars.items()
            for le, entry in per.items()
        ]
        path = os.path.join(self._dir, f"{EXEMPLARS_FILE}_{FILE_TOKEN}{self._pid}.json")
        temporary = path + ".tmp"
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump(rows, f, separators=(",", ":"))
        os.replace(temporary, path)

    def _write_histogram(self, series: list, counts: tuple, sum_: float) -> None:
        write = self._write
        written = series[3]
        for i, (key, count) in enumerate(zip(series[0], counts)):
            if written is None or written[i] != count:
                write("histogram", key, float(count), 0.0)
        if series[4] != sum_:
            write("histogram", series[1], sum_, 0.0)
        series[3], series[4] = counts, sum_

    def _new_counter(self, metric, point) -> list:
        """[key, value written]"""
        from prometheus_client.mmap_dict import mmap_key

        name = self._name(metric.name)
        base = name[:-6] if name.endswith("_total") else name
        keys, values = self._labels(point.attributes)
        return [mmap_key(base, base + "_total", keys, values, _help(metric.description or "", metric.unit or "")), None]

    def _new_gauge(self, metric, point) -> tuple:
        """(key, file type)"""
        from prometheus_client.mmap_dict import mmap_key

        name = self._name(metric.name)
        keys, values = self._labels(point.attributes)
        return (
            mmap_key(name, name, keys, values, _help(metric.description or "", metric.unit or "")),
            "gauge_" + self._gauge_modes.get(metric.name, "livemostrecent"),
        )

    def _name(self, otel_name: str) -> str:
        return self._names.get(otel_name) or metric_name(otel_name)

    @staticmethod
    def _labels(attributes) -> tuple[list, list]:
        items = sorted(attributes.items()) if attributes else ()
        return [label_name(k) for k, _ in items], [v if isinstance(v, str) else str(v) for _, v in items]

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        if os.getpid() != self._pid:
            return
        self._closed = True
        for f in self._files.values():
            try:
                f.mmaped.close()
            except Exception:
                pass
        self._files.clear()

    def remove_live_gauges(self) -> None:
        """Called at process exit: this process no longer contributes to ``live*`` gauges; nor do those
        of processes gone without their own cleanup (a child SIGKILLed after the sweep vLLM's stop
        allowed for, ``handlers.process``: the kill takes effect asynchronously)."""
        if os.getpid() != self._pid:
            return
        for path in files(self._dir, f"gauge_live*_{FILE_TOKEN}{self._pid}.db"):
            try:
                os.remove(path)
            except OSError:
                pass
        forget_identity(self._dir, self._pid)
        try:
            remove_dead_live_gauges(self._dir)
        except Exception:  # a sweep of others' files: never an error at exit
            pass


def _allocate(path: str, size: int) -> None:
    """Makes the first ``size`` bytes of ``path`` (created if needed) take real disk blocks now. An
    mmap'ed file grown with truncate() is sparse: on a full filesystem the first write into a page
    the disk cannot back is a SIGBUS that kills the process. Allocated first, a full disk is an
    OSError (ENOSPC) here instead. On a filesystem without fallocate the file stays sparse (a full
    disk can then still be a SIGBUS)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        size = max(size, os.fstat(fd).st_size)
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
    finally:
        os.close(fd)


def _entry_size(key: str) -> int:
    """Bytes a key's entry takes in a prometheus_client mmap file: its length (4), the key padded to 8-byte
    alignment, value and timestamp (8 each) — the file format ``MmapedDict`` writes."""
    n = len(key.encode("utf-8"))
    return 4 + n + (8 - (n + 4) % 8) + 16


def _reserve(f: _File, key: str) -> None:
    """Before ``key`` is added to the MmapedDict of ``f``: if it will grow the file (doubling it, as
    prometheus_client does), allocate the grown size first (see _allocate)."""
    size = _entry_size(key)
    need = f.used + size
    capacity = f.capacity
    while need > capacity:
        capacity *= 2
    if capacity != f.capacity:
        _allocate(f.path, capacity)
        f.capacity = capacity
    f.used = need
    f.keys.add(key)


#: The size a new file starts at (prometheus_client's own first size; a file we allocated first keeps its size).
_INITIAL_SIZE = 1 << 20


class _File:
    """One prometheus_client ``MmapedDict`` of this process and what it holds, counted here from its public
    ``read_all_values()`` and the file format, so that no private field of prometheus_client is read: the keys
    written, the bytes used and the file's size (which ``_reserve`` grows before prometheus_client does)."""

    __slots__ = ("path", "mmaped", "write_value", "keys", "used", "capacity")

    def __init__(self, path: str) -> None:
        from prometheus_client.mmap_dict import MmapedDict

        self.path = path
        self.mmaped = MmapedDict(path)
        self.write_value = self.mmaped.write_value
        self.keys = {key for key, _, _ in self.mmaped.read_all_values()}
        self.used = 8 + sum(_entry_size(key) for key in self.keys)  # an 8-byte header, then the entries
        self.capacity = os.path.getsize(path)
