"""KV cache manager: allocation failures."""

from __future__ import annotations

from ..hooks.handler import Handler
from ..state import UNKNOWN
from .scheduler import flush_step
from .steps import CURRENT_STEP, Step


def _failed() -> None:
    step = CURRENT_STEP.get()
    if step is not None:
        step.allocate_failures += 1
    else:
        outside = Step()
        outside.allocate_failures = 1
        flush_step(outside, UNKNOWN)


class AllocateSlots(Handler):
    """``KVCacheManager.allocate_slots``: a call that returned None (no room) or raised is one failure.
    The exception itself reaches the caller unchanged."""

    after_only_on_none = True  # called once per scheduled request per step: keep success free
    reads_args = 0

    def after(self, state, args, kwargs, result):
        if result is None:
            _failed()

    def error(self, state, args, kwargs, exc):
        _failed()
