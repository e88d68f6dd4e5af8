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
"""

from __future__ import annotations

import errno
import glob
import logging
import math
import os
import re
import struct
import threading
import time
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
from ..context import BOOT_ID

logger = logging.getLogger(__name__)

FILE_TOKEN = "otel-"
_NAME_RE = re.compile(r"[^a-zA-Z0-9_:]")
_LABEL_RE = re.compile(r"[^a-zA-Z0-9_]")
_PID_RE = re.compile(r"_otel-(\d+)\.(?:db|id)$")

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
        self._files: dict[str, Any] = {}  # file type -> prometheus_client MmapedDict
        #: Per series (kind, OTel name, attribute items): its file keys and the values last written.
        #: series key -> a histogram's or counter's [keys, values written] list, a gauge's (key, file type)
        self._series: dict[tuple, Any] = {}
        self._closed = False
        self._failed_once = False

    # -- files ------------------------------------------------------------------------------
    def _path(self, typ: str) -> str:
        return os.path.join(self._dir, f"{typ}_{FILE_TOKEN}{self._pid}.db")

    def _file(self, typ: str):
        f = self._files.get(typ)
        if f is None:
            from prometheus_client.mmap_dict import _INITIAL_MMAP_SIZE, MmapedDict

            if not self._files:
                write_identity(self._dir, self._pid)
            path = self._path(typ)
            _allocate(path, _INITIAL_MMAP_SIZE)
            f = self._files[typ] = MmapedDict(path)
        return f

    def _write(self, typ: str, key: str, value: float, timestamp: float) -> None:
        f = self._files.get(typ) or self._file(typ)
        if key not in f._positions:
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
                            elif series[3] == counts and series[4] == point.sum:
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

    def _new_histogram(self, metric, point) -> list:
        """[bucket keys, sum key, bounds, counts written, sum written]"""
        from prometheus_client.mmap_dict import mmap_key

        name, help_text = self._name(metric.name), _help(metric.description or "", metric.unit or "")
        keys, values = self._labels(point.attributes)
        bounds = tuple(point.explicit_bounds)
        bucket_keys = [
            mmap_key(name, name + "_bucket", keys + ["le"], values + [_go_float(bound)], help_text)
            for bound in bounds + (math.inf,)
        ]
        return [bucket_keys, mmap_key(name, name + "_sum", keys, values, help_text), bounds, None, None]

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
                f.close()
            except Exception:
                pass
        self._files.clear()

    def remove_live_gauges(self) -> None:
        """Called at process exit: this process no longer contributes to ``live*`` gauges; nor do those
        of processes gone without their own cleanup (a child SIGKILLed after the sweep vLLM's stop
        allowed for, ``handlers.process``: the kill takes effect asynchronously)."""
        if os.getpid() != self._pid:
            return
        for path in _files(self._dir, f"gauge_live*_{FILE_TOKEN}{self._pid}.db"):
            try:
                os.remove(path)
            except OSError:
                pass
        _forget_identity(self._dir, self._pid)
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


def _reserve(f, key: str) -> None:
    """Before ``key`` is added to the MmapedDict ``f``: if it will grow the file (doubling it, as
    prometheus_client does), allocate the grown size first (see _allocate)."""
    n = len(key.encode("utf-8"))
    need = f._used + 4 + n + (8 - (n + 4) % 8) + 16
    capacity = f._capacity
    while need > capacity:
        capacity *= 2
    if capacity != f._capacity:
        _allocate(f._fname, capacity)


def proc_stat(pid: int) -> list[bytes]:
    """The fields of ``/proc/<pid>/stat`` after the command name (state, ppid, …, start time at index
    19); raises OSError (FileNotFoundError: no such process)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return stat[stat.rfind(b")") + 2 :].split()


def process_identity(pid: int) -> str | None:
    """``"<boot id> <start time>"`` of the running process ``pid`` (from /proc): a pid reused by
    another process, or after a reboot, has another one. None when no such process runs (a zombie
    counts as gone); ``""`` when /proc cannot tell."""
    try:
        fields = proc_stat(pid)
    except FileNotFoundError:
        return None
    except OSError:
        return ""
    if not fields or fields[0] in (b"Z", b"X"):
        return None
    return f"{BOOT_ID} {int(fields[19])}" if len(fields) > 19 else ""


def _identity_path(directory: str, pid: int) -> str:
    return os.path.join(directory, f"process_{FILE_TOKEN}{pid}.id")


def _forget_identity(directory: str, pid: int) -> None:
    """Remove ``pid``'s identity file once no metric file of it is left."""
    if not _files(directory, f"*_{FILE_TOKEN}{pid}.db"):
        try:
            os.remove(_identity_path(directory, pid))
        except OSError:
            pass


def write_identity(directory: str, pid: int) -> None:
    """Next to a process's first metric file: which process (boot and start time) wrote it, and the
    root of its process tree (pid, boot and start time)."""
    identity = process_identity(pid)
    if not identity:
        return
    from .. import environment

    root = ""
    try:
        root_pid = int(os.environ.get(environment.ROOT_PID, ""))
        root = f"{root_pid} {process_identity(root_pid) or ''}"
    except ValueError:
        pass
    try:
        with open(_identity_path(directory, pid), "w") as f:
            f.write(f"{identity}\n{root}\n")
    except OSError:
        pass


def file_process_alive(directory: str, pid: int) -> bool:
    """Whether the process that wrote ``pid``'s files still runs, in a tree that still runs: the pid
    runs and, where recorded, it is the same process (not a reused pid) and the root of its tree
    still runs (an EngineCore left running by a SIGKILLed API server serves no /metrics any more:
    its series would be counted twice next to the next server's)."""
    identity = process_identity(pid)
    if identity is None:
        return False
    if identity == "":
        return _pid_alive(pid)
    try:
        with open(_identity_path(directory, pid)) as f:
            recorded = f.read().split("\n")
    except OSError:
        return True
    if recorded[0].strip() and recorded[0].strip() != identity:
        return False
    root = recorded[1].split(" ", 1) if len(recorded) > 1 and recorded[1].strip() else None
    if root and len(root) == 2 and root[1].strip():
        try:
            root_pid = int(root[0])
        except ValueError:
            return True
        if root_pid != pid and process_identity(root_pid) not in ("", root[1].strip()):
            return False
    return True


def _files(directory: str, pattern: str) -> list[str]:
    """Files of ``directory`` matching ``pattern``; the directory's own name is taken literally (a
    ``[1]`` or ``*`` in TMPDIR or PROMETHEUS_MULTIPROC_DIR is not a glob pattern)."""
    return glob.glob(os.path.join(glob.escape(directory), pattern))


def _check_header(path: str) -> None:
    """A multiprocess file starts with the number of bytes in use (at least its 8-byte header, at
    most the file's size): anything else is not such a file, or a damaged one."""
    with open(path, "rb") as f:
        header = f.read(8)
        size = os.fstat(f.fileno()).st_size
    if len(header) < 8:
        raise ValueError(f"{size}-byte file, shorter than the header")
    used = struct.unpack_from("i", header)[0]  # native order, as prometheus_client writes it
    if not 8 <= used <= size:
        raise ValueError(f"header says {used} bytes in use, the file has {size}")


def read_whole(path: str, parse) -> list:
    """Every ``(parse(key), value, timestamp)`` of one multiprocess file, read and parsed whole before
    any of it is used: raises on a file that is not whole (random bytes, a header that does not fit
    the file, a truncated entry, a key ``parse`` rejects, a 0-byte file left by a process killed
    while creating it)."""
    from prometheus_client.mmap_dict import MmapedDict

    _check_header(path)
    return [(parse(key), value, timestamp) for key, value, timestamp, _ in MmapedDict.read_all_values_from_file(path)]


def _warn_unreadable(seen: set, path: str, exc: Exception) -> None:
    """One warning per unreadable file (each scrape skips it again, silently)."""
    if path in seen:
        return
    seen.add(path)
    logger.warning(
        "opentelemetry-instrumentation-vllm-ascend: skipping unreadable metrics file %s (%s: %s); "
        "the rest of /metrics is served",
        path,
        type(exc).__name__,
        exc,
    )


def _key_fields(key: str) -> None:
    """A key as prometheus_client's multiprocess collector unpacks it: a JSON list of metric name,
    sample name, labels object, help text."""
    import json

    _metric, _sample, labels, _help_text = json.loads(key)
    if not isinstance(labels, dict):
        raise ValueError("the labels of a key are not an object")


class _GuardedReadMetrics:
    """``MultiProcessCollector._read_metrics`` reads every file of ``PROMETHEUS_MULTIPROC_DIR`` at once
    and raises on the first it cannot read, taking vLLM's whole ``/metrics`` down (its own metrics
    too): this replacement hands it the same files less those of ours that are not whole (each
    checked with ``read_whole``; one warning per file). Other files are passed on untouched."""

    def __init__(self, original) -> None:
        self.original = original  # the staticmethod object of MultiProcessCollector
        self.skipped: set = set()

    def __call__(self, files):
        kept = []
        for path in files:
            if FILE_TOKEN in os.path.basename(path):
                try:
                    read_whole(path, _key_fields)
                except FileNotFoundError:
                    continue
                except Exception as exc:
                    _warn_unreadable(self.skipped, path, exc)
                    continue
            kept.append(path)
        return self.original.__func__(kept)


class MultiprocessGuard:
    __slots__ = ("replacement",)

    def __init__(self, replacement) -> None:
        self.replacement = replacement

    def remove(self) -> None:
        from prometheus_client.multiprocess import MultiProcessCollector

        replacement: _GuardedReadMetrics = self.replacement
        current = MultiProcessCollector.__dict__.get("_read_metrics")
        if isinstance(current, staticmethod) and current.__func__ is replacement:
            MultiProcessCollector._read_metrics = replacement.original


def guard_multiprocess_collector() -> MultiprocessGuard | None:
    """Install ``_GuardedReadMetrics`` in this process (where vLLM serves ``/metrics`` from
    ``PROMETHEUS_MULTIPROC_DIR``); None when prometheus_client has no such method or it is in place."""
    from prometheus_client.multiprocess import MultiProcessCollector

    original = MultiProcessCollector.__dict__.get("_read_metrics")
    if not isinstance(original, staticmethod) or isinstance(original.__func__, _GuardedReadMetrics):
        return None
    replacement = _GuardedReadMetrics(original)
    MultiProcessCollector._read_metrics = staticmethod(replacement)
    return MultiprocessGuard(replacement)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _file_pid(path: str) -> int | None:
    match = _PID_RE.search(path)
    return int(match.group(1)) if match else None


class _Skip(threading.local):
    active = False


class FilesCollector:
    """prometheus_client collector over one directory of per-process files (ours only).

    Same merge rules as prometheus_client's MultiProcessCollector (counters and histograms summed
    over processes, gauges by their multiprocess mode), with parsed keys cached across scrapes:
    file keys never change, so a scrape only reads values (a test checks both give the same text).
    ``describe()`` returns nothing, so registering it never clashes with vLLM's metrics and vLLM's
    ``unregister_vllm_metrics()`` (which matches collectors by name) leaves it alone.
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._keys: dict[str, tuple] = {}
        self._le: dict[float, str] = {}  # bucket bound -> its ``le`` label value
        #: Set (per thread) while recording/exposition.py renders these families itself: collect() yields none.
        self.skip = _Skip()
        self._skipped: set[str] = set()

    def describe(self):
        return []

    def _unreadable(self, path: str, exc: Exception) -> None:
        _warn_unreadable(self._skipped, path, exc)

    def _parse(self, key: str) -> tuple:
        parsed = self._keys.get(key)
        if parsed is None:
            import json

            metric, sample, labels, help_text = json.loads(key)
            items = tuple(sorted(labels.items()))
            le = labels.get("le")
            bucket = None
            if le is not None:
                bucket = (tuple(item for item in items if item[0] != "le"), float(le))
            parsed = self._keys[key] = (metric, sample, items, help_text, bucket)
        return parsed

    def collect(self):
        if self.skip.active:  # recording/exposition.py renders this collector's families itself
            return []
        from prometheus_client.metrics_core import Metric
        from prometheus_client.samples import Sample

        out = []
        for name, typ, help_text, samples in self.families():
            metric = Metric(name, help_text, typ)
            metric.samples.extend(Sample(sample, dict(labels), value) for sample, labels, value in samples)
            out.append(metric)
        return out

    def families(self) -> list:
        """Every family merged over the directory's files: ``[(name, type, help, [(sample name, label items,
        value)])]``, in exposition order (a histogram's cumulative buckets and ``_count`` per label set, then its
        ``_sum`` samples)."""
        from prometheus_client.utils import floatToGoString

        families: dict[str, list] = {}  # name -> [type, help, mode, values {(sample, labels): v}, buckets]
        for path in _files(self.directory, "*.db"):
            parts = os.path.basename(path).split("_")
            typ = parts[0]
            mode = parts[1] if typ == "gauge" else None
            if mode is not None and mode.startswith("live"):
                pid = _file_pid(path)
                if pid is not None and not file_process_alive(self.directory, pid):
                    continue
            try:
                # Read and parse the whole file before merging any of it: a file that cannot be read
                # (truncated, overwritten, a 0-byte file left by a process killed while creating it)
                # is left out whole, and the rest of /metrics — vLLM's own metrics too — is served.
                values = read_whole(path, self._parse)
            except FileNotFoundError:  # a live gauge file removed since the glob
                continue
            except Exception as exc:
                self._unreadable(path, exc)
                continue
            for (name, sample, labels, help_text, bucket), value, timestamp in values:
                family = families.get(name)
                if family is None:
                    family = families[name] = [typ, help_text, mode, {}, {}]
                samples, buckets = family[3], family[4]
                if typ == "histogram":
                    if bucket is not None:
                        rest, bound = bucket
                        per = buckets.get(rest)
                        if per is None:
                            per = buckets[rest] = {}
                        per[bound] = per.get(bound, 0.0) + value
                        continue
                    samples[(sample, labels)] = samples.get((sample, labels), 0.0) + value
                elif typ == "gauge":
                    self._gauge(samples, mode, sample, labels, value, timestamp, parts)
                else:
                    samples[(sample, labels)] = samples.get((sample, labels), 0.0) + value
        out = []
        le_of = self._le
        for name, (typ, help_text, _mode, samples, buckets) in families.items():
            rows = []
            for rest, per in buckets.items():
                acc = 0.0
                for bound in sorted(per):
                    acc += per[bound]
                    le = le_of.get(bound)
                    if le is None:
                        le = le_of[bound] = floatToGoString(bound)
                    rows.append((name + "_bucket", rest + (("le", le),), acc))
                rows.append((name + "_count", rest, acc))
            for (sample, labels), value in samples.items():
                rows.append((sample, labels, value[0] if isinstance(value, tuple) else value))
            out.append((name, typ, help_text, rows))
        return out

    @staticmethod
    def _gauge(samples, mode, sample, labels, value, timestamp, parts) -> None:
        if mode in ("all", "liveall"):
            pid = parts[2][:-3]
            samples[(sample, labels + (("pid", pid),))] = value
            return
        key = (sample, labels)
        if mode in ("sum", "livesum"):
            samples[key] = samples.get(key, 0.0) + value
        elif mode in ("max", "livemax"):
            samples[key] = max(samples.get(key, value), value)
        elif mode in ("min", "livemin"):
            samples[key] = min(samples.get(key, value), value)
        else:  # mostrecent, livemostrecent: (value, timestamp), newest wins
            current = samples.get(key)
            if current is None or current[1] < timestamp:
                samples[key] = (value, timestamp)


def _remove_files_of_dead(directory: str, pattern: str) -> None:
    alive: dict[int, bool] = {}
    for path in _files(directory, pattern):
        pid = _file_pid(path)
        if pid is None:
            continue
        if pid not in alive:
            alive[pid] = file_process_alive(directory, pid)
        if not alive[pid]:
            try:
                os.remove(path)
            except OSError:
                pass
    for pid, running in alive.items():
        if not running and pattern.endswith("*.db"):
            _forget_identity(directory, pid)


def remove_dead_files(directory: str) -> None:
    """Drop our files left by processes of an earlier run (PROMETHEUS_MULTIPROC_DIR reused): those
    of pids that no longer run, or run as another process (a pid reused after a container restart)."""
    _remove_files_of_dead(directory, f"*_{FILE_TOKEN}*.db")


def remove_dead_live_gauges(directory: str) -> None:
    """Drop the ``live*`` gauge files of processes that are gone (killed before their exit-time
    cleanup): vLLM's MultiProcessCollector would keep serving them. Counters and histograms stay."""
    _remove_files_of_dead(directory, f"gauge_live*_{FILE_TOKEN}*.db")
