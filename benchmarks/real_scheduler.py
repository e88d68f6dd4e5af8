"""Section G: the EngineCore's share of a step on real vLLM objects, in one process — a real vLLM
``Scheduler`` (with its real KVCacheManager, requests and profiling scopes) scheduling decode steps
and taking their outputs back (``schedule()`` + ``update_from_output()``), without and with
instrumentation (``instrument()`` / ``uninstrument()`` in between) — instrumented with every metric
(OTEL_VLLM_ASCEND_ENABLED_METRICS=*: the opt-in profiling scopes timed, vLLM's per-request
"schedule: allocate_slots" among them), and with the default set (the scopes opt-in: only the worker's
forward / post-processing scopes timed, none of the scheduler's).

    tox -e bench-e2e -- …      (runs this first)   or:   python benchmarks/real_scheduler.py

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
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from functools import partial

from e2e_overhead import bootstrap_median_by_set


def build(model: str, batch: int, blocks: int = 8192):
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

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


def steps(scheduler, n: int) -> tuple[list[float], list[float]]:
    """``n`` steps as the EngineCore makes them: schedule(), then (once the step's execute_model RPC
    would be sent) get_grammar_bitmask(), then update_from_output() with the model's output. Returns
    per step (critical path: schedule + update_from_output, while the workers wait; overlapped: the
    get_grammar_bitmask call, made while the workers would compute)."""
    from vllm.v1.outputs import ModelRunnerOutput

    critical, overlapped = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        out = scheduler.schedule()
        t1 = time.perf_counter()
        scheduler.get_grammar_bitmask(out)
        t2 = time.perf_counter()
        ids = list(out.num_scheduled_tokens)
        model_output = ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=[[7]] * len(ids)
        )
        t3 = time.perf_counter()
        scheduler.update_from_output(out, model_output)
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
    context.set_process("engine_core", "0", "mixed")
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
    args = parser.parse_args(argv)
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
    # Variants, rotated per round: uninstrumented, instrumented with every metric (the opt-in scopes timed:
    # OTEL_VLLM_ASCEND_ENABLED_METRICS=*, read when the hooks are installed), and the default set.
    variants = (OFF, ON, UNTIMED)
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
