"""Section G: the EngineCore's share of a step on real vLLM objects, in one process — a real vLLM
``Scheduler`` (with its real KVCacheManager, requests and profiling scopes) scheduling decode steps
and taking their outputs back (``schedule()`` + ``update_from_output()``), without and with
instrumentation, alternating in blocks in the same process (``instrument()`` / ``uninstrument()``) —
instrumented with every metric (OTEL_VLLM_ASCEND_ENABLED_METRICS=*: the opt-in profiling scopes timed, vLLM's
per-request "schedule: allocate_slots" the largest single item of the EngineCore's share), and with the default
set (the scopes opt-in: only the worker's forward / post-processing scopes timed, none of the scheduler's).

    tox -e bench-e2e -- …      (runs this first)   or:   python benchmarks/real_scheduler.py

Each step is made as the EngineCore makes it (schedule, get_grammar_bitmask right after the step's
execute_model RPC would be sent, update_from_output), and the two parts are reported apart: the
critical path (schedule + update_from_output: the workers wait for it) and the part that overlaps
the workers' compute (get_grammar_bitmask, where the scheduler hook's deferred records run).
Unlike section F's stand-ins, this has vLLM's own call pattern and data: one
"schedule: allocate_slots" profiling scope and one ``allocate_slots`` call per running request, real
SchedulerOutputs for the phase classification, real request objects for the queue states. No model
runs: a step's model output is one sampled token per request. Each block builds a fresh scheduler
with ``batch`` requests (10-token prompts), schedules 20 warm-up steps (prefill, then decode) and
times 128 decode steps; per block, the median step's critical path and the mean overlapped part
are reported (the scheduler hook's records run for 32 steps at once, in one step's
get_grammar_bitmask).
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


def block(model: str, batch: int, timed: int = 128) -> tuple[float, float]:
    """(median critical path, mean overlapped part) per step, µs. The overlapped part is a mean: the
    scheduler hook records 32 steps at once (handlers.scheduler.FLUSH_STEPS), in one step's
    get_grammar_bitmask, so its median would hide the cost. 32 warm-up steps and 128 timed ones
    keep whole batches of 32 inside the timed window."""
    scheduler = build(model, batch)
    steps(scheduler, 32)  # the prefill step, then decode
    critical, overlapped = steps(scheduler, timed)
    return statistics.median(critical) * 1e6, statistics.fmean(overlapped) * 1e6


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


def run_as(instrumentor, context, variant: str, measure):
    """``measure()`` as ``variant``: the hooks installed for it only (and the variable set only while
    they are installed)."""
    if variant == OFF:
        return measure()
    if variant == ON:
        os.environ["OTEL_VLLM_ASCEND_ENABLED_METRICS"] = "*"
    instrumentor.instrument()
    context.set_process("engine_core", "0", "mixed")
    try:
        return measure()
    finally:
        instrumentor.uninstrument()
        os.environ.pop("OTEL_VLLM_ASCEND_ENABLED_METRICS", None)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="16,64,256")
    parser.add_argument("--blocks", type=int, default=6, help="blocks per variant and batch")
    parser.add_argument("--model-dir", default=os.path.join(tempfile.gettempdir(), "otel-vllm-ascend-tiny-llama"))
    args = parser.parse_args(argv)
    # The in-process pipeline: the fast recorder and its /metrics files, no OTLP push.
    os.environ.setdefault("OTEL_METRICS_EXPORTER", "none")
    os.environ.pop("OTEL_VLLM_ASCEND_ENABLED", None)
    os.environ.pop("OTEL_VLLM_ASCEND_DISABLED_SCOPES", None)
    os.environ.pop("OTEL_VLLM_ASCEND_ENABLED_METRICS", None)
    from opentelemetry_instrumentation_vllm_ascend import VllmAscendInstrumentor, context
    from opentelemetry_instrumentation_vllm_ascend.cli.demo import tiny_model

    tiny_model.build(args.model_dir)  # the scheduler's ModelConfig reads the model's config
    instrumentor = VllmAscendInstrumentor()
    # Variants, rotated per block: uninstrumented, instrumented with every metric (the opt-in scopes timed:
    # OTEL_VLLM_ASCEND_ENABLED_METRICS=*, read when the hooks are installed), and the default set.
    variants = (OFF, ON, UNTIMED)
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        results = {v: [] for v in variants}
        block(args.model_dir, batch)  # warm-up
        for i in range(args.blocks):
            for variant in variants[i % 3 :] + variants[: i % 3]:
                results[variant].append(run_as(instrumentor, context, variant, partial(block, args.model_dir, batch)))
        rows.append((batch, results))

    def cell(values):
        return f"{statistics.median(values):.1f} ({min(values):.1f}–{max(values):.1f})"

    def added(results, variant):
        return statistics.median(c for c, _ in results[variant]) - statistics.median(c for c, _ in results[OFF])

    print("\n### G. EngineCore step on a real vLLM Scheduler, µs per step\n")
    print(
        "Per block of 128 decode steps: the median step's critical path and the mean overlapped part; "
        f"median (min–max) over {args.blocks} blocks per variant, the three variants rotating in one process. "
        "Critical path: `schedule()` + `update_from_output()`, the EngineCore's work while the workers wait for "
        "it. Overlapped: `get_grammar_bitmask()`, called right after the step's `execute_model` RPC is sent, "
        "while the workers compute — where the scheduler hook's records run, 32 steps at a time (hence the "
        f"mean). Instrumented: every metric (OTEL_VLLM_ASCEND_ENABLED_METRICS=*), the opt-in profiling scopes "
        f"included (`{UNTIMED_SCOPE}`: once per running request). Default set: the scopes opt-in, so no "
        "scheduler scope is timed.\n"
    )
    print(
        "| batch | critical path, uninstrumented | critical path, instrumented | added | ratio | "
        "critical path, default set | added | overlapped, uninstrumented | overlapped, instrumented | "
        "overlapped, default set |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for batch, results in rows:
        crit = {v: [c for c, _ in results[v]] for v in variants}
        over = {v: [o for _, o in results[v]] for v in variants}
        print(
            f"| {batch} | {cell(crit[OFF])} | {cell(crit[ON])} | {added(results, ON):.1f} | "
            f"{statistics.median(crit[ON]) / statistics.median(crit[OFF]):.3f} | {cell(crit[UNTIMED])} | "
            f"{added(results, UNTIMED):.1f} | {cell(over[OFF])} | {cell(over[ON])} | {cell(over[UNTIMED])} |"
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
