"""The handler protocol: what a hook's handler may implement, how its failures are reported (``report``,
from ``errors``), and the mutable cell an installed wrapper reads its handler from.

Contract, for every wrapper kind (``wrappers.py``): the original runs exactly once per call, with the
same arguments; its result, its exception and its timing semantics reach the caller unchanged; a
handler that raises is counted (``hook_errors``), logged (once per handler and place) and otherwise
ignored."""

from __future__ import annotations

from ..errors import report

__all__ = ["Handler", "Hook", "report"]


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
    #: contract test checks the names it reads through ``params``.
    after_if: str | None = None
    #: The hooked method's parameters (after ``self``) the handler reads by position, in order, named once
    #: here beside the code that indexes them (``args[1]`` is ``params[0]``): the contract test checks them in
    #: the source of every supported release, and a class that names them reads exactly ``self`` and those
    #: (``reads_args = len(params) + 1``) unless it says otherwise.
    params: tuple[str, ...] = ()
    #: How many leading arguments the handler reads (``args[0]`` is ``self`` for methods); None: all
    #: of ``args`` and ``kwargs``. With a number, the hook's wrapper has the target's own signature,
    #: ``args`` is the tuple of exactly those leading parameters (whether the caller passed them by
    #: position or by name) and ``kwargs`` is None — no packing of every argument into a tuple and a
    #: dict on each call.
    reads_args: int | None = None

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = cls.__qualname__
        if "params" in cls.__dict__ and "reads_args" not in cls.__dict__:
            cls.reads_args = len(cls.params) + 1

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

    def timed_inline(self):
        """Timer kinds only: None, or ``(lines, names)`` that do exactly what ``timed`` does, for the wrapper to run
        in place of the call (one frame less per call): ``lines`` read ``_otel_seconds`` (nothing else of the call)
        and the names of ``names``, each of which begins with ``_otel_``."""
        return None


class Hook:
    """The mutable part of one installed wrapper: ``handler`` is None once removed while another
    wrapper sits on top of ours (the wrapper then only calls through)."""

    __slots__ = ("handler",)

    def __init__(self, handler: Handler | None) -> None:
        self.handler = handler
