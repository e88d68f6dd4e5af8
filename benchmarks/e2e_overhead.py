"""End-to-end overhead on real vLLM (CPU build, tiny model): interleaved rounds of the same load on
two resident servers, one instrumented and one not.

    tox -e bench-e2e            (or: python benchmarks/e2e_overhead.py --server-pairs 2 --rounds 10)

Both servers of a pair run at once with the same launcher (``opentelemetry-instrument``); only
``OTEL_VLLM_ASCEND_ENABLED`` differs. An idle vLLM server uses ~1.5 % of a core here, so the other
server's load is not disturbed. Each round sends the same load to one server and then to the other
(which goes first alternates): ``--requests`` completions of ``--max-tokens`` tokens (ignore_eos) in
one completion request, so that they reach the engine together; the next starts once the server
is idle again (a vLLM worker spins for about a second after its last step). Rounds are seconds apart, so the
machine's drift (a shared VM) cancels within a round's pair; fresh server pairs (``--server-pairs``)
cover start-up effects such as memory placement.

Reported: tokens per second per variant; the instrumented/uninstrumented throughput ratio per round
(median, quartiles, min–max) and per server pair; CPU seconds per generated token of the API server,
the EngineCore and the worker (from /proc). The tiny model's steps take a few milliseconds, so any
per-step cost weighs 5–25x more here than on a real model.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time

from opentelemetry_instrumentation_vllm_ascend import catalogue
from opentelemetry_instrumentation_vllm_ascend.cli.demo import tiny_model
from opentelemetry_instrumentation_vllm_ascend.cli.demo.server import Server, series_counts, total

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


PROCESS_KINDS = (("api_server", None), ("engine_core", b"EngineCore"), ("worker", b"Worker"))


def process_kind(pid: int) -> str | None:
    """The kind of a server process: EngineCore and worker by their titles (VLLM::EngineCore /
    VLLM::Worker), anything else the API server's; None once it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:
        return None
    return next((kind for kind, title in PROCESS_KINDS if title and title in cmd), "api_server")


def cpu_seconds(server_pid: int) -> dict:
    """utime+stime per process kind: the API server (the launched process and any child that is
    neither an EngineCore nor a worker), the EngineCore and the worker."""
    out = {kind: 0.0 for kind, _ in PROCESS_KINDS}
    for pid in [server_pid] + descendants(server_pid):
        kind = process_kind(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if kind is not None:
            out[kind] += (int(fields[11]) + int(fields[12])) / CLK
    return out


def start(
    model: str,
    instrumented: bool,
    log_dir: str,
    i: int,
    disabled: str = "",
    control: bool = False,
    disabled_scopes: str = "",
) -> Server:
    env = {"OTEL_VLLM_ASCEND_ENABLED": "true" if instrumented and not control else "false"}
    if instrumented and disabled:
        env["OTEL_VLLM_ASCEND_DISABLED_METRICS"] = disabled
    if instrumented and disabled_scopes:
        env["OTEL_VLLM_ASCEND_DISABLED_SCOPES"] = disabled_scopes
    log = os.path.join(log_dir, f"{'on' if instrumented else 'off'}-{i}.log")
    extra = ("--num-gpu-blocks-override", "512", "--max-num-seqs", "64")  # room for the whole batch
    server = Server(model, env=env, log_path=log, extra_args=extra).start()
    server.complete(tiny_model.prompt(999), max_tokens=8)  # warm-up
    return server


def instrumented_processes(servers: dict, expected: dict, timeout: float = 30.0) -> dict:
    """Processes each server shows as instrumented on /metrics, once every process has exported
    (each exports on its own interval)."""
    deadline = time.monotonic() + timeout
    while True:
        hooked = {k: total(s.scrape(), "vllm_profiling_instrumented_processes") for k, s in servers.items()}
        if hooked == expected or time.monotonic() > deadline:
            return hooked
        time.sleep(0.5)


def wait_idle(server: Server, timeout: float = 10.0) -> None:
    """Return once the server's processes are idle. After its last step a vLLM worker keeps spinning
    on its message queue for about a second (measured: ~1 CPU-second over the next second): a round
    started on the other server meanwhile would share the two cores with it."""
    deadline = time.monotonic() + timeout
    previous = sum(cpu_seconds(server.proc.pid).values())
    while time.monotonic() < deadline:
        time.sleep(0.25)
        current = sum(cpu_seconds(server.proc.pid).values())
        if current - previous < 0.03:
            return
        previous = current


def one_round(server: Server, requests: int, max_tokens: int, round_no: int) -> dict:
    prompts = [tiny_model.prompt(round_no * requests + k) for k in range(requests)]
    cpu0 = cpu_seconds(server.proc.pid)
    t0 = time.perf_counter()
    response = server.batch(prompts, max_tokens)
    wall = time.perf_counter() - t0
    cpu1 = cpu_seconds(server.proc.pid)
    tokens = response["usage"]["completion_tokens"]
    assert tokens == requests * max_tokens, response["usage"]
    return {
        "tokens_per_s": tokens / wall,
        "tokens": tokens,
        **{f"{k}_cpu_ms_per_token": (cpu1[k] - cpu0[k]) / tokens * 1e3 for k, _ in PROCESS_KINDS},
    }


def bootstrap_median(values, resamples: int = 4000, seed: int = 1) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of the median of ``values`` (rounds resampled with
    replacement; a fixed seed, so a run's printout is reproducible from its ratios)."""
    rng = random.Random(seed)
    n = len(values)
    medians = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def quantiles(values):
    """median, (first quartile, third quartile), (min, max)."""
    q = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3
    return q[1], (q[0], q[2]), (min(values), max(values))


def scrape_cost(servers: dict, scrapes: int = 20) -> dict:
    """Series on each server's /metrics (ours: vllm_profiling_*, of which recorded by the worker; vLLM's: the rest)
    and the wall time of a scrape (one GET /metrics, body read), ``scrapes`` times, alternating the servers."""
    out: dict = {}
    for on, server in servers.items():
        counts = series_counts(server.scrape(), "")
        ours = {f: n for f, n in counts.items() if f.startswith(catalogue.PREFIX)}
        out[on] = {
            "ours": sum(n for n, _ in ours.values()),
            "worker": sum(w for _, w in ours.values()),
            "vllm": sum(n for f, (n, _) in counts.items() if f not in ours),
            "families": ours,
            "ms": [],
        }
    for _ in range(scrapes):
        for on, server in servers.items():
            t0 = time.perf_counter()
            server.scrape()
            out[on]["ms"].append((time.perf_counter() - t0) * 1e3)
    return out


def print_scrape_cost(cost: dict) -> None:
    on, off = cost[True], cost[False]
    med_on, med_off = statistics.median(on["ms"]), statistics.median(off["ms"])
    print("\n### /metrics of one single-engine server (TP=1), after the rounds\n")
    print("| | uninstrumented | instrumented |")
    print("|---|---:|---:|")
    print(f"| vLLM's series | {off['vllm']} | {on['vllm']} |")
    print(f"| our series (vllm_profiling_*) | {off['ours']} | {on['ours']} |")
    print(f"| of which recorded by the worker (rank) | {off['worker']} | {on['worker']} |")
    print(
        f"| scrape ms, median (max) of {len(on['ms'])} | {med_off:.1f} ({max(off['ms']):.1f}) "
        f"| {med_on:.1f} ({max(on['ms']):.1f}) |"
    )
    print(
        f"\nSeries budget (docs/performance.md): ours {on['ours']} of {catalogue.SERIES_BUDGET} per engine, "
        f"{on['worker']} of {catalogue.WORKER_SERIES_BUDGET} per worker; scrape time added "
        f"{med_on - med_off:+.1f} ms (median; budget {catalogue.SCRAPE_BUDGET_MS} ms)."
    )
    largest = sorted(on["families"].items(), key=lambda kv: -kv[1][0])[:8]
    print("Largest of our families: " + ", ".join(f"{f[len(catalogue.PREFIX) :]} {n}" for f, (n, _) in largest))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server-pairs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10, help="rounds per server pair")
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument(
        "--disabled-metrics",
        default="",
        help="OTEL_VLLM_ASCEND_DISABLED_METRICS for the instrumented server (to find what costs)",
    )
    parser.add_argument(
        "--disabled-scopes",
        default="",
        help="OTEL_VLLM_ASCEND_DISABLED_SCOPES for the instrumented server (e.g. 'schedule: allocate_slots')",
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="A/A control: the 'instrumented' server is started uninstrumented too, to see what "
        "ratio the method itself reports when nothing differs",
    )
    parser.add_argument("--model-dir", default=os.path.join(tempfile.gettempdir(), "otel-vllm-ascend-tiny-llama"))
    args = parser.parse_args(argv)
    tiny_model.build(args.model_dir)
    log_dir = tempfile.mkdtemp(prefix="otel_vllm_e2e_overhead_")
    rounds = []  # (server pair, on, off)
    steps = cost = None
    for p in range(args.server_pairs):
        servers = {}
        try:
            for instrumented in (False, True) if p % 2 == 0 else (True, False):
                servers[instrumented] = start(
                    args.model_dir, instrumented, log_dir, p, args.disabled_metrics, args.control, args.disabled_scopes
                )
            expected = {True: 0 if args.control else 3, False: 0}
            hooked = instrumented_processes(servers, expected)
            assert hooked == expected, hooked
            for server in servers.values():
                wait_idle(server)
            for r in range(args.rounds):
                result = {}
                for instrumented in (False, True) if r % 2 == 0 else (True, False):
                    result[instrumented] = one_round(servers[instrumented], args.requests, args.max_tokens, r)
                    wait_idle(servers[instrumented])
                rounds.append((p, result[True], result[False]))
                on, off = result[True], result[False]
                print(
                    f"server pair {p + 1} round {r + 1:2d}: uninstrumented {off['tokens_per_s']:6.0f} tok/s, "
                    f"instrumented {on['tokens_per_s']:6.0f} tok/s, "
                    f"ratio {on['tokens_per_s'] / off['tokens_per_s']:.3f}",
                    flush=True,
                )
            text = servers[True].scrape()
            steps = (total(text, "vllm:iteration_tokens_total_count"), total(text, "vllm:generation_tokens_total"))
            if not args.control:
                cost = scrape_cost(servers)
        finally:
            for s in servers.values():
                s.stop()

    def fmt(values, f="{:.3f}"):
        med, (q1, q3), (lo, hi) = quantiles(values)
        return f"{f.format(med)} ({f.format(q1)}–{f.format(q3)}; {f.format(lo)}–{f.format(hi)})"

    ratios = [on["tokens_per_s"] / off["tokens_per_s"] for _, on, off in rounds]
    print(
        f"\n### End-to-end overhead: {args.server_pairs} server pairs x {args.rounds} interleaved rounds, "
        f"{args.requests} x {args.max_tokens} tokens per round"
        + (f"; disabled metrics: {args.disabled_metrics}" if args.disabled_metrics else "")
        + (f"; untimed scopes: {args.disabled_scopes}" if args.disabled_scopes else "")
        + ("; A/A CONTROL: both servers uninstrumented" if args.control else "")
        + "\n"
    )
    print("Medians (quartiles; min–max) over rounds.\n")
    print("| | uninstrumented | instrumented | ratio instrumented/uninstrumented (per round) |")
    print("|---|---:|---:|---:|")
    rows = [("tokens/s", "tokens_per_s", "{:.0f}")] + [
        (f"{k} CPU ms per token", f"{k}_cpu_ms_per_token", "{:.4f}") for k, _ in PROCESS_KINDS
    ]
    for label, key, f in rows:
        offs = [off[key] for _, _, off in rounds]
        ons = [on[key] for _, on, _ in rounds]
        per_round = [a / b for a, b in zip(ons, offs) if b]
        print(f"| {label} | {fmt(offs, f)} | {fmt(ons, f)} | {fmt(per_round) if per_round else '–'} |")
    for p in range(args.server_pairs):
        mine = [r for q, r in zip((q for q, _, _ in rounds), ratios) if q == p]
        print(f"\nServer pair {p + 1}: throughput ratio median {statistics.median(mine):.3f} over {len(mine)} rounds")
    med = statistics.median(ratios)
    low, high = bootstrap_median(ratios)
    print(
        f"\nThroughput change, median over all rounds: {(med - 1) * 100:+.1f} % (ratio {med:.3f}; bootstrap 95 % "
        f"interval of the median {low:.3f}–{high:.3f}); instrumented slower in "
        f"{sum(r < 1 for r in ratios)} of {len(ratios)} rounds"
    )
    print("Per-round ratios (to pool runs): " + " ".join(f"{r:.4f}" for r in ratios))
    if steps:
        print(
            f"Last instrumented server: {steps[0]:.0f} engine steps for {steps[1]:.0f} generated tokens "
            f"(vllm:iteration_tokens_total count, warm-up included): {steps[1] / max(steps[0], 1):.1f} tokens per step"
        )
    if cost:
        print_scrape_cost(cost)
    print(f"Server logs: {log_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
