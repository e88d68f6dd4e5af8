"""Declarative hooks: what a target row records, as data (``Target.measures``), and the handler built
from it. A plain timer, counter or value-of-an-argument hook needs no handler class: its row lists
its ``Measure``s and ``build_handler`` makes the handler. Hand-written handlers remain where real
logic lives (``Target.handler``).

The same form is what users' hook files declare: a ``Measure`` per metric, on a row naming the
symbol; ``value_reader`` is the one place that turns a measure into the function computing its
value from a call (an expression evaluator plugs in there)."""

from __future__ import annotations

from dataclasses import dataclass

TIMER = "timer"
COUNTER = "counter"
HISTOGRAM = "histogram"
GAUGE = "gauge"
MEASURE_KINDS = (TIMER, COUNTER, HISTOGRAM, GAUGE)

#: How a measure's ``phase`` label is chosen (the labels are always dp, role, phase):
#: - ``all``: the catalogue's ``ALL`` (work not tied to one step: between steps, request level);
#: - ``step``: the phase of the step most recently scheduled in this process (``STATE.last_step_phase``);
#: - ``engine_step`` (timers only): the phase of the step scheduled during the call, ``idle`` when no
#:   ``schedule()`` ran inside it (``handlers/engine.py:EngineStepTimer``).
PHASE_ALL = "all"
PHASE_STEP = "step"
PHASE_ENGINE_STEP = "engine_step"
MEASURE_PHASES = (PHASE_ALL, PHASE_STEP, PHASE_ENGINE_STEP)

#: The catalogue kind each measure kind records into.
CATALOGUE_KIND = {TIMER: "histogram", COUNTER: "counter", HISTOGRAM: "histogram", GAUGE: "gauge"}


@dataclass(frozen=True)
class Measure:
    """One metric a declarative hook records on each call that returned (a call that raised records
    nothing).

    ``metric``: the catalogue seed. ``kind``: ``timer`` (the call's duration; needs a timer wrapper
    kind), ``counter`` (adds ``value``, 1 without one), ``histogram`` (observes ``value``) or ``gauge``
    (sets ``value``). ``value``: None, or the name of one parameter of the target (it must be in the
    row's ``params``, which the contract test checks against vLLM's source). ``phase``: how the phase
    label is chosen (``MEASURE_PHASES``)."""

    metric: str
    kind: str
    value: str | None = None
    phase: str = PHASE_ALL


def value_reader(measure: Measure, params: tuple[str, ...]):
    """``reader(args, result, seconds) -> value`` for ``measure`` on a target whose leading parameters
    (after self) are ``params``: ``args`` is ``(self, *params)`` as the wrapper passes it, ``result`` the
    call's result, ``seconds`` its duration (timer kinds; None otherwise). The single place where a
    measure becomes code: an expression evaluator plugs in here."""
    if measure.value is None:
        if measure.kind == TIMER:
            return _seconds
        if measure.kind == COUNTER:
            return _one
        raise ValueError(f"{measure.metric}: a {measure.kind} measure needs a value")
    if measure.value not in params:
        raise ValueError(f"{measure.metric}: value {measure.value!r} is not one of the row's params {params}")
    index = params.index(measure.value) + 1

    def argument(args, result, seconds, _index=index):
        return args[_index]

    return argument


def _seconds(args, result, seconds):
    return seconds


def _one(args, result, seconds):
    return 1


def problems(target, catalogue_by_seed) -> list[str]:
    """What is wrong with a declarative row (empty when it is sound): unknown metrics, a measure whose
    kind does not match its catalogue entry, a timer on a non-timer wrapper kind, a value that is not
    a parameter, labels the declarative handler cannot fill."""
    from .wrappers import COROUTINE, COROUTINE_TIMER, SYNC, SYNC_TIMER

    out = []
    if target.handler and target.measures:
        out.append(f"{target.symbol}: a row has either a handler or measures, not both")
    timer_kinds = (SYNC_TIMER, COROUTINE_TIMER)
    if target.measures and target.kind not in timer_kinds + (SYNC, COROUTINE):
        out.append(f"{target.symbol}: measures need a sync/coroutine (timer) wrapper kind, not {target.kind}")
    for m in target.measures:
        spec = catalogue_by_seed.get(m.metric)
        if spec is None:
            out.append(f"{target.symbol}: {m.metric} is not in the catalogue")
            continue
        if m.kind not in MEASURE_KINDS:
            out.append(f"{target.symbol}: {m.metric}: unknown measure kind {m.kind!r}")
        elif CATALOGUE_KIND[m.kind] != spec.kind:
            out.append(f"{target.symbol}: {m.metric} is a {spec.kind}, the measure a {m.kind}")
        if m.phase not in MEASURE_PHASES or (m.phase == PHASE_ENGINE_STEP and m.kind != TIMER):
            out.append(f"{target.symbol}: {m.metric}: phase {m.phase!r} not allowed for a {m.kind}")
        if m.phase == PHASE_ENGINE_STEP and len(target.measures) > 1:
            out.append(f"{target.symbol}: {m.metric}: an engine_step timer is the row's only measure")
        if m.kind == TIMER and target.kind not in timer_kinds:
            out.append(f"{target.symbol}: {m.metric}: a timer needs wrapper kind {timer_kinds}")
        if spec.labels != ("dp", "role", "phase"):
            out.append(
                f"{target.symbol}: {m.metric} has labels {spec.labels}: a declarative hook fills dp, role, phase"
            )
        try:
            value_reader(m, target.params)
        except ValueError as exc:
            out.append(f"{target.symbol}: {exc}")
    return out


def build_handler(target):
    """The handler of a declarative row. One plain timer is the timer handler itself (the cheapest
    hook: ``StepTimer`` / ``AllPhaseTimer`` / ``EngineStepTimer``, as hand-bound before); anything
    else is a ``MeasuresHandler`` over the row's measures."""
    from .. import catalogue
    from ..handlers import common, engine

    measures = target.measures
    if len(measures) == 1 and measures[0].kind == TIMER and measures[0].value is None:
        timer = {
            PHASE_ALL: common.AllPhaseTimer,
            PHASE_STEP: common.StepTimer,
            PHASE_ENGINE_STEP: engine.EngineStepTimer,
        }
        return timer[measures[0].phase](catalogue.BY_SEED[measures[0].metric])
    return common.MeasuresHandler(
        tuple(
            (catalogue.BY_SEED[m.metric], m.kind, m.phase == PHASE_STEP, value_reader(m, target.params))
            for m in measures
        ),
        reads_args=len(target.params) + 1 if any(m.value is not None for m in measures) else 0,
    )
