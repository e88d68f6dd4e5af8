"""Where the end-to-end cost goes: one instrumented real vLLM server (CPU build, tiny model) under the
e2e benchmark's load, each of its processes sampled with py-spy while it holds the GIL.

    tox -e bench-profile        (or: python -m benchmarks.e2e_profile --seconds 60; needs py-spy and
                                 permission to read the server's memory: root, or ptrace allowed)
    tox -e bench-profile -- --preset short      (the API-bound load: many short requests)

Throughput ratios (``e2e_overhead.py``) say how much slower the instrumented server is, but not
where: on a 2-core machine the API server, the EngineCore and the worker share the cores, so CPU
added in any of them slows the others. This samples each process (``py-spy record --gil``: only
the thread that holds the GIL, i.e. Python running) and counts the samples whose innermost Python
frame is this package's code — a generated wrapper, a handler, the recorder, the exporter — so C
functions our code calls (``perf_counter``, ``sorted``) count as ours, and vLLM's code that our
wrappers call does not. Reported per process: GIL samples, our share of them, our CPU time per
engine step (samples / rate / steps, steps from vLLM's own ``vllm:iteration_tokens_total`` count
over the same window), and which hook the time is under.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from benchmarks.e2e_overhead import PRESETS, descendants, one_round, pin, process_kind, start  # noqa: E402
from opentelemetry_instrumentation_vllm_ascend.cli.demo import tiny_model  # noqa: E402
from opentelemetry_instrumentation_vllm_ascend.cli.demo.server import total  # noqa: E402

_GENERATED = re.compile(r"otel-vllm-ascend wrapper of ([^>]+)>")


def ours(frame: str) -> bool:
    return "opentelemetry_instrumentation_vllm_ascend" in frame or "otel-vllm-ascend wrapper" in frame


def where(frames: list[str]) -> str:
    """The hook a sample of ours is under: the outermost frame of the run of our frames that ends at
    the innermost one (a generated wrapper is named by its target)."""
    i = len(frames) - 1
    while i > 0 and ours(frames[i - 1]):
        i -= 1
    match = _GENERATED.search(frames[i])
    if match:
        return f"wrapper of {match.group(1)}"
    function = frames[i].split(" (")[0]
    return "exporter thread" if function.startswith(("FilesExporter", "Store.collect")) else function


def attribute(path: str) -> tuple[int, int, collections.Counter]:
    """(samples, samples of ours, ours by hook) of a py-spy raw (collapsed stacks) file."""
    samples = mine = 0
    hooks: collections.Counter = collections.Counter()
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            n = int(count)
            samples += n
            frames = stack.split(";")
            if ours(frames[-1]):
                mine += n
                hooks[where(frames)] += n
    return samples, mine, hooks


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=60, help="sampling window")
    parser.add_argument("--rate", type=int, default=197, help="py-spy samples per second")
    parser.add_argument(
        "--preset",
        choices=("tiny", "short"),
        default="tiny",
        help="e2e_overhead's load on the tiny model: tiny (batches), short (many short requests)",
    )
    parser.add_argument("--requests", type=int, help="per round (default: the preset's)")
    parser.add_argument("--max-tokens", type=int, help="per request (default: the preset's)")
    parser.add_argument("--concurrency", type=int, default=32, help="short load: requests in flight")
    parser.add_argument("--top", type=int, default=8, help="hooks listed per process")
    parser.add_argument(
        "--py-spy", default=shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    )
    parser.add_argument("--model-dir", default=os.path.join(tempfile.gettempdir(), "otel-vllm-ascend-tiny-llama"))
    args = parser.parse_args(argv)
    if not os.path.exists(args.py_spy):
        print("py-spy not found (tox -e bench-profile installs it)", file=sys.stderr)
        return 2
    tiny_model.build(args.model_dir)
    log_dir = tempfile.mkdtemp(prefix="otel_vllm_e2e_profile_")
    # The preset's server and load (e2e_overhead.PRESETS), instrumented with the default set.
    preset = PRESETS[args.preset]
    args.load, args.max_num_seqs, args.disabled_metrics, args.disabled_scopes = preset["load"], 64, "", ""
    args.requests = args.requests or preset["requests"]
    args.max_tokens = args.max_tokens or preset["max_tokens"]
    args.bind = True  # as e2e_overhead binds its servers (see its bind())
    server = start(args.model_dir, "on", log_dir, 0, args)
    if server.api_cores:
        pin(os.getpid(), server.api_cores)
    stop = threading.Event()
    try:
        processes = {server.proc.pid: "api_server"}
        for pid in descendants(server.proc.pid):
            kind = process_kind(pid)
            if kind in ("engine_core", "worker"):  # other children (e.g. a resource tracker) are not sampled
                processes[pid] = kind

        def load():
            r = 0
            while not stop.is_set():
                try:
                    one_round(server, args, r)
                except Exception:
                    if stop.is_set():
                        return  # the server stopped under a round in flight
                    raise
                r += 1

        driver = threading.Thread(target=load, daemon=True)
        driver.start()
        time.sleep(5)  # into steady load
        before = server.scrape()
        spies = []
        for pid, kind in processes.items():
            out = os.path.join(log_dir, f"py-spy-{kind}-{pid}.txt")
            spies.append(
                (
                    kind,
                    pid,
                    out,
                    subprocess.Popen(
                        [
                            args.py_spy,
                            "record",
                            "--gil",
                            "--nonblocking",
                            "-r",
                            str(args.rate),
                            "-d",
                            str(args.seconds),
                            "-f",
                            "raw",
                            "-o",
                            out,
                            "--pid",
                            str(pid),
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE,
                    ),
                )
            )
        for kind, _pid, _out, spy in spies:
            _, err = spy.communicate(timeout=args.seconds + 120)
            if spy.returncode != 0:
                print(f"py-spy failed on {kind} (pid {pid}): {err.decode(errors='replace')[-500:]}", file=sys.stderr)
                return 1
        after = server.scrape()
    finally:
        stop.set()
        server.stop()
    steps = total(after, "vllm:iteration_tokens_total_count") - total(before, "vllm:iteration_tokens_total_count")
    tokens = total(after, "vllm:generation_tokens_total") - total(before, "vllm:generation_tokens_total")
    print(f"\n### Where the instrumented server's time goes (py-spy --gil, {args.rate} Hz, {args.seconds} s)\n")
    requests = total(after, "vllm:request_success_total") - total(before, "vllm:request_success_total")
    print(
        f"Load ({args.preset}): rounds of {args.requests} x {args.max_tokens} tokens"
        + (f", {args.concurrency} requests in flight" if args.load == "short" else "")
        + f"; in the window {steps:.0f} engine steps, {tokens:.0f} generated tokens "
        f"({tokens / max(steps, 1):.1f} per step), {requests:.0f} requests.\n"
    )
    print(
        "Our share is the steadier figure: the absolute column assumes py-spy took every sample it was asked "
        "for, and the number of GIL samples varied between runs of the same code by up to 2x here (three "
        "samplers and the server on two cores; the cause is not pinned down), so read it as an order of "
        "magnitude. Shares vary too (a few dozen samples of ours per process): compare runs, not single rows.\n"
    )
    print("| process | GIL samples | of them in our code | our share | our CPU per engine step, µs | per request, µs |")
    print("|---|---:|---:|---:|---:|---:|")
    results = []
    for kind, _pid, out, _ in spies:
        samples, mine, hooks = attribute(out)
        results.append((kind, samples, mine, hooks))
        per_step = mine / args.rate / max(steps, 1) * 1e6
        per_request = mine / args.rate / max(requests, 1) * 1e6
        print(
            f"| {kind} | {samples} | {mine} | {mine / max(samples, 1) * 100:.2f} % | {per_step:.1f} "
            f"| {per_request:.1f} |"
        )
    for kind, samples, _mine, hooks in results:
        print(f"\n{kind}: our samples by hook (share of the process's GIL samples)\n")
        print("| hook | samples | share |")
        print("|---|---:|---:|")
        for hook, n in hooks.most_common(args.top):
            print(f"| {hook} | {n} | {n / max(samples, 1) * 100:.2f} % |")
    print(f"\nRaw py-spy files and server log: {log_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
