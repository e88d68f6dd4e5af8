"""Building blocks shared by subsystem handlers: step-labelled timers."""

from __future__ import annotations

import sys

from .. import catalogue, context, recording
from ..hooks.handler import Handler


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


class AllPhaseTimer(Handler):
    """SYNC_TIMER / COROUTINE_TIMER: the (awaited) call's duration into the class's ``spec``, labelled
    with this process's dp / role and phase ``all`` (work not tied to one step). Calls that raised are
    not timed."""

    spec: catalogue.MetricSpec
    reads_args = 0

    def timed(self, seconds, args, kwargs, result):
        recording.record(self.spec, seconds, context.step_labels(catalogue.ALL))


def device_module():
    """The torch device module this process computes on — ``torch.npu`` (torch_npu) or ``torch.cuda``,
    available and initialised — or None (CPU, or torch not imported). Never imports torch."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    for name in ("npu", "cuda"):
        module = getattr(torch, name, None)
        try:
            if module is not None and module.is_available() and module.is_initialized():
                return module
        except Exception:
            continue
    return None
