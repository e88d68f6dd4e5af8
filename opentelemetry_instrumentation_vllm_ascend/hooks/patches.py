"""Patching classes in place (the original classes, whatever later rebinds their module names), and
the patch records that undo it."""

from __future__ import annotations

import functools
import threading
import weakref

from ..state import STATE
from . import codegen, futures
from .handler import Handler, Hook, report
from .wrappers import wrap

#: An attribute the class did not define itself before we patched it.
ABSENT = object()


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
            if self.original is ABSENT:
                delattr(self.owner, self.attribute)
            else:
                setattr(self.owner, self.attribute, self.original)
            codegen.forget(self.wrapper)  # its source lines, kept for tracebacks, are not needed now
            # A reference taken while it was installed (the exception handler an app registered from a hooked
            # module-level name) calls straight through from now on.
            self.hook.handler = None
        else:
            # Someone wrapped over us (vllm-ascend assigns its own wrappers onto classes): removing
            # ours would drop theirs, so ours turns into a plain call-through instead.
            self.hook.handler = None


def stand_in(holder, attribute: str, replacement):
    """Set ``holder.attribute`` (an object vLLM built and keeps there) to ``replacement``, which stands in for it
    (and calls it); ``restore_stand_ins()`` — at ``uninstrument()`` — puts the object back. Returns
    ``replacement``."""
    original = getattr(holder, attribute)
    setattr(holder, attribute, replacement)
    try:
        held = weakref.ref(holder)
    except TypeError:  # no weak references to it: hold it
        held = holder
    STATE.stand_ins.append((held, attribute, original, replacement))
    return replacement


def restore_stand_ins() -> int:
    """Put back every object a stand-in replaced, where the stand-in is still there; returns how many."""
    restored = 0
    stand_ins, STATE.stand_ins = STATE.stand_ins, []
    for held, attribute, original, replacement in reversed(stand_ins):
        holder = held() if isinstance(held, weakref.ref) else held
        if holder is not None and getattr(holder, attribute, None) is replacement:
            try:
                setattr(holder, attribute, original)
                restored += 1
            except Exception:  # never break the host
                pass
    return restored


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


def hook_future_class(cls, completes_later: bool = False) -> list:
    """Give ``cls`` (a concurrent.futures.Future subclass, e.g. vLLM's FutureWrapper) its own
    ``set_result`` / ``set_exception`` that, after the inherited ones, hand the completion to the
    FUTURE handler attached to that future, if any. A future completed any other way (cancelled)
    is not reported. ``completes_later``: futures of ``cls`` are only completed after the call that
    returned them has returned (vLLM's FutureWrapper: in ``result()``), so the hook need not check."""
    patches: list[Patch | _ForgetCompletionClass] = []
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
            futures.deliver(self)

        for name, inherited, completion in (
            ("set_result", set_result, completed),
            ("set_exception", set_exception, failed),
        ):
            functools.update_wrapper(completion, inherited)
            original = cls.__dict__.get(name, ABSENT)
            setattr(cls, name, completion)
            patches.append(Patch(cls, name, original, completion, Hook(None)))
        if futures.PENDING not in cls.__dict__:
            setattr(cls, futures.PENDING, None)
            patches.append(Patch(cls, futures.PENDING, ABSENT, None, Hook(None)))
        STATE.completion_hooked.add(cls)
        if completes_later:
            STATE.completes_later.add(cls)
        patches.append(_ForgetCompletionClass(cls))
    return patches


class _ForgetCompletionClass:
    __slots__ = ("cls",)

    def __init__(self, cls) -> None:
        self.cls = cls

    def remove(self) -> None:
        STATE.completion_hooked.discard(self.cls)
        STATE.completes_later.discard(self.cls)
