"""Building blocks shared by subsystem handlers: step-labelled timers and scopes."""

from __future__ import annotations

from time import perf_counter

from .. import catalogue, recording
from ..wrappers import Handler, report


class StepTimer(Handler):
    """Wrapper kind SYNC_TIMER / COROUTINE_TIMER: the call's duration into ``spec`` (a histogram),
    labelled dp/role and the phase of the step most recently scheduled in this process."""

    __slots__ = ("spec", "name")
    reads_args = 0

    def __init__(self, spec: catalogue.MetricSpec, name: str | None = None) -> None:
        self.spec = spec
        self.name = name or spec.seed

    def timed(self, seconds, args, kwargs, result, _record=recording.record_in_step):
        _record(self.spec, seconds)


class Scope:
    """Times a ``with`` block into ``spec`` with labels ``labels`` (a tuple in spec.labels order),
    around an inner context manager (e.g. the profiler scope vLLM would have used). A block that
    raises is not timed; the exception passes through unchanged."""

    __slots__ = ("spec", "labels", "inner", "start")

    def __init__(self, spec: catalogue.MetricSpec, labels: tuple, inner=None) -> None:
        self.spec = spec
        self.labels = labels
        self.inner = inner

    def __enter__(self):
        value = self.inner.__enter__() if self.inner is not None else None
        self.start = perf_counter()
        return value

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            try:
                recording.record(self.spec, perf_counter() - self.start, self.labels)
            except Exception:
                report(self, "scope")
        if self.inner is not None:
            return self.inner.__exit__(exc_type, exc, tb)
        return False

    name = "Scope"
