"""Non-blocking calls that return futures (vLLM's executor RPCs): the FUTURE wrapper's adapter, and
the future classes that hand their own completions to the hook (``patches.hook_future_class``)."""

from __future__ import annotations

from ..state import STATE
from . import codegen
from .handler import Handler, report


class FutureAdapter(Handler):
    """Turns a handler's ``future_done`` into the ``after`` of a sync wrapper: when the call returns
    a future (vLLM's non-blocking RPC), failures arriving through it reach ``future_done``, in
    whichever thread completes it; any other result goes to ``after``."""

    def __init__(self, inner: Handler) -> None:
        self.inner = inner
        self.name = inner.name
        # The inner handler's own methods, bound once: no extra call per hooked call.
        self.before = inner.before  # type: ignore[method-assign]
        self.error = inner.error  # type: ignore[method-assign]

    def after(self, state, args, kwargs, result, _hooked=STATE.completion_hooked):
        if type(result) in _hooked:
            # The future's class hands its completion to us: one attribute store, no callback.
            setattr(result, PENDING, (self.inner, state, args, kwargs))
            if result._state != "PENDING" and result._state != "RUNNING":
                deliver(result)  # it completed before we attached (not vLLM's case; be safe)
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
PENDING = "_otel_vllm_ascend_pending"


def _take(future):
    """The pending hook stored on ``future``, removed from it; None when it had none or another
    thread took it first (so each is delivered at most once)."""
    pending = getattr(future, PENDING, None)
    if pending is not None:
        try:
            delattr(future, PENDING)
        except AttributeError:  # taken meanwhile
            return None
    return pending


def deliver(future) -> None:
    pending = _take(future)
    if pending is not None:
        handler, state, args, kwargs = pending
        try:
            handler.future_done(state, args, kwargs, future)
        except Exception:
            report(handler, "future_done")


def future_wrapper(original, hook):
    hook.handler = FutureAdapter(hook.handler)
    return codegen.generate(
        original,
        hook,
        codegen.FULL_BODY.replace("{on_result}", codegen.FUTURE_AFTER),
        is_async=False,
        head=hook.handler.inner.reads_args,
        FAILED=codegen.FAILED,
        completes_later=STATE.completes_later,
    )
