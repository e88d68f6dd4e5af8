"""Drive whichever vLLM ``import vllm`` finds — its real ``Scheduler`` (with its real KVCacheManager and
requests), in this process — under a preempting load, with the package instrumented (``instrument()``,
every metric on), and print one JSON object: what our metrics recorded and vLLM's own accounting of the
same steps. Run by tests/contract/test_real_scheduler_versions.py in a subprocess whose ``PYTHONPATH`` puts a
release's unpacked ``vllm/`` (and a ``vllm-<version>+cpu.dist-info`` beside it) ahead of the installed
vLLM, so another release's pure-Python scheduler runs beside the installed CPU torch.

    python tests/support/real_scheduler_run.py MODEL_DIR [--triton]

``--triton``: set ``vllm.triton_utils.HAS_TRITON`` before the config is built (vLLM 0.34 refuses an x86
CPU without triton-cpu when it builds the config; the Scheduler never uses Triton).

The oracle, computed from vLLM's objects only (never from our code): per step, the requests each
SchedulerOutput scheduled, split into prefill work (new requests — on 0.34 resumed ones too — cached
requests resumed after a preemption, cached requests with no output yet, and cached requests with more
than one uncomputed token before the step, read from the ``Request`` objects before ``schedule()``) and
decodes (the rest), with the tokens each was scheduled; ``get_request_counts()`` and the admission limit
after ``schedule()``; the preemptions as each request counts them (``num_preemptions``), as the outputs
report them (``preempted_req_ids``), as its event records say (``PREEMPTED`` events of the
EngineCoreOutputs ``update_from_output`` returns) and as its ``vllm:num_preemptions`` counter counts those
(its frontend's ``IterationStats.update_from_events``); the tokens each resumed request computes again (its
computed tokens when it was preempted: no prefix caching).
"""

from __future__ import annotations

import dataclasses
import json
import sys

BLOCKS = 16
BLOCK_SIZE = 16
REQUESTS = 8
PROMPT = 30
MAX_TOKENS = 40


def vllm_config(model_path: str, additional_config: dict | None = None, pipeline_parallel_size: int = 1):
    """The VllmConfig of the load: 16 KV blocks of 16 tokens, 6 requests at most running, chunked prefill,
    no prefix caching (``additional_config``: vllm-ascend's options; ``pipeline_parallel_size`` as given)."""
    from vllm.config import CacheConfig, ModelConfig, ParallelConfig, SchedulerConfig, VllmConfig

    model_config = ModelConfig(model=model_path, dtype="float32", max_model_len=256, skip_tokenizer_init=True)
    scheduler_config = SchedulerConfig(
        max_num_seqs=6,
        max_num_batched_tokens=128,
        max_model_len=256,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
    )
    cache_config = CacheConfig(block_size=BLOCK_SIZE, cache_dtype="auto", enable_prefix_caching=False)
    cache_config.num_gpu_blocks = BLOCKS
    extra: dict = {}
    if additional_config is not None:
        extra["additional_config"] = additional_config
    if pipeline_parallel_size != 1:
        extra["parallel_config"] = ParallelConfig(pipeline_parallel_size=pipeline_parallel_size)
    return VllmConfig(model_config=model_config, scheduler_config=scheduler_config, cache_config=cache_config, **extra)


def build(model_path: str, config=None, cls=None):
    """A scheduler of class ``cls`` (vLLM's ``Scheduler`` as its module binds it now) over ``config``
    (``vllm_config(model_path)``), with a KV cache of ``BLOCKS`` blocks."""
    import torch
    from vllm.v1.core.sched import scheduler as scheduler_module
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    config = config if config is not None else vllm_config(model_path)
    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=64, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    return (cls or scheduler_module.Scheduler)(
        vllm_config=config,
        kv_cache_config=kv,
        log_stats=True,
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK_SIZE,
    )


def make_request(i: int):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    return Request(
        request_id=f"r{i}",
        prompt_token_ids=[(i * 31 + k * 7) % 400 + 4 for k in range(PROMPT)],
        sampling_params=SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True),
        pooling_params=None,
    )


def model_output(scheduler, output):
    """One sampled token per request that finished its prompt (vLLM 0.34's ModelRunnerOutput has no
    req_id_to_index)."""
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(output.num_scheduled_tokens)
    sampled = []
    for req_id in ids:
        req = scheduler.requests[req_id]
        sampled.append([7] if req.num_computed_tokens >= req.num_tokens else [])
    kwargs = {"req_ids": ids, "sampled_token_ids": sampled}
    if "req_id_to_index" in {f.name for f in dataclasses.fields(ModelRunnerOutput)}:
        kwargs["req_id_to_index"] = {r: i for i, r in enumerate(ids)}
    return ModelRunnerOutput(**kwargs)


def admission_limit(scheduler) -> int:
    limit = getattr(scheduler, "max_num_active_reqs", None)
    if limit is None:
        return scheduler.max_num_running_reqs
    return limit - getattr(scheduler, "num_waiting_for_streaming_input", 0)


def new_oracle() -> dict:
    """The oracle's counts before the first step (``drive`` fills them)."""
    return {
        "steps": {},
        "phase_requests": {"prefill": 0, "decode": 0},
        "phase_tokens": {"prefill": 0, "decode": 0},
        "batch": 0,
        "running": [],
        "waiting": [],
        "blocked_edges": 0,
        "reported_preemptions": 0,
        "preempted_events": 0,
        "recomputed_tokens": 0,
        "recompute_reports": 0,  # requests a SchedulerOutput's recomputed_reqs hands back (vllm-ascend)
        "recomputed_outputs": 0,  # outputs update_from_output finished with stop_reason "recomputed"
        "vllm_num_preemptions": 0,  # vLLM's counter vllm:num_preemptions, as its frontend counts the outputs
        "lb_pauses": 0,  # requests vllm-ascend's DyntraLB paused for load balancing (KV kept, PREEMPTED event)
    }


def drive(scheduler, requests, oracle, plan=None) -> None:
    """Add ``requests`` and run steps until none is left, filling ``oracle``; ``plan(scheduler, step)``, when
    given, runs before each ``schedule()`` (what an engine sets on its scheduler between steps)."""
    from vllm.v1.engine import EngineCoreEventType
    from vllm.v1.metrics.stats import IterationStats, LoRARequestStates, RequestStateStats

    # vLLM's own preemption counter (vllm:num_preemptions): its frontend's IterationStats over each step's outputs.
    lora_states = LoRARequestStates(log_stats=True)
    request_stats: dict = {}

    for r in requests:
        scheduler.add_request(r)
    preempted_at: dict = {}  # request id -> its computed tokens when it was preempted
    blocked = False
    for number in range(2000):
        if not scheduler.has_requests():
            return
        if plan is not None:
            plan(scheduler, number)
        paused = getattr(scheduler, "_lb_paused_req_ids", None)  # vllm-ascend DyntraLB: requests it paused
        paused_before = set(paused or ())
        before = {
            req_id: (r.num_computed_tokens, r.num_tokens, r.num_output_tokens)
            for req_id, r in scheduler.requests.items()
        }
        output = scheduler.schedule()
        if paused is not None:
            oracle["lb_pauses"] += len(set(scheduler._lb_paused_req_ids) - paused_before)
        scheduled = output.num_scheduled_tokens
        new_ids = {r.req_id for r in output.scheduled_new_reqs}
        resumed = getattr(output.scheduled_cached_reqs, "resumed_req_ids", None) or set()
        prefill = [0, 0]
        decode = [0, 0]
        for req_id, tokens in scheduled.items():
            computed, num_tokens, outputs = before[req_id]
            if req_id in new_ids or req_id in resumed or not outputs or computed < num_tokens - 1:
                prefill[0] += 1
                prefill[1] += tokens
            else:
                decode[0] += 1
                decode[1] += tokens
        phase = "idle"
        if prefill[0] and decode[0]:
            phase = "mixed"
        elif prefill[0]:
            phase = "prefill"
        elif decode[0]:
            phase = "decode"
        oracle["steps"][phase] = oracle["steps"].get(phase, 0) + 1
        for key, (reqs, tokens) in (("prefill", prefill), ("decode", decode)):
            if scheduled:
                oracle["phase_requests"][key] += reqs
                oracle["phase_tokens"][key] += tokens
        oracle["batch"] += len(scheduled)
        running, waiting = scheduler.get_request_counts()
        oracle["running"].append(running)
        oracle["waiting"].append(waiting)
        now_blocked = waiting > 0 and running >= admission_limit(scheduler)
        oracle["blocked_edges"] += now_blocked and not blocked
        blocked = now_blocked
        for req_id in output.preempted_req_ids or ():
            oracle["reported_preemptions"] += 1
            preempted_at[req_id] = before[req_id][0]
        for req_id in scheduled:
            if req_id in preempted_at:  # resumed: no prefix caching, all it had computed is computed again
                oracle["recomputed_tokens"] += preempted_at.pop(req_id)
        oracle["recompute_reports"] += len(getattr(output, "recomputed_reqs", None) or ())
        scheduler.get_grammar_bitmask(output)
        engine_outputs = scheduler.update_from_output(output, model_output(scheduler, output))
        iteration = IterationStats()
        for outputs in (engine_outputs or {}).values():
            for out in outputs.outputs:
                oracle["recomputed_outputs"] += out.stop_reason == "recomputed"
                for event in out.events or ():
                    if event.type == EngineCoreEventType.PREEMPTED:
                        oracle["preempted_events"] += 1
                if out.events:
                    stats = request_stats.setdefault(out.request_id, RequestStateStats())
                    iteration.update_from_events(out.request_id, out.events, False, stats, lora_states, None)
        oracle["vllm_num_preemptions"] += iteration.num_preempted_reqs
    raise AssertionError("requests did not finish")


def points(reader) -> dict:
    """{metric: [[attributes], value or [count, sum]]}"""
    out: dict = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for p in metric.data.data_points:
                    value = [p.count, p.sum] if hasattr(p, "bucket_counts") else p.value
                    out.setdefault(metric.name, []).append([dict(p.attributes), value])
    return out


def main() -> None:
    model_path = sys.argv[1]
    if "--triton" in sys.argv:
        import vllm.triton_utils

        vllm.triton_utils.HAS_TRITON = True

    from tests.support.process import instrument_every_metric

    _instrumentor, reader, failures = instrument_every_metric("engine_core")

    import vllm
    from vllm.v1.core.sched.scheduler import Scheduler

    scheduler = build(model_path)
    requests = [make_request(i) for i in range(REQUESTS)]
    oracle = new_oracle()
    drive(scheduler, requests, oracle)
    oracle["num_preemptions"] = sum(r.num_preemptions for r in requests)
    print(
        json.dumps(
            {
                "vllm": vllm.__version__,
                "vllm_file": vllm.__file__,
                "schedule_hooked": Scheduler.schedule.__qualname__ != "Scheduler.schedule"
                or hasattr(Scheduler.schedule, "__wrapped__"),
                "has_resumed_req_ids": "resumed_req_ids" in _fields("vllm.v1.core.sched.output", "CachedRequestData"),
                "oracle": oracle,
                "points": points(reader),
                "failures": failures,
            }
        )
    )


def _fields(module: str, cls: str) -> set:
    import importlib

    return {f.name for f in dataclasses.fields(getattr(importlib.import_module(module), cls))}


if __name__ == "__main__":
    main()
