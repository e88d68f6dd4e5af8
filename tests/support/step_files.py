"""The per-step records a live server wrote (``OTEL_VLLM_ASCEND_STEPS_FILE``, docs/steps.md), read back by the
end-to-end tests, and a ZMQ subscriber that connects and then stops reading."""

from __future__ import annotations

import json
import os
import time

from opentelemetry_instrumentation_vllm_ascend.recording.step_fields import STAGE_FIELDS
from opentelemetry_instrumentation_vllm_ascend.recording.step_records import EXTENSION


def read(path: str) -> list[dict]:
    """The records of one JSON-lines file, in file order ([] while it does not exist). A last line without its
    newline (being written) is left out."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return [json.loads(line) for line in text.split("\n")[:-1] if line]


def scheduled_tokens(record: dict) -> int:
    """The step's scheduled tokens: its prefill requests' and its decode requests' (our extension's field)."""
    return record["scheduled_requests"]["sum_prefill_tokens"] + record[EXTENSION]["sum_decode_tokens"]


def check_counters(records: list[dict], schedule_calls: float) -> None:
    """One engine's records: counter_id strictly increasing in file order (each step once), all within the
    schedule() calls the engine made (the counter counts them all, idle ones included: the ids left out are the
    steps that scheduled nothing), each record's step its counter_id."""
    ids = [r["counter_id"] for r in records]
    assert ids == sorted(set(ids)), "a step twice, or out of order"
    assert ids and 1 <= ids[0] and ids[-1] <= schedule_calls, (ids[:3], ids[-3:], schedule_calls)
    assert all(r[EXTENSION]["step"] == r["counter_id"] for r in records)


def check_token_sums(records: list[dict], budget: int) -> None:
    """Each record's batch composition holds together: it scheduled tokens (a record is for a non-idle step), at
    most the step budget; at least one token per decode request; prefill tokens only with prefill requests."""
    for r in records:
        s = r["scheduled_requests"]
        tokens = scheduled_tokens(r)
        assert 0 < tokens <= budget, r
        assert s["num_prefill_requests"] + s["num_decode_requests"] > 0, r
        assert r[EXTENSION]["sum_decode_tokens"] >= s["num_decode_requests"], r
        assert (s["sum_prefill_tokens"] > 0) == (s["num_prefill_requests"] > 0), r
        # Dynamo's wall_time is schedule + the executor wait + the update, each measured (never negative).
        parts = [r[EXTENSION][k] for k in ("schedule_s", "execute_s", "update_s")]
        assert min(parts) >= 0 and abs(sum(parts) - r["wall_time"]) < 1e-6, r


class StalledSubscriber:
    """A SUB socket connected to ``endpoint`` (before the server binds it: ZMQ connects when it can) that
    subscribes to everything and then reads nothing until ``drain``: one message of receive high-water mark;
    with the publisher's at 1 too its pipe is full at once, and a message goes out only when ZMQ's I/O thread
    has moved the last one into the kernel's socket buffer (about one in twenty, measured in process)."""

    def __init__(self, endpoint: str) -> None:
        import zmq

        self.zmq = zmq
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.SUB)
        self.socket.setsockopt(zmq.RCVHWM, 1)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        self.socket.connect(endpoint)

    def drain(self, quiet_s: float = 2.0) -> list[tuple[int, bytes]]:
        """Read everything now, until nothing came for ``quiet_s``: [(sequence number, payload)]."""
        out = []
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline and self.socket.poll(int(quiet_s * 1000)):
            _topic, seq, payload = self.socket.recv_multipart()
            out.append((int.from_bytes(seq, "big"), payload))
        return out

    def close(self) -> None:
        self.socket.close(linger=0)
        self.context.term()


#: The worker's stages in a record, idle (between steps) left out.
WORKER_STAGES = STAGE_FIELDS


def check_worker(records: list[dict], rank: str) -> dict:
    """Each record has the worker's part from the rank that replied (``rank``), on the EngineCore's clock (one
    host): its stages are never negative, the forward took time, and dispatch + the worker's step + the reply's
    way back are exactly the engine's execute wait. Returns the records' seconds per stage, summed."""
    sums = dict.fromkeys(WORKER_STAGES, 0.0)
    for r in records:
        ours = r[EXTENSION]
        worker = ours["worker"]
        assert worker is not None and worker["rank"] == rank, r
        assert min(worker[k] for k in WORKER_STAGES) >= 0 and worker["forward_s"] > 0, r
        assert worker["dispatch_s"] >= 0 and worker["reply_s"] >= 0, r
        parts = worker["dispatch_s"] + sum(worker[k] for k in WORKER_STAGES) + worker["reply_s"]
        assert abs(parts - ours["execute_s"]) < 1e-9, r
        for k in WORKER_STAGES:
            sums[k] += worker[k]
    return sums
