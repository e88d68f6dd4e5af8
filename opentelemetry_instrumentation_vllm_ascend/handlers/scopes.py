"""vLLM's profiling scopes: the scope factory (target kind SCOPE_FACTORY) and the scopes it builds.

vLLM's ``record_function_or_nullcontext(name)`` returns ``vllm.v1.utils._PROFILER_FUNC(name)``,
looking the global up on every call: replacing that one global with a factory that wraps whatever
vLLM would have used reaches every caller, however and whenever it imported the function — also
when ``instrument()`` runs after vLLM's modules were imported and its objects built.

Each scope is timed into ``record_function_or_nullcontext`` (opt-in); in a worker step the forward,
post-processing and sampling scopes also mark the step's timeline and budget stages (``handlers.model_runner``).
Inside ``Scheduler.schedule`` the scopes' durations go with the scheduling step's records
(``handlers.scheduler``).
"""

from __future__ import annotations

import contextlib
import fnmatch
from time import perf_counter
from types import MappingProxyType
from typing import Any

from .. import catalogue, context, environment, recording
from ..catalogue import M
from ..hooks.handler import report
from ..state import STATE
from .budget import W_FORWARD, W_OTHER, W_SAMPLE, WORKER_TO, off
from .model_runner import NO_EVENT, SCOPE_FAILURES, device_timeline
from .steps import CURRENT_STEP, Step

_SCOPES = M["record_function_or_nullcontext"]

#: Scope names that open a step's forward pass / close its post-processing (vLLM GPU/CPU runner,
#: vllm-ascend NPU runner).
FORWARD_SCOPES = frozenset({"gpu_model_runner: forward", "forward"})
POSTPROCESS_SCOPES = frozenset({"gpu_model_runner: postprocess", "post process"})
#: Scope names of a step's sampling (vLLM GPU/CPU runner, vllm-ascend NPU runner): the worker budget's
#: ``sample`` stage.
SAMPLE_SCOPES = frozenset({"gpu_model_runner: sample", "sample_token"})
#: The worker budget's stage each of those scopes opens (it returns to ``other`` when the scope ends).
_SCOPE_STAGES = {**dict.fromkeys(FORWARD_SCOPES, W_FORWARD), **dict.fromkeys(SAMPLE_SCOPES, W_SAMPLE)}
#: At most this many distinct scope names get their own series; later ones are recorded as "other".
MAX_SCOPE_NAMES = catalogue.MAX_SCOPE_NAMES


# -- profiling scopes ---------------------------------------------------------------------------------

_names = STATE.scope_names


def name_label(name) -> str:
    """A scope name's label value: the name, for at most MAX_SCOPE_NAMES names; ``other`` beyond."""
    label = _names.get(name)
    if label is None:
        if isinstance(name, str) and len(_names) < MAX_SCOPE_NAMES:
            label = _names[name] = name
        else:
            label = "other"  # not remembered: the table stays bounded whatever names come
    return label


class _Scope:
    """One ``with record_function_or_nullcontext(name):`` block: times it (after entering vLLM's own
    scope, before leaving it) and, in a worker step, marks the step's forward / post-processing.
    Built by the scope factory (``ProfilerScopes``), which sets ``name``, ``inner`` and ``device``."""

    __slots__ = ("name", "inner", "start", "device")
    name: Any  # vLLM passes a str; anything else is labelled "other"
    inner: Any  # vLLM's own scope (a context manager), or None
    start: float
    device: Any  # the device event at the start of a forward scope, or None

    def __enter__(self):
        value = self.inner.__enter__() if self.inner is not None else None
        self.start = perf_counter()
        stage = _SCOPE_STAGES.get(self.name)
        if stage is not None:
            step = STATE.worker_step
            if step is not None:
                step.to(stage, self.start)  # the worker budget: forward / sample begins
                if stage == W_FORWARD:
                    step.forward_start = self.start
                    if step.start_event is not None and step.start_event is not NO_EVENT:  # device timeline
                        try:
                            self.device = device_timeline().start()
                        except Exception:
                            report(SCOPE_FAILURES, "device event")
        return value

    def __exit__(self, exc_type, exc, tb, _step=CURRENT_STEP.get, _state=STATE):
        if exc_type is None:
            end = perf_counter()
            try:
                step = _step()
                if step is None:  # recorded now, with the phase of the step most recently scheduled
                    labels = _scope_labels.get(_state.last_step_phase, _NO_LABELS).get(self.name)
                    if labels is None:
                        labels = _labels_of(_state.last_step_phase, self.name)
                    _record(_SCOPES, end - self.start, labels)
                    if _state.worker_step is not None:
                        _worker_scope_ended(self, end)
                else:  # inside Scheduler.schedule (vLLM's profiler on): recorded with the step's records
                    _step_values(step, self.name).append(end - self.start)
            except Exception:
                report(SCOPE_FAILURES, "scope")
        if self.inner is not None:
            return self.inner.__exit__(exc_type, exc, tb)
        return False


class _TimelineScope(_Scope):
    """A forward / post-processing / sample scope while the scope histogram is off (the default set): only
    its worker step's timeline marks and budget stages (``_worker_scope_ended``); nothing is recorded per
    scope. vLLM enters these scopes in the worker only, never inside ``Scheduler.schedule``."""

    __slots__ = ()

    def __exit__(self, exc_type, exc, tb, _state=STATE):
        if exc_type is None and _state.worker_step is not None:
            try:
                _worker_scope_ended(self, perf_counter())
            except Exception:
                report(SCOPE_FAILURES, "scope")
        if self.inner is not None:
            return self.inner.__exit__(exc_type, exc, tb)
        return False


class _InStepScope:
    """Every ``with record_function_or_nullcontext(name):`` block of one name inside one
    ``Scheduler.schedule`` call (vLLM's profiler off): one shared object, no object per block —
    vLLM enters "schedule: allocate_slots" once per running request. Each block that ends normally
    adds its duration to the step's list for that name (recorded with the step's phase when the step
    is); starts are kept on a stack, so nested blocks of one name pair up correctly."""

    __slots__ = ("starts", "values")
    starts: list[float]
    values: list[float]

    def __enter__(self):
        self.starts.append(perf_counter())

    def __exit__(self, exc_type, exc, tb):
        end = perf_counter()
        start = self.starts.pop()
        if exc_type is None:
            self.values.append(end - start)
        return False


def _step_values(step: Step, name) -> list:
    """The step's list of durations of scopes named ``name`` (made on first use)."""
    scopes = step.scopes
    if scopes is None:
        scopes = step.scopes = {}
    label = name if name.__class__ is str else name_label(name)
    values = scopes.get(label)
    if values is None:
        values = scopes[label] = []
    return values


#: What an untimed scope (OTEL_VLLM_ASCEND_DISABLED_SCOPES) is inside a scheduling step when vLLM's
#: own choice is nullcontext: one shared instance (nullcontext is reusable and reentrant).
_UNTIMED = contextlib.nullcontext()


def _in_step_scope(step: Step, name, untimed=None):
    """The step's shared scope for ``name`` (made on its first block in this step): its timer, or,
    for a scope ``untimed(name)`` switches off, the shared nullcontext."""
    timers = step.timers
    if timers is None:
        timers = step.timers = {}
    if untimed is not None and untimed(name):
        timers[name] = _UNTIMED
        return _UNTIMED
    timer = _InStepScope()
    timer.starts = []
    timer.values = _step_values(step, name)
    timers[name] = timer
    return timer


_record = recording.record
_NO_LABELS: MappingProxyType = MappingProxyType({})
#: phase → {scope name → label tuple}; emptied when the process context changes.
_scope_labels = STATE.scope_labels


def _labels_of(phase: str, name) -> tuple:
    labels = context.step_labels_with(phase, name_label(name))
    by_name = _scope_labels.setdefault(phase, {})
    if name.__class__ is str and len(by_name) < MAX_SCOPE_NAMES:  # bounded, whatever names come
        by_name[name] = labels
    return labels


def _worker_scope_ended(
    scope: _Scope, end: float, _forward=FORWARD_SCOPES, _post=POSTPROCESS_SCOPES, _sample=SAMPLE_SCOPES
) -> None:
    """A scope ended inside a worker step: the forward / post-processing marks of its timeline, and the
    end of the worker budget's forward / sample stage."""
    worker_step = STATE.worker_step
    name = scope.name
    if name in _forward:
        worker_step.forward_end = end
        worker_step.to(W_OTHER, end)
        if scope.device is not None and worker_step.start_event is not None:
            worker_step.device = (scope.device, device_timeline().start())
    elif name in _post:
        worker_step.post_end = end
    elif name in _sample:
        worker_step.to(W_OTHER, end)


def untimed_scopes(patterns: tuple[str, ...], only=None):
    """None when ``patterns`` is empty and ``only`` None, else ``untimed(name)``: whether a scope name matches one
    of them (shell-style) or, with ``only`` (a set of names), is not in it (decided once per name, for a bounded
    number of names)."""
    if not patterns and only is None:
        return None
    decided: dict = {}

    def untimed(name) -> bool:
        off = decided.get(name)
        if off is None:
            off = (only is not None and not (isinstance(name, str) and name in only)) or (
                isinstance(name, str) and any(fnmatch.fnmatchcase(name, p) for p in patterns)
            )
            if len(decided) < 4 * MAX_SCOPE_NAMES:
                decided[name] = off
        return off

    untimed.decided = decided  # type: ignore[attr-defined]  # the factory reads a decided name directly
    return untimed


class _ScopeTable(dict):
    """The scope factory where vLLM's choice is nullcontext and the scope histogram is off (the default set): the
    names decided untimed map to the shared nullcontext, and ``record_function_or_nullcontext`` gets the table's
    bound ``__getitem__`` — a C call, no Python frame, for vLLM's per-request "schedule: allocate_slots" — while
    any other name falls through to ``__missing__``, the Python factory (each ``install`` makes its own subclass
    with it). Bounded: at most ``4 * MAX_SCOPE_NAMES`` names are remembered; later untimed ones are decided each
    time, as ``untimed_scopes`` decides them."""

    __slots__ = ()


def is_factory(obj) -> bool:
    """Whether ``obj`` is a scope factory this package installed (a function, or a ``_ScopeTable``'s lookup)."""
    return bool(getattr(obj, "_otel_vllm_ascend_factory", False)) or isinstance(
        getattr(obj, "__self__", None), _ScopeTable
    )


class ProfilerScopes:
    """Installs the scope factory as ``vllm.v1.utils._PROFILER_FUNC`` (target kind SCOPE_FACTORY).
    Scopes named in OTEL_VLLM_ASCEND_DISABLED_SCOPES, and with record_function_or_nullcontext off every scope but
    the forward, post-processing and (worker budget on) sample ones, get vLLM's own choice (outside a scheduling
    step: ``inner(name)``; inside one with nullcontext: one shared nullcontext), untimed."""

    attribute = "_PROFILER_FUNC"

    def install(self, module):
        attribute = self.attribute
        inner = getattr(module, attribute)
        if inner is None:
            # What vLLM would choose on its first call (nullcontext, torch record_function, nvtx).
            module.record_function_or_nullcontext("")
            inner = getattr(module, attribute)
        if inner is None or is_factory(inner):
            raise RuntimeError(f"{module.__name__}.{attribute} is not a scope factory ({inner!r})")
        plain = inner is contextlib.nullcontext
        # With the scope histogram off (opt-in, catalogue.OPT_IN) only the scopes the worker's forward, non-forward
        # and kernel-launch durations and its step budget's forward / sample stages are measured from are timed:
        # the rest run as without us.
        only = None
        if environment.metric_disabled(_SCOPES.seed):
            only = FORWARD_SCOPES | POSTPROCESS_SCOPES | (SAMPLE_SCOPES if WORKER_TO is not off else frozenset())
        untimed = untimed_scopes(environment.disabled_scope_patterns(), only)
        decided = untimed.decided.get if untimed is not None else None
        # With the scope histogram off the timed scopes only mark the worker step's timeline.
        cls = _TimelineScope if only is not None else _Scope
        # Then, with vLLM's nullcontext, the factory is a table's lookup (``_ScopeTable``): an untimed name costs
        # no Python call.
        table = type("_ScopeTable", (_ScopeTable,), {"__slots__": ()})() if only is not None and plain else None

        def factory(
            name,
            _inner=inner,
            _plain=plain,
            _new=_Scope.__new__,
            _cls=cls,
            _step=CURRENT_STEP.get,
            _untimed=untimed,
            _decided=decided,
            _shared=_UNTIMED,
            _table=table,
        ):
            if _decided is not None:
                off = _decided(name)
                if off:  # untimed (decided before), in a scheduling step or not: vLLM's own choice;
                    if _table is not None and len(_table) < 4 * MAX_SCOPE_NAMES:
                        _table[name] = _shared  # looked up in C from now on
                    return _shared if _plain else _inner(name)  # its nullcontext is reusable: one shared instance
            else:
                off = False
            if _plain:
                step = _step()
                if step is not None:  # inside Scheduler.schedule: once per running request
                    try:
                        return step.timers[name]
                    except Exception:  # the first block of this name in this step (or a strange name)
                        try:
                            return _in_step_scope(step, name, _untimed)
                        except Exception:
                            report(SCOPE_FAILURES, "scope")
            if off is None:  # a name not decided yet
                if _untimed(name):
                    return _shared if _plain else _inner(name)
            scope = _new(_cls)  # no __init__ frame
            scope.name = name
            scope.inner = None if _plain else _inner(name)
            scope.device = None
            return scope

        factory._otel_vllm_ascend_factory = True
        replacement = factory
        if table is not None:
            type(table).__missing__ = staticmethod(factory)  # called with the name
            replacement = table.__getitem__
        setattr(module, attribute, replacement)
        return _ModuleGlobalPatch(module, attribute, inner, replacement)


class _ModuleGlobalPatch:
    __slots__ = ("module", "attribute", "original", "replacement")

    def __init__(self, module, attribute, original, replacement) -> None:
        self.module, self.attribute, self.original, self.replacement = module, attribute, original, replacement

    def remove(self) -> None:
        if getattr(self.module, self.attribute, None) is self.replacement:
            setattr(self.module, self.attribute, self.original)
