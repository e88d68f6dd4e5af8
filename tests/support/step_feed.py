"""Completed steps handed to a real ``step_records.Stream``'s queue in the shape the scheduler hooks leave them
(``handlers.scheduler._keep_step`` + ``UpdateFromOutput``), with chosen times and batches, so that the records the
stream builds have known values: ``wall_time`` = ``wall`` exactly (dyadic times), the scheduled tokens, the shape
and the queue depth as given. The hooks' own path is tests/unit/recording/test_step_records.py's."""

from __future__ import annotations

from types import SimpleNamespace

from opentelemetry_instrumentation_vllm_ascend.handlers.steps import Step


def feed(stream, counter: int, start: float, wall: float, decode: int = 0, prefill=(), queued: int = 0) -> None:
    """One step: ``decode`` decode requests (10 tokens computed, 3 output tokens, 1 token scheduled each),
    ``prefill`` new requests as (prompt length, tokens scheduled), ``queued`` requests left waiting (never
    preempted, prompt 8 each); ``schedule()`` started at ``start`` and ``update_from_output()`` returned at
    ``start + wall``."""
    tokens: dict = {}
    new = []
    for i, (length, chunk) in enumerate(prefill):
        req_id = f"p{counter}-{i}"
        tokens[req_id] = chunk
        new.append(SimpleNamespace(req_id=req_id, prompt_token_ids=[0] * length, num_computed_tokens=0))
    ids = [f"d{i}" for i in range(decode)]
    tokens.update(dict.fromkeys(ids, 1))
    kept = (tokens, new, ids, [10] * decode, [3] * decode, None, set())
    waiting = tuple(SimpleNamespace(request_id=f"w{i}", num_prompt_tokens=8) for i in range(queued)) or None
    phase = "mixed" if decode and prefill else ("prefill" if prefill else "decode")
    queues = (decode + len(prefill), 0, queued, 0)
    scheduled = (
        id(kept), SimpleNamespace(requests={}), counter, start, start + wall / 4, Step(), (phase, 0, 0, 0, 0),
        queues, (16, 10), waiting, None, kept,
    )  # fmt: skip
    stream.queue.append((scheduled, start + wall / 2, start + wall))
