"""Section G: the EngineCore's share of a step on real vLLM objects, in one process — a real vLLM
``Scheduler`` (with its real KVCacheManager, requests and profiling scopes) scheduling decode steps
and taking their outputs back (``schedule()`` + ``update_from_output()``), without and with
instrumentation (``instrument()`` / ``uninstrument()`` in between) — instrumented with every metric
(OTEL_VLLM_ASCEND_ENABLED_METRICS=*: the opt-in profiling scopes timed, vLLM's per-request
"schedule: allocate_slots" among them), and with the default set (the scopes opt-in: only the worker's
forward / post-processing scopes timed, none of the scheduler's).

    tox -e bench-e2e -- …      (runs this first)   or:   python -m benchmarks.real_scheduler

Each step is made as the EngineCore makes it (schedule, get_grammar_bitmask right after the step's
execute_model RPC would be sent, update_from_output), and the two parts are reported apart: the
critical path (schedule + update_from_output: the workers wait for it) and the part that overlaps
the workers' compute (get_grammar_bitmask, where the scheduler hook's deferred records run).
Unlike section F's stand-ins, this has vLLM's own call pattern and data: one
"schedule: allocate_slots" profiling scope and one ``allocate_slots`` call per running request, real
SchedulerOutputs for the phase classification, real request objects for the queue states. No model
runs: a step's model output is one sampled token per request.

The variants are compared in rounds on the same scheduler (``paired_rounds``): a fresh scheduler's
requests (10-token prompts) are scheduled for 32 warm-up steps, then each round runs every variant
in turn (hooks installed or removed in between, 8 untimed steps, 64 timed ones), in an order that
rotates. The cost of a variant is the median over rounds of its difference to the uninstrumented
steps of the same round, with a bootstrap interval that resamples schedulers, then their rounds: fresh
schedulers differ by more than the hooks cost (their requests land elsewhere in memory), and so does the
machine from minute to minute.

Section G2 runs the same steps under callgrind (``_callgrind``), which counts instructions instead of
timing them: the count does not depend on what else the machine does, so a difference of a fraction of a
percent of the step reads where G's intervals span more than the hooks cost. ``--skip-timed`` leaves G out,
``--skip-instructions`` G2.

Section G3 times our critical-path handlers from inside the same steps (``handler_times``): each handler
method's own time, per step, as the scheduler's work around it leaves the caches. Unlike G's differences
between rounds, these are medians of one quantity, stable to a few percent from run to run on a noisy
machine, so a code change to a handler reads there first. ``--skip-handlers`` leaves it out.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from functools import lru_cache, partial

from benchmarks import _callgrind
from benchmarks.e2e_overhead import bootstrap_median_by_set
from tests.support.process import set_process


@lru_cache
def configs(model: str, batch: int, blocks: int):
    """The VllmConfig and KVCacheConfig of ``build``'s schedulers (reading the model's config once)."""
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    model_config = ModelConfig(model=model, dtype="float32", max_model_len=1024, skip_tokenizer_init=True)
    scheduler_config = SchedulerConfig(
        max_num_seqs=batch,
        max_num_batched_tokens=max(2048, batch * 16),
        max_model_len=1024,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
    )
    cache_config = CacheConfig(block_size=32, cache_dtype="auto", enable_prefix_caching=False)
    cache_config.num_gpu_blocks = blocks
    config = VllmConfig(model_config=model_config, scheduler_config=scheduler_config, cache_config=cache_config)
    spec = FullAttentionSpec(block_size=32, num_kv_heads=1, head_size=64, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    return config, kv


def build(model: str, batch: int, blocks: int = 8192):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    config, kv = configs(model, batch, blocks)
    scheduler = Scheduler(
        vllm_config=config,
        kv_cache_config=kv,
        log_stats=True,
        structured_output_manager=StructuredOutputManager(config),
        block_size=32,
    )
    for i in range(batch):
        scheduler.add_request(
            Request(
                request_id=f"r{i}",
                prompt_token_ids=[(i * 7 + k) % 500 + 4 for k in range(10)],
                sampling_params=SamplingParams(max_tokens=900, ignore_eos=True),
                pooling_params=None,
            )
        )
    return scheduler


def model_output(scheduler_output):
    """The model's output for a step: one sampled token per scheduled request."""
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(scheduler_output.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=[[7]] * len(ids)
    )


def steps(scheduler, n: int) -> tuple[list[float], list[float]]:
    """``n`` steps as the EngineCore makes them: schedule(), then (once the step's execute_model RPC
    would be sent) get_grammar_bitmask(), then update_from_output() with the model's output. Returns
    per step (critical path: schedule + update_from_output, while the workers wait; overlapped: the
    get_grammar_bitmask call, made while the workers would compute)."""
    critical, overlapped = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        out = scheduler.schedule()
        t1 = time.perf_counter()
        scheduler.get_grammar_bitmask(out)
        t2 = time.perf_counter()
        output = model_output(out)
        t3 = time.perf_counter()
        scheduler.update_from_output(out, output)
        t4 = time.perf_counter()
        critical.append(t1 - t0 + t4 - t3)
        overlapped.append(t2 - t1)
    return critical, overlapped


def paired_rounds(instrumentor, context, model: str, batch: int, variants, sets: int, warm: int = 8, timed: int = 64):
    """Per variant, one (median critical path, mean overlapped part) per round, µs. A round runs every
    variant in turn on the same scheduler (the same requests, the same memory), each for ``warm`` steps
    whose timings are dropped (the interpreter specialises the call sites its hooks changed) and
    ``timed`` timed ones; the order rotates from round to round and set to set. Each set is a fresh
    scheduler, built with the hooks installed as the EngineCore builds it, with 32 warm-up steps (the
    prefill step, then decode), and runs as many rounds as its requests' 900 tokens allow. The overlapped
    part is a mean: the scheduler hook records FLUSH_STEPS = 32 steps at once, in one step's
    get_grammar_bitmask (``timed``, a multiple of 32, keeps whole flushes inside the timed steps)."""
    results = {v: [] for v in variants}
    per_round = len(variants) * (warm + timed)
    rounds = max(1, (850 - 32) // per_round)
    for s in range(sets):
        scheduler = run_as(instrumentor, context, UNTIMED, partial(build, model, batch))
        steps(scheduler, 32)
        for r in range(rounds):
            k = (s * rounds + r) % len(variants)
            for variant in variants[k:] + variants[:k]:

                def measure(scheduler=scheduler):
                    steps(scheduler, warm)
                    return steps(scheduler, timed)

                critical, overlapped = run_as(instrumentor, context, variant, measure)
                results[variant].append((statistics.median(critical) * 1e6, statistics.fmean(overlapped) * 1e6))
    return results


def collections(model: str, batch: int, timed: int) -> int:
    """Garbage collections (any generation) during ``timed`` decode steps of a fresh scheduler, after
    32 warm-up steps. vLLM's scheduler allocates and frees in balance, so it triggers next to none;
    hooks that kept objects alive across steps (a deferred record holding its step's output) would."""
    count = [0]

    def on_gc(phase, info):
        if phase == "stop":
            count[0] += 1

    scheduler = build(model, batch)
    steps(scheduler, 32)
    gc.callbacks.append(on_gc)
    try:
        steps(scheduler, timed)
    finally:
        gc.callbacks.remove(on_gc)
    return count[0]


def counted_steps(scheduler, n: int, tag: str) -> None:
    """``steps()`` for callgrind (section G2): the same calls, each part of a step ending at a mark — its
    critical path (``schedule``, ``update_from_output``) as ``tag|i|critical``, the rest (``get_grammar_bitmask``
    and the model output's construction, which no variant changes) as ``tag|i|other``."""
    mark = _callgrind.mark
    gc.collect()
    gc.disable()
    try:
        mark(None)
        for i in range(n):
            out = scheduler.schedule()
            mark(f"{tag}|{i}|critical")
            scheduler.get_grammar_bitmask(out)
            output = model_output(out)
            mark(f"{tag}|{i}|other")
            scheduler.update_from_output(out, output)
            mark(f"{tag}|{i}|critical")
    finally:
        gc.enable()


def count_child(instrumentor, context, model: str, batches, variant: str, warm: int = 40, counted: int = 32) -> None:
    """Under callgrind, one variant: per batch, a fresh scheduler that makes 32 steps uninstrumented (the prefill
    step, then decode), then with the variant's hooks installed ``warm`` steps not counted and ``counted``
    counted. ``counted`` = FLUSH_STEPS: one flush of the scheduler hook's records; the first flush after an
    install, which creates its series again (several times a steady one), falls in the ``warm`` steps."""
    for batch in batches:
        if not _KV_BYTES[0]:  # Scheduler.__init__'s hook reads the KV bytes per token (the same for every batch)
            run_as(instrumentor, context, UNTIMED, partial(build, model, batch))
        scheduler = build(model, batch)
        steps(scheduler, 32)

        def measure(scheduler=scheduler, tag=str(batch)):
            steps(scheduler, warm)
            counted_steps(scheduler, counted, tag)

        run_as(instrumentor, context, variant, measure)
    _callgrind.save()


def count_variants(model: str, batches, seeds, simulate: bool = False) -> dict[tuple[str, int], dict]:
    """``count_child`` under callgrind once per variant and hash seed, as many at a time as there are cores.
    Per (variant, seed): per batch, (median critical path of a step, mean rest of a step) in instructions, and
    with ``simulate`` the median critical path in callgrind's estimated cycles (else None)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(job):
        variant, seed = job
        argv = ["-m", "benchmarks.real_scheduler", "--instructions-child", variant, "--model-dir", model]
        argv += ["--instruction-batches", ",".join(map(str, batches))]
        counts = _callgrind.run(argv, seed=seed, simulate=simulate)
        per_batch = {}
        for batch in batches:
            parts: dict = {}
            for label, (events, _segments) in counts.items():
                b, i, part = label.split("|")
                if int(b) == batch:
                    parts.setdefault(part, []).append(events)
            critical, rest = parts["critical"], parts["other"]
            per_batch[batch] = (
                statistics.median(e["Ir"] for e in critical),
                statistics.fmean(e["Ir"] for e in rest),
                statistics.median(map(_callgrind.estimated_cycles, critical)) if simulate else None,
            )
        return job, per_batch

    jobs = [(variant, seed) for seed in seeds for variant in (OFF, ON, UNTIMED)]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return dict(pool.map(one, jobs))


def instruction_table(model: str, batches, step_us: dict, seeds=(0, 1, 2), simulate: bool = False) -> None:
    """Section G2: ``count_child`` under callgrind, printed per step; ``step_us``: G's median uninstrumented
    critical path per batch in this run (µs), to read the added instructions as time."""
    print("\n### G2. The same steps in instructions (callgrind), per step\n")
    reason = _callgrind.unavailable()
    if reason:
        print(f"Not measured: {reason}.")
        return
    try:
        counts = count_variants(model, batches, seeds, simulate)
    except (OSError, RuntimeError, ValueError) as exc:  # the end-to-end presets still run after this section
        print(f"Not measured: {exc}")
        return
    print(
        "G's steps run under `valgrind --tool=callgrind`, which counts the instructions executed: the same code "
        "and inputs give the same count whatever else the machine does. One process per variant and hash seed "
        f"(PYTHONHASHSEED {', '.join(map(str, seeds))}); per batch, a fresh scheduler makes 32 steps "
        "uninstrumented, then with the variant's hooks 40 steps not counted (the first flush of the scheduler "
        "hook's records, which creates their series, among them) and 32 counted (one steady flush), the garbage "
        "collector paused (G counts its collections). Per process and "
        "batch: the median critical path of the 32 steps (`schedule()` + `update_from_output()`) and the mean "
        "rest (`get_grammar_bitmask()`, where the flush runs, and the model output's construction, which no "
        "variant changes). Added: per seed, a variant's count minus the uninstrumented one of the same seed; "
        "the median over seeds (min–max). The uninstrumented count moves with the seed (dict layouts, and what "
        "the interpreter specialises): its spread over seeds is the resolution. The last column reads the "
        "default set's added critical path at the rate of G's uninstrumented steps in this run (its median µs "
        "over its median instructions): a floor, not a time — the hooks' Python runs on the same interpreter "
        "as the scheduler's, but what they cost in cache misses and mispredicted branches is not counted "
        "(`--simulate` estimates it).\n"
    )
    rows = [("instructions", 0)] + ([("estimated cycles", 2)] if simulate else [])
    print(
        "| batch | count | uninstrumented: critical path / rest | uninstrumented, spread over seeds | every metric: "
        "added critical path / rest | default set: added critical path / rest | default set's share of the "
        "critical path | default set's added critical path at G's rate |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for batch in batches:
        off = {seed: counts[OFF, seed][batch] for seed in seeds}

        def added(variant, part, batch=batch, off=off):
            differences = [counts[variant, seed][batch][part] - off[seed][part] for seed in seeds]
            return statistics.median(differences), min(differences), max(differences)

        def cell(value):
            return f"{value[0]:+,.0f} ({value[1]:+,.0f} … {value[2]:+,.0f})"

        for name, part in rows:
            critical = [values[part] for values in off.values()]
            base = statistics.median(critical)
            on, default = added(ON, part), added(UNTIMED, part)
            share = default[0] / base
            rest = {"base": "", ON: "", UNTIMED: ""}
            if part == 0:  # the rest, in instructions only
                rest = {
                    "base": f" / {statistics.median(values[1] for values in off.values()):,.0f}",
                    ON: f" / {added(ON, 1)[0]:+,.0f}",
                    UNTIMED: f" / {added(UNTIMED, 1)[0]:+,.0f}",
                }
            at_rate = (
                f"{share * step_us[batch]:+.1f} µs (of {step_us[batch]:.0f})" if batch in step_us else "(G not run)"
            )
            print(
                f"| {batch} | {name} | {base:,.0f}{rest['base']} | {max(critical) - min(critical):,.0f} | "
                f"{cell(on)}{rest[ON]} | {cell(default)}{rest[UNTIMED]} | {share * 100:+.2f} % | {at_rate} |"
            )


OFF, ON, UNTIMED = "uninstrumented", "instrumented, every metric", "default set"
UNTIMED_SCOPE = "schedule: allocate_slots"  # what the default set leaves untimed (with the other scheduler scopes)


#: What Scheduler.__init__'s hook found (KV bytes per token), kept across the variants' installs: it
#: runs when a set's scheduler is built, and uninstrument() resets the process's state.
_KV_BYTES = [0]


def run_as(instrumentor, context, variant: str, measure):
    """``measure()`` as ``variant``: the hooks installed for it only (and the variable set only while
    they are installed)."""
    if variant == OFF:
        return measure()
    from opentelemetry_instrumentation_vllm_ascend.state import STATE

    if variant == ON:
        os.environ["OTEL_VLLM_ASCEND_ENABLED_METRICS"] = "*"
    instrumentor.instrument()
    set_process("engine_core", "0", "mixed")
    STATE.kv_bytes_per_token = STATE.kv_bytes_per_token or _KV_BYTES[0]
    try:
        return measure()
    finally:
        _KV_BYTES[0] = STATE.kv_bytes_per_token or _KV_BYTES[0]
        instrumentor.uninstrument()
        os.environ.pop("OTEL_VLLM_ASCEND_ENABLED_METRICS", None)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="16,64,256")
    parser.add_argument("--sets", type=int, default=16, help="fresh schedulers per batch (3 rounds each)")
    parser.add_argument("--model-dir", default=os.path.join(tempfile.gettempdir(), "otel-vllm-ascend-tiny-llama"))
    parser.add_argument("--instruction-batches", default="64,256", help="G2's batches (callgrind: minutes each)")
    parser.add_argument("--seeds", default="0,1,2", help="G2's hash seeds: one callgrind process per variant and seed")
    parser.add_argument("--simulate", action="store_true", help="G2 with simulated caches and branch predictors")
    parser.add_argument("--skip-timed", action="store_true", help="no G (G2 and G3 run)")
    parser.add_argument("--skip-instructions", action="store_true", help="G only (timed)")
    parser.add_argument("--skip-handlers", action="store_true", help="no G3 (the handlers timed from inside)")
    parser.add_argument("--instructions-child", metavar="VARIANT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    # The in-process pipeline: the fast recorder and its /metrics files, no OTLP push.
    os.environ.setdefault("OTEL_METRICS_EXPORTER", "none")
    os.environ.pop("OTEL_VLLM_ASCEND_ENABLED", None)
    os.environ.pop("OTEL_VLLM_ASCEND_DISABLED_SCOPES", None)
    os.environ.pop("OTEL_VLLM_ASCEND_ENABLED_METRICS", None)
    os.environ.pop("OTEL_VLLM_ASCEND_DISABLED_METRICS", None)
    from opentelemetry_instrumentation_vllm_ascend import VllmAscendInstrumentor, context
    from opentelemetry_instrumentation_vllm_ascend.cli.demo import tiny_model

    tiny_model.build(args.model_dir)  # the scheduler's ModelConfig reads the model's config
    instrumentor = VllmAscendInstrumentor()
    counted = [int(b) for b in args.instruction_batches.split(",")]
    if args.instructions_child:
        count_child(instrumentor, context, args.model_dir, counted, args.instructions_child)
        return 0
    step_us, added_us = ({}, {}) if args.skip_timed else timed_table(instrumentor, context, args, batches)
    if not args.skip_handlers:
        handler_table(instrumentor, context, args.model_dir, counted, added_us)
    if not args.skip_instructions:
        seeds = [int(seed) for seed in args.seeds.split(",")]
        instruction_table(args.model_dir, counted, step_us, seeds, args.simulate)
    return 0


#: The default set's handler methods on the EngineCore's critical path (G3), as (module, class, method).
CRITICAL_HANDLERS = (
    ("scheduler", "Schedule", "before"),
    ("scheduler", "Schedule", "after"),
    ("scheduler", "UpdateFromOutput", "before"),
    ("scheduler", "UpdateFromOutput", "after"),
)
#: The hook where the scheduler hook's records run, FLUSH_STEPS steps at a time, off the critical path (G3: its
#: mean per step).
FLUSH_HANDLER = ("scheduler", "GrammarBitmask", "before")
FLUSH_NAME = f"{FLUSH_HANDLER[1]}.{FLUSH_HANDLER[2]}"  # its key in handler_times' result


def timing_shims(methods):
    """Replace each (class, method name) of ``methods`` by a shim that times the original's calls (perf_counter
    around it); returns ({"Class.method": [seconds, …]}, restore). The shim adds its own frame and two clock reads
    to what it times (~0.1 µs)."""
    times: dict = {}
    originals = []
    for cls, name in methods:
        original = cls.__dict__[name]
        calls = times[f"{cls.__name__}.{name}"] = []

        def shim(self, *args, _original=original, _append=calls.append, _clock=time.perf_counter):
            start = _clock()
            try:
                return _original(self, *args)
            finally:
                _append(_clock() - start)

        originals.append((cls, name, original))
        setattr(cls, name, shim)

    def restore() -> None:
        for cls, name, original in originals:
            setattr(cls, name, original)

    return times, restore


def handler_times(
    instrumentor, context, model: str, batch: int, cold: bool = False, sets: int = 8, warm: int = 40, timed: int = 256
):
    """Section G3: the default set's critical-path handler methods (``CRITICAL_HANDLERS``) timed from inside G's
    steps: per fresh scheduler, ``warm`` steps, then per method the median of its calls in ``timed`` steps (µs),
    and for ``FLUSH_HANDLER`` (``timed`` a multiple of 32: whole flushes) the mean per step. ``cold``: a copy of
    section F2's sweep buffer (more than the last-level cache, untimed) before each timed step, as a CPU server's
    forward pass leaves the caches between two engine steps (``_step.cache_sweep``). Returns
    {"Class.method": [value per scheduler, …]}."""
    import importlib

    from benchmarks._step import cache_sweep

    sweep = cache_sweep() if cold else None

    methods = [
        (getattr(importlib.import_module(f"opentelemetry_instrumentation_vllm_ascend.handlers.{module}"), cls), name)
        for module, cls, name in CRITICAL_HANDLERS + (FLUSH_HANDLER,)
    ]
    times, restore = timing_shims(methods)
    per_scheduler: dict = {name: [] for name in times}
    try:
        for _ in range(sets):
            scheduler = run_as(instrumentor, context, UNTIMED, partial(build, model, batch))
            steps(scheduler, 32)

            def measure(scheduler=scheduler):
                steps(scheduler, warm)
                for calls in times.values():
                    calls.clear()
                if sweep is None:
                    steps(scheduler, timed)
                else:
                    for _ in range(timed):
                        sweep()
                        steps(scheduler, 1)

            run_as(instrumentor, context, UNTIMED, measure)
            for name, calls in times.items():
                value = sum(calls) / timed if name == FLUSH_NAME else statistics.median(calls)
                per_scheduler[name].append(value * 1e6)
    finally:
        restore()
    return per_scheduler


def handler_table(instrumentor, context, model: str, batches, added_us: dict) -> None:
    """Section G3, printed; ``added_us``: G's added critical path per batch with the default set, this run (µs)."""
    print("\n### G3. The default set's critical-path handlers timed from inside G's steps, µs per step\n")
    print(
        "Each handler method on the EngineCore's critical path (the hooks of `Scheduler.schedule` and "
        "`update_from_output`) is wrapped in a timer while G's steps run with the default set: per fresh "
        "scheduler (8) the median of its 256 calls after 40 steps, then the median over schedulers (min–max). "
        "The scheduler's own work between the calls leaves them the caches a server's step leaves them, so "
        "these are the handlers' cost in place, not hot in a loop (section A). Not included: the generated "
        "wrappers around them and the scope factory (per request), which G's added time includes; each timer "
        "adds its own frame and two clock reads (~0.1 µs). Last column: the scheduler hook's records, run every "
        "32nd step in `get_grammar_bitmask` while the workers compute (off the critical path; on a CPU server, "
        "on the worker's core), their time over the 256 steps (8 flushes) per step. Cold caches: the same with "
        "a copy of a 48 MiB buffer (more than the last-level cache, untimed) before each of 128 timed steps, as a "
        "CPU server's forward pass leaves the caches between two engine steps (section F2).\n"
    )
    names = [f"{cls}.{method}" for _module, cls, method in CRITICAL_HANDLERS]
    print(
        "| batch | "
        + " | ".join(f"`{name}`" for name in names)
        + " | sum of medians | G: default set's added | off the critical path: the flush "
        + f"(`{FLUSH_NAME}`), mean per step |"
    )
    print("|---:|" + "---:|" * (len(names) + 3))
    for batch, cold in [(batch, cold) for cold in (False, True) for batch in batches]:
        per = handler_times(instrumentor, context, model, batch, cold=cold, timed=128 if cold else 256)
        medians = {name: statistics.median(values) for name, values in per.items()}
        cells = " | ".join(f"{medians[n]:.2f} ({min(per[n]):.2f}–{max(per[n]):.2f})" for n in names)
        g = "" if cold else f"{added_us[batch]:+.1f}" if batch in added_us else "(G not run)"
        critical = sum(medians[n] for n in names)
        flushed = f"{medians[FLUSH_NAME]:.2f} ({min(per[FLUSH_NAME]):.2f}–{max(per[FLUSH_NAME]):.2f})"
        print(f"| {batch}{', cold caches' if cold else ''} | {cells} | {critical:.2f} | {g} | {flushed} |")


def timed_table(instrumentor, context, args, batches) -> tuple[dict[int, float], dict[int, float]]:
    """Section G, printed; per batch, G's median uninstrumented critical path and the default set's added one (µs)."""
    # Variants, rotated per round: uninstrumented, instrumented with every metric (the opt-in scopes timed:
    # OTEL_VLLM_ASCEND_ENABLED_METRICS=*, read when the hooks are installed), and the default set.
    variants = (OFF, ON, UNTIMED)
    rows = []
    for batch in batches:
        rows.append((batch, paired_rounds(instrumentor, context, args.model_dir, batch, variants, args.sets)))

    def cell(values):
        return f"{statistics.median(values):.1f} ({min(values):.1f}–{max(values):.1f})"

    def added(results, variant):
        """Median over rounds of (variant − uninstrumented) in the same round, with its interval."""
        differences = [c - o for (c, _), (o, _) in zip(results[variant], results[OFF])]
        per_set = len(differences) // args.sets  # paired_rounds runs its schedulers one after the other
        low, high = bootstrap_median_by_set([differences[i : i + per_set] for i in range(0, len(differences), per_set)])
        return statistics.median(differences), low, high

    print("\n### G. EngineCore step on a real vLLM Scheduler, µs per step\n")
    rounds = len(rows[0][1][OFF]) if rows else 0
    print(
        "Per variant and round: the median critical path of 64 decode steps and the mean overlapped part; "
        f"{rounds} rounds per batch ({args.sets} fresh schedulers), each running the three variants in turn on "
        "the same scheduler (rotating order; 8 untimed steps after each switch). Critical path: `schedule()` + "
        "`update_from_output()`, the EngineCore's work while the workers wait for it. Overlapped: "
        "`get_grammar_bitmask()`, called right after the step's `execute_model` RPC is sent, while the workers "
        "compute — where the scheduler hook's records run, 32 steps at a time (hence the mean). Added: the "
        "median over rounds of the difference to the same round's uninstrumented steps, with its 95 % interval "
        "(two-stage bootstrap: schedulers, then their rounds). Every metric: OTEL_VLLM_ASCEND_ENABLED_METRICS=*, the "
        "opt-in profiling scopes included "
        f"(`{UNTIMED_SCOPE}`: once per running request). Default set: no scheduler scope timed.\n"
    )
    print(
        "| batch | uninstrumented | every metric | added (95 % interval) | default set | added (95 % interval) | "
        "default set's share of the critical path | overlapped: uninstrumented / every metric / default set |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for batch, results in rows:
        crit = {v: [c for c, _ in results[v]] for v in variants}
        over = {v: statistics.median(o for _, o in results[v]) for v in variants}
        on, default = added(results, ON), added(results, UNTIMED)
        share = default[0] / statistics.median(crit[OFF]) * 100
        print(
            f"| {batch} | {cell(crit[OFF])} | {cell(crit[ON])} | {on[0]:.1f} ({on[1]:.1f} … {on[2]:.1f}) | "
            f"{cell(crit[UNTIMED])} | {default[0]:.1f} ({default[1]:.1f} … {default[2]:.1f}) | {share:+.1f} % | "
            f"{over[OFF]:.1f} / {over[ON]:.1f} / {over[UNTIMED]:.1f} |"
        )
    batch, timed = 64, 2048
    counted = {
        v: run_as(instrumentor, context, v, partial(collections, args.model_dir, batch, timed)) for v in (OFF, ON)
    }
    print(
        f"\nGarbage collections in {timed} decode steps at batch {batch} (after 32 warm-up steps): "
        f"uninstrumented {counted[OFF]}, instrumented {counted[ON]}."
    )
    return {batch: statistics.median(c for c, _ in results[OFF]) for batch, results in rows}, {
        batch: added(results, UNTIMED)[0] for batch, results in rows
    }


if __name__ == "__main__":
    sys.exit(main())
