"""Drive vLLM's *real* Scheduler (``real_scheduler_run``'s load: 16 KV blocks, 8 requests, preemptions) with the
package instrumented and both step-record sinks on (the environment names them: ``OTEL_VLLM_ASCEND_STEPS_ZMQ``,
an ipc endpoint, and ``OTEL_VLLM_ASCEND_STEPS_FILE``), a real ZMQ SUB socket subscribed before the first step,
and print one JSON object: the raw ZMQ frames received (hex), the JSON lines written, and the oracle per
non-idle step, computed from vLLM's objects only — the SchedulerOutput's ``num_scheduled_tokens``, split into
prefill and decode by the same rule as ``real_scheduler_run.drive`` (read from the Request objects before
``schedule()``), its ``preempted_req_ids``, and the PREEMPTED events of the run — plus our metrics' points.

    python tests/support/step_records_run.py MODEL_DIR [--triton]
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time


def main() -> None:
    model_path = sys.argv[1]
    if "--triton" in sys.argv:
        import vllm.triton_utils

        vllm.triton_utils.HAS_TRITON = True

    import zmq

    from tests.support.process import instrument_every_metric

    _instrumentor, reader, failures = instrument_every_metric("engine_core")

    import real_scheduler_run as run
    import vllm
    from vllm.v1.engine import EngineCoreEventType

    from opentelemetry_instrumentation_vllm_ascend.recording import step_records
    from opentelemetry_instrumentation_vllm_ascend.state import STATE

    stream = STATE.step_stream
    assert stream is not None, "no sink on"
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(os.environ["OTEL_VLLM_ASCEND_STEPS_ZMQ"])
    stream.start()  # (the first completed step would start it: here first, to see the subscription arrive)
    deadline = time.monotonic() + 10
    while not stream.subscribers:
        assert time.monotonic() < deadline, "the subscription never arrived"
        time.sleep(0.01)

    scheduler = run.build(model_path)
    requests = [run.make_request(i) for i in range(run.REQUESTS)]
    for r in requests:
        scheduler.add_request(r)
    steps = []  # per non-idle step: what it scheduled, preempted and left waiting (the oracle)
    idle_steps = 0
    preempted_events = 0
    preempted_at: dict = {}  # request id -> its computed tokens when it was preempted (not yet resumed)
    from vllm.v1.request import RequestStatus

    for _number in range(2000):
        if not scheduler.has_requests():
            break
        before = {
            req_id: (r.num_computed_tokens, r.num_tokens, r.num_output_tokens, r.num_prompt_tokens)
            for req_id, r in scheduler.requests.items()
        }
        output = scheduler.schedule()
        scheduled = output.num_scheduled_tokens
        new_ids = {r.req_id for r in output.scheduled_new_reqs}
        resumed = getattr(output.scheduled_cached_reqs, "resumed_req_ids", None) or set()
        for req_id in output.preempted_req_ids or ():
            preempted_at[req_id] = before[req_id][0]
        row: dict = {
            "total": output.total_num_scheduled_tokens,
            "preempted": len(output.preempted_req_ids or ()),
            "prefill_tokens": 0,
            "prefill_kv": 0,
            "prefill_lengths": [],
            "decode_tokens": 0,
            "decode_kv": [],
            "queued_prefill": [],
            "queued_decode": [],
        }
        for req_id, tokens in scheduled.items():
            computed, num_tokens, outputs, prompt = before[req_id]
            if req_id in new_ids or req_id in resumed or not outputs or computed < num_tokens - 1:
                row["prefill_tokens"] += tokens
                row["prefill_kv"] += 0 if req_id in new_ids else computed  # (no prefix caching: new ones have 0)
                row["prefill_lengths"].append(prompt)
            else:
                row["decode_tokens"] += tokens
                row["decode_kv"].append(computed)
        for req_id in scheduled:
            preempted_at.pop(req_id, None)  # resumed
        for r in scheduler.waiting:
            if r.status == RequestStatus.PREEMPTED:
                row["queued_decode"].append(preempted_at[r.request_id])
            else:
                row["queued_prefill"].append(r.num_prompt_tokens)
        if scheduled:
            steps.append(row)
        else:
            idle_steps += 1
        scheduler.get_grammar_bitmask(output)
        engine_outputs = scheduler.update_from_output(output, run.model_output(scheduler, output))
        for outputs in (engine_outputs or {}).values():
            for out in outputs.outputs:
                for event in out.events or ():
                    preempted_events += event.type == EngineCoreEventType.PREEMPTED
    else:
        raise AssertionError("requests did not finish")
    queued_at_stop = len(stream.queue) + len(stream.pending)
    step_records.close()  # a clean stop: everything queued reaches the sinks
    frames = []
    while sub.poll(500):
        frames.append([part.hex() for part in sub.recv_multipart()])
    lines = []
    for path in sorted(
        glob.glob(os.environ["OTEL_VLLM_ASCEND_STEPS_FILE"].replace("{pid}", "*").replace(".jsonl", "*"))
    ):
        with open(path, encoding="utf-8") as f:
            lines += [json.loads(line) for line in f]
    STATE.step_stream = stream  # (closed: its drop counts are still exported)
    print(
        json.dumps(
            {
                "vllm": vllm.__version__,
                "frames": frames,
                "lines": lines,
                "steps": steps,
                "idle_steps": idle_steps,
                "preempted_events": preempted_events,
                "num_preemptions": sum(r.num_preemptions for r in requests),
                "queued_at_stop": queued_at_stop,
                "written": stream.written,
                "sent": stream.sent,
                "points": run.points(reader),
                "failures": failures,
            }
        )
    )


if __name__ == "__main__":
    main()
