"""Wrapper kinds and the patching machinery.

Plain closures, not wrapt: on our machines a closure wrapper costs ~106 ns per call against
wrapt.FunctionWrapper's ~464 ns (benchmarks/bench_hooks.py measures both).

Contract, for every kind: the original runs exactly once per call, with the same arguments; its
result, its exception and its timing semantics reach the caller unchanged; a handler that raises
is logged (once per handler and place) and otherwise ignored.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from time import perf_counter

logger = logging.getLogger(__name__)

SYNC = "sync"
COROUTINE = "coroutine"
ASYNC_GENERATOR = "async_generator"
FUTURE = "future"
#: Timers: the wrapper itself reads the clock around the call and hands the handler the duration
#: (``Handler.timed``) — the cheapest shape for the most common hook. Failed calls are not timed.
SYNC_TIMER = "sync_timer"
COROUTINE_TIMER = "coroutine_timer"
#: Not a wrapper: makes a Future subclass deliver its completions to FUTURE handlers itself (see
#: ``hook_future_class``), so that a FUTURE hook on a call returning such futures costs an attribute
#: store instead of a done-callback per call.
FUTURE_CLASS = "future_class"
#: Not a wrapper: a module-level factory replaced by the handler's own ``install(module)`` (vLLM's
#: ``vllm.v1.utils._PROFILER_FUNC``, which ``record_function_or_nullcontext`` calls for every scope).
SCOPE_FACTORY = "scope_factory"
#: A coroutine that may return an async generator (a streaming HTTP response): awaited, then, when
#: the result is an async generator, handed back inside a delegating async generator that ends the
#: measurement when the stream ends (``after`` / ``error`` as for ASYNC_GENERATOR); any other result
#: goes to ``after``.
COROUTINE_STREAM = "coroutine_stream"

_FAILED = object()
_ABSENT = object()


class Handler:
    """Measurements from arguments. Override what you need; every method may raise safely.

    ``failures_only = True`` tells FUTURE wrappers that ``future_done`` only matters for futures
    that failed or were cancelled (successful completions are then not delivered at all).

    ``before`` returns a state object passed to the others (``None`` is fine).
    ``after`` sees the result (for async generators: ``None``, once exhausted).
    ``error`` sees the exception the original raised (for async generators: also an early close,
    as ``GeneratorExit``). ``future_done`` sees a future the original returned, once it is done.
    """

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
    reads_args: int | None = None

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


_reported: set = set()


def report(handler, where: str) -> None:
    """Log a handler failure: the first one per (handler, place) with its traceback, then silence."""
    key = (handler.name, where)
    if key in _reported:
        return
    _reported.add(key)
    logger.warning(
        "opentelemetry-instrumentation-vllm-ascend: handler %s failed in %s; vLLM continues unaffected, "
        "this handler's measurement is skipped (further failures of it are not logged)",
        handler.name, where, exc_info=sys.exc_info()[0] is not None,
    )


class Hook:
    """The mutable part of one installed wrapper: ``handler`` is None once removed while another
    wrapper sits on top of ours (the wrapper then only calls through)."""

    __slots__ = ("handler",)

    def __init__(self, handler: Handler) -> None:
        self.handler = handler


def wrap(original, handler: Handler, kind: str):
    hook = Hook(handler)
    maker = {
        SYNC: _sync,
        COROUTINE: _coroutine,
        ASYNC_GENERATOR: _async_generator,
        FUTURE: _future,
        SYNC_TIMER: _sync_timer,
        COROUTINE_TIMER: _coroutine_timer,
        COROUTINE_STREAM: _coroutine_stream,
    }[kind]
    wrapper = maker(original, hook)
    functools.update_wrapper(wrapper, original)
    wrapper.__otel_vllm_ascend_hook__ = hook
    return wrapper, hook


def _sync(original, hook):
    return _build(original, hook, is_async=False)


def _coroutine(original, hook):
    return _build(original, hook, is_async=True)


def _sync_timer(original, hook):
    return _generate(original, hook, _TIMER_BODY, is_async=False, head=hook.handler.reads_args)


def _coroutine_timer(original, hook):
    return _generate(original, hook, _TIMER_BODY, is_async=True, head=hook.handler.reads_args)


def _build(original, hook, is_async: bool):
    handler = hook.handler
    inner = handler.inner if isinstance(handler, _FutureAdapter) else handler
    if not is_async and not isinstance(handler, _FutureAdapter) and type(handler).before is Handler.before:
        return _generate(original, hook, _OUTCOME_BODY, is_async=False, head=inner.reads_args,
                         guard=handler.after_if, none_only=handler.after_only_on_none)
    return _generate(original, hook, _FULL_BODY.replace("{on_result}", _AFTER), is_async=is_async,
                     head=inner.reads_args, FAILED=_FAILED)


# -- generated wrappers ------------------------------------------------------------------------------
# One template per wrapper shape, built with exec in one of two forms:
# - with the target's own signature (when the handler declares ``reads_args``): the parameters, their
#   defaults (the very same objects) and keyword-only markers are the original's, the call passes them
#   straight through, and the handler's ``args`` is the tuple of the leading parameters it reads;
# - generic ``(*args, **kwargs)`` otherwise, or for targets that take *args / **kwargs themselves.
# Every name the templates use starts with ``_otel_``, so no target parameter can clash with them.

_OUTCOME_BODY = """
def {name}({params}):
    _otel_handler = _otel_hook.handler
    if _otel_handler is None:
        return _otel_original({call})
    try:
        _otel_result = _otel_original({call})
    except BaseException as _otel_exc:
        try:
            _otel_handler.error(None, {args}, {kwargs}, _otel_exc)
        except Exception:
            _otel_report(_otel_handler, "error")
        raise
{guard}    if _otel_result is None or not _otel_none_only:
        try:
            _otel_handler.after(None, {args}, {kwargs}, _otel_result)
        except Exception:
            _otel_report(_otel_handler, "after")
    return _otel_result
"""

_FULL_BODY = """
{def_} {name}({params}):
    _otel_handler = _otel_hook.handler
    if _otel_handler is None:
        return {await_}_otel_original({call})
    _otel_args = {args}
    _otel_kwargs = {kwargs}
    try:
        _otel_state = _otel_handler.before(_otel_args, _otel_kwargs)
    except Exception:
        _otel_state = _otel_FAILED
        _otel_report(_otel_handler, "before")
    try:
        _otel_result = {await_}_otel_original({call})
    except BaseException as _otel_exc:
        if _otel_state is not _otel_FAILED:
            try:
                _otel_handler.error(_otel_state, _otel_args, _otel_kwargs, _otel_exc)
            except Exception:
                _otel_report(_otel_handler, "error")
        raise
    if _otel_state is not _otel_FAILED:
{on_result}
    return _otel_result
"""

_AFTER = """\
        try:
            _otel_handler.after(_otel_state, _otel_args, _otel_kwargs, _otel_result)
        except Exception:
            _otel_report(_otel_handler, "after")"""

#: The non-blocking RPC shape: a future of a class that completes only after the call returned (vLLM's
#: FutureWrapper) gets the pending hook stored on it in place of ``after``.
_FUTURE_AFTER = """\
        if _otel_result.__class__ in _otel_completes_later:
            _otel_result._otel_vllm_ascend_pending = (_otel_handler.inner, _otel_state, _otel_args, _otel_kwargs)
        else:
    """ + _AFTER.replace("\n", "\n    ")

_TIMER_BODY = """
{def_} {name}({params}):
    _otel_handler = _otel_hook.handler
    if _otel_handler is None:
        return {await_}_otel_original({call})
    _otel_start = _otel_clock()
    _otel_result = {await_}_otel_original({call})  # to completion: awaiting included
    _otel_end = _otel_clock()
    try:
        _otel_handler.timed(_otel_end - _otel_start, {args}, {kwargs}, _otel_result)
    except Exception:
        _otel_report(_otel_handler, "timed")
    return _otel_result
"""

_GENERIC = "*_otel_a, **_otel_k"


def _signature(original, head):
    """(params, call, args expression) reproducing ``original``'s signature, or None."""
    code = getattr(original, "__code__", None)
    if head is None or code is None or code.co_flags & (0x04 | 0x08):  # CO_VARARGS | CO_VARKEYWORDS
        return None
    n_pos, n_kwonly = code.co_argcount, code.co_kwonlyargcount
    names = code.co_varnames[: n_pos + n_kwonly]
    if head > n_pos or any(not n.isidentifier() or n.startswith("_otel_") for n in names):
        return None
    defaults = original.__defaults__ or ()
    kwdefaults = original.__kwdefaults__ or {}
    namespace, params, call = {}, [], []
    first_default = n_pos - len(defaults)
    for i, n in enumerate(names[:n_pos]):
        if i >= first_default:
            namespace[f"_otel_default_{i}"] = defaults[i - first_default]
            params.append(f"{n}=_otel_default_{i}")
        else:
            params.append(n)
        call.append(n)
    if code.co_posonlyargcount:
        params.insert(code.co_posonlyargcount, "/")
    if n_kwonly:
        params.append("*")
        for n in names[n_pos:]:
            if n in kwdefaults:
                namespace[f"_otel_kwdefault_{n}"] = kwdefaults[n]
                params.append(f"{n}=_otel_kwdefault_{n}")
            else:
                params.append(n)
            call.append(f"{n}={n}")
    args = "(" + "".join(f"{n}, " for n in names[:head]) + ")"
    return ", ".join(params), ", ".join(call), args, namespace


_GUARD = """\
    try:
        _otel_go = {guard}
    except Exception:
        _otel_go = True  # the handler decides (and reports its own failure)
    if not _otel_go:
        return _otel_result
"""


def _generate(original, hook, body: str, *, is_async: bool, head, guard: str | None = None, **extra):
    namespace = {"_otel_hook": hook, "_otel_original": original, "_otel_report": report,
                 "_otel_clock": perf_counter, **{"_otel_" + k: v for k, v in extra.items()}}
    signature = _signature(original, head)
    if signature is not None:
        params, call, args, defaults = signature
        namespace.update(defaults)
        kwargs = "None"
    else:
        params = call = _GENERIC
        args, kwargs = "_otel_a", "_otel_k"
    # A handler's after_if needs the target's parameter names: only in the signature form.
    guard = _GUARD.format(guard=guard) if guard and signature is not None else ""
    source = body.format(name="_otel_vllm_ascend_wrapper", params=params, call=call, args=args, kwargs=kwargs,
                         guard=guard, def_="async def" if is_async else "def", await_="await " if is_async else "")
    exec(compile(source, f"<otel-vllm-ascend wrapper of {getattr(original, '__qualname__', original)}>", "exec"),
         namespace)
    wrapper = namespace["_otel_vllm_ascend_wrapper"]
    try:  # argument errors name the target, as they would without us
        wrapper.__code__ = wrapper.__code__.replace(co_name=getattr(original, "__name__", "wrapper"))
    except (AttributeError, TypeError, ValueError):
        pass
    return wrapper


class _FutureAdapter(Handler):
    """Turns a handler's ``future_done`` into the ``after`` of a sync wrapper: when the call returns
    a future (vLLM's non-blocking RPC), failures arriving through it reach ``future_done``, in
    whichever thread completes it; any other result goes to ``after``."""

    def __init__(self, inner: Handler) -> None:
        self.inner = inner
        self.name = inner.name
        # The inner handler's own methods, bound once: no extra call per hooked call.
        self.before = inner.before
        self.error = inner.error

    def after(self, state, args, kwargs, result):
        if type(result) in _COMPLETION_HOOKED:
            # The future's class hands its completion to us: one attribute store, no callback.
            setattr(result, _PENDING, (self.inner, state, args, kwargs))
            if result._state != "PENDING" and result._state != "RUNNING":
                _deliver(result)  # it completed before we attached (not vLLM's case; be safe)
            return
        add_done_callback = getattr(result, "add_done_callback", None)
        if add_done_callback is None or not callable(getattr(result, "exception", None)):
            self.inner.after(state, args, kwargs, result)
            return
        inner = self.inner

        def done(future):
            try:
                inner.future_done(state, args, kwargs, future)
            except Exception:
                report(inner, "future_done")

        add_done_callback(done)


#: The attribute a future of a FUTURE_CLASS-hooked class carries its pending hook in: the class
#: itself holds None, so reading it needs no default, and instances keep their inline attribute
#: values (``__dict__.pop`` would build the instance's dict on every future: ~70 ns more).
_PENDING = "_otel_vllm_ascend_pending"
_COMPLETION_HOOKED: set = set()  # future classes that deliver their completion to the hook
_COMPLETES_LATER: set = set()  # …and are only ever completed after the call that made them returned


def _take(future):
    """The pending hook stored on ``future``, removed from it; None when it had none or another
    thread took it first (so each is delivered at most once)."""
    pending = getattr(future, _PENDING, None)
    if pending is not None:
        try:
            delattr(future, _PENDING)
        except AttributeError:  # taken meanwhile
            return None
    return pending


def _deliver(future) -> None:
    pending = _take(future)
    if pending is not None:
        handler, state, args, kwargs = pending
        try:
            handler.future_done(state, args, kwargs, future)
        except Exception:
            report(handler, "future_done")


def hook_future_class(cls, completes_later: bool = False) -> list:
    """Give ``cls`` (a concurrent.futures.Future subclass, e.g. vLLM's FutureWrapper) its own
    ``set_result`` / ``set_exception`` that, after the inherited ones, hand the completion to the
    FUTURE handler attached to that future, if any. A future completed any other way (cancelled)
    is not reported. ``completes_later``: futures of ``cls`` are only completed after the call that
    returned them has returned (vLLM's FutureWrapper: in ``result()``), so the hook need not check."""
    patches = []
    with _patch_lock:
        set_result, set_exception = cls.set_result, cls.set_exception

        def completed(self, result, _inherited=set_result):
            _inherited(self, result)  # InvalidStateError passes through, nothing delivered
            # _take(self), inlined: this runs on every successful non-blocking RPC.
            pending = self._otel_vllm_ascend_pending  # the class's None unless a hook is pending
            if pending is None:
                return
            try:
                del self._otel_vllm_ascend_pending
            except AttributeError:  # another thread took it: delivered at most once
                return
            if not pending[0].failures_only:
                try:
                    pending[0].future_result(pending[1], pending[2], pending[3], self)
                except Exception:
                    report(pending[0], "future_done")

        def failed(self, exception, _inherited=set_exception):
            _inherited(self, exception)
            _deliver(self)

        for name, inherited, completion in (("set_result", set_result, completed),
                                            ("set_exception", set_exception, failed)):
            functools.update_wrapper(completion, inherited)
            original = cls.__dict__.get(name, _ABSENT)
            setattr(cls, name, completion)
            patches.append(Patch(cls, name, original, completion, Hook(None)))
        if _PENDING not in cls.__dict__:
            setattr(cls, _PENDING, None)
            patches.append(Patch(cls, _PENDING, _ABSENT, None, Hook(None)))
        _COMPLETION_HOOKED.add(cls)
        if completes_later:
            _COMPLETES_LATER.add(cls)
        patches.append(_ForgetCompletionClass(cls))
    return patches


class _ForgetCompletionClass:
    __slots__ = ("cls",)

    def __init__(self, cls) -> None:
        self.cls = cls

    def remove(self) -> None:
        _COMPLETION_HOOKED.discard(self.cls)
        _COMPLETES_LATER.discard(self.cls)


def _future(original, hook):
    hook.handler = _FutureAdapter(hook.handler)
    return _generate(original, hook, _FULL_BODY.replace("{on_result}", _FUTURE_AFTER), is_async=False,
                     head=hook.handler.inner.reads_args, FAILED=_FAILED, completes_later=_COMPLETES_LATER)


def _end_stream(handler, state, args, kwargs, exc) -> None:
    try:
        if exc is None:
            handler.after(state, args, kwargs, None)
        else:
            handler.error(state, args, kwargs, exc)
    except Exception:
        report(handler, "async generator end")


async def _delegate(agen, handler, state, args, kwargs):
    """An async generator that yields what ``agen`` yields (``asend`` values and ``athrow``
    exceptions are passed on to it) and tells the handler, once, how iteration ended: exhausted
    (``after``), raised (``error``), or closed early (``error`` with GeneratorExit; the real generator
    is closed first). Being an async generator itself, it is cheaper per item than a proxy object
    with a coroutine per ``__anext__`` (~65 ns against ~185 ns), and the event loop's finalizer
    closes it (ending the measurement) if it is dropped unfinished."""
    value = None
    thrown = None
    try:
        while True:
            try:
                if thrown is None:
                    item = await agen.asend(value)  # asend(None) is __anext__()
                else:
                    exc, thrown = thrown, None
                    item = await agen.athrow(exc)
            except StopAsyncIteration:
                _end_stream(handler, state, args, kwargs, None)
                return
            try:
                value = yield item
            except GeneratorExit:
                raise
            except BaseException as exc:  # athrow() into us: on to the real generator
                thrown, value = exc, None
    except GeneratorExit:
        try:
            await agen.aclose()
        finally:
            _end_stream(handler, state, args, kwargs, GeneratorExit())
        raise
    except BaseException as exc:
        _end_stream(handler, state, args, kwargs, exc)
        raise


#: The async-generator shape: the generator object (its creation is the call) is handed back inside
#: a delegating async generator that ends the measurement when iteration ends.
_ASYNC_GENERATOR_RESULT = """\
        _otel_result = _otel_proxy(_otel_result, _otel_handler, _otel_state, _otel_args, _otel_kwargs)"""


_STREAM_RESULT = """\
        if _otel_isasyncgen(_otel_result):
            _otel_result = _otel_proxy(_otel_result, _otel_handler, _otel_state, _otel_args, _otel_kwargs)
        else:
""" + _AFTER.replace("\n", "\n    ").replace("        try:", "            try:", 1)


def _coroutine_stream(original, hook):
    import inspect

    return _generate(original, hook, _FULL_BODY.replace("{on_result}", _STREAM_RESULT), is_async=True,
                     head=hook.handler.reads_args, FAILED=_FAILED, proxy=_delegate,
                     isasyncgen=inspect.isasyncgen)


def _async_generator(original, hook):
    return _generate(original, hook, _FULL_BODY.replace("{on_result}", _ASYNC_GENERATOR_RESULT), is_async=False,
                     head=hook.handler.reads_args, FAILED=_FAILED, proxy=_delegate)


# --------------------------------------------------------------------------------------------
# Patching classes in place (the original classes, whatever later rebinds their module names).


class Patch:
    __slots__ = ("owner", "attribute", "original", "wrapper", "hook")

    def __init__(self, owner, attribute, original, wrapper, hook) -> None:
        self.owner = owner
        self.attribute = attribute
        self.original = original
        self.wrapper = wrapper
        self.hook = hook

    def remove(self) -> None:
        current = self.owner.__dict__.get(self.attribute)
        if current is self.wrapper:
            if self.original is _ABSENT:
                delattr(self.owner, self.attribute)
            else:
                setattr(self.owner, self.attribute, self.original)
        else:
            # Someone wrapped over us (vllm-ascend assigns its own wrappers onto classes): removing
            # ours would drop theirs, so ours turns into a plain call-through instead.
            self.hook.handler = None


def original_class(module, qualname: str):
    """The class defined as ``module.qualname``, even when the module's name now points at a
    subclass (vllm-ascend rebinds e.g. ``Scheduler``): walk the MRO back to the definition."""
    obj = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if isinstance(obj, type):
        for klass in obj.__mro__:
            if klass.__module__ == module.__name__ and klass.__qualname__ == qualname:
                return klass
    return obj


_patch_lock = threading.RLock()


def patch_method(owner, attribute: str, handler: Handler, kind: str) -> Patch:
    """Replace ``owner.attribute`` (defined on ``owner`` itself) by a wrapper of ``kind``."""
    with _patch_lock:
        if attribute not in owner.__dict__:
            raise AttributeError(f"{owner.__qualname__}.{attribute} is not defined on {owner.__qualname__}")
        original = owner.__dict__[attribute]
        if isinstance(original, (staticmethod, classmethod)):
            raise TypeError(f"{owner.__qualname__}.{attribute}: static/class methods are not supported")
        wrapper, hook = wrap(original, handler, kind)
        setattr(owner, attribute, wrapper)
        return Patch(owner, attribute, original, wrapper, hook)
