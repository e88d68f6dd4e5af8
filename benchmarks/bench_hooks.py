"""Nanoseconds per hooked call: bare call, plain closure, wrapt, and our wrappers/handlers, measured
side by side in one run. Prints a table of medians with min–max over repeats and the ratio to a
bare call. Speed claims come from here, never from timed tests.

    python benchmarks/bench_hooks.py [--number 200000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import platform
import statistics
import sys
import tempfile
import timeit
from types import SimpleNamespace as NS

import wrapt

from opentelemetry_instrumentation_vllm_ascend import catalogue, context, environment, pipeline, recording
from opentelemetry_instrumentation_vllm_ascend.handlers.executor import CollectiveRpc
from opentelemetry_instrumentation_vllm_ascend.handlers.kv_cache import AllocateSlots
from opentelemetry_instrumentation_vllm_ascend.handlers.scheduler import PreemptRequest
from opentelemetry_instrumentation_vllm_ascend.wrappers import FUTURE, SYNC, Handler, wrap


class Target:
    def allocate_slots(self, request, n):
        return request

    def preempt(self, request, ts):
        return None

    def rpc(self, method, non_block=False):
        return DONE


DONE = concurrent.futures.Future()
DONE.set_result(1)


def closure(f):
    def w(*a, **k):
        return f(*a, **k)

    return w


@wrapt.decorator
def _wrapt_pass(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)


def cases():
    t = Target()
    req = NS(num_computed_tokens=10)
    bare = Target.allocate_slots
    sync_noop = wrap(Target.allocate_slots, Handler(), SYNC)[0]
    alloc = wrap(Target.allocate_slots, AllocateSlots(), SYNC)[0]
    preempt = wrap(Target.preempt, PreemptRequest(), SYNC)[0]
    rpc = wrap(Target.rpc, CollectiveRpc(), FUTURE)[0]
    plain = closure(Target.allocate_slots)
    wrapt_w = _wrapt_pass(Target.allocate_slots)
    attrs = context.step_labels("decode")
    step = context.Step()
    context.CURRENT_STEP.set(step)  # as inside Scheduler.schedule()
    return [
        ("bare call", lambda: bare(t, req, 1)),
        ("plain closure wrapper", lambda: plain(t, req, 1)),
        ("wrapt.decorator wrapper", lambda: wrapt_w(t, req, 1)),
        ("ours: sync wrapper, no-op handler", lambda: sync_noop(t, req, 1)),
        ("ours: allocate_slots (success)", lambda: alloc(t, req, 1)),
        ("ours: _preempt_request in a step", lambda: preempt(t, req, 0.0)),
        ("ours: collective_rpc non-block (future cb)", lambda: rpc(t, "execute_model", non_block=True)),
        ("recording.add (OTel SDK counter, 3 attrs)", lambda: recording.add(catalogue.RUNNING_TO_WAITING, 1, attrs)),
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--number", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)

    os.environ[environment.FILES_DIR] = tempfile.mkdtemp(prefix="bench_hooks_")
    os.environ[environment.PROMETHEUS_INTERVAL_MS] = "3600000"
    os.environ.pop(environment.METRICS_EXPORTER, None)
    pipeline.reset()
    context.set_process("engine_core", "0", "mixed")

    rows = []
    for name, fn in cases():
        fn()  # warm (creates instruments)
        runs = [t / args.number * 1e9 for t in timeit.repeat(fn, number=args.number, repeat=args.repeat)]
        rows.append((name, statistics.median(runs), min(runs), max(runs)))
    base = rows[0][1]
    print(f"# ns per call; python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs; "
          f"number={args.number} repeat={args.repeat} (lambda call overhead included in every row)")
    print(f"| {'case':45} | {'median ns':>9} | {'min–max ns':>15} | {'× bare':>6} | {'added ns':>8} |")
    print(f"|{'-' * 47}|{'-' * 10}:|{'-' * 16}:|{'-' * 7}:|{'-' * 9}:|")
    for name, med, lo, hi in rows:
        print(f"| {name:45} | {med:9.0f} | {lo:7.0f}–{hi:<7.0f} | {med / base:6.2f} | {med - base:8.0f} |")
    pipeline.reset()
    return 0


if __name__ == "__main__":
    sys.exit(main())
