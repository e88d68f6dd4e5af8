"""Building blocks shared by subsystem handlers: step-labelled timers."""

from __future__ import annotations

from .. import catalogue, recording
from ..wrappers import Handler


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
