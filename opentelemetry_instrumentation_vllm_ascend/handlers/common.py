"""Building blocks shared by subsystem handlers: the timers and the handler declarative rows build."""

from __future__ import annotations

import sys

from .. import catalogue, context, recording
from ..hooks.handler import Handler
from ..state import STATE


class StepTimer(Handler):
    """Wrapper kind SYNC_TIMER / COROUTINE_TIMER: the call's duration into ``spec`` (a histogram),
    labelled dp/role and the phase of the step most recently scheduled in this process (a declarative
    row's timer with ``phase="step"``)."""

    __slots__ = ("spec",)
    reads_args = 0

    def __init__(self, spec: catalogue.MetricSpec) -> None:
        self.spec = spec

    def timed(self, seconds, args, kwargs, result, _record=recording.record_in_step):
        _record(self.spec, seconds)


class AllPhaseTimer(Handler):
    """SYNC_TIMER / COROUTINE_TIMER: the (awaited) call's duration into ``spec``, labelled with this
    process's dp / role and phase ``all`` (work not tied to one step; a declarative row's timer with
    ``phase="all"``). Calls that raised are not timed."""

    __slots__ = ("spec",)
    reads_args = 0

    def __init__(self, spec: catalogue.MetricSpec) -> None:
        self.spec = spec

    def timed(self, seconds, args, kwargs, result):
        recording.record(self.spec, seconds, context.step_labels(catalogue.ALL))


class MeasuresHandler(Handler):
    """A declarative row's handler (``hooks/declarative.py``) when it is more than one plain timer:
    after each call that returned, every measure's value (``value_reader``) into its metric, labelled
    dp / role and phase ``all`` or the step's. Timer wrapper kinds call ``timed``; sync / coroutine
    kinds ``after`` (no duration then)."""

    def __init__(self, measures: tuple, reads_args: int) -> None:
        #: (spec, measure kind, step phase?, reader) per measure.
        self.measures = measures
        self.reads_args = reads_args

    def timed(self, seconds, args, kwargs, result):
        for spec, kind, in_step, reader in self.measures:
            value = reader(args, result, seconds)
            labels = context.step_labels(STATE.last_step_phase if in_step else catalogue.ALL)
            if kind == "counter":
                recording.add(spec, value, labels)
            elif kind == "gauge":
                recording.set_gauge(spec, value, labels)
            else:
                recording.record(spec, value, labels)

    def after(self, state, args, kwargs, result):
        self.timed(None, args, kwargs, result)


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
