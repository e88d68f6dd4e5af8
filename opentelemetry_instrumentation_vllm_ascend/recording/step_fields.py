"""The fields of a step record (docs/steps.md), built on the stream's background thread (``step_records.Stream``)
from what the hooks kept: the batch and queue sums (Dynamo's forward-pass metrics v1 names and units), our own
timing, and the worker's part — its step's stages and KV transfers, from the stamp the worker put on its output
(``handlers/model_runner.py``: ``(clock, returned, ready, (rank, marks, kv))``; ``marks`` is ``[stage, now, …]``,
one pair per worker budget boundary, ``kv`` ``[(direction, connector, bytes, count, now, blocking seconds)]``)."""

from __future__ import annotations

import sys

from .. import context
from ..catalogue import WORKER_STAGES
from ..context import HOST_CLOCK
from ..version import __version__

#: The record's schema version (Dynamo's ``FPM_VERSION``: the fields keep its names and units).
VERSION = 1
#: The key of our own fields in a record (Dynamo's decoder ignores keys it does not know).
EXTENSION = "otel_vllm_ascend"
#: The worker's stage fields: every stage of ``worker:stage_seconds`` but ``idle`` (index 0: between steps).
STAGE_FIELDS = tuple(f"{name}_s" for name in WORKER_STAGES[1:])


def _variance(values: list) -> float:
    """Population variance (Dynamo's ``var_*`` fields); 0.0 for no value."""
    n = len(values)
    if not n:
        return 0.0
    mean = sum(values) / n
    return float(sum((v - mean) ** 2 for v in values) / n)


def _vllm_version() -> str:
    module = sys.modules.get("vllm")
    return str(getattr(module, "__version__", "unknown")) if module is not None else "unknown"


def _worker_part(stamp) -> tuple | None:
    """``(clock, rank, marks, kv)`` of a stamp that carries the worker's part of a step (at least one stage), else
    None."""
    if stamp is None or len(stamp) < 4 or stamp[3] is None:
        return None
    rank, marks, kv = stamp[3]
    return (stamp[0], rank, marks, kv) if len(marks) >= 4 else None


def worker_fields(stamp, schedule_end: float, update_start: float) -> tuple[dict | None, dict | None]:
    """The record's ``worker`` and ``kv_transfer`` fields from the worker's stamp (None, None: the step's worker noted
    nothing: step records off in its process, no worker budget, an uninstrumented worker, vLLM's shared empty
    output). ``worker``: the rank that replied and its seconds per stage in the step; where its clock is this
    process's (``context.HOST_CLOCK``), also ``dispatch_s`` (from schedule()'s return to the worker's
    execute_model call) and ``reply_s`` (from the worker's step end to update_from_output's call), else None.
    ``kv_transfer``: per direction, the bytes and transfers the worker recorded while the step ran, and the
    seconds they blocked its thread."""
    part = _worker_part(stamp)
    if part is None:
        return None, None
    clock, rank, marks, kv = part
    spent = [0.0] * len(WORKER_STAGES)
    for i in range(0, len(marks) - 2, 2):
        spent[marks[i]] += marks[i + 3] - marks[i + 1]
    worker: dict = {"rank": rank}
    worker.update(zip(STAGE_FIELDS, spent[1:]))  # idle (before the step's first boundary) is not the step's
    shared = clock == HOST_CLOCK
    worker["dispatch_s"] = marks[1] - schedule_end if shared else None
    worker["reply_s"] = update_start - marks[-1] if shared else None
    transfers: dict = {}
    for direction, _connector, nbytes, count, _now, blocking in kv or ():
        entry = transfers.get(direction)
        if entry is None:
            entry = transfers[direction] = {"bytes": 0, "transfers": 0, "blocking_s": 0.0}
        entry["bytes"] += nbytes
        entry["transfers"] += count
        if blocking is not None:
            entry["blocking_s"] += blocking
    return worker, transfers


def worker_timeline(stamp, offset: float) -> tuple[list, list] | None:
    """A kept step's worker spans (``step_spans``), on the system clock (``offset``: this process's ``time() -
    perf_counter()``): ``[(stage name, start, end)]`` per boundary (idle and empty stages left out) and the
    blocking KV transfers ``[(direction, connector, bytes, start, end)]``; None where
    the worker's clock is not this process's."""
    part = _worker_part(stamp)
    if part is None or part[0] != HOST_CLOCK:
        return None
    _clock, _rank, marks, kv = part
    stages = [  # a stage left the moment it began (no time in it) is no span
        (WORKER_STAGES[marks[i]], marks[i + 1] + offset, marks[i + 3] + offset)
        for i in range(0, len(marks) - 2, 2)
        if marks[i] and marks[i + 3] > marks[i + 1]
    ]
    waits = [
        (direction, connector, nbytes, now - blocking + offset, now + offset)
        for direction, connector, nbytes, _count, now, blocking in kv or ()
        if blocking
    ]
    return stages, waits


def record(stream, scheduled, update_start: float, update_end: float, stamp=None) -> dict:
    """One step's record (docs/steps.md has its fields) from what the hooks kept: ``scheduled`` (the scheduler
    hook's tuple), the update's two clock readings, the worker's ``stamp`` on its output (``worker``)."""
    _key, scheduler, counter, start, end, step, step_class, queues, blocks, waiting, preempted, kept = scheduled
    tokens, new, cached_ids, cached_computed, cached_outputs, resumed, finished = kept
    prompts = stream.prompts
    requests = getattr(scheduler, "requests", None) or {}
    prefill_tokens = prefill_kv = 0
    prefill_lengths: list = []
    decode_tokens = 0
    decode_kv: list = []
    for r in new:
        ids = r.prompt_token_ids
        if ids is not None:
            length = len(ids)
        else:
            req = requests.get(r.req_id)
            length = req.num_prompt_tokens if req is not None else 0
        prompts[r.req_id] = length
        prefill_lengths.append(length)
        prefill_tokens += tokens[r.req_id]
        prefill_kv += r.num_computed_tokens
    resumed = resumed or ()
    for req_id, before, outputs in zip(cached_ids, cached_computed, cached_outputs):
        known = prompts.get(req_id)
        if known is None:
            req = requests.get(req_id)
            known = prompts[req_id] = req.num_prompt_tokens if req is not None else 0
        length = known
        # The step's classification (handlers.steps.classify_step): resumed, no output yet, or more
        # than one uncomputed token before the step is prefill work; the rest decodes.
        if req_id in resumed or not outputs or before + 1 < length + outputs:
            prefill_lengths.append(length)
            prefill_tokens += tokens[req_id]
            prefill_kv += before
        else:
            decode_kv.append(before)
            decode_tokens += tokens[req_id]
    for req_id in finished or ():
        prompts.pop(req_id, None)
    queued_prefill: list = []
    queued_decode: list = []
    preempted = preempted or {}
    for request in waiting or ():
        # Both values were fixed at the step: a preempted request's computed tokens when it was preempted
        # (its KV to rebuild), another's prompt (a request never read after it was queued).
        req_id = request.request_id
        if req_id in preempted:
            queued_decode.append(preempted[req_id] or 0)
        else:
            queued_prefill.append(request.num_prompt_tokens)
    running = queues[0] if queues is not None else None
    waiting_count = queues[2] if queues is not None else None
    total, free = blocks if blocks is not None else (None, None)
    dp = context.PROCESS.dp
    previous, stream.last_end = stream.last_end, update_end
    worker, kv = worker_fields(stamp, end, update_start)
    return {
        "version": VERSION,
        "worker_id": stream.worker_id,
        "dp_rank": int(dp) if dp.isdigit() else -1,
        "counter_id": counter,
        "wall_time": float(update_end - start),
        "scheduled_requests": {
            "num_prefill_requests": len(prefill_lengths),
            "sum_prefill_tokens": prefill_tokens,
            "var_prefill_length": _variance(prefill_lengths),
            "sum_prefill_kv_tokens": prefill_kv,
            "num_decode_requests": len(decode_kv),
            "sum_decode_kv_tokens": sum(decode_kv),
            "var_decode_kv_tokens": _variance(decode_kv),
        },
        "queued_requests": {
            "num_prefill_requests": len(queued_prefill),
            "sum_prefill_tokens": sum(queued_prefill),
            "var_prefill_length": _variance(queued_prefill),
            "num_decode_requests": len(queued_decode),
            "sum_decode_kv_tokens": sum(queued_decode),
            "var_decode_kv_tokens": _variance(queued_decode),
        },
        EXTENSION: {
            "engine_id": stream.worker_id,
            "dp": dp,
            "role": context.PROCESS.role,
            "pid": stream.pid,
            "vllm_version": _vllm_version(),
            "package_version": __version__,
            "step": counter,
            "phase": step_class[0] if step_class is not None else "unknown",
            "start_time_unix": start + stream.clock_offset,
            "schedule_s": end - start,
            "execute_s": update_start - end,
            "update_s": update_end - update_start,
            "sum_decode_tokens": decode_tokens,
            "preemptions": step.preemptions,
            "recomputes": step.recomputes,
            "recomputed_tokens": step.recomputed_tokens,
            "block_allocate_failures": step.allocate_failures,
            "running": running,
            "waiting": waiting_count,
            "kv_blocks_total": total,
            "kv_blocks_free": free,
            "kv_blocks_used": total - free - 1 if total is not None else None,  # the null block is never free
            "gap_before_s": start - previous if previous is not None else None,
            "worker": worker,
            "kv_transfer": kv,
        },
    }
