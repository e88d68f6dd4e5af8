"""Step-classification shorthands over ``handlers.steps`` for tests and benchmarks."""

from opentelemetry_instrumentation_vllm_ascend.handlers.steps import RECOMPUTING_ATTRIBUTE, classify_step


def recomputing_of(scheduler) -> set:
    """The ids ``steps.mark_recomputing`` noted for ``scheduler`` and classification has not yet forgotten."""
    return getattr(scheduler, "__dict__", {}).get(RECOMPUTING_ATTRIBUTE) or set()


def step_phase(scheduler, scheduler_output) -> str:
    """prefill / decode / mixed for the work one SchedulerOutput schedules (``idle`` if none); see
    ``steps.classify_step``."""
    return classify_step(scheduler, scheduler_output)[0]
