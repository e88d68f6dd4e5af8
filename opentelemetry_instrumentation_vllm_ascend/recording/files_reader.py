"""Our ``/metrics`` files, read and merged: in the process that serves vLLM's ``/metrics``.

:class:`FilesCollector` merges every process's files of one directory (written by ``files_writer``) as
prometheus_client's MultiProcessCollector would, with parsed keys cached across scrapes; where vLLM merges
``PROMETHEUS_MULTIPROC_DIR`` itself, ``multiprocess_guard`` keeps a file of ours that is not
whole from taking its ``/metrics`` down and adds our exemplars to its histogram buckets. Gauges of processes that
no longer run (``identity``) are skipped.

Another writer of our names: ms-service-metric exports ``vllm_profiling_*`` names too (``catalogue.PREFIX``). Both
in one exposition would be one family from two writers (prometheus_client's multiprocess merge sums their samples:
two tools' counts added up) or one family name twice. While any family another writer exports starts with
``PREFIX``, every family of ours with that prefix is served as ``catalogue.SHARED_PREFIX`` + the rest of its name
(:class:`Sharing`), decided at each scrape, in the process that serves ``/metrics``; one warning says so.

Exemplars: each process's ``exemplars_otel-<pid>.json`` (``files_writer``) holds the latest exemplar of each
bucket it recorded; :class:`ExemplarFiles` merges them (the newest per bucket over processes) and both collectors
put them on the bucket samples (``Sample.exemplar``). prometheus_client's OpenMetrics encoder writes them; its text
encoder leaves them out, so a text scrape is what it would be without them.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import threading

from ..catalogue import PREFIX, SHARED_PREFIX
from .identity import EXEMPLARS_FILE, FILE_TOKEN, file_pid, file_process_alive, files
from .private_prometheus import registered_names

logger = logging.getLogger(__name__)


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


def warn_unreadable(seen: set, path: str, exc: Exception) -> None:
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


def key_fields(key: str) -> None:
    """A key as prometheus_client's multiprocess collector unpacks it: a JSON list of metric name,
    sample name, labels object, help text."""
    import json

    _metric, _sample, labels, _help_text = json.loads(key)
    if not isinstance(labels, dict):
        raise ValueError("the labels of a key are not an object")


def shared_name(name: str) -> str:
    """Our ``name`` as served while another writer exports names with our prefix (unchanged without that prefix)."""
    return SHARED_PREFIX + name[len(PREFIX) :] if name.startswith(PREFIX) else name


def own_name(name: str) -> str:
    """The name ``shared_name`` made ``name`` from (``name`` itself if it made none)."""
    return PREFIX + name[len(SHARED_PREFIX) :] if name.startswith(SHARED_PREFIX) else name


def writes_our_prefix(names) -> bool:
    """Whether any of ``names`` (another writer's family or sample names) starts with our prefix."""
    return any(name.startswith(PREFIX) for name in names)


class Sharing:
    """Whether our prefix is shared now, and the one warning the first time it is."""

    __slots__ = ("warned",)

    def __init__(self) -> None:
        self.warned = False

    def shared(self, names) -> bool:
        if not writes_our_prefix(names):
            return False
        if not self.warned:
            self.warned = True
            import sys

            who = "ms-service-metric" if "ms_service_metric" in sys.modules else "another exporter in this server"
            logger.warning(
                "opentelemetry-instrumentation-vllm-ascend: %s also writes %s*; this instrumentation's are served "
                "as %s* on /metrics while it does (OTLP names unchanged)",
                who,
                PREFIX,
                SHARED_PREFIX,
            )
        return True


def rename_families(metrics) -> list:
    """prometheus_client ``Metric``s (``MultiProcessCollector.merge``'s), those with our prefix renamed
    (``shared_name``), family and samples."""
    out = []
    for metric in metrics:
        if metric.name.startswith(PREFIX):
            metric.name = shared_name(metric.name)
            metric.samples = [s._replace(name=shared_name(s.name)) for s in metric.samples]
        out.append(metric)
    return out


class ExemplarFiles:
    """The exemplars of every process's ``exemplars_otel-<pid>.json`` in one directory, merged: for each bucket the
    newest over processes. A file is parsed again only when it changed (size or modification time); one that
    cannot be read is left out (one warning)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._parsed: dict[str, tuple[tuple[int, int], list]] = {}
        self._skipped: set[str] = set()

    def _rows(self, path: str) -> list:
        st = os.stat(path)
        signature = (st.st_mtime_ns, st.st_size)
        cached = self._parsed.get(path)
        if cached is not None and cached[0] == signature:
            return cached[1]
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
        rows = []
        for name, labels, le, value, timestamp, trace_id, span_id in raw:
            rest = tuple(sorted((str(k), str(v)) for k, v in labels))
            rows.append(((str(name) + "_bucket", rest, str(le)), float(value), float(timestamp), trace_id, span_id))
        self._parsed[path] = (signature, rows)
        return rows

    def read(self) -> dict:
        """{(bucket sample name, sorted label items without ``le``, ``le``): prometheus_client ``Exemplar``}"""
        newest: dict = {}
        paths = files(self.directory, f"{EXEMPLARS_FILE}_{FILE_TOKEN}*.json")
        for path in paths:
            try:
                rows = self._rows(path)
            except FileNotFoundError:
                continue
            except Exception as exc:
                warn_unreadable(self._skipped, path, exc)
                continue
            for key, value, timestamp, trace_id, span_id in rows:
                current = newest.get(key)
                if current is None or current[1] < timestamp:
                    newest[key] = (value, timestamp, trace_id, span_id)
        if len(self._parsed) > len(paths):  # files gone since: forget them
            kept = set(paths)
            self._parsed = {path: parsed for path, parsed in self._parsed.items() if path in kept}
        if not newest:
            return {}
        from prometheus_client.samples import Exemplar

        return {
            key: Exemplar({"trace_id": str(trace_id), "span_id": str(span_id)}, value, timestamp)
            for key, (value, timestamp, trace_id, span_id) in newest.items()
        }


def attach_exemplars(metrics, exemplars: dict) -> None:
    """Put ``exemplars`` (``ExemplarFiles.read()``) on the matching bucket samples of ``metrics`` (prometheus_client
    ``Metric``s, changed in place)."""
    if not exemplars:
        return
    for metric in metrics:
        if metric.type != "histogram":
            continue
        samples = metric.samples
        for i, sample in enumerate(samples):
            if sample.exemplar is not None or not sample.name.endswith("_bucket"):
                continue
            le = sample.labels.get("le")
            rest = tuple(sorted(item for item in sample.labels.items() if item[0] != "le"))
            exemplar = exemplars.get((own_name(sample.name), rest, le))
            if exemplar is not None:
                samples[i] = sample._replace(exemplar=exemplar)


class _Skip(threading.local):
    active = False
    #: Set by collect() while active: the registry being encoded holds this collector (public evidence of it).
    called = False


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
        self.exemplar_files = ExemplarFiles(directory)
        #: The registry it is served from: the other collectors' names there tell whether our prefix is shared.
        self.registry = None
        self.sharing = Sharing()

    def describe(self):
        return []

    def _unreadable(self, path: str, exc: Exception) -> None:
        warn_unreadable(self._skipped, path, exc)

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
            self.skip.called = True
            return []
        from prometheus_client.metrics_core import Metric
        from prometheus_client.samples import Sample

        out = []
        for name, typ, help_text, samples in self.families():
            metric = Metric(name, help_text, typ)
            metric.samples.extend(
                Sample(sample, dict(labels), value, None, exemplar) for sample, labels, value, exemplar in samples
            )
            out.append(metric)
        return out

    def families(self) -> list:
        """Every family merged over the directory's files: ``[(name, type, help, [(sample name, label items,
        value, exemplar or None)])]``, in exposition order (per label set, a histogram's cumulative buckets, ``_count``
        and ``_sum``: OpenMetrics keeps a label set's samples together); a bucket's exemplar is the newest any
        process recorded for it. Names with our prefix are ``shared_name``'s while another collector of
        ``registry`` has a name with that prefix (``Sharing``)."""
        from prometheus_client.utils import floatToGoString

        registry = self.registry
        families: dict[str, list] = {}  # name -> [type, help, mode, values {(sample, labels): v}, buckets]
        for path in files(self.directory, "*.db"):
            parts = os.path.basename(path).split("_")
            typ = parts[0]
            mode = parts[1] if typ == "gauge" else None
            if mode is not None and mode.startswith("live"):
                pid = file_pid(path)
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
        shared = registry is not None and self.sharing.shared(registered_names(registry, families))
        out = []
        le_of = self._le
        try:
            exemplars = self.exemplar_files.read()
        except Exception as exc:  # never /metrics down for an exemplar
            self._unreadable(self.directory, exc)
            exemplars = {}
        for name, (typ, help_text, _mode, samples, buckets) in families.items():
            rows = []
            served = shared_name(name) if shared else name
            bucket_name = name + "_bucket"
            served_bucket = served + "_bucket"
            for rest, per in buckets.items():
                acc = 0.0
                for bound in sorted(per):
                    acc += per[bound]
                    le = le_of.get(bound)
                    if le is None:
                        le = le_of[bound] = floatToGoString(bound)
                    exemplar = exemplars.get((bucket_name, rest, le)) if exemplars else None
                    rows.append((served_bucket, rest + (("le", le),), acc, exemplar))
                rows.append((served + "_count", rest, acc, None))
                total = samples.pop((name + "_sum", rest), None)  # with its label set's buckets (OpenMetrics)
                if total is not None:
                    rows.append((served + "_sum", rest, total, None))
            for (sample, labels), value in samples.items():
                sample = shared_name(sample) if shared else sample
                rows.append((sample, labels, value[0] if isinstance(value, tuple) else value, None))
            out.append((served, typ, help_text, rows))
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
