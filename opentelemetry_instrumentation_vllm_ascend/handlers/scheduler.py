"""Scheduler: the step boundary (phase), what each step scheduled, queue and KV cache states,
preemptions and recompute events."""

from __future__ import annotations

import sys
from collections import deque
from time import perf_counter

from .. import catalogue, context, recording
from ..catalogue import ALL, M
from ..hooks.handler import Handler, report
from ..recording import step_records
from ..recording.deferred import MAX_VALUES
from ..state import STATE, UNKNOWN
from . import budget
from .budget import ENGINE_TO
from .kv_transfer import kv_writes
from .scopes import name_label
from .steps import (
    CURRENT_STEP,
    FLUSH_STEPS,
    IN_PREFIX_CACHE_RESET,
    PHASE_ATTRIBUTE,
    READY_ATTRIBUTE,
    Step,
    classify_step,
    mark_recomputing,
)

_DURATION = M["scheduler:duration"]
_BATCH = M["scheduler:batch_size"]
_RUNNING = M["scheduler:running_queue_size"]
_SEQLEN_SUM = M["scheduler:seqlen:sum"]
_SEQLEN_AVG = M["scheduler:seqlen:avg"]
_PHASE_BATCH = M["scheduler:phase_batch_size"]
_PHASE_TOKENS = M["scheduler:phase_scheduled_tokens"]
_PHASE_COUNTER = M["scheduler:phase_scheduled_token_counter"]
_RUNNING_PHASE = M["running_phase_batch_size"]
_WAITING_PHASE = M["waiting_phase_batch_size"]
_TOTAL_BLOCKS = M["total_kvcache_blocks"]
_FREE_BLOCKS = M["free_kvcache_blocks"]
_ALLOCATED_BLOCKS = M["allocated_kvcache_blocks"]
_PENDING = M["request_prefill_pending_nums"]
_SCOPES = M["record_function_or_nullcontext"]
#: The engine budget's stages the scheduler hooks open (module constants: no attribute read per step).
_SCHEDULE, _DISPATCH, _UPDATE, _OUTPUT = budget.SCHEDULE, budget.DISPATCH, budget.UPDATE, budget.OUTPUT
#: Observations left for later (``recording.record_later``) after which one more runs them at once.
_FULL = MAX_VALUES - 1


def flush_step(step: Step, phase: str) -> None:
    """Record what one scheduling step saw, once, labelled with that step's phase."""
    if step.scopes:
        for name, values in step.scopes.items():
            recording.record_many(_SCOPES, values, context.step_labels_with(phase, name_label(name)))
    if not (step.preemptions or step.recomputes or step.allocate_failures or step.recomputed_tokens):
        return
    labels = context.step_labels(phase)
    recording.add(catalogue.RUNNING_TO_WAITING, step.preemptions, labels)
    recording.add(catalogue.RECOMPUTE_EVENTS, step.recomputes, labels)
    recording.add(catalogue.RECOMPUTED_TOKENS, step.recomputed_tokens, labels)
    recording.add(catalogue.BLOCK_ALLOCATE_FAILURES, step.allocate_failures, labels)


#: Per scheduler (by id; one per EngineCore): was it blocked on capacity after its last step?
_BLOCKED = STATE.blocked


#: A FCFS queue is vLLM's deque subclass, whose len() and iteration are Python calls: the deque's own are used.
_deque_len, _deque_iter = deque.__len__, deque.__iter__


def _step_sizes(handler, output) -> tuple:
    """(requests scheduled, what their context length after the step is made of) of a SchedulerOutput, read
    when ``schedule()`` returns (the output itself is not kept for the deferred records: holding 32 steps'
    outputs would delay their release, and the garbage collector would start running). The length is
    ``_seqlen(sizes)``: the scheduled tokens and the new requests' computed ones are added now, the cached
    requests' list of computed tokens (vLLM builds it for the step and never changes it) is summed only for
    the step whose length is recorded (the last of its phase in a flush; the gauges keep only that one);
    ``(0, None, None)`` when nothing was scheduled. The two reads fail apart: a length that cannot be read
    (reported once as "context length") leaves ``(requests, None, None)``, and the batch size stays."""
    n = len(output.num_scheduled_tokens)
    if not n:
        return 0, None, None
    try:
        new = output.scheduled_new_reqs
        base = output.total_num_scheduled_tokens
        if new:  # (a decode step has none: no comprehension to run)
            base += sum([r.num_computed_tokens for r in new])
        return n, base, output.scheduled_cached_reqs.num_computed_tokens
    except Exception:
        report(handler, "context length")
        return n, None, None


def _seqlen(sizes: tuple):
    """The context length after a step, summed over its requests, from ``_step_sizes``' parts; None when the
    computed tokens are not a list of numbers (a scheduler of another shape: no length, the other records stay)."""
    try:
        return sizes[1] + sum(sizes[2])
    except TypeError:
        return None


#: The admission limit of a step after which a waiting request can still be admitted past the running
#: limit (vLLM 0.34+: an async KV load): never blocked.
_NO_LIMIT = float("inf")


def _queue_state(handler, scheduler, phase: str, step_class) -> tuple:
    """(running, of which prefill, waiting, admission limit) right after the step was scheduled. The three
    reads fail apart: one that raises is reported once (as "running queue", "waiting queues" or "admission
    limit") and leaves None in its place(s); the metrics of the others are still recorded.

    Waiting: the queues vLLM's ``get_request_counts()`` counts — ``waiting`` plus ``skipped_waiting``
    (0.23) or ``kv_holding_waiting`` (0.32+: requests that wait holding KV blocks, such as P/D decode
    requests waiting for remote KV and streaming sessions waiting for input), plus ``async_kv_waiting``
    (0.34+: with ``--max-num-inflight-kv-loads``, requests that may load their KV asynchronously and have
    not started). Admission limit: what a waiting request is admitted against — ``max_num_running_reqs``
    (0.23; on 0.30 less the paused streaming sessions, ``STATE.streaming_holds_a_slot``), ``max_num_active_reqs`` less
    the paused streaming sessions, which hold a slot outside ``running`` (0.32+). On 0.34+ a full batch still
    admits async KV loads (``loads_only``): they take no running slot until their KV has arrived. So a step
    after which ``async_kv_waiting`` has requests and the in-flight load limit is not reached (vLLM's own
    ``_admits_inflight_kv_load()``, read only then) has no limit (``_NO_LIMIT``): it is not blocked."""
    running: int | None
    prefill: int | None
    try:
        queue = scheduler.running
        running = len(queue)
        if phase == "decode" and step_class[3] == running:
            prefill = 0  # every running request was scheduled, and all of them decoded
        else:
            prefill = 0
            for request in queue:
                if request.num_computed_tokens < request.num_prompt_tokens:
                    prefill += 1
    except Exception:
        running = prefill = None
        report(handler, "running queue")
    loads = None
    try:
        # Requests that have not computed their prompt (preemption resets it) or wait for KV: prefill.
        held = getattr(scheduler, "kv_holding_waiting", None)
        if held is None:
            held = getattr(scheduler, "skipped_waiting", None) or ()
        waiting = scheduler.waiting
        waiting = (_deque_len(waiting) if isinstance(waiting, deque) else len(waiting)) + (
            _deque_len(held) if isinstance(held, deque) else len(held)
        )
        loads = getattr(scheduler, "async_kv_waiting", None)
        if loads is not None:
            loads = _deque_len(loads) if isinstance(loads, deque) else len(loads)
            waiting += loads
    except Exception:
        waiting = None
        report(handler, "waiting queues")
    try:
        limit = getattr(scheduler, "max_num_active_reqs", None)
        if limit is None:
            limit = scheduler.max_num_running_reqs
            # vLLM 0.30 admits while len(running) + num_waiting_for_streaming_input < max_num_running_reqs, 0.23
            # while len(running) < max_num_running_reqs (it has the counter, not that use): the installer's reading.
            if STATE.streaming_holds_a_slot:
                limit -= getattr(scheduler, "num_waiting_for_streaming_input", 0)
        else:
            limit -= getattr(scheduler, "num_waiting_for_streaming_input", 0)
        if loads and running is not None and running >= limit and scheduler._admits_inflight_kv_load():
            limit = _NO_LIMIT
    except Exception:
        limit = None
        report(handler, "admission limit")
    return running, prefill, waiting, limit


#: Per scheduler (by id): (total, free, pipeline generation) last recorded; unchanged values are not set again.
_BLOCKS = STATE.blocks


def _record_blocks(key: int, blocks: tuple) -> None:
    total, free = blocks
    state = (total, free, recording.generation())
    if _BLOCKS.get(key) == state:
        return
    _BLOCKS[key] = state
    labels = context.step_labels(ALL)
    recording.set_gauge(_TOTAL_BLOCKS, total, labels)
    recording.set_gauge(_FREE_BLOCKS, free, labels)
    recording.set_gauge(_ALLOCATED_BLOCKS, total - free - 1, labels)  # the null block is never free


def _record_schedule(*step) -> None:
    """Everything one ``schedule()`` call measured (deferred: see ``Schedule``): ``(scheduler key,
    Step, phase, seconds, sizes, step class, queue state, block state)``."""
    _record_schedules([step])


def _record_schedules(steps: list) -> None:
    """What ``schedule()`` calls measured (``_record_schedule``'s arguments, oldest first), recorded
    together with the values each step would record alone: equal values of a histogram series are
    counted at once (``record_n``: a steady batch repeats the same sizes step after step), durations
    and scopes go per series in one ``record_many``, counters add their totals, gauges take the last
    step's value, and the prefill-pending edges are found in order. Each step records its duration,
    scopes and events; its batch shape and context length (when ``sizes`` could be read; phase
    metrics and context length only when it scheduled requests); its queue states (also idle steps)
    and block gauges (unchanged values are not set again)."""
    durations: dict = {}  # phase -> [seconds]
    shapes: dict = {}  # (phase, step_class, scheduled requests) -> how many steps
    queue_shapes: dict = {}  # (phase, running, prefill, waiting) -> how many steps
    pending: dict = {}  # phase -> prefill-pending edges
    last_sizes: dict = {}  # phase -> (requests, context length) of its last step that scheduled any
    last_blocks: dict = {}  # scheduler key -> blocks
    for key, step, phase, seconds, sizes, step_class, queues, blocks in steps:
        values = durations.get(phase)
        if values is None:
            durations[phase] = [seconds]
        else:
            values.append(seconds)
        if step.scopes or step.preemptions or step.recomputes or step.allocate_failures or step.recomputed_tokens:
            flush_step(step, phase)
        if sizes is not None:
            shape = (phase, step_class, sizes[0])  # (step_class None: the classification failed)
            shapes[shape] = shapes.get(shape, 0) + 1
            if sizes[0]:
                last_sizes[phase] = sizes
        if queues is not None:
            running, prefill, waiting, limit = queues
            queue_shape = (phase, running, prefill, waiting)
            queue_shapes[queue_shape] = queue_shapes.get(queue_shape, 0) + 1
            if running is not None and waiting is not None and limit is not None:
                blocked = waiting > 0 and running >= limit
                if blocked and not _BLOCKED.get(key):
                    pending[phase] = pending.get(phase, 0) + 1
                _BLOCKED[key] = blocked
        if blocks is not None:
            last_blocks[key] = blocks
    record_n = recording.record_n
    with_phase = context.step_labels_with
    for phase, values in durations.items():
        recording.record_many(_DURATION, values, context.step_labels(phase))
    for (phase, step_class, n), count in shapes.items():
        labels = context.step_labels(phase)
        record_n(_BATCH, n, count, labels)
        if n and step_class is not None:
            _, prefill_reqs, prefill_tokens, decode_reqs, decode_tokens = step_class
            for req_phase, reqs, tokens in (
                ("prefill", prefill_reqs, prefill_tokens),
                ("decode", decode_reqs, decode_tokens),
            ):
                phase_labels = with_phase(phase, req_phase)
                record_n(_PHASE_BATCH, reqs, count, phase_labels)
                record_n(_PHASE_TOKENS, tokens, count, phase_labels)
                recording.add(_PHASE_COUNTER, tokens * count, phase_labels)
                kv_writes(tokens * count, phase_labels)
    for phase, sizes in last_sizes.items():  # context lengths after the step: sum and mean
        n, seqlen = sizes[0], _seqlen(sizes)
        if seqlen is None:
            continue
        labels = context.step_labels(phase)
        recording.set_gauge(_SEQLEN_SUM, seqlen, labels)
        recording.set_gauge(_SEQLEN_AVG, seqlen / n, labels)
    for (phase, running, prefill, waiting), count in queue_shapes.items():
        if running is not None:
            record_n(_RUNNING, running, count, context.step_labels(phase))
            record_n(_RUNNING_PHASE, prefill, count, with_phase(phase, "prefill"))
            record_n(_RUNNING_PHASE, running - prefill, count, with_phase(phase, "decode"))
        if waiting is not None:
            record_n(_WAITING_PHASE, waiting, count, with_phase(phase, "prefill"))
    for phase, edges in pending.items():
        recording.add(_PENDING, edges, context.step_labels(phase))
    for key, blocks in last_blocks.items():
        _record_blocks(key, blocks)


_record_schedule.many = _record_schedules  # type: ignore[attr-defined]  # read by recording.defer


#: Attribute of each scheduler: {request id: tokens it had computed when it was preempted (None:
#: preempted by reset_prefix_cache)} for its requests preempted and not yet resumed. Entries leave when
#: the request is scheduled again (its resume) or has left the scheduler.
_PREEMPTED = "_otel_vllm_ascend_preempted"


#: vllm-ascend's DyntraLB scheduler's set of the requests it paused for load balancing (``_count_preemptions``).
_LB_PAUSED = "_lb_paused_req_ids"


def _preempted_of(scheduler) -> dict:
    try:
        return scheduler.__dict__[_PREEMPTED]  # no AttributeError raised and caught on every step
    except (KeyError, AttributeError):
        pending = getattr(scheduler, _PREEMPTED, None)
    if pending is None:
        pending = {}
        try:
            setattr(scheduler, _PREEMPTED, pending)
        except (AttributeError, TypeError):
            pass  # a scheduler that takes no attributes: each step sees only its own preemptions
    return pending


def _preempted_status():
    """vllm.v1.request.RequestStatus.PREEMPTED, once a scheduler was seen (STATE.status_preempted)."""
    status = STATE.status_preempted
    if status is None:
        module = sys.modules.get("vllm.v1.request")
        if module is not None:
            status = STATE.status_preempted = module.RequestStatus.PREEMPTED
    return status


def _count_preemptions(handler, scheduler, result, step: Step) -> None:
    """Preemptions made in this ``schedule()`` call without ``_preempt_request`` (whose hook counts its
    own and records them, ``_preempted_of``), and the resumes of preempted requests: the tokens they
    compute again.

    A scheduler that preempts inline (vllm-ascend's ``SchedulerDynamicBatch``: it frees the request,
    sets it PREEMPTED and prepends it to ``waiting``) is seen in two ways: through
    ``SchedulerOutput.preempted_req_ids`` where the scheduler fills it (vLLM 0.23's and the other
    Ascend schedulers: this call's preemptions; vLLM 0.32+: every ``_preempt_request`` since the last
    step, reset_prefix_cache's included), and at the head of a FCFS ``waiting`` queue, where a
    preempted request is put back (a priority queue is searched whole, only for a scheduler that does
    not fill ``preempted_req_ids``). A preemption already recorded (``_preempted_of``) is not counted
    again. A request preempted inline had computed its tokens but the one it last sampled (exact for a
    decoding request: its computed count was reset before it could be read). vllm-ascend's
    ``DyntraLBScheduler`` pauses running requests for load balancing (PREEMPTED, in ``waiting`` or
    ``skipped_waiting``, their ids in its ``_lb_paused_req_ids`` until they resume): each is a preemption
    with its KV kept, no recompute event and no tokens to compute again.

    The common step (nothing preempted, none waiting to resume) makes no call: the scheduler's dict of
    preempted requests is read from its instance dict, and made (``_preempted_of``) only to note one.

    Its reads fail apart, each reported once under its name: the output's ``preempted_req_ids``, the
    waiting queue's head, the paused requests, a found request's tokens, the resumes
    (``scheduler:recomputed_tokens``)."""
    attributes = getattr(scheduler, "__dict__", None)
    pending = attributes.get(_PREEMPTED) if attributes is not None else None
    known = pending or ()  # preemptions already noted (membership only)
    found = None  # {request id: request} preempted in this call without _preempt_request
    ids = None
    try:
        ids = getattr(result, "preempted_req_ids", None)
        if ids:
            for req_id in ids:
                if req_id not in known:
                    request = scheduler.requests.get(req_id)
                    if request is not None:
                        found = found or {}
                        found[req_id] = request
    except Exception:
        report(handler, "preempted_req_ids")
    try:
        waiting = scheduler.waiting
        # FCFS (vLLM's deque subclass, whose len() and bool() are Python calls: the deque's own are used):
        # preempted requests are put back at its head.
        if isinstance(waiting, deque):
            if _deque_len(waiting):
                preempted = STATE.status_preempted or _preempted_status()
                if getattr(waiting[0], "status", None) is preempted:
                    for request in _deque_iter(waiting):
                        if request.status is not preempted:
                            break
                        if request.request_id not in known:
                            found = found or {}
                            found[request.request_id] = request
        elif ids is None and waiting:  # a priority queue, of a scheduler that reports none
            preempted = _preempted_status()
            for request in waiting:
                if (
                    preempted is not None
                    and getattr(request, "status", None) is preempted
                    and request.request_id not in known
                ):
                    found = found or {}
                    found[request.request_id] = request
    except Exception:
        report(handler, "preempted waiting requests")
    # vllm-ascend's DyntraLBScheduler (0.30+) pauses running requests for load balancing: PREEMPTED, back in
    # waiting (or skipped_waiting, where a step that does not admit them leaves them), a PREEMPTED event, their
    # KV kept (a preemption; nothing is recomputed). It keeps their ids until they resume.
    paused = None
    try:
        paused = attributes.get(_LB_PAUSED) if attributes is not None else None
        if paused:
            for req_id in paused:
                if req_id not in known and (found is None or req_id not in found):
                    request = scheduler.requests.get(req_id)
                    if request is not None:
                        found = found or {}
                        found[req_id] = request
    except Exception:
        paused = None
        report(handler, "paused requests")
    if found:
        pending = _preempted_of(scheduler)
        for req_id, request in found.items():
            if paused and req_id in paused:
                pending[req_id] = 0  # noted until it resumes; no tokens to compute again
                step.preemptions += 1
                continue
            mark_recomputing(scheduler, req_id)
            try:
                pending[req_id] = max(request.num_tokens - 1, 0)
            except Exception:  # counted; its recomputed tokens are not
                pending[req_id] = None
                report(handler, "preempted request's tokens")
            step.preemptions += 1
            step.recomputes += 1  # a running request has computed tokens
    if pending:
        try:
            scheduled = result.num_scheduled_tokens
            requests = scheduler.requests
            for req_id in list(pending):
                request = requests.get(req_id)
                if request is None:
                    del pending[req_id]  # finished or aborted while it waited
                elif req_id in scheduled:  # resumed in this step: what the prefix cache did not give back
                    before = pending.pop(req_id)
                    if before:
                        hit = request.num_computed_tokens - scheduled[req_id]
                        if before > hit:
                            step.recomputed_tokens += before - hit
        except Exception:
            report(handler, "resumes")


#: Records waiting at which the update hook wakes the stream's thread (step_records.WAKE_AT).
_WAKE_AT = step_records.WAKE_AT
#: Steps scheduled and not yet updated that a stream keeps at most (the batch queue's depth is 2-3): an older one
#: whose update never came (update_from_output raised, or ran outside the hook) is dropped as ``incomplete``.
_MAX_PENDING = 8


def _keep_step(stream, result, scheduler, counter, start, end, step, step_class, queues, blocks) -> None:
    """The scheduler hook's part of a step record (recording/step_records.py): one tuple of what it read,
    and a C-level copy of the waiting queue (FCFS: the deque's own iteration) when it holds requests; the
    update hook completes it."""
    waiting = preempted = None
    if queues is not None and queues[2]:
        try:
            queue = scheduler.waiting
            waiting = tuple(_deque_iter(queue)) if isinstance(queue, deque) else tuple(queue)
            # {request id: tokens it had computed when preempted} of those not resumed (_count_preemptions
            # made it current): the queued decode requests' KV, as the preemption hooks read it.
            preempted = scheduler.__dict__.get(_PREEMPTED)
            preempted = dict(preempted) if preempted else None
        except Exception:
            waiting = preempted = None
    # Only the parts of the SchedulerOutput the record reads (not the output: its per-request lists, kept alive
    # until the background thread has built the record, would start the garbage collector on this thread).
    cached = result.scheduled_cached_reqs
    kept = (
        result.num_scheduled_tokens,
        result.scheduled_new_reqs,
        cached.req_ids,
        cached.num_computed_tokens,
        cached.num_output_tokens,
        getattr(cached, "resumed_req_ids", None),
        result.finished_req_ids,
    )
    pending = stream.pending
    if len(pending) >= _MAX_PENDING:
        pending.popleft()
        stream.dropped["incomplete"] += 1
    pending.append(
        (id(result), scheduler, counter, start, end, step, step_class, queues, blocks, waiting, preempted, kept)
    )


def _complete_later(stream, output, start: float, end: float, result=None, runner_output=None) -> None:
    """An update whose step is not the oldest kept: the older ones never got theirs (``incomplete``); an update
    of a step not kept (nothing scheduled) leaves them."""
    pending = stream.pending
    key = id(output)
    for index, kept in enumerate(pending):
        if kept[0] == key:
            for _ in range(index):
                pending.popleft()
                stream.dropped["incomplete"] += 1
            pending.popleft()
            tracer = stream.tracer
            stamp = getattr(runner_output, READY_ATTRIBUTE, None)
            stream.enqueue(
                (kept, start, end, stamp) if tracer is None else tracer.keep(kept, start, end, result, stamp)
            )
            return


class Schedule(Handler):
    """``Scheduler.schedule``: the step's phase is computed once, from its SchedulerOutput, stored on
    that output (it travels with it to the workers) and used for every value of the step: its
    duration, its batch shape, the events and profiling scopes seen inside the call, the queue and
    KV cache states after it (read when it returns). Those values are recorded later, through
    ``recording.defer``, ``FLUSH_STEPS`` steps together (``_record_schedules``): once that many wait,
    when the EngineCore has sent a step to the workers (``GrammarBitmask``) — or at the next
    ``schedule()`` for an engine that never asks for grammar bitmasks — and always before a
    collection or ``flush()``, so no export misses a step."""

    reads_args = 1  # self

    def before(self, args, kwargs, _pending=STATE.deferred, _state=STATE):
        if CURRENT_STEP.get() is not None:
            return None  # a subclass's schedule() calling the base's: the outermost hook measures
        if len(_pending) >= FLUSH_STEPS:  # an engine that never asks for grammar bitmasks
            recording.run_deferred()
        _state.schedule_calls += 1
        step = Step()
        start = perf_counter()
        ENGINE_TO(_SCHEDULE, start)
        return step, CURRENT_STEP.set(step), start

    def after(self, state, args, kwargs, result, _pending=STATE.deferred, _state=STATE):
        end = perf_counter()
        if state is None:
            return
        ENGINE_TO(_DISPATCH, end)
        step, token, start = state
        CURRENT_STEP.reset(token)
        scheduler = args[0]
        # Each read below fails apart (reported once under its name): it loses only the metrics that
        # depend on it, and the step's phase is set whatever fails after the classification.
        # vllm-ascend's RecomputeScheduler (PD decode nodes): requests handed back to the proxy to be
        # recomputed elsewhere, without _preempt_request.
        try:
            recomputed = getattr(result, "recomputed_reqs", None)
            if recomputed:
                step.recomputes += len(recomputed)
        except Exception:
            report(self, "recomputed_reqs")
        try:
            _count_preemptions(self, scheduler, result, step)
        except Exception:
            report(self, "_count_preemptions")
        try:
            step_class = classify_step(scheduler, result)
            phase = step_class[0]
        except Exception:
            step_class, phase = None, UNKNOWN
            report(self, "classify_step")
        STATE.last_step_phase = phase
        try:
            # Also "unknown" when the classification failed: the workers do not try it again.
            setattr(result, PHASE_ATTRIBUTE, phase)
        except (AttributeError, TypeError):
            pass  # the workers classify the step themselves
        # The states the step left are read now; recording waits (FLUSH_STEPS steps at a time) until
        # the engine waits for the workers (GrammarBitmask, right after a step's execute_model RPC was
        # sent) — off the critical path of a synchronous engine step.
        queues = _queue_state(self, scheduler, phase, step_class)
        try:  # (read inline: one Python call less per step)
            pool = scheduler.kv_cache_manager.block_pool
            blocks = pool.num_gpu_blocks, pool.get_num_free_blocks()
        except Exception:
            blocks = None
            report(self, "_block_state")
        try:
            sizes = _step_sizes(self, result)
        except Exception:
            sizes = None
            report(self, "_step_sizes")
        if step.timers is not None:
            step.timers = None  # the step's shared scope timers are done with
        stream = _state.step_stream
        if stream is not None and sizes is not None and sizes[0]:  # a sink is on and the step scheduled work
            _keep_step(stream, result, scheduler, _state.schedule_calls, start, end, step, step_class, queues, blocks)
        records = (id(scheduler), step, phase, end - start, sizes, step_class, queues, blocks)
        if _state.pipeline is None:
            recording.defer(_record_schedule, *records)  # (makes the pipeline, whose collections run them)
        else:
            _pending.append((_record_schedule, records))  # recording.defer, inline

    def error(self, state, args, kwargs, exc):
        if state is None:
            return
        step, token, _start = state
        ENGINE_TO(_DISPATCH, perf_counter())
        CURRENT_STEP.reset(token)
        STATE.last_step_phase = UNKNOWN
        flush_step(step, UNKNOWN)


class PreemptRequest(Handler):
    """``Scheduler._preempt_request(request, timestamp, …)``: +1 preemption when it returns normally;
    +1 recompute event when the request had computed tokens (they are dropped: redone at its resume
    unless the prefix cache still has them). The tokens it had computed wait for its resume
    (``scheduler:recomputed_tokens``) in ``_preempted_of``; reset_prefix_cache's preemptions are only
    noted there, so that vLLM 0.32+'s ``preempted_req_ids`` does not count them."""

    params = ("request",)

    def before(self, args, kwargs):
        scheduler, request = args[0], args[1]
        req_id = request.request_id
        # Whatever the reason, the request will recompute its tokens when it resumes.
        mark_recomputing(scheduler, req_id)
        if IN_PREFIX_CACHE_RESET.get():
            _preempted_of(scheduler)[req_id] = None
            return None
        try:
            computed = request.num_computed_tokens or 0
        except Exception:  # the preemption is still counted; its recompute event and tokens are not
            computed = None
            report(self, "num_computed_tokens")
        return req_id, computed

    def after(self, state, args, kwargs, result):
        if state is None:
            return
        req_id, computed = state
        _preempted_of(args[0])[req_id] = computed
        step = CURRENT_STEP.get()
        if step is not None:
            step.preemptions += 1
            if computed:
                step.recomputes += 1
            return
        # Outside any scheduling step (e.g. a scheduler subclass that schedules without schedule()).
        outside = Step()
        outside.preemptions = 1
        outside.recomputes = 1 if computed else 0
        flush_step(outside, UNKNOWN)


class ResetPrefixCache(Handler):
    """``Scheduler.reset_prefix_cache``: preemptions it makes are bookkeeping, not memory pressure."""

    reads_args = 0

    def before(self, args, kwargs):
        return IN_PREFIX_CACHE_RESET.set(True)

    def after(self, state, args, kwargs, result):
        IN_PREFIX_CACHE_RESET.reset(state)

    def error(self, state, args, kwargs, exc):
        IN_PREFIX_CACHE_RESET.reset(state)


class GrammarBitmask(Handler):
    """``Scheduler.get_grammar_bitmask``: the EngineCore calls it right after sending a step's
    ``execute_model`` RPC, before it waits for the reply — the moment to run the records the
    scheduler hook deferred (once ``FLUSH_STEPS`` steps wait), while the workers compute (no
    measurement of its own). The stage budget's ``telemetry`` stage is that run; the stage it
    interrupted (``dispatch``; ``output`` for the batch queue's deferred sampling) resumes after it."""

    reads_args = 0

    def before(self, args, kwargs, _pending=STATE.deferred, _clock=budget.ENGINE):
        if len(_pending) >= FLUSH_STEPS:
            resumed = _clock.stage
            ENGINE_TO(budget.TELEMETRY, perf_counter())
            recording.run_deferred()
            ENGINE_TO(resumed, perf_counter())


class UpdateFromOutput(Handler):
    """``Scheduler.update_from_output(scheduler_output, model_runner_output)``: its duration, with the
    phase of the step whose output it processes (read from that step's SchedulerOutput)."""

    params = ("scheduler_output", "model_runner_output")  # the worker's stamp on its output: for the step record
    spec = M["scheduler:update_from_output:duration"]

    def before(self, args, kwargs):
        start = perf_counter()
        ENGINE_TO(_UPDATE, start)
        return start

    def after(self, state, args, kwargs, result, _labels=context.STEP_LABELS, _values=STATE.deferred_values):
        end = perf_counter()
        ENGINE_TO(_OUTPUT, end)
        stream = STATE.step_stream
        if stream is not None and stream.pending and len(args) > 1:  # complete the step's record (docs/steps.md)
            pending = stream.pending
            head = pending[0]
            if head[0] == id(args[1]):
                pending.popleft()
                queue = stream.queue
                if len(queue) < stream.capacity:
                    # The worker's stamp on its output: its step's boundaries and KV (recording/step_fields.py).
                    stamp = getattr(args[2], READY_ATTRIBUTE, None) if len(args) > 2 else None
                    tracer = stream.tracer  # slow-step traces (recording/step_traces.py): one comparison a step
                    if tracer is None or (end - head[3] <= tracer.slow_s and not head[5].preemptions):
                        queue.append((head, state, end, stamp))
                    else:
                        queue.append(tracer.keep(head, state, end, result, stamp))
                    if len(queue) == _WAKE_AT:
                        stream.wake.set()
                else:
                    stream.queue_full += 1
                if not stream.started:
                    stream.start()
            else:
                _complete_later(stream, args[1], state, end, result, args[2] if len(args) > 2 else None)
        phase = (getattr(args[1], PHASE_ATTRIBUTE, None) if len(args) > 1 else None) or STATE.last_step_phase
        labels = _labels.get(phase) or context.step_labels(phase)
        # Recorded with the scheduler hook's records (the step scheduled: they run soon): recording.record_later,
        # inline while the pipeline exists and this observation does not fill the queue.
        if STATE.pipeline is None or len(_values) >= _FULL:
            recording.record_later(self.spec, end - state, labels)
        else:
            _values.append((self.spec, end - state, labels))
