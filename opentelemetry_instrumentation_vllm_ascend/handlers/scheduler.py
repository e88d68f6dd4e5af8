"""Scheduler: the step boundary (phase), preemptions and recompute events."""

from __future__ import annotations

from .. import catalogue, context, recording
from ..context import CURRENT_STEP, IN_PREFIX_CACHE_RESET, LAST_STEP_PHASE, UNKNOWN, Step
from ..wrappers import Handler


def flush_step(step: Step, phase: str) -> None:
    """Record what one scheduling step saw, once, labelled with that step's phase."""
    if not (step.preemptions or step.recomputes or step.allocate_failures):
        return
    labels = context.step_labels(phase)
    recording.add(catalogue.RUNNING_TO_WAITING, step.preemptions, labels)
    recording.add(catalogue.RECOMPUTE_EVENTS, step.recomputes, labels)
    recording.add(catalogue.BLOCK_ALLOCATE_FAILURES, step.allocate_failures, labels)


class Schedule(Handler):
    """``Scheduler.schedule``: events inside the call are collected and recorded when it returns,
    labelled with the phase of the step it scheduled (computed once, from its SchedulerOutput)."""

    name = "Scheduler.schedule"
    reads_args = 1  # self

    def before(self, args, kwargs):
        step = Step()
        return step, CURRENT_STEP.set(step)

    def after(self, state, args, kwargs, result):
        step, token = state
        CURRENT_STEP.reset(token)
        phase = LAST_STEP_PHASE[0] = context.step_phase(args[0], result)
        flush_step(step, phase)

    def error(self, state, args, kwargs, exc):
        step, token = state
        CURRENT_STEP.reset(token)
        LAST_STEP_PHASE[0] = UNKNOWN
        flush_step(step, UNKNOWN)


class PreemptRequest(Handler):
    """``Scheduler._preempt_request(request, timestamp, …)``: +1 preemption when it returns normally;
    +1 recompute event when the request had computed tokens (they are dropped and redone)."""

    name = "Scheduler._preempt_request"
    reads_args = 2  # self, request

    def before(self, args, kwargs):
        request = args[1] if len(args) > 1 else (kwargs or {}).get("request")
        # Whatever the reason, the request will recompute its tokens when it resumes.
        context.mark_recomputing(args[0], getattr(request, "request_id", None))
        if IN_PREFIX_CACHE_RESET.get():
            return None
        return getattr(request, "num_computed_tokens", 0) or 0

    def after(self, state, args, kwargs, result):
        if state is None:
            return
        step = CURRENT_STEP.get()
        if step is not None:
            step.preemptions += 1
            if state > 0:
                step.recomputes += 1
            return
        # Outside any scheduling step (e.g. a scheduler subclass that schedules without schedule()).
        outside = Step()
        outside.preemptions = 1
        outside.recomputes = 1 if state > 0 else 0
        flush_step(outside, UNKNOWN)


class ResetPrefixCache(Handler):
    """``Scheduler.reset_prefix_cache``: preemptions it makes are bookkeeping, not memory pressure."""

    name = "Scheduler.reset_prefix_cache"
    reads_args = 0

    def before(self, args, kwargs):
        return IN_PREFIX_CACHE_RESET.set(True)

    def after(self, state, args, kwargs, result):
        IN_PREFIX_CACHE_RESET.reset(state)

    def error(self, state, args, kwargs, exc):
        IN_PREFIX_CACHE_RESET.reset(state)
