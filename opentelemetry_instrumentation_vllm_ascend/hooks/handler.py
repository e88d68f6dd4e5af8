"""The handler protocol: what a hook's handler may implement, how its failures are reported, and
the mutable cell an installed wrapper reads its handler from.

Contract, for every wrapper kind (``wrappers.py``): the original runs exactly once per call, with the
same arguments; its result, its exception and its timing semantics reach the caller unchanged; a
handler that raises is counted (``hook_errors``), logged (once per handler and place) and otherwise
ignored."""

from __future__ import annotations

import logging
import sys

from ..state import STATE
from ..targets import reads_args_of

logger = logging.getLogger(__name__)


class Handler:
    """Measurements from arguments. Override what you need; every method may raise safely.

    ``failures_only = True`` tells FUTURE wrappers that ``future_done`` only matters for futures
    that failed or were cancelled (successful completions are then not delivered at all).

    ``before`` returns a state object passed to the others (``None`` is fine).
    ``after`` sees the result (for async generators: ``None``, once exhausted).
    ``error`` sees the exception the original raised (for async generators: also an early close,
    as ``GeneratorExit``). ``future_done`` sees a future the original returned, once it is done.
    """

    #: What reports call the handler: its class's qualname, and, once ``wiring.declarative.load_handler`` built it
    #: for a row, the hooked symbol's qualname.
    name = "handler"
    failures_only = False
    #: Sync hooks only: call ``after`` only when the result is None (vLLM's "no room" answer),
    #: sparing the call on every successful result.
    after_only_on_none = False
    #: Sync hooks without ``before`` only: a Python expression over the target's parameter names (and
    #: ``_otel_result``), evaluated in the wrapper after the call; ``after`` is called only when it is
    #: true (or when it raises). Sparing the call on the common case of a hook that runs per request
    #: per iteration. Needs ``reads_args`` (the wrapper with the target's own signature); the
    #: contract test checks the names it reads through ``Target.params``.
    after_if: str | None = None
    #: How many leading arguments the handler reads (``args[0]`` is ``self`` for methods); None: all
    #: of ``args`` and ``kwargs``. With a number, the hook's wrapper has the target's own signature,
    #: ``args`` is the tuple of exactly those leading parameters (whether the caller passed them by
    #: position or by name) and ``kwargs`` is None — no packing of every argument into a tuple and a
    #: dict on each call.
    #: ``RowParams()``: self plus the parameters the class's rows name (``Target.params``), from the row.
    reads_args: int | None = None

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = cls.__qualname__

    def before(self, args, kwargs):
        return None

    def after(self, state, args, kwargs, result):
        pass

    def error(self, state, args, kwargs, exc):
        pass

    def future_done(self, state, args, kwargs, future):
        pass

    def future_result(self, state, args, kwargs, future):
        """A future of a FUTURE_CLASS-hooked class completed through ``set_result`` (it did not fail).
        Default: ``future_done``; a handler may override it to skip checking the future."""
        self.future_done(state, args, kwargs, future)

    def timed(self, seconds, args, kwargs, result):
        """Timer kinds only: the call returned after ``seconds`` (perf_counter)."""


class RowParams:
    """``reads_args = RowParams()`` on a handler class: it reads ``self`` and the parameters its
    target rows list in ``Target.params`` (the contract test checks them against vLLM's source), so
    the count is the row's, not restated. Resolved when a wrapper is built, never per call."""

    def __get__(self, obj, owner) -> int | None:
        return reads_args_of(owner)


_reported = STATE.reported


def report(handler, where: str, _state=STATE) -> None:
    """A handler failed in ``where`` (a fixed string: the method, or the read that failed): count it
    (``STATE.failures``, exported as ``hook_errors`` and listed by ``control status``), and log the first one
    per (handler, place) with its traceback. Only ever called on a failure: nothing is counted or paid
    while nothing fails."""
    key = (handler.name, where)
    failures = _state.failures
    with _state.failures_lock:
        failures[key] = failures.get(key, 0) + 1
    if key in _reported:
        return
    _reported.add(key)
    sink = _state.on_new_failure
    if sink is not None:
        try:
            sink()
        except Exception:
            pass
    logger.warning(
        "opentelemetry-instrumentation-vllm-ascend: handler %s failed in %s; vLLM continues unaffected, "
        "this handler's measurement is skipped (further failures of it are not logged; all are counted in "
        "vllm_profiling_hook_errors_total)",
        handler.name,
        where,
        exc_info=sys.exc_info()[0] is not None,
    )


class Hook:
    """The mutable part of one installed wrapper: ``handler`` is None once removed while another
    wrapper sits on top of ours (the wrapper then only calls through)."""

    __slots__ = ("handler",)

    def __init__(self, handler: Handler | None) -> None:
        self.handler = handler
