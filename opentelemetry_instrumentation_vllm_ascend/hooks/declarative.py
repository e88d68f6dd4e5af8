"""Declarative hooks: what a target row records, as data (``Target.measures``), and the handler built
from it. A plain timer, counter or value-of-an-argument hook needs no handler class: its row lists
its ``Measure``s and ``build_handler`` makes the handler. Hand-written handlers remain where real
logic lives (``Target.handler``).

The same form is what users' hook files compile to (hooks/userfile.py): a row naming the symbol, one
``Measure`` per metric, whose value may be a checked expression (hooks/expressions.py) and whose
extra labels are expressions too, with the metric's own ``spec``. ``value_reader`` is the one place
that turns a measure's value into the function computing it from a call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import catalogue
from .expressions import Expression

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

#: Distinct values one label expression may give in one process (per metric and label); later new values
#: are recorded as ``OTHER``. Values are cut at ``MAX_LABEL_LENGTH`` characters.
MAX_LABEL_VALUES = 32
MAX_LABEL_LENGTH = 64
OTHER = "other"

#: Where the samples an expression could not compute are counted (a measure with an expression, as in
#: users' hook files, skips such a sample; a measure without one fails as any handler does: logged once).
#: The catalogue's ``hook_errors`` (every handler failure counts there too): hook the symbol, where the metric.
HOOK_ERRORS = catalogue.HOOK_ERRORS


@dataclass(frozen=True)
class Measure:
    """One metric a declarative hook records on each call that returned (a call that raised records
    nothing; on a stream row, a timer records however the stream ended).

    ``metric``: the seed. ``kind``: ``timer`` (the call's duration, or ``value``; needs a timer or
    stream wrapper kind), ``counter`` (adds ``value``, 1 without one), ``histogram`` (observes
    ``value``) or ``gauge`` (sets ``value``). ``value``: None, the name of one parameter of the target
    (it must be in the row's ``params``, which the contract test checks against vLLM's source), or an
    ``Expression`` over the target's parameters, ``self``, ``result`` and ``duration``, whose failures
    and non-numbers skip the sample and count in ``HOOK_ERRORS``. ``phase``: how the phase label is
    chosen (``MEASURE_PHASES``). ``labels``: ``((name, Expression), …)``, labels after dp, role,
    phase (at most ``MAX_LABEL_VALUES`` values each). ``spec``: the metric's definition when it is not
    the catalogue's (a hook file's own metric)."""

    metric: str
    kind: str
    value: str | Expression | None = None
    phase: str = PHASE_ALL
    labels: tuple[tuple[str, Expression], ...] = ()
    spec: catalogue.MetricSpec | None = None


def spec_of(measure: Measure) -> catalogue.MetricSpec:
    """The metric ``measure`` records into: its own spec, else the catalogue's."""
    return measure.spec if measure.spec is not None else catalogue.BY_SEED[measure.metric]


def argument_names(target) -> tuple[str, ...]:
    """The names of the positional arguments the wrapper hands the handler, in order: ``self`` and the
    row's ``params`` for a method, the ``params`` for a module-level function."""
    return target.params if target.owner_qualname is None else ("self", *target.params)


def expressions_of(measure: Measure) -> tuple[Expression, ...]:
    value = (measure.value,) if isinstance(measure.value, Expression) else ()
    return value + tuple(expression for _, expression in measure.labels)


def value_reader(measure: Measure, names: tuple[str, ...]):
    """``reader(args, values, result, seconds) -> value`` for ``measure`` on a target whose positional
    arguments are ``names`` (``argument_names``): ``args`` as the wrapper passes them, ``values`` the
    names an expression reads (None when the row has no expression), ``result`` the call's result,
    ``seconds`` its duration (timer and stream kinds; None otherwise). The single place where a
    measure's value becomes code."""
    value = measure.value
    if value is None:
        if measure.kind == TIMER:
            return duration
        if measure.kind == COUNTER:
            return _one
        raise ValueError(f"{measure.metric}: a {measure.kind} measure needs a value")
    if isinstance(value, Expression):
        counter = measure.kind == COUNTER

        def evaluate(args, values, result, seconds, _evaluate=value.evaluate, _counter=counter):
            number = _number(_evaluate(values))
            if _counter and number < 0:
                raise ValueError("a counter cannot decrease")
            return number

        return evaluate
    if value not in names:
        raise ValueError(f"{measure.metric}: value {value!r} is not one of the row's arguments {names}")
    index = names.index(value)

    def argument(args, values, result, seconds, _index=index):
        return args[_index]

    return argument


def duration(args, values, result, seconds):
    """The reader of a plain timer: the call's duration."""
    return seconds


def _one(args, values, result, seconds):
    return 1


def _number(value):
    if isinstance(value, bool):
        return int(value)
    if not isinstance(value, (int, float)) or value != value:
        raise TypeError(f"not a number: {type(value).__name__}")
    return value


def problems(target, catalogue_by_seed) -> list[str]:
    """What is wrong with a declarative row (empty when it is sound): unknown metrics, a measure whose
    kind does not match its metric, a timer on a wrapper kind that does not time, a value that is not
    a parameter, labels the declarative handler cannot fill."""
    from .wrappers import ASYNC_GENERATOR, COROUTINE, COROUTINE_STREAM, COROUTINE_TIMER, SYNC, SYNC_TIMER

    out = []
    if target.handler and target.measures:
        out.append(f"{target.symbol}: a row has either a handler or measures, not both")
    timing = (SYNC_TIMER, COROUTINE_TIMER, ASYNC_GENERATOR, COROUTINE_STREAM)
    if target.measures and target.kind not in timing + (SYNC, COROUTINE):
        out.append(f"{target.symbol}: measures need a sync/coroutine/stream wrapper kind, not {target.kind}")
    for m in target.measures:
        spec = m.spec if m.spec is not None else catalogue_by_seed.get(m.metric)
        if spec is None:
            out.append(f"{target.symbol}: {m.metric} is not in the catalogue")
            continue
        if m.kind not in MEASURE_KINDS:
            out.append(f"{target.symbol}: {m.metric}: unknown measure kind {m.kind!r}")
        elif CATALOGUE_KIND[m.kind] != spec.kind:
            out.append(f"{target.symbol}: {m.metric} is a {spec.kind}, the measure a {m.kind}")
        engine_step = m.phase == PHASE_ENGINE_STEP
        if m.phase not in MEASURE_PHASES or (engine_step and (m.kind != TIMER or target.kind not in timing[:2])):
            out.append(f"{target.symbol}: {m.metric}: phase {m.phase!r} not allowed for a {m.kind} on {target.kind}")
        if engine_step and len(target.measures) > 1:
            out.append(f"{target.symbol}: {m.metric}: an engine_step timer is the row's only measure")
        if m.kind == TIMER and target.kind not in timing:
            out.append(f"{target.symbol}: {m.metric}: a timer needs wrapper kind {timing}")
        wanted = catalogue.STEP_LABELS + tuple(name for name, _ in m.labels)
        if spec.labels != wanted:
            out.append(
                f"{target.symbol}: {m.metric} has labels {spec.labels}: a declarative hook fills dp, role, phase"
                + (f" and {', '.join(wanted[3:])}" if m.labels else "")
            )
        try:
            value_reader(m, argument_names(target))
        except ValueError as exc:
            out.append(f"{target.symbol}: {exc}")
    return out


def build_handler(target) -> Any:
    """The handler of a declarative row. One plain timer is the timer handler itself (the cheapest
    hook: ``StepTimer`` / ``AllPhaseTimer`` / ``EngineStepTimer``, ``StreamTimer`` on a stream row);
    anything else is a ``MeasuresHandler`` over the row's measures (``StreamMeasuresHandler`` on a
    stream row: it reads the clock itself)."""
    from ..handlers import common, engine
    from .wrappers import ASYNC_GENERATOR, COROUTINE_STREAM

    measures = target.measures
    stream = target.kind in (ASYNC_GENERATOR, COROUTINE_STREAM)
    first = measures[0]
    if len(measures) == 1 and first.kind == TIMER and first.value is None and not first.labels:
        spec = spec_of(first)
        if stream:
            return common.StreamTimer(spec, in_step=first.phase == PHASE_STEP)
        timer = {
            PHASE_ALL: common.AllPhaseTimer,
            PHASE_STEP: common.StepTimer,
            PHASE_ENGINE_STEP: engine.EngineStepTimer,
        }
        return timer[first.phase](spec)
    names = argument_names(target)
    read: dict[str, None] = {}
    for m in measures:
        for expression in expressions_of(m):
            read.update(dict.fromkeys(n for n in expression.names if n not in ("result", "duration")))
    has_expression = any(expressions_of(m) for m in measures)
    arguments = tuple((n, names.index(n)) for n in read if n in names) if has_expression else None
    if arguments:
        reads_args = None  # every argument, by position or name, as the caller passed them
    elif any(isinstance(m.value, str) for m in measures):
        reads_args = len(names)
    else:
        reads_args = 0
    compiled = tuple(
        common.Measured(
            spec_of(m),
            m.kind,
            m.phase == PHASE_STEP,
            value_reader(m, names),
            m.labels,
            bool(expressions_of(m)),
        )
        for m in measures
    )
    handler_class = common.StreamMeasuresHandler if stream else common.MeasuresHandler
    return handler_class(compiled, reads_args, arguments, target.symbol)
