"""The per-step record's own cost on the EngineCore thread (docs/steps.md), per step, in ns: the code the record
adds to the two scheduler hooks, timed on real objects — a real vLLM ``Scheduler``'s decode SchedulerOutput at
each batch size (section G's ``build``), its ``scheduler`` and the step's real queue and block state:

- ``off``: ``UpdateFromOutput.after`` with no sink on, against itself with the record's check removed … the check is
  one field read: reported as ``UpdateFromOutput.after`` with the stream None vs on, and ``_keep_step`` alone;
- ``on``: ``_keep_step`` (the scheduler hook's part: one tuple, the kept parts of the output) plus
  ``UpdateFromOutput.after`` with a stream (its completion and append), minus ``UpdateFromOutput.after`` with none;
- ``traced``: ``UpdateFromOutput.after`` with a stream whose slow-step traces are on (docs/steps.md), for a step no
  rule keeps (the comparison with ``slow_s`` and the preemption read).

The update hook reads the worker's stamp on a real stamped reply (``reply``: the step's marks). A second table
times the worker's side (on the EngineCore's thread with an in-process worker): one worker step's boundaries
through the model runner hooks' own functions (``begin_step``, the seven boundaries of an execute + sample step,
``reply``), with step records on (each boundary noted: ``budget.WORKER_MARKED``) and off.

No background thread runs (the queue is emptied between repeats, outside the timing): what the thread costs the
EngineCore is the GIL time it takes while the EngineCore's thread would run, which section G (sinks on vs off)
reads — on a server the EngineCore's thread waits for the workers most of a step, with the GIL released.

    python -m benchmarks.step_record_cost [--batches 16,64,256] [--model-dir DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from types import SimpleNamespace


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="16,64,256")
    parser.add_argument("--model-dir", default=os.path.join(tempfile.gettempdir(), "otel-vllm-ascend-tiny-llama"))
    parser.add_argument("--number", type=int, default=0, help="calls per repeat (default: half the deferred queue)")
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args(argv)

    from benchmarks.real_scheduler import build, steps
    from opentelemetry_instrumentation_vllm_ascend.cli.demo import tiny_model
    from opentelemetry_instrumentation_vllm_ascend.context import HOST_CLOCK
    from opentelemetry_instrumentation_vllm_ascend.handlers.scheduler import UpdateFromOutput, _keep_step
    from opentelemetry_instrumentation_vllm_ascend.handlers.steps import READY_ATTRIBUTE, Step
    from opentelemetry_instrumentation_vllm_ascend.recording.deferred import MAX_VALUES
    from opentelemetry_instrumentation_vllm_ascend.recording.step_records import Stream
    from opentelemetry_instrumentation_vllm_ascend.recording.step_traces import StepTracer
    from opentelemetry_instrumentation_vllm_ascend.state import STATE

    if not os.path.exists(os.path.join(args.model_dir, "config.json")):
        tiny_model.build(args.model_dir)
    print("### Step record: ns per step on the EngineCore thread (median of repeats)\n")
    print(
        "| batch | `_keep_step` | `UpdateFromOutput.after`, no sink | with a sink | with step traces on "
        "(step not kept) | record's total (on) |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    update = UpdateFromOutput()
    for batch in (int(b) for b in args.batches.split(",")):
        scheduler = build(args.model_dir, batch)
        steps(scheduler, 16)
        out = scheduler.schedule()
        queues = (len(scheduler.running), 0, len(scheduler.waiting), batch)
        pool = scheduler.kv_cache_manager.block_pool
        blocks = (pool.num_gpu_blocks, pool.get_num_free_blocks())
        step_class = ("decode", 0, 0, batch, batch)
        stream = Stream(None, os.devnull)
        stream.started = True  # no thread: the queue is emptied between repeats
        stream.capacity = 1 << 30
        traced_stream = Stream(None, os.devnull, tracer=StepTracer())  # no rule keeps these steps
        traced_stream.started = True
        traced_stream.capacity = 1 << 30
        reply = SimpleNamespace()
        setattr(reply, READY_ATTRIBUTE, (HOST_CLOCK, 1.0, 2.0, ("0", [1, 0.0] * 8, None)))
        call = (scheduler, out, reply)
        n = args.number or MAX_VALUES // 2

        def keep(n=n, stream=stream, out=out, scheduler=scheduler, queues=queues, blocks=blocks, sc=step_class):
            step = Step()
            t = time.perf_counter()
            for _ in range(n):
                _keep_step(stream, out, scheduler, 1, 0.0, 0.0, step, sc, queues, blocks)
            return (time.perf_counter() - t) / n

        def updates(n=n, call=call):
            STATE.deferred_values.clear()  # (no flush of the deferred observations inside the timed calls)
            t = time.perf_counter()
            for _ in range(n):
                update.after(0.0, call, {}, None)
            return (time.perf_counter() - t) / n

        kept, off, on, traced = [], [], [], []
        STATE.step_stream = None
        updates()  # (warm: the pipeline, the deferred queue's first flushes)
        for _ in range(args.repeat):
            STATE.step_stream = None
            off.append(updates())
            STATE.step_stream = stream
            kept.append(keep())
            stream.pending.clear()
            # The update with a stream: each call finds its step at the head (one kept per call).
            for _ in range(n):
                _keep_step(stream, out, scheduler, 1, 0.0, 0.0, Step(), step_class, queues, blocks)
            on.append(updates())
            stream.pending.clear()
            stream.queue.clear()
            STATE.step_stream = traced_stream
            for _ in range(n):
                _keep_step(traced_stream, out, scheduler, 1, 0.0, 0.0, Step(), step_class, queues, blocks)
            traced.append(updates())
            traced_stream.pending.clear()
            traced_stream.queue.clear()
        STATE.step_stream = None
        k, f, o, tr = (statistics.median(v) * 1e9 for v in (kept, off, on, traced))
        print(f"| {batch} | {k:.0f} | {f:.0f} | {o:.0f} | {tr:.0f} | {k + o - f:.0f} |")
    worker(args, Stream(None, os.devnull))
    return 0


def worker(args, stream) -> None:
    """The worker's side: one step's boundaries with step records off and on (median of repeats, ns per step)."""
    from opentelemetry_instrumentation_vllm_ascend.handlers import budget, model_runner
    from opentelemetry_instrumentation_vllm_ascend.state import STATE

    if budget.WORKER_TO is budget.off:
        print("\n(worker budget off: no worker marks)")
        return
    STATE.device = None  # the host timeline (a CPU worker)
    n = args.number or 2000
    stages = (budget.W_FORWARD, budget.W_OTHER, budget.W_WAIT_SAMPLE, budget.W_OTHER, budget.W_SAMPLE, budget.W_OTHER)

    def steps(n=n):
        clock = time.perf_counter
        out = SimpleNamespace()
        t = clock()
        for _ in range(n):
            step = model_runner.begin_step("decode")
            for stage in stages:
                step.to(stage, 1.0)
            step.to(budget.W_IDLE, 1.0)
            model_runner.reply(out, step, 1.0)
            STATE.worker_step = None
        return (clock() - t) / n

    off, on = [], []
    steps()
    for _ in range(args.repeat):
        STATE.step_stream = None
        off.append(steps())
        STATE.step_stream = stream
        on.append(steps())
    STATE.step_stream = None
    f, o = (statistics.median(v) * 1e9 for v in (off, on))
    print("\n### The worker's step boundaries: ns per step (begin_step, 7 boundaries, reply; median of repeats)\n")
    print("| records off | records on (marks noted, stamped) | added |")
    print("|---:|---:|---:|")
    print(f"| {f:.0f} | {o:.0f} | {o - f:.0f} |")


if __name__ == "__main__":
    raise SystemExit(main())
