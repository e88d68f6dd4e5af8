"""End-to-end overhead on real vLLM (CPU build): interleaved rounds of the same load on three resident servers —
uninstrumented, instrumented, and uninstrumented again as the A/A control — in one run.

    tox -e bench-e2e            (all presets; or: python -m benchmarks.e2e_overhead --preset step)

Presets (``PRESETS``): ``tiny`` — the tests' 2-layer model, ~3 ms decode steps, where any per-step cost weighs
most; ``step`` — a random model sized so that a decode step at batch 64 takes 20-40 ms on one core, as an
accelerator's step does on a real model (``--layers`` resizes it on a faster or slower machine; the run says
when); ``short`` — the tiny model under many short requests (the API server's per-request work is the
bottleneck). The three servers of a set run at once with the same launcher
(``opentelemetry-instrument``); only ``OTEL_VLLM_ASCEND_ENABLED`` differs. An idle vLLM server uses ~1.5 % of a
core here, so the others' load is not disturbed. Each round sends the same load to each server in turn (every
order of the three in turn), each starting once the previous server is idle again (a vLLM worker spins for about
a second after its last step). Rounds are seconds apart, so the machine's drift (a shared VM) cancels within a
round; fresh server sets (``--server-sets``) cover start-up effects such as memory placement. Each server's
EngineCore is bound to its worker's core and its API server, with this client, to the other cores (``bind()``;
``--placement apart`` binds the EngineCore with the API server, leaving the worker's core to the forward pass, as
an accelerator server does; ``--no-bind`` leaves them floating).

``--switched`` measures one instrumented server per set instead, as all three variants: its recording on, and
switched off at runtime with the package's ``control`` command (off twice: the A/A control), so a server's own
speed offset cancels. It tells what switching off saves (the handlers' and the recording's work), not what the
package costs installed: the wrapper frames of hooks switched off, the scope factory, the exporter and control
threads and the imports stay in both arms. ``--recording-off`` is its complement: three servers as usual, the
instrumented one's recording switched off once it has started, so the ratio tells what the package costs installed
and switched off — those parts alone — against uninstrumented servers.

Reported: throughput per variant; the instrumented/uninstrumented and the control/uninstrumented throughput
ratios per round (median, quartiles, min–max, and a 95 % interval of the median that resamples server sets, then
their rounds: ``bootstrap_median_by_set``); CPU seconds per
generated token of the API server, the EngineCore and the worker (from /proc: each thread's schedstat, see
``cpu_between``); the uninstrumented decode step
time the load gave; and, for the first set, the series on /metrics and the time a scrape takes on the
instrumented and the uninstrumented server.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

from opentelemetry_instrumentation_vllm_ascend import catalogue
from opentelemetry_instrumentation_vllm_ascend.cli.demo import tiny_model
from opentelemetry_instrumentation_vllm_ascend.cli.demo.server import Server, total
from opentelemetry_instrumentation_vllm_ascend.environment import metric_disabled
from tests.support.scrape import series_counts

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
    neither an EngineCore nor a worker), the EngineCore and the worker. In clock ticks (10 ms here)."""
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


def cpu_snapshot(server_pid: int) -> dict:
    """Per process of the server: (kind, utime+stime in seconds, {thread id: its CPU time in ns from
    /proc/PID/task/TID/schedstat}). See cpu_between()."""
    out = {}
    for pid in [server_pid] + descendants(server_pid):
        kind = process_kind(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            threads = {}
            for tid in os.listdir(f"/proc/{pid}/task"):
                try:
                    with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                        threads[tid] = int(f.read().split()[0])
                except OSError:
                    pass  # the thread ended meanwhile: cpu_between() sees it missing
        except OSError:
            continue
        if kind is not None:
            out[pid] = (kind, (int(fields[11]) + int(fields[12])) / CLK, threads)
    return out


def cpu_between(before: dict, after: dict) -> dict:
    """CPU seconds per process kind between two cpu_snapshot()s. A process's time is the sum over its threads'
    schedstat (nanoseconds): utime and stime count whole clock ticks, 10 ms here, a few percent of what an
    EngineCore spends in one round. Where a thread of the first snapshot is gone from the second, its time
    since the first is lost to schedstat, so that process counts in ticks; a process new in the second
    counts all its time."""
    out = {kind: 0.0 for kind, _ in PROCESS_KINDS}
    for pid, (kind, ticks, threads) in after.items():
        kind0, ticks0, threads0 = before.get(pid, (kind, 0.0, {}))
        if threads0.keys() <= threads.keys():
            out[kind] += sum(ns - threads0.get(tid, 0) for tid, ns in threads.items()) / 1e9
        else:
            out[kind] += ticks - ticks0
    return out


def worker_cores(server_pid: int) -> set[int]:
    """The cores a server's workers are bound to (vLLM's CPU backend binds each worker's OpenMP threads)."""
    cores: set[int] = set()
    for pid in descendants(server_pid):
        if process_kind(pid) == "worker":
            try:
                cores |= os.sched_getaffinity(pid)
            except OSError:
                pass
    return cores


def pin(pid: int, cores: set[int]) -> None:
    """Bind every thread of ``pid`` to ``cores`` (threads it starts later inherit the binding)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tids:
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:
            pass


def bind(server: Server, placement: str = "shared") -> set[int] | None:
    """Bind the server's EngineCore to its workers' cores (``placement`` ``shared``) or to the other cores
    (``apart``: the workers' cores run the workers alone, as an accelerator server's EngineCore has a core of
    its own) and its API server (every other process) to the remaining cores, where the benchmark's client runs
    too; returns those API-side cores (None, binding nothing, when the workers have every core).

    The EngineCore and its worker take turns: the worker computes while the EngineCore waits for its reply,
    and the EngineCore schedules while the worker waits for the next step; both wait by polling. Unbound, the
    EngineCore floats between the cores, polls on the API server's core while a step runs and now and then
    lands on the worker's: which process gets a core then decides a round (measured on 2 cores: the short
    preset's throughput swung between ~40 and ~340 requests/s from one round to the next). Bound so, the A/A
    control's per-round ratios keep their quartiles within about ±2 % in every preset, and what a hook costs in the
    EngineCore or the worker shows up as their CPU time, not as polling."""
    everything = os.sched_getaffinity(0)
    engine = worker_cores(server.proc.pid)
    api = everything - engine
    if not engine or not api:
        return None
    for pid in [server.proc.pid] + descendants(server.proc.pid):
        kind = process_kind(pid)
        if kind == "engine_core":
            pin(pid, engine if placement == "shared" else api)
        elif kind == "api_server":
            pin(pid, api)
    return api


VARIANTS = ("off", "on", "control")  # uninstrumented, instrumented, uninstrumented again (the A/A control)

#: How a printout's header names each design and placement (``pool.py`` pools printouts that share them).
SWITCHED_HEADER = "SWITCHED"
APART_HEADER = "workers alone on their core(s)"
RECORDING_OFF_HEADER = "the instrumented server's recording switched off"

#: The throughput ratios each round gives (``round_ratios``), as the printout names them.
RATIOS = {
    "on": "instrumented/uninstrumented",
    "on_both": "instrumented/mean of both uninstrumented",
    "control": "A/A control, uninstrumented/uninstrumented",
}


def round_ratios(off: float, on: float, control: float) -> dict[str, float]:
    """One round's throughput ratios (``RATIOS``): the instrumented server against the first uninstrumented one,
    against the mean of both uninstrumented ones (a steadier reference: the two differ by the A/A control's
    spread, and over a few server sets one of them can read slow throughout), and the A/A control."""
    return {"on": on / off, "on_both": on / ((off + control) / 2), "control": control / off}


def control(server: Server, action: str) -> dict:
    """The package's own ``control`` command on ``server`` (``on``, ``off``: returns once every process of the
    server has applied it, each polling its control file once per export interval; ``status``): its JSON."""
    command = [sys.executable, "-m", "opentelemetry_instrumentation_vllm_ascend", "control", action]
    done = subprocess.run(
        command + ["--server", str(server.proc.pid), "--json"], capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        raise RuntimeError(f"control {action} failed ({done.returncode}): {done.stderr.strip()}")
    return json.loads(done.stdout)


def switch(server: Server, variant: str) -> None:
    """``--switched``: set the one instrumented server's recording for ``variant`` (``on``: on; ``off`` and
    ``control``: off). Called before every measurement, the same way whatever the state was, so each measurement
    follows the same wait."""
    control(server, "on" if variant == "on" else "off")


def start(model: str, variant: str, log_dir: str, i: int, args) -> Server:
    instrumented = variant == "on"
    env = {"OTEL_VLLM_ASCEND_ENABLED": "true" if instrumented else "false"}
    if instrumented and args.disabled_metrics:
        env["OTEL_VLLM_ASCEND_DISABLED_METRICS"] = args.disabled_metrics
    if instrumented and args.disabled_scopes:
        env["OTEL_VLLM_ASCEND_DISABLED_SCOPES"] = args.disabled_scopes
    log = os.path.join(log_dir, f"{variant}-{i}.log")
    # Room for the whole batch: --max-num-seqs concurrent requests of up to 8 + max_tokens tokens.
    extra = ("--num-gpu-blocks-override", "512", "--max-num-seqs", str(args.max_num_seqs), "--max-model-len", "1024")
    server = Server(model, env=env, log_path=log, extra_args=extra).start(timeout=900)
    server.complete(tiny_model.prompt(999), max_tokens=8)  # warm-up
    server.api_cores = bind(server, args.placement) if args.bind else None
    return server


def instrumented_processes(servers: dict, expected: dict, gauge: bool = True, timeout: float = 30.0) -> dict:
    """Processes each server shows as instrumented on /metrics, once every process has exported
    (each exports on its own interval); with ``gauge`` false (``--disabled-metrics`` switched that gauge off), an
    uninstrumented server counts 0 and an instrumented one the processes its ``control status`` lists."""

    def count(server: Server) -> float:
        if gauge:
            return total(server.scrape(), "vllm_profiling_instrumented_processes")
        if server.env.get("OTEL_VLLM_ASCEND_ENABLED") != "true":
            return 0
        return len(control(server, "status")["processes"])

    deadline = time.monotonic() + timeout
    while True:
        hooked = {k: count(s) for k, s in servers.items()}
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


def batch_load(server: Server, args, round_no: int) -> tuple[int, int]:
    """One completion request of ``--requests`` prompts × ``--max-tokens`` tokens (ignore_eos): they reach the
    engine together. Returns (requests, generated tokens)."""
    prompts = [tiny_model.prompt(round_no * args.requests + k) for k in range(args.requests)]
    response = server.batch(prompts, args.max_tokens)
    tokens = response["usage"]["completion_tokens"]
    assert tokens == args.requests * args.max_tokens, response["usage"]
    return args.requests, tokens


def short_load(server: Server, args, round_no: int) -> tuple[int, int]:
    """``--requests`` separate short completion requests (``--max-tokens`` each), ``--concurrency`` in flight at
    once (aiohttp, one connection each): the API server's per-request work is the bottleneck, not the model."""
    import asyncio

    import aiohttp

    body = {"model": "tiny", "max_tokens": args.max_tokens, "temperature": 0.0, "ignore_eos": True}
    url = server.url + "/v1/completions"

    async def run() -> int:
        todo = iter(range(args.requests))
        tokens = 0

        async def client(session) -> None:
            nonlocal tokens
            for k in todo:
                prompt = tiny_model.prompt(round_no * args.requests + k, words=4)
                async with session.post(url, json={**body, "prompt": prompt}) as response:
                    tokens += (await response.json())["usage"]["completion_tokens"]

        connector = aiohttp.TCPConnector(limit=args.concurrency)
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            await asyncio.gather(*(client(session) for _ in range(args.concurrency)))
        return tokens

    tokens = asyncio.run(run())
    assert tokens == args.requests * args.max_tokens, tokens
    return args.requests, tokens


LOADS = {"batch": batch_load, "short": short_load}


def one_round(server: Server, args, round_no: int) -> dict:
    cpu0 = cpu_snapshot(server.proc.pid)
    t0 = time.perf_counter()
    requests, tokens = LOADS[args.load](server, args, round_no)
    wall = time.perf_counter() - t0
    cpu = cpu_between(cpu0, cpu_snapshot(server.proc.pid))
    return {
        "tokens_per_s": tokens / wall,
        "requests_per_s": requests / wall,
        "tokens": tokens,
        **{f"{k}_cpu_ms_per_token": cpu[k] / tokens * 1e3 for k, _ in PROCESS_KINDS},
    }


def bootstrap_median(values, resamples: int = 4000, seed: int = 1) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of the median of ``values`` (resampled with replacement; a fixed
    seed, so a printout is reproducible from its values). For independent values, such as G's paired
    differences within one scheduler; rounds of resident servers are not independent (``bootstrap_median_by_set``)."""
    rng = random.Random(seed)
    n = len(values)
    medians = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def bootstrap_median_by_set(sets, resamples: int = 4000, seed: int = 1) -> tuple[float, float]:
    """95 % interval of the median of the rounds of ``sets`` (a list of server sets, each the list of its rounds'
    ratios) by a two-stage percentile bootstrap: draw as many server sets as there are, with replacement, then
    each drawn set's rounds, with replacement; the median of what was drawn. Rounds of one set share its three
    server processes, and a process runs a few percent faster or slower than another of the same code for its
    whole life (memory placement): an interval that resampled rounds alone would count a set's offset once per
    round, as if it were noise that averages out, and come out too narrow (an A/A control of 1.066 with an
    interval of 1.031–1.092 in one run). Resampling at both stages is conservative; with few sets the interval
    is wide, which is what few server processes can tell. One set: the rounds' bootstrap (``bootstrap_median``)."""
    rng = random.Random(seed)
    k = len(sets)
    medians = []
    for _ in range(resamples):
        drawn: list = []
        for chosen in rng.choices(sets, k=k):
            drawn += rng.choices(chosen, k=len(chosen))
        medians.append(statistics.median(drawn))
    medians.sort()
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


#: The decode step time at batch 64 the step preset stands for: an accelerator's on a real model.
STEP_RANGE_MS = (20, 40)


def resized_layers(layers: int, step_ms: float) -> int:
    """The layers that bring a decode step of ``step_ms`` with ``layers`` layers to the middle of
    ``STEP_RANGE_MS``, taking the step as proportional to the layers (it is not quite: the sampler and the
    engine's own work do not grow with them)."""
    return max(1, round(layers * sum(STEP_RANGE_MS) / 2 / step_ms))


PRESETS = {
    # The tests' tiny model: ~3 ms decode steps, the per-step cost weighs most here.
    "tiny": dict(size=tiny_model.TINY, load="batch", requests=128, max_tokens=200, max_num_seqs=64),
    # Decode steps of tens of milliseconds at batch 64 (an accelerator's regime).
    "step": dict(size=tiny_model.STEP_SIZED, load="batch", requests=64, max_tokens=128, max_num_seqs=64),
    # The API-bound regime: many short requests, the tiny model.
    "short": dict(size=tiny_model.TINY, load="short", requests=1000, max_tokens=8, max_num_seqs=64),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny", help="model size and load (see PRESETS)")
    parser.add_argument("--server-sets", type=int, default=2, help="fresh trios of servers (off, on, control)")
    parser.add_argument("--rounds", type=int, default=8, help="rounds per server set")
    parser.add_argument("--requests", type=int, help="requests per round and server (default: the preset's)")
    parser.add_argument("--max-tokens", type=int, help="tokens per request (default: the preset's)")
    parser.add_argument("--concurrency", type=int, default=32, help="short load: requests in flight")
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
        "--no-bind",
        dest="bind",
        action="store_false",
        help="leave the EngineCores, the API servers and this client unbound (see bind())",
    )
    parser.add_argument(
        "--placement",
        choices=("shared", "apart"),
        default="shared",
        help="bound servers: each EngineCore on its worker's core (shared: what the EngineCore does, its hooks "
        "included, shares a core with the forward pass) or with the API server and this client (apart: the "
        "worker's core runs the forward pass alone, as on an accelerator server)",
    )
    design = parser.add_mutually_exclusive_group()
    design.add_argument(
        "--switched",
        action="store_true",
        help="one instrumented server per set, its recording switched on and off at runtime between measurements "
        "(on; off; off again as the A/A control): what switching off saves, without the servers' own offsets",
    )
    design.add_argument(
        "--recording-off",
        action="store_true",
        help="switch the instrumented server's recording off at runtime once it has started (hooks stay installed, "
        "their handlers off): what the package costs installed and switched off - the wrapper frames, the scope "
        "factory, the exporter and control threads, the imports - against the same uninstrumented servers",
    )
    parser.add_argument(
        "--layers",
        type=int,
        help="the preset model's layers (default: the preset's): a VM faster than the one the step preset was sized "
        "on needs more to bring its decode steps at batch 64 back to 20-40 ms",
    )
    parser.add_argument("--model-dir", help="where to build the preset's model (default: a directory per size)")
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset]
    args.load, args.max_num_seqs = preset["load"], preset["max_num_seqs"]
    args.requests = args.requests or preset["requests"]
    args.max_tokens = args.max_tokens or preset["max_tokens"]
    size = dict(preset["size"], **({"layers": args.layers} if args.layers else {}))
    model_dir = args.model_dir or os.path.join(
        tempfile.gettempdir(), "otel-vllm-ascend-llama-{hidden}x{layers}".format(**size)
    )
    tiny_model.build(model_dir, **size)
    log_dir = tempfile.mkdtemp(prefix="otel_vllm_e2e_overhead_")
    rounds = []  # (server set, {variant: result})
    steps = cost = None
    bound: set = set()
    unit = "requests_per_s" if args.load == "short" else "tokens_per_s"
    # Whether the instrumented server shows its processes on /metrics (--disabled-metrics may switch that gauge off).
    patterns = tuple(x.strip() for x in args.disabled_metrics.split(",") if x.strip())
    gauge = not metric_disabled(catalogue.INSTRUMENTED_PROCESSES.seed, patterns)
    for p in range(args.server_sets):
        servers: dict = {}
        try:
            if args.switched:  # one instrumented server measured as all three variants
                one = start(model_dir, "on", log_dir, p, args)
                servers = {variant: one for variant in VARIANTS}
            else:
                for k in range(len(VARIANTS)):  # start order rotates with the set
                    variant = VARIANTS[(k + p) % len(VARIANTS)]
                    servers[variant] = start(model_dir, variant, log_dir, p, args)
            expected = {v: 3 if v == "on" or args.switched else 0 for v in VARIANTS}
            hooked = instrumented_processes(servers, expected, gauge)
            assert hooked == expected, hooked
            if args.recording_off:
                control(servers["on"], "off")
            api = {frozenset(s.api_cores or ()) for s in servers.values()}
            if len(api) == 1 and frozenset() not in api:  # every server bound, alike
                bound = set(next(iter(api)))
                pin(os.getpid(), bound)  # the client shares the API servers' cores
            for server in servers.values():
                wait_idle(server)
            for r in range(args.rounds):
                # Every order of the three in turn: each variant runs first, second and third equally often.
                order = list(itertools.permutations(VARIANTS))[(r + p) % 6]
                result = {}
                for variant in order:
                    number = r
                    if args.switched:  # one server: prompts of its own for each measurement (no prefix-cache hits)
                        switch(servers[variant], variant)
                        number = r * len(VARIANTS) + VARIANTS.index(variant)
                    result[variant] = one_round(servers[variant], args, number)
                    wait_idle(servers[variant])
                rounds.append((p, result))
                print(
                    f"server set {p + 1} round {r + 1:2d}: "
                    + ", ".join(f"{v} {result[v][unit]:8.2f}" for v in VARIANTS)
                    + f" {unit}; on/off {result['on'][unit] / result['off'][unit]:.3f}, "
                    f"control/off {result['control'][unit] / result['off'][unit]:.3f}",
                    flush=True,
                )
            text = servers["on"].scrape()
            steps = (total(text, "vllm:iteration_tokens_total_count"), total(text, "vllm:generation_tokens_total"))
            if p == 0 and not (args.switched or args.recording_off):  # the budget: a server that records
                cost = scrape_cost({True: servers["on"], False: servers["off"]})
        finally:
            for s in {id(s): s for s in servers.values()}.values():
                s.stop()

    def fmt(values, f="{:.3f}"):
        med, (q1, q3), (lo, hi) = quantiles(values)
        return f"{f.format(med)} ({f.format(q1)}–{f.format(q3)}; {f.format(lo)}–{f.format(hi)})"

    print(
        f"\n### End-to-end overhead, preset {args.preset}: model hidden {size['hidden']} x {size['layers']} layers "
        f"(intermediate {size['intermediate']}), {args.load} load of {args.requests} x {args.max_tokens} tokens per "
        f"round and server"
        + (f" ({args.concurrency} in flight)" if args.load == "short" else "")
        + f"; {args.server_sets} server sets x {args.rounds} rounds"
        + (
            f"; {SWITCHED_HEADER}: one instrumented server per set, 'uninstrumented' and 'control' mean its recording "
            "switched off at runtime (hooks stay installed)"
            if args.switched
            else ""
        )
        + (f"; disabled metrics: {args.disabled_metrics}" if args.disabled_metrics else "")
        + (f"; {RECORDING_OFF_HEADER} at runtime once started (hooks installed)" if args.recording_off else "")
        + (f"; untimed scopes: {args.disabled_scopes}" if args.disabled_scopes else "")
        + (
            (
                f"; EngineCores bound to their workers' core(s), API servers and the client to {sorted(bound)}"
                if args.placement == "shared"
                else f"; {APART_HEADER}, EngineCores, API servers and the client on {sorted(bound)}"
            )
            if bound
            else "; EngineCores, API servers and the client not bound"
        )
        + "\n"
    )
    print("Medians (quartiles; min–max) over rounds.\n")
    columns = ("switched off", "recording on") if args.switched else ("uninstrumented", "instrumented")
    print(f"| | {columns[0]} | {columns[1]} | control ({columns[0]}) | on/off per round | control/off per round |")
    print("|---|---:|---:|---:|---:|---:|")
    rows = [("tokens/s", "tokens_per_s", "{:.0f}"), ("requests/s", "requests_per_s", "{:.1f}")] + [
        (f"{k} CPU ms per token", f"{k}_cpu_ms_per_token", "{:.4f}") for k, _ in PROCESS_KINDS
    ]
    for label, key, f in rows:
        col = {v: [res[v][key] for _, res in rounds] for v in VARIANTS}
        ratios = {v: [a / b for a, b in zip(col[v], col["off"]) if b] for v in ("on", "control")}
        print(
            f"| {label} | {fmt(col['off'], f)} | {fmt(col['on'], f)} | {fmt(col['control'], f)} "
            f"| {fmt(ratios['on']) if ratios['on'] else '–'} | {fmt(ratios['control']) if ratios['control'] else '–'} |"
        )
    print()
    per_round = [(p, round_ratios(*(res[v][unit] for v in VARIANTS))) for p, res in rounds]
    for key, what in RATIOS.items():
        if args.switched:
            what = what.replace("uninstrumented", "switched off").replace("instrumented", "recording on")
        by_set: dict = {}
        for p, ratio in per_round:
            by_set.setdefault(p, []).append(ratio[key])
        ratios = [r for rs in by_set.values() for r in rs]
        med = statistics.median(ratios)
        low, high = bootstrap_median_by_set(list(by_set.values()))
        print(
            f"Throughput ratio {what} ({unit}): median {med:.3f}, 95 % interval of the median {low:.3f}–{high:.3f} "
            f"(two-stage bootstrap: server sets, then their rounds); below 1 in {sum(r < 1 for r in ratios)} of "
            f"{len(ratios)} rounds; medians per server set "
            + " ".join(f"{statistics.median(rs):.3f}" for rs in by_set.values())
        )
    if steps:
        print(
            f"Last instrumented server: {steps[0]:.0f} engine steps for {steps[1]:.0f} generated tokens "
            f"(vllm:iteration_tokens_total count, warm-up included): {steps[1] / max(steps[0], 1):.1f} tokens per step"
        )
    if args.load == "batch":
        batch = min(args.requests, args.max_num_seqs)
        # tokens/s at a full batch: one token per request per step
        per_step = [batch / res["off"]["tokens_per_s"] * 1e3 for _, res in rounds]
        step_ms = statistics.median(per_step)
        print(
            f"{columns[0].capitalize()} step time at batch {batch}, from its throughput (prefill included): "
            f"median {step_ms:.1f} ms"
        )
        low, high = STEP_RANGE_MS
        if args.preset == "step" and batch == 64 and not low <= step_ms <= high:
            print(
                f"That is outside the {low}-{high} ms the step preset stands for (this machine is faster or slower "
                f"than the one it was sized on): rerun with --layers {resized_layers(size['layers'], step_ms)}"
            )
    if cost:
        print_scrape_cost(cost)
    print(f"Server logs: {log_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
