"""Declarative hooks: what a target row records, as data (``Target.measures``), and the handler built
from it. A plain timer, counter or value-of-an-argument hook needs no handler class: its row lists
its ``Measure``s and ``build_handler`` makes the handler. Hand-written handlers remain where real
logic lives (``Target.handler``).

The same form is what users' hook files compile to (wiring/userfile.py): a row naming the symbol, one
``Measure`` per metric, whose value may be a checked expression (wiring/expressions.py) and whose
extra labels are expressions too, with the metric's own ``spec``. ``value_reader`` is the one place
that turns a measure's value into the function computing it from a call."""

from __future__ import annotations

import importlib
from typing import Any

from .. import catalogue
from ..handlers import common, engine
from ..handlers.common import HOOK_ERRORS, MAX_LABEL_LENGTH, MAX_LABEL_VALUES, OTHER, duration  # noqa: F401
from ..kinds import ASYNC_GENERATOR, COROUTINE_STREAM
from ..targets import (  # noqa: F401  (the row vocabulary, re-exported for hook files and tests)
    COUNTER,
    GAUGE,
    HISTOGRAM,
    MEASURE_KINDS,
    MEASURE_PHASES,
    PHASE_ALL,
    PHASE_ENGINE_STEP,
    PHASE_STEP,
    TIMER,
    Measure,
)
from .expressions import Expression

#: Where ``Target.handler`` names live ("module:Class").
HANDLERS_PACKAGE = common.__name__.rsplit(".", 1)[0]


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
        if measure.kind == COUNTER or measure.incumbent:
            return _one  # ms-service-metric records 1 for a metric without expr (handlers/builtin.py)
        raise ValueError(f"{measure.metric}: a {measure.kind} measure needs a value")
    if isinstance(value, Expression) and measure.incumbent:
        return _incumbent_reader(value, measure.kind == COUNTER)
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


def _one(args, values, result, seconds):
    return 1


def _incumbent_reader(value: Expression, counter: bool):
    """ms-service-metric's value rules (handlers/builtin.py ``_record_metrics_common``, metrics/metrics_manager.py
    ``record_metric``, ms-service-metric 26.0.0 and master): an expression that raises records 1 (here it also
    counts in hook_errors: ``common.RecordOne``); a counter adds its value when > 0, else 1 (NaN included). A
    value that is not a number is skipped, as there (prometheus_client refuses it); so is a histogram's or gauge's
    NaN, which there would be written."""

    def evaluate(args, values, result, seconds, _evaluate=value.evaluate, _counter=counter):
        try:
            raw = _evaluate(values)
        except Exception as exc:
            raise common.RecordOne(exc) from exc
        if _counter:
            if isinstance(raw, float) and raw != raw:
                return 1
            number = _number(raw)
            return number if number > 0 else 1
        return _number(raw)

    return evaluate


def _number(value):
    if isinstance(value, bool):
        return int(value)
    if not isinstance(value, (int, float)) or value != value:
        raise TypeError(f"not a number: {type(value).__name__}")
    return value


def build_handler(target) -> Any:
    """The handler of a declarative row. One plain timer is the timer handler itself (the cheapest
    hook: ``StepTimer`` / ``AllPhaseTimer`` / ``EngineStepTimer``, ``StreamTimer`` on a stream row);
    anything else is a ``MeasuresHandler`` over the row's measures (``StreamMeasuresHandler`` on a
    stream row: it reads the clock itself)."""
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


def load_handler(target):
    """The handler of a row: built from its measures (declarative rows), or its handler class's
    instance; named after the hooked symbol (what reports name). None for rows without either."""
    if target.measures:
        handler = build_handler(target)
    elif not target.handler:
        return None
    else:
        handler = handler_class(target)()
    handler.name = target.qualname
    return handler


def handler_class(target):
    """The class a handler row names (``Target.handler``, "module:Class" under ``handlers``)."""
    module_name, class_name = target.handler.split(":")
    return getattr(importlib.import_module(f"{HANDLERS_PACKAGE}.{module_name}"), class_name)


def params_of(target) -> tuple[str, ...]:
    """The parameters (after ``self``) a row's hook reads by position, in order: a handler row's from its handler
    class (``Handler.params``), a declarative row's from the row. What the contract test checks in the source."""
    if target.handler and not target.measures:
        return getattr(handler_class(target), "params", ())
    return target.params
