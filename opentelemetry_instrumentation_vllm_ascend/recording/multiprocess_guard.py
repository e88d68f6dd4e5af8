"""Where vLLM merges ``PROMETHEUS_MULTIPROC_DIR`` itself (prometheus_client's MultiProcessCollector): a file of ours
that is not whole never takes its ``/metrics`` down, ours are renamed while another writer exports our prefix
(``files_reader.Sharing``), and our exemplars (``files_reader.ExemplarFiles``) go on its histogram buckets. Both
replacements wrap public methods of MultiProcessCollector (``merge``, ``collect``)."""

from __future__ import annotations

import logging
import os
import threading

from .files_reader import (
    ExemplarFiles,
    Sharing,
    attach_exemplars,
    key_fields,
    read_whole,
    rename_families,
    warn_unreadable,
)
from .identity import FILE_TOKEN

logger = logging.getLogger(__name__)


class _Merged(threading.local):
    #: The directory of the files the last ``MultiProcessCollector.merge`` of this thread read (its collector's).
    directory: str | None = None


class _GuardedMerge:
    """``MultiProcessCollector.merge`` (public; ``collect()`` hands it every file of ``PROMETHEUS_MULTIPROC_DIR``)
    reads them all at once and raises on the first it cannot read, taking vLLM's whole ``/metrics`` down (its own
    metrics too): this replacement hands it the same files less those of ours that are not whole (each checked
    with ``read_whole``; one warning per file). Other files are passed on untouched. It notes the files' directory
    (``merged``), where ``_ExemplarCollect`` finds the exemplar files.

    Ours and the other files are merged apart (each file once) and put together; while another writer's families
    include one with our prefix, ours with that prefix are renamed first (``Sharing``), so no family of ours is
    summed with another tool's. Where both write a name outside our prefix, one merge of every file, as before."""

    def __init__(self, original) -> None:
        self.original = original  # the staticmethod object of MultiProcessCollector
        self.skipped: set = set()
        self.sharing = Sharing()
        self.merged = _Merged()

    def __call__(self, files, accumulate=True):
        ours, others = [], []
        for path in files:
            if FILE_TOKEN in os.path.basename(path):
                try:
                    read_whole(path, key_fields)
                except FileNotFoundError:
                    continue
                except Exception as exc:
                    warn_unreadable(self.skipped, path, exc)
                    continue
                ours.append(path)
            else:
                others.append(path)
        self.merged.directory = os.path.dirname(files[0]) if files else None
        merge = self.original.__func__
        if not ours or not others:
            return merge(ours or others, accumulate)
        metrics = list(merge(others, accumulate))
        mine = list(merge(ours, accumulate))
        names = {m.name for m in metrics}
        if not self.sharing.shared(names):
            if names.isdisjoint(m.name for m in mine):
                return metrics + mine
            return merge(ours + others, accumulate)  # a name both write: one merge sums it, as always
        by_name = {m.name: m for m in metrics}
        for metric in rename_families(mine):
            current = by_name.get(metric.name)
            if current is None:
                metrics.append(metric)
            else:  # a name both write outside our prefix: one family, the two writers' series side by side
                current.samples.extend(metric.samples)
        return metrics


class _ExemplarCollect:
    """``MultiProcessCollector.collect`` with our exemplars on its buckets (prometheus_client's multiprocess mode
    has no exemplars: the files hold values only). The merged samples are passed on otherwise untouched."""

    def __init__(self, original, merged: _Merged) -> None:
        self.original = original  # the function of MultiProcessCollector
        self.merged = merged  # where the guarded merge notes the directory it read
        self.readers: dict[str, ExemplarFiles] = {}
        self.failed = False

    def __call__(self, collector):
        self.merged.directory = None
        metrics = self.original(collector)
        try:
            directory = self.merged.directory
            if directory is None:  # no files: no buckets to put exemplars on
                return metrics
            reader = self.readers.get(directory)
            if reader is None:
                reader = self.readers[directory] = ExemplarFiles(directory)
            metrics = list(metrics)
            attach_exemplars(metrics, reader.read())
        except Exception:  # never /metrics down for an exemplar
            if not self.failed:
                self.failed = True
                logger.warning(
                    "opentelemetry-instrumentation-vllm-ascend: cannot add exemplars to /metrics", exc_info=True
                )
        return metrics

    def __get__(self, instance, owner=None):  # a method of the collector, as the function it replaces
        return self if instance is None else _bound(self, instance)


def _bound(replacement: _ExemplarCollect, instance):
    def collect():
        return replacement(instance)

    return collect


class MultiprocessGuard:
    __slots__ = ("replacement", "collect")

    def __init__(self, replacement, collect=None) -> None:
        self.replacement = replacement
        self.collect = collect

    def remove(self) -> None:
        from prometheus_client.multiprocess import MultiProcessCollector

        replacement: _GuardedMerge = self.replacement
        current = MultiProcessCollector.__dict__.get("merge")
        if isinstance(current, staticmethod) and current.__func__ is replacement:
            MultiProcessCollector.merge = replacement.original
        if self.collect is not None and MultiProcessCollector.__dict__.get("collect") is self.collect:
            MultiProcessCollector.collect = self.collect.original


def guard_multiprocess_collector() -> MultiprocessGuard | None:
    """Install ``_GuardedMerge`` and ``_ExemplarCollect`` in this process (where vLLM serves ``/metrics`` from
    ``PROMETHEUS_MULTIPROC_DIR``); None when prometheus_client has no such method or they are in place. Both wrap
    public methods of MultiProcessCollector (``merge``, ``collect``)."""
    from prometheus_client.multiprocess import MultiProcessCollector

    original = MultiProcessCollector.__dict__.get("merge")
    if not isinstance(original, staticmethod) or isinstance(original.__func__, _GuardedMerge):
        return None
    replacement = _GuardedMerge(original)
    MultiProcessCollector.merge = staticmethod(replacement)
    collect = MultiProcessCollector.__dict__.get("collect")
    exemplar_collect = None
    if callable(collect) and not isinstance(collect, _ExemplarCollect):
        exemplar_collect = _ExemplarCollect(collect, replacement.merged)
        MultiProcessCollector.collect = exemplar_collect
    return MultiprocessGuard(replacement, exemplar_collect)
