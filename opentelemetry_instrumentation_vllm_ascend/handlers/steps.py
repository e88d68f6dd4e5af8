"""The step being scheduled (per scheduling call, in a ContextVar so threads and coroutines never see
each other's), the attributes a step's phase and timestamps travel in between the EngineCore and its
workers, and the classification of a step's work into prefill / decode / mixed.

Per-process values (the last step's phase, the ``schedule()`` call count) are fields of ``state.STATE``;
the requests a scheduler is recomputing are noted on the scheduler itself.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from ..state import UNKNOWN


class Step:
    """Events seen while one ``schedule()`` call runs; recorded once, with the step's phase, when it returns."""

    __slots__ = ("preemptions", "recomputes", "recomputed_tokens", "allocate_failures", "scopes", "timers")

    def __init__(self) -> None:
        self.preemptions = 0
        self.recomputes = 0
        #: Tokens computed again by requests that resumed in this step after a preemption.
        self.recomputed_tokens = 0
        self.allocate_failures = 0
        #: {scope name: [seconds, …]} of profiling scopes that ended inside the schedule() call
        #: (vLLM's per-request "schedule: allocate_slots" scope ends once per running request).
        self.scopes: dict[Any, list[float]] | None = None
        #: {scope name: the one timing context manager the scope factory hands out for that name in
        #: this step} (handlers.scopes._InStepScope).
        self.timers: dict[Any, Any] | None = None


CURRENT_STEP: ContextVar[Step | None] = ContextVar("otel_vllm_ascend_step", default=None)
#: Set while Scheduler.reset_prefix_cache runs: its preemptions are not memory pressure.
IN_PREFIX_CACHE_RESET: ContextVar[bool] = ContextVar("otel_vllm_ascend_reset", default=False)

#: Steps whose records wait (``recording.defer``) until they are recorded together: the EngineCore's scheduler
#: records, in the window where the engine waits for the workers (``GrammarBitmask``), and a worker's step
#: records (``model_runner._later``) — or at any collection or ``flush()``.
FLUSH_STEPS = 32

#: Attribute the EngineCore sets on each SchedulerOutput it scheduled: the step's phase travels with
#: the step's arguments to the workers (SchedulerOutput is pickled with its instance dict).
PHASE_ATTRIBUTE = "_otel_vllm_ascend_phase"
#: Attribute the worker sets on the ModelRunnerOutput it replies with (travelling to the EngineCore
#: pickled with the output's instance dict, or handed over in-process):
#: ``(HOST_CLOCK, execute_model returned, reply ready)``, perf_counter seconds of the worker's clock.
READY_ATTRIBUTE = "_otel_vllm_ascend_ready"
#: Attribute the worker sets on an async model runner output (async scheduling) when sample_tokens /
#: execute_model returns it: ``(phase, execute_model returned)`` of the step whose output it is.
STEP_ATTRIBUTE = "_otel_vllm_ascend_step"


#: Attribute of each scheduler (in its instance dict): ids of its requests preempted and not yet done
#: recomputing their tokens (the only cached requests that can have outputs and still do prefill work).
#: Filled by the preemption hooks; read with one dict lookup per step (no weak-key dictionary, whose
#: ``get`` is a Python function that builds a weak reference per call).
RECOMPUTING_ATTRIBUTE = "_otel_vllm_ascend_recomputing"


def mark_recomputing(scheduler, req_id) -> None:
    try:
        attributes = scheduler.__dict__
    except AttributeError:  # no instance dict: classification always takes the exact loop
        return
    recomputing = attributes.get(RECOMPUTING_ATTRIBUTE)
    if recomputing is None:
        recomputing = attributes[RECOMPUTING_ATTRIBUTE] = set()
    recomputing.add(req_id)


def _phase_of(prefill_reqs: int, decode_reqs: int) -> str:
    if prefill_reqs and decode_reqs:
        return "mixed"
    if prefill_reqs:
        return "prefill"
    return "decode" if decode_reqs else UNKNOWN


def classify_step(scheduler, scheduler_output) -> tuple:
    """``(phase, prefill_requests, prefill_tokens, decode_requests, decode_tokens)`` of one step.

    The four request classes of a step:
    - new requests (``scheduled_new_reqs``): their prefill, whatever the prefix-cache hit;
    - resumed requests: they recompute from scratch. vLLM up to 0.33 sends them as cached requests
      listed in ``scheduled_cached_reqs.resumed_req_ids``; 0.34 removed that field and re-sends a
      resumed request in full in ``scheduled_new_reqs`` (its blocks and worker state were dropped at
      preemption), where it is prefill work like a new request. The field is read once per step with a
      default (``getattr``), so either shape classifies;
    - chunked-prefill continuations: cached requests that, before this step, had fewer than
      ``prompt + outputs - 1`` tokens computed (``num_computed_tokens`` / ``num_output_tokens`` of
      ``CachedRequestData`` are the values before the step, output placeholders included);
    - decodes: every other cached request (its last sampled token, plus speculative drafts).
    The first three are the ``prefill`` requests, the last the ``decode`` ones; the step's phase is
    prefill, decode or mixed accordingly (``idle`` when it scheduled nothing).

    A cached request with no output yet is still in its prompt (prefill); one with outputs decodes,
    unless it was preempted and is still recomputing. So, when no request of this scheduler is
    recomputing, C-level scans of ``num_output_tokens`` decide the step, and only a mixed step walks
    its requests to split the tokens; otherwise an exact loop runs (and forgets requests that caught up
    or left).
    """
    scheduled = getattr(scheduler_output, "num_scheduled_tokens", None)
    if not scheduled:
        return _IDLE
    total = scheduler_output.total_num_scheduled_tokens
    new = scheduler_output.scheduled_new_reqs
    cached = scheduler_output.scheduled_cached_reqs
    ids = cached.req_ids
    # vLLM 0.34+ has no resumed_req_ids: its resumed requests are among the new ones.
    resumed = getattr(cached, "resumed_req_ids", None)
    if not ids:
        return ("prefill", len(scheduled), total, 0, 0) if new else (UNKNOWN, 0, 0, 0, 0)
    try:
        recomputing = scheduler.__dict__.get(RECOMPUTING_ATTRIBUTE)
    except AttributeError:
        recomputing = True  # unknown (no instance dict to note preemptions in): be exact
    if not recomputing and not resumed:
        outputs = cached.num_output_tokens
        # (all() is the cheaper scan where every request has outputs, a decode step's case: no count to make)
        zeros = 0 if all(outputs) else outputs.count(0)
        if not zeros:
            if not new:
                return ("decode", 0, 0, len(ids), total)
        elif zeros == len(outputs):
            return ("prefill", len(scheduled), total, 0, 0)
        prefill_tokens = sum([scheduled[r.req_id] for r in new])
        if zeros:
            prefill_tokens += sum([scheduled[i] for i, o in zip(ids, outputs) if not o])
        prefill_reqs = len(new) + zeros
        return ("mixed", prefill_reqs, prefill_tokens, len(ids) - zeros, total - prefill_tokens)
    return _classify_exact(
        scheduler, scheduled, total, new, cached, resumed or (), recomputing if isinstance(recomputing, set) else None
    )


_IDLE = ("idle", 0, 0, 0, 0)


def _classify_exact(scheduler, scheduled, total, new, cached, resumed, recomputing) -> tuple:
    requests = scheduler.requests
    prefill_reqs = len(new)
    prefill_tokens = sum([scheduled[r.req_id] for r in new])
    decode_reqs = 0
    for req_id, before, outputs in zip(cached.req_ids, cached.num_computed_tokens, cached.num_output_tokens):
        req = requests.get(req_id)
        if req is None:
            continue
        # (no output yet: still in its prompt, even for its last prompt token, as the fast path says)
        if req_id in resumed or not outputs or before + 1 < req.num_prompt_tokens + outputs:
            prefill_reqs += 1
            prefill_tokens += scheduled[req_id]
        else:
            decode_reqs += 1
    if recomputing:
        for req_id in list(recomputing):
            req = requests.get(req_id)
            # Caught up: schedule() already counted this step's tokens as computed.
            if req is None or req.num_computed_tokens >= req.num_tokens - 1:
                recomputing.discard(req_id)
    return (_phase_of(prefill_reqs, decode_reqs), prefill_reqs, prefill_tokens, decode_reqs, total - prefill_tokens)
