"""Handler failures on ``/metrics`` and OTLP: ``hook_errors``.

``errors.report`` (below the recording layer, which it never imports) counts each failure in ``STATE.failures``;
at the start of every collection (``recording.pipeline``'s pre-collection step, after the deferred records,
whose failures count too) :func:`export` adds what each (hook, place) gained since the last one to the
``hook_errors`` counter. A process in which nothing failed does nothing here but one empty-dict test."""

from __future__ import annotations

from .. import catalogue, context
from ..state import STATE
from . import pipeline
from .instruments import add


def _pipeline_exists() -> None:
    """A first failure (``STATE.on_new_failure``): the count must reach an export, in a process that recorded
    nothing yet too (its collections export it)."""
    if STATE.pipeline is None and not STATE.pipeline_lock.locked():  # locked: being built (maybe by this thread)
        pipeline.get()


STATE.on_new_failure = _pipeline_exists


def snapshot() -> dict[tuple, int]:
    """(hook, where) -> failures so far in this process (a copy)."""
    with STATE.failures_lock:
        return dict(STATE.failures)


def export() -> None:
    """Add the failures counted since the last collection to ``hook_errors`` (the current pipeline's)."""
    if not STATE.failures:
        return
    exported = STATE.failures_exported
    ctx = context.PROCESS
    for (hook, where), count in snapshot().items():
        delta = count - exported.get((hook, where), 0)
        if delta > 0:
            add(catalogue.HOOK_ERRORS, delta, (ctx.process, ctx.dp, ctx.role, hook, where))
            exported[(hook, where)] = count


def degraded() -> list[dict]:
    """This process's failed hooks for ``control status``: [{hook, where, failures}], most failures first."""
    items = sorted(snapshot().items(), key=lambda item: (-item[1], item[0]))
    return [{"hook": hook, "where": where, "failures": count} for (hook, where), count in items]
