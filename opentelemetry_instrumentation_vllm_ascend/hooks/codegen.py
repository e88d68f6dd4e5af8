"""Wrapper source generation: one template per wrapper shape, compiled with ``exec`` and registered
in ``linecache`` so that a traceback through a wrapper shows its source (``forget`` drops it when the
wrapper is uninstalled)."""

from __future__ import annotations

import linecache
from time import perf_counter

from .handler import report

#: How the pseudo file name of every generated wrapper begins (tracebacks show it; ``forget`` checks it).
FILENAME_PREFIX = "<otel-vllm-ascend wrapper of "
#: Marks a ``before`` that raised: the wrapper then skips the handler's other methods for that call.
FAILED = object()

# One template per wrapper shape, built with exec in one of two forms:
# - with the target's own signature (when the handler declares ``reads_args``): the parameters, their
#   defaults (the very same objects) and keyword-only markers are the original's, the call passes them
#   straight through, and the handler's ``args`` is the tuple of the leading parameters it reads;
# - generic ``(*args, **kwargs)`` otherwise, or for targets that take *args / **kwargs themselves.
# Every name the templates use starts with ``_otel_``, so no target parameter can clash with them.

OUTCOME_BODY = """
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

#: A handler that only overrides ``before`` (a boundary mark: the stage budget's, the deferred records'
#: trigger): its state would go nowhere, so ``after`` and ``error`` are not called at all.
BEFORE_BODY = """
{def_} {name}({params}):
    _otel_handler = _otel_hook.handler
    if _otel_handler is not None:
        try:
            _otel_handler.before({args}, {kwargs})
        except Exception:
            _otel_report(_otel_handler, "before")
    return {await_}_otel_original({call})
"""

FULL_BODY = """
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

AFTER = """\
        try:
            _otel_handler.after(_otel_state, _otel_args, _otel_kwargs, _otel_result)
        except Exception:
            _otel_report(_otel_handler, "after")"""

#: The non-blocking RPC shape: a future of a class that completes only after the call returned (vLLM's
#: FutureWrapper) gets the pending hook stored on it in place of ``after``.
FUTURE_AFTER = """\
        if _otel_result.__class__ in _otel_completes_later:
            _otel_result._otel_vllm_ascend_pending = (_otel_handler.inner, _otel_state, _otel_args, _otel_kwargs)
        else:
    """ + AFTER.replace("\n", "\n    ")

#: A timer: the call's duration in ``_otel_seconds``, then ``{inline}`` under the guard — the handler's ``timed``
#: called, or the lines it hands over to run in place of that call (``Handler.timed_inline``, one frame less).
TIMER_BODY = """
{def_} {name}({params}):
    _otel_handler = _otel_hook.handler
    if _otel_handler is None:
        return {await_}_otel_original({call})
    _otel_start = _otel_clock()
    _otel_result = {await_}_otel_original({call})  # to completion: awaiting included
    _otel_seconds = _otel_clock() - _otel_start
    try:
{inline}
    except Exception:
        _otel_report(_otel_handler, "timed")
    return _otel_result
"""
#: TIMER_BODY's ``{inline}`` where the handler hands over no lines.
TIMED_CALL = "_otel_handler.timed(_otel_seconds, {args}, {kwargs}, _otel_result)"

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


def generate(
    original, hook, body: str, *, is_async: bool, head, guard: str | None = None, inline: str | None = None, **extra
):
    namespace = {
        "_otel_hook": hook,
        "_otel_original": original,
        "_otel_report": report,
        "_otel_clock": perf_counter,
        **{"_otel_" + k: v for k, v in extra.items()},
    }
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
    if inline is None:
        inline = TIMED_CALL.format(args=args, kwargs=kwargs)
    source = body.format(
        name="_otel_vllm_ascend_wrapper",
        params=params,
        call=call,
        args=args,
        kwargs=kwargs,
        guard=guard,
        def_="async def" if is_async else "def",
        await_="await " if is_async else "",
        inline="".join(f"        {line}\n" for line in inline.splitlines()).rstrip("\n"),
    )
    filename = f"{FILENAME_PREFIX}{getattr(original, '__qualname__', original)} #{id(hook):x}>"
    # Registered so that tracebacks and debuggers show the wrapper's lines (no file holds them); a
    # None mtime keeps ``linecache.checkcache`` from dropping the entry.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), namespace)
    wrapper = namespace["_otel_vllm_ascend_wrapper"]
    try:  # argument errors name the target, as they would without us
        wrapper.__code__ = wrapper.__code__.replace(co_name=getattr(original, "__name__", "wrapper"))
    except (AttributeError, TypeError, ValueError):
        pass
    return wrapper


def forget(wrapper) -> None:
    """Drop ``wrapper``'s source from ``linecache`` (it was uninstalled: nothing runs its lines any more).
    Anything but a generated wrapper is left alone."""
    code = getattr(wrapper, "__code__", None)
    if code is not None and code.co_filename.startswith(FILENAME_PREFIX):
        linecache.cache.pop(code.co_filename, None)


def _end_stream(handler, state, args, kwargs, exc) -> None:
    try:
        if exc is None:
            handler.after(state, args, kwargs, None)
        else:
            handler.error(state, args, kwargs, exc)
    except Exception:
        report(handler, "async generator end")


async def delegate(agen, handler, state, args, kwargs):
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
ASYNC_GENERATOR_RESULT = """\
        _otel_result = _otel_proxy(_otel_result, _otel_handler, _otel_state, _otel_args, _otel_kwargs)"""


STREAM_RESULT = """\
        if _otel_isasyncgen(_otel_result):
            _otel_result = _otel_proxy(_otel_result, _otel_handler, _otel_state, _otel_args, _otel_kwargs)
        else:
""" + AFTER.replace("\n", "\n    ").replace("        try:", "            try:", 1)
