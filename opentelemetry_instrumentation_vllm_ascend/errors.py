"""How a failure of the package's own code is reported: counted, logged once, never raised into vLLM.

A leaf of the package (it imports ``state`` only), so every layer reports through it: the hook mechanism
(``hooks/``), the handlers and the recording layer (its deferred records and observable gauges)."""

from __future__ import annotations

import logging
import sys

from .state import STATE

logger = logging.getLogger(__name__)

_reported = STATE.reported


def report(handler, where: str, _state=STATE) -> None:
    """A handler failed in ``where`` (a fixed string: the method, or the read that failed): count it
    (``STATE.failures``, exported as ``hook_errors`` and listed by ``control status``), and log the first one
    per (handler, place) with its traceback. ``handler``: anything with a ``name`` (a hook's handler, or the
    recording layer's stand-in for one). Only ever called on a failure: nothing is counted or paid while
    nothing fails."""
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
