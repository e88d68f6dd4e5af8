"""Who is recording: process kind, engine dp rank and PD role (per process), and the step being
scheduled (per scheduling call, in a ContextVar so threads and coroutines never see each other's).

Label rules (docs/labels.md):
- ``dp``: the engine's data-parallel index, ``parallel_config.data_parallel_index`` (vLLM keeps it
  even for dense models, where ``data_parallel_rank`` is reset to 0). Where that attribute does not
  exist, ``data_parallel_rank`` is used only when it cannot have been reset (DP size 1, or a MoE model);
  otherwise ``unknown`` — never a fake 0.
- ``role``: ``kv_transfer_config.kv_role``: kv_producer → prefill, kv_consumer → decode,
  kv_both or no KV transfer → mixed.
- ``rank`` (a process label, catalogue.WORKER_LABELS): the global rank of the worker this process
  hosts, from ``WorkerBase.__init__``; unset (no ``rank`` label) in a process hosting no worker.
"""

from __future__ import annotations

import weakref
from contextvars import ContextVar

from .catalogue import ROLES

UNKNOWN = "unknown"

# Higher wins when several hooks claim the same process (an in-process worker inside an EngineCore).
_PRIORITY = {UNKNOWN: 0, "api_server": 1, "worker": 2, "engine_core": 3, "eplb": 4}


class ProcessContext:
    __slots__ = ("process", "dp", "role", "labels")

    def __init__(self) -> None:
        self.process = UNKNOWN
        self.dp = UNKNOWN
        self.role = "mixed"
        #: Values of the process labels (catalogue.WORKER_LABELS) this process has: {"rank": "1"} in a
        #: worker, {} elsewhere. Replaced, never mutated, when it changes.
        self.labels: dict = {}


PROCESS = ProcessContext()


def process_attributes(names: tuple) -> dict:
    """The process's values of the process labels ``names`` (a spec's ``process_labels``) that it has."""
    values = PROCESS.labels
    if not names or not values:
        return {}
    return {name: values[name] for name in names if name in values}


def series_attributes(names: tuple, values: tuple, extra: dict | None = None) -> dict:
    """A series' attributes: the recorded label values by name, then the recording process's labels
    ``extra`` (``process_attributes``). A value of None is no attribute (an ``error.type`` of a request
    that did not fail, a model name not known)."""
    attributes = dict(zip(names, values))
    if None in values:
        attributes = {name: value for name, value in attributes.items() if value is not None}
    if extra:
        attributes.update(extra)
    return attributes


def set_rank(rank) -> None:
    """This process hosts the worker of global rank ``rank`` (``unknown`` if it is not an int)."""
    PROCESS.labels = {**PROCESS.labels, "rank": str(rank) if isinstance(rank, int) else UNKNOWN}


def dp_of(vllm_config) -> str:
    parallel = getattr(vllm_config, "parallel_config", None)
    if parallel is None:
        return UNKNOWN
    index = getattr(parallel, "data_parallel_index", None)
    if isinstance(index, int):
        return str(index)
    size = getattr(parallel, "data_parallel_size", None)
    rank = getattr(parallel, "data_parallel_rank", None)
    if size == 1:
        return "0"
    is_moe = getattr(getattr(vllm_config, "model_config", None), "is_moe", None)
    if isinstance(rank, int) and is_moe is True:
        return str(rank)
    return UNKNOWN


def api_dp_of(vllm_config) -> str:
    parallel = getattr(vllm_config, "parallel_config", None)
    return "0" if getattr(parallel, "data_parallel_size", None) == 1 else UNKNOWN


def role_of(vllm_config) -> str:
    kv = getattr(vllm_config, "kv_transfer_config", None)
    kv_role = getattr(kv, "kv_role", None) if kv is not None else None
    return ROLES.get(kv_role, "mixed")


_step_labels: dict[str, tuple] = {}


def step_labels(phase: str) -> tuple:
    """``(dp, role, phase)``: label values of a step-scoped series, in catalogue order (cached)."""
    labels = _step_labels.get(phase)
    if labels is None:
        labels = _step_labels[phase] = (PROCESS.dp, PROCESS.role, phase)
    return labels


_extra_labels: dict[tuple, tuple] = {}
#: Caches of label tuples derived from the process context (handlers may add theirs): emptied whenever
#: the process context changes.
LABEL_CACHES: list = [_step_labels, _extra_labels]


def _clear_label_caches() -> None:
    for cache in LABEL_CACHES:
        cache.clear()


def step_labels_with(phase: str, extra: str) -> tuple:
    """``(dp, role, phase, extra)`` (cached): step labels plus one more catalogue label's value."""
    key = (phase, extra)
    labels = _extra_labels.get(key)
    if labels is None:
        labels = _extra_labels[key] = (PROCESS.dp, PROCESS.role, phase, extra)
    return labels


def set_process(process: str, dp: str, role: str, rank: str | None = None) -> None:
    """Set the process context directly (tests, benchmarks); claim() is what hooks use. ``rank``: the
    hosted worker's rank (None: no worker)."""
    PROCESS.process, PROCESS.dp, PROCESS.role = process, dp, role
    PROCESS.labels = {} if rank is None else {"rank": rank}
    _clear_label_caches()


def claim(process: str, vllm_config=None, *, api: bool = False) -> bool:
    """Record what this process is. Returns True when the claim changed the process kind."""
    _clear_label_caches()
    ctx = PROCESS
    if _PRIORITY.get(process, 0) < _PRIORITY.get(ctx.process, 0):
        return False
    changed = ctx.process != process
    ctx.process = process
    if vllm_config is not None:
        ctx.role = role_of(vllm_config)
        # An API server serves every engine: with one DP rank that is engine 0; with several it has no
        # dp of its own (its per-engine values carry the engine's index).
        ctx.dp = api_dp_of(vllm_config) if api else dp_of(vllm_config)
    return changed


def reset_after_fork() -> None:
    _clear_label_caches()


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
        self.scopes = None
        #: {scope name: the one timing context manager the scope factory hands out for that name in
        #: this step} (handlers.model_runner._InStepScope).
        self.timers = None


CURRENT_STEP: ContextVar[Step | None] = ContextVar("otel_vllm_ascend_step", default=None)
#: Set while Scheduler.reset_prefix_cache runs: its preemptions are not memory pressure.
IN_PREFIX_CACHE_RESET: ContextVar[bool] = ContextVar("otel_vllm_ascend_reset", default=False)

#: Phase of the step most recently scheduled in this process (read by executor RPC handlers, which
#: dispatch that step's work right after ``schedule()`` returned).
LAST_STEP_PHASE = [UNKNOWN]
#: ``schedule()`` calls so far in this process (outermost calls, raised ones included): an engine step
#: during which it did not change scheduled nothing (phase ``idle``).
SCHEDULE_CALLS = [0]
#: Phase of the step whose execute_model RPC was dispatched last (EngineCore): its sample_tokens follows.
EXEC_PHASE = [UNKNOWN]
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


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


#: This boot of the machine (Linux's boot id; "" where /proc does not tell): read once per process.
BOOT_ID = _boot_id()


def _host_clock() -> str:
    """Which monotonic clock this process's ``perf_counter`` reads: on Linux CPython's perf_counter is
    ``clock_gettime(CLOCK_MONOTONIC)``, one clock for every process of a machine (boot id) and time
    namespace (an offset may differ between namespaces). Two processes with the same value can
    subtract each other's perf_counter readings."""
    if BOOT_ID:
        parts = [BOOT_ID]
    else:
        import socket

        parts = [socket.gethostname()]
    try:
        import os

        parts.append(os.readlink("/proc/self/ns/time"))
    except OSError:
        pass
    return "/".join(parts)


HOST_CLOCK = _host_clock()


#: Per scheduler: ids of requests preempted and not yet done recomputing their tokens (the only
#: cached requests that can have outputs and still do prefill work). Filled by the preemption hook.
_RECOMPUTING: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def mark_recomputing(scheduler, req_id) -> None:
    try:
        recomputing = _RECOMPUTING.get(scheduler)
        if recomputing is None:
            recomputing = _RECOMPUTING[scheduler] = set()
    except TypeError:  # not weak-referenceable: classification falls back to the exact loop
        return
    recomputing.add(req_id)


def step_phase(scheduler, scheduler_output) -> str:
    """prefill / decode / mixed for the work one SchedulerOutput schedules (``idle`` if none); see
    :func:`classify_step`."""
    return classify_step(scheduler, scheduler_output)[0]


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
    - resumed requests (``scheduled_cached_reqs.resumed_req_ids``): they recompute from scratch;
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
    resumed = cached.resumed_req_ids
    if not ids:
        return ("prefill", len(scheduled), total, 0, 0) if new else (UNKNOWN, 0, 0, 0, 0)
    try:
        recomputing = _RECOMPUTING.get(scheduler)
    except TypeError:
        recomputing = True  # unknown: be exact
    if not recomputing and not resumed:
        outputs = cached.num_output_tokens
        zeros = outputs.count(0)
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
        scheduler, scheduled, total, new, cached, recomputing if isinstance(recomputing, set) else None
    )


_IDLE = ("idle", 0, 0, 0, 0)


def _classify_exact(scheduler, scheduled, total, new, cached, recomputing) -> tuple:
    requests = scheduler.requests
    resumed = cached.resumed_req_ids
    prefill_reqs = len(new)
    prefill_tokens = sum([scheduled[r.req_id] for r in new])
    decode_reqs = 0
    for req_id, before, outputs in zip(cached.req_ids, cached.num_computed_tokens, cached.num_output_tokens):
        req = requests.get(req_id)
        if req is None:
            continue
        if req_id in resumed or before + 1 < req.num_prompt_tokens + outputs:
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
