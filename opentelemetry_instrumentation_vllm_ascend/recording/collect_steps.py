"""What runs at the start of every collection of this process's pipeline (``recording/pipeline.py``), in order
(``add_pre_collect``: the records left for later, what the handlers hold, what is reported about them, then work
that only looks), and what runs in a forked child after its fork handler (``add_after_fork``)."""

from __future__ import annotations

import logging

from ..state import STATE

logger = logging.getLogger(__name__)


#: Where a pre-collection step runs among the others (``add_pre_collect``): the records left for later go in
#: first, then what the handlers hold (a stage budget's seconds so far), then what is reported about them
#: (handler failures, those of the records just made included), then work that only looks (``LAST``).
RECORDS, HANDLERS, REPORTS, LAST = 0, 1, 2, 3


def add_pre_collect(step, place: int = LAST) -> None:
    """Run ``step()`` at the start of every collection (and before a flush's or the final export), in the
    collecting thread, at ``place`` among the others (``RECORDS``, ``HANDLERS``, ``REPORTS``, ``LAST``); the
    recording facade registers the recording layer's, ``instrument()`` the handlers'. Registered once: a
    second registration of the same step is ignored."""
    steps = STATE.pre_collect
    if any(registered is step for _place, registered in steps):
        return
    steps.insert(sum(1 for registered_place, _step in steps if registered_place <= place), (place, step))


def add_after_fork(step) -> None:
    """Run ``step()`` in a forked child, after its fork handler dropped the parent's pipeline and state."""
    if step not in STATE.after_fork:
        STATE.after_fork.append(step)


def before_collect() -> None:
    """Run at the start of every collection, in the collecting thread: the registered steps in order
    (``add_pre_collect``): the deferred records go in, then the stage clocks' seconds so far
    (handlers.budget), then the handler failures counted since the last one (``hook_errors``). A step that
    raises is logged and skips those after it until the next collection."""
    try:
        with STATE.collect_lock:
            for _place, step in STATE.pre_collect:
                step()
    except Exception:
        logger.warning("opentelemetry-instrumentation-vllm-ascend: a pre-collection hook failed", exc_info=True)
