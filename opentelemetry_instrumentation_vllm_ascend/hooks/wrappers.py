"""The wrapper kinds and ``wrap``, which builds the wrapper of one kind around a function.

Plain closures and generated functions, not wrapt: a closure wrapper costs several times less per call than
wrapt.FunctionWrapper (``tox -e bench`` measures both; docs/performance.md, section A, has the current figures)."""

from __future__ import annotations

import functools

from ..kinds import (  # noqa: F401  (re-exported: the kinds wrap() takes)
    ASYNC_GENERATOR,
    COROUTINE,
    COROUTINE_STREAM,
    COROUTINE_TIMER,
    FUTURE,
    FUTURE_CLASS,
    SCOPE_FACTORY,
    SYNC,
    SYNC_TIMER,
)
from . import codegen, futures, rewrite
from .handler import Handler, Hook


def wrap(original, handler: Handler, kind: str):
    hook = Hook(handler)
    maker = {
        SYNC: _sync,
        COROUTINE: _coroutine,
        ASYNC_GENERATOR: _async_generator,
        FUTURE: futures.future_wrapper,
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
    return _timer(original, hook, is_async=False)


def _coroutine_timer(original, hook):
    return _timer(original, hook, is_async=True)


def _timer(original, hook, is_async: bool):
    handler = hook.handler
    inline = handler.timed_inline()
    if inline is None:
        return codegen.generate(original, hook, codegen.TIMER_BODY, is_async=is_async, head=handler.reads_args)
    # The handler's class is fixed for the hook's life (the hook only ever holds it or None): its ``timed`` runs
    # as lines of the wrapper, one frame less on every call.
    lines, names = inline
    return codegen.generate(
        original,
        hook,
        codegen.TIMER_BODY,
        is_async=is_async,
        head=handler.reads_args,
        inline=lines,
        **{name.removeprefix("_otel_"): value for name, value in names.items()},
    )


def _build(original, hook, is_async: bool):
    handler = hook.handler
    inner = handler.inner if isinstance(handler, futures.FutureAdapter) else handler
    if not is_async and not isinstance(handler, futures.FutureAdapter) and type(handler).before is Handler.before:
        if handler.after_only_on_none and handler.reads_args == 0 and not handler.after_if:
            # Per-request "no room" hooks: the target's own returns tell the handler (no wrapper frame).
            copy = rewrite.none_returns(original, hook)
            if copy is not None:
                return copy
        return codegen.generate(
            original,
            hook,
            codegen.OUTCOME_BODY,
            is_async=False,
            head=inner.reads_args,
            guard=handler.after_if,
            none_only=handler.after_only_on_none,
        )
    if (
        not isinstance(handler, futures.FutureAdapter)
        and type(handler).after is Handler.after
        and type(handler).error is Handler.error
    ):
        # Only ``before``: a mark at the call (the handler's class is fixed for the hook's life).
        return codegen.generate(original, hook, codegen.BEFORE_BODY, is_async=is_async, head=inner.reads_args)
    return codegen.generate(
        original,
        hook,
        codegen.FULL_BODY.replace("{on_result}", codegen.AFTER),
        is_async=is_async,
        head=inner.reads_args,
        FAILED=codegen.FAILED,
    )


def _coroutine_stream(original, hook):
    import inspect

    return codegen.generate(
        original,
        hook,
        codegen.FULL_BODY.replace("{on_result}", codegen.STREAM_RESULT),
        is_async=True,
        head=hook.handler.reads_args,
        FAILED=codegen.FAILED,
        proxy=codegen.delegate,
        isasyncgen=inspect.isasyncgen,
    )


def _async_generator(original, hook):
    return codegen.generate(
        original,
        hook,
        codegen.FULL_BODY.replace("{on_result}", codegen.ASYNC_GENERATOR_RESULT),
        is_async=False,
        head=hook.handler.reads_args,
        FAILED=codegen.FAILED,
        proxy=codegen.delegate,
    )
