"""End-to-end overhead on real vLLM (CPU build, tiny model): paired, alternating runs with and
without instrumentation under the same load.

    tox -e bench-e2e            (or: python benchmarks/e2e_overhead.py --pairs 5)

For each run: one fresh server, a warm-up request, then ``--requests`` concurrent completions of
``--max-tokens`` tokens each (ignore_eos). Reported per variant: generated tokens per second
(median, min–max over pairs), the instrumented/uninstrumented throughput ratio per pair, and the
EngineCore + worker CPU seconds per generated token (from /proc, summed over both processes).
The tiny model's steps take about a millisecond, so any per-step cost weighs far more here than on
a real model: the overhead measured here is an upper bound.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

from opentelemetry_instrumentation_vllm_ascend.demo import tiny_model
from opentelemetry_instrumentation_vllm_ascend.demo.server import Server, total

CLK = os.sysconf("SC_CLK_TCK")


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def engine_cpu_seconds(server_pid: int) -> float:
    """utime+stime of the EngineCore and worker processes (titles VLLM::EngineCore / VLLM::Worker)."""
    seconds = 0.0
    for pid in descendants(server_pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ")
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if b"EngineCore" in cmd or b"Worker" in cmd:
            seconds += (int(fields[11]) + int(fields[12])) / CLK
    return seconds


def one_run(model: str, instrumented: bool, requests: int, max_tokens: int, log_dir: str, i: int) -> dict:
    env = {"OTEL_VLLM_ASCEND_ENABLED": "true" if instrumented else "false"}
    log = os.path.join(log_dir, f"{'on' if instrumented else 'off'}-{i}.log")
    # Same launcher either way (opentelemetry-instrument), so only the instrumentation differs.
    extra = ("--num-gpu-blocks-override", "512", "--max-num-seqs", "64")  # room for the whole batch
    with Server(model, env=env, log_path=log, extra_args=extra) as server:
        server.complete(tiny_model.prompt(999), max_tokens=8)  # warm-up
        cpu0 = engine_cpu_seconds(server.proc.pid)
        start = time.perf_counter()
        responses = server.burst([tiny_model.prompt(i) for i in range(requests)], max_tokens)
        wall = time.perf_counter() - start
        cpu = engine_cpu_seconds(server.proc.pid) - cpu0
        tokens = sum(r["usage"]["completion_tokens"] for r in responses)
        text = server.scrape()
        hooked = total(text, "vllm_profiling_instrumented_processes")
        steps = total(text, "vllm:iteration_tokens_total_count")  # vLLM's own count of engine steps
    return {"tokens_per_s": tokens / wall, "cpu_per_token_ms": cpu / tokens * 1e3, "tokens": tokens,
            "instrumented_processes": hooked, "steps": steps}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--model-dir", default=os.path.join(tempfile.gettempdir(), "otel-vllm-ascend-tiny-llama"))
    args = parser.parse_args(argv)
    tiny_model.build(args.model_dir)
    log_dir = tempfile.mkdtemp(prefix="otel_vllm_e2e_overhead_")
    results = {True: [], False: []}
    for i in range(args.pairs):
        order = (False, True) if i % 2 == 0 else (True, False)  # alternate which goes first
        for instrumented in order:
            r = one_run(args.model_dir, instrumented, args.requests, args.max_tokens, log_dir, i)
            results[instrumented].append(r)
            print(f"pair {i + 1}: {'instrumented  ' if instrumented else 'uninstrumented'} "
                  f"{r['tokens_per_s']:8.0f} tok/s  {r['cpu_per_token_ms']:.3f} ms CPU/token "
                  f"(instrumented processes on /metrics: {r['instrumented_processes']:g})", flush=True)
        assert results[True][-1]["instrumented_processes"] == 3 and results[False][-1]["instrumented_processes"] == 0
    ratios = [on["tokens_per_s"] / off["tokens_per_s"] for on, off in zip(results[True], results[False])]
    cpu_ratios = [on["cpu_per_token_ms"] / off["cpu_per_token_ms"] for on, off in zip(results[True], results[False])]

    def summary(values, fmt):
        return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"

    print(f"\n### End-to-end overhead, {args.pairs} pairs, {args.requests} x {args.max_tokens} tokens per run\n")
    print("| | tokens/s, median (min–max) | EngineCore+worker CPU ms per token |")
    print("|---|---:|---:|")
    for label, key in (("uninstrumented", False), ("instrumented", True)):
        rs = results[key]
        print(f"| {label} | {summary([r['tokens_per_s'] for r in rs], '{:.0f}')} "
              f"| {summary([r['cpu_per_token_ms'] for r in rs], '{:.3f}')} |")
    print(f"| ratio instrumented/uninstrumented (per pair) | {summary(ratios, '{:.3f}')} | {summary(cpu_ratios, '{:.3f}')} |")
    print(f"\nThroughput loss, median over pairs: {(1 - statistics.median(ratios)) * 100:.1f} %")
    on = results[True][-1]
    print(f"Engine steps per run (vllm:iteration_tokens_total count, warm-up included): {on['steps']:.0f}; "
          f"generated tokens: {on['tokens']}; tokens per step: {on['tokens'] / max(on['steps'], 1):.1f}")
    print(f"Server logs: {log_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
