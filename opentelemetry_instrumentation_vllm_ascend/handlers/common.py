"""Building blocks shared by subsystem handlers: the timers and the handlers declarative rows build."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from time import perf_counter
from typing import NamedTuple

from .. import catalogue, context, recording
from ..hooks.handler import Handler
from ..state import STATE

#: Distinct values one label expression may give in one process (per metric and label); later new values
#: are recorded as ``OTHER``. Values are cut at ``MAX_LABEL_LENGTH`` characters.
MAX_LABEL_VALUES = 32
MAX_LABEL_LENGTH = 64
OTHER = "other"

#: Where the samples an expression could not compute are counted (a measure with an expression, as in
#: users' hook files, skips such a sample; a measure without one fails as any handler does: logged once).
HOOK_ERRORS = catalogue.HOOK_ERRORS


class RecordOne(Exception):
    """A measure's expression raised where ms-service-metric's rules apply (``targets.Measure.incumbent``): the
    handler records 1 for that sample, as ms-service-metric does, and counts the failure in ``HOOK_ERRORS``."""


def duration(args, values, result, seconds):
    """The reader of a plain timer: the call's duration."""
    return seconds


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

    def timed_inline(self):
        # The wrapper runs record_in_step's lines itself; a subclass with its own ``timed`` is called.
        return recording.in_step_inline(self.spec) if type(self).timed is StepTimer.timed else None


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


class StreamTimer(Handler):
    """ASYNC_GENERATOR / COROUTINE_STREAM (a stream row's plain timer): from the call until the result
    is complete — a plain result, or a stream exhausted — and, alike, until the call raised or a stream
    raised or was closed / cancelled early (a stream cut short still occupied the server until then).
    Labelled dp / role and phase ``all`` (``in_step``: the step's)."""

    __slots__ = ("spec", "in_step")
    reads_args = 0

    def __init__(self, spec: catalogue.MetricSpec, in_step: bool = False) -> None:
        self.spec = spec
        self.in_step = in_step

    def before(self, args, kwargs):
        return perf_counter()

    def after(self, state, args, kwargs, result):
        phase = STATE.last_step_phase if self.in_step else catalogue.ALL
        recording.record(self.spec, perf_counter() - state, context.step_labels(phase))

    error = after


class Measured(NamedTuple):
    """One measure of a ``MeasuresHandler``, compiled from a row (``wiring/declarative.py``)."""

    spec: catalogue.MetricSpec
    kind: str
    in_step: bool  # phase label: the step's (else ``all``)
    reader: Callable  # (args, values, result, seconds) -> value
    labels: tuple  # ((label name, Expression), …) after dp, role, phase
    counted: bool  # an expression: a failed sample is skipped and counted in hook_errors


class MeasuresHandler(Handler):
    """A declarative row's handler (``wiring/declarative.py``) when it is more than one plain timer:
    after each call that returned, every measure's value into its metric, labelled dp / role, phase
    ``all`` or the step's, and the measure's own label expressions. Timer wrapper kinds call
    ``timed``; sync / coroutine kinds ``after`` (no duration then). A measure computed by an expression
    that fails (or gives no number) skips that sample (records 1 where it raised under ms-service-metric's
    rules: ``RecordOne``) and counts it in hook_errors; the call and the other measures are unaffected."""

    def __init__(self, measures: tuple, reads_args: int | None, arguments=None, hook: str = "") -> None:
        self.measures: tuple[Measured, ...] = measures
        self.reads_args = reads_args
        #: ((name, position), …) of the arguments the expressions read; None: the row has no expression.
        self.arguments = arguments
        self.hook = hook  # the symbol, for hook_errors
        #: (metric, label) -> the values given so far (at most MAX_LABEL_VALUES).
        self.label_values: dict[tuple, set] = {}
        self.lock = threading.Lock()

    def timed(self, seconds, args, kwargs, result):
        self._record(self.measures, seconds, args, kwargs, result)

    def after(self, state, args, kwargs, result):
        self._record(self.measures, None, args, kwargs, result)

    def _record(self, measures, seconds, args, kwargs, result):
        values = None
        if self.arguments is not None:
            values = {"result": result, "duration": seconds}
            for name, i in self.arguments:
                if kwargs and name in kwargs:
                    values[name] = kwargs[name]
                elif i < len(args):
                    values[name] = args[i]
        for spec, kind, in_step, reader, labels, counted in measures:
            try:
                row = context.step_labels(STATE.last_step_phase if in_step else catalogue.ALL)
                if labels:
                    row = row + tuple(self._label(spec.seed, name, e, values) for name, e in labels)
                value = reader(args, values, result, seconds)
                if kind == "counter":  # _put's branches, inlined on the hot path
                    recording.add(spec, value, row)
                elif kind == "gauge":
                    recording.set_gauge(spec, value, row)
                else:
                    recording.record(spec, value, row)
            except Exception as exc:
                if not counted:
                    raise
                if type(exc) is RecordOne:
                    try:
                        _put(kind, spec, 1, row)
                    except Exception:
                        pass
                try:
                    ctx = context.PROCESS
                    recording.add(HOOK_ERRORS, 1, (ctx.process, ctx.dp, ctx.role, self.hook, spec.seed))
                except Exception:
                    pass

    def _label(self, metric: str, name: str, expression, values) -> str:
        text = str(expression.evaluate(values))[:MAX_LABEL_LENGTH]
        key = (metric, name)
        seen = self.label_values.get(key)
        if seen is None:
            seen = self.label_values.setdefault(key, set())
        if text in seen:
            return text
        with self.lock:
            if len(seen) >= MAX_LABEL_VALUES:
                return OTHER
            seen.add(text)
        return text


def _put(kind: str, spec, value, row) -> None:
    """Record ``value`` into a measure's metric by its kind (MeasuresHandler.after inlines the same)."""
    if kind == "counter":
        recording.add(spec, value, row)
    elif kind == "gauge":
        recording.set_gauge(spec, value, row)
    else:
        recording.record(spec, value, row)


class StreamMeasuresHandler(MeasuresHandler):
    """A ``MeasuresHandler`` on a stream row (ASYNC_GENERATOR / COROUTINE_STREAM): it reads the clock
    itself, records every measure when the result is complete (a stream exhausted), and its plain
    timers also when the call or the stream raised or was closed early (as ``StreamTimer``)."""

    def __init__(self, measures: tuple, reads_args: int | None, arguments=None, hook: str = "") -> None:
        super().__init__(measures, reads_args, arguments, hook)
        self.timers = tuple(m for m in measures if m.reader is duration)

    def before(self, args, kwargs):
        return perf_counter()

    def after(self, state, args, kwargs, result):
        self._record(self.measures, perf_counter() - state, args, kwargs, result)

    def error(self, state, args, kwargs, exc):
        if self.timers:
            self._record(self.timers, perf_counter() - state, args, kwargs, None)


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
