"""The metric catalogue: the single source of truth for every metric this package records.

Each entry gives the seed name (the name the design and the incumbent use), kind, unit, buckets,
labels and meaning. From it come the OTel instrument names, the SDK Views that rename instruments to
``vllm_profiling_<seed name>`` (colons kept; ``recording.pipeline`` builds them), the Prometheus exposition
names and ``docs/metrics.md``.

Units: OTLP carries each metric's unit in its ``unit`` field. Prometheus names carry **no unit
suffix** (``vllm_profiling_executor:execute_model:duration_bucket``, not ``…_seconds_bucket``) so
that existing ``vllm_profiling_…`` dashboards keep working; every duration is in seconds, and the
unit is stated in each metric's HELP text and in docs/metrics.md. Counters get ``_total``.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from . import semconv
from .state import STATE

PREFIX = "vllm_profiling_"
#: The prefix our ``PREFIX`` names are served under on /metrics while another writer (ms-service-metric) exports
#: names with ``PREFIX`` in the same exposition (recording/files_reader.py): one name, one writer.
SHARED_PREFIX = "otel_" + PREFIX
INSTRUMENT_PREFIX = "vllm_ascend."

COUNTER = "counter"
HISTOGRAM = "histogram"
GAUGE = "gauge"

# The labels every step-scoped series carries.
STEP_LABELS = ("dp", "role", "phase")

#: ``exception_type`` values of ``rpc_errors`` (anything else is ``other``); see handlers/executor.py.
RPC_EXCEPTION_TYPES = ("timeout", "executor_failed", "worker_failed", "cancelled", "other")

#: Values of ``phase``. prefill/decode/mixed describe the tokens of the step (or, API side, the
#: iteration) a value belongs to; ``idle`` is a step that scheduled none; ``unknown`` a step event
#: whose step could not be told; ``all`` a value not about one step (queue states, KV cache blocks,
#: request-level latencies, work between steps).
PHASES = ("prefill", "decode", "mixed", "idle", "unknown", "all")
ALL = "all"

#: ``role`` from ``kv_transfer_config.kv_role``.
ROLES = MappingProxyType({"kv_producer": "prefill", "kv_consumer": "decode", "kv_both": "mixed", None: "mixed"})

#: Process kinds (label ``process`` and resource attribute ``vllm.process.role``).
PROCESS_KINDS = ("api_server", "engine_core", "worker", "eplb", "unknown")

#: Labels whose value belongs to the recording process, not to the measurement: handlers never pass
#: them; the pipeline adds them, with the process's value, to every series of the metrics that declare
#: them (``targets.process_labels``), in both recorders. ``rank``: the global rank of the worker the
#: process hosts (``WorkerBase.__init__``'s ``rank``: 0 … TP×PP−1 within its engine), so TP and PP
#: workers of one engine never merge into one series; a process hosting no worker adds nothing.
WORKER_LABELS = ("rank",)

#: OpenTelemetry's Prometheus unit suffixes, for the explicitly named (semantic-convention) metrics.
_PROMETHEUS_UNIT_SUFFIXES = MappingProxyType({"s": "_seconds"})


@dataclass(frozen=True)
class MetricSpec:
    seed: str  # e.g. "scheduler:recompute_events"
    kind: str
    unit: str
    description: str
    labels: tuple[str, ...] = STEP_LABELS
    buckets: tuple[float, ...] | None = None
    #: How /metrics merges a gauge over processes (prometheus_client multiprocess mode).
    gauge_mode: str = "livemostrecent"
    #: An explicit exposed name outside the ``vllm_profiling_`` namespace (the OpenTelemetry GenAI semantic
    #: conventions' ``gen_ai.server.*`` metrics): it is the OTel instrument name and what OTLP receives;
    #: ``labels`` are then OTel attribute names (dotted), which /metrics writes with underscores.
    name: str | None = None
    # Which symbols feed it, in which processes it is recorded and so whether it carries the worker's rank are
    # the target table's facts (``targets.py``: ``hooked_symbols``, ``recorded_in``, ``process_labels``).

    @property
    def instrument_name(self) -> str:
        """OTel instrument name (the API forbids ':'; a View restores the seed name)."""
        if self.name:
            return self.name
        return INSTRUMENT_PREFIX + self.seed.replace(":", ".")

    @property
    def exposed_name(self) -> str:
        """The View's name: what OTLP receives and, sanitised, what /metrics shows."""
        return self.name or PREFIX + self.seed

    @property
    def prometheus_name(self) -> str:
        """The sample name on /metrics (counters end in ``_total``; histograms add _bucket/_sum/_count). An
        explicitly named metric follows OpenTelemetry's OTLP→Prometheus naming instead: dots become
        underscores and the unit becomes a suffix (``gen_ai.server.time_to_first_token`` →
        ``gen_ai_server_time_to_first_token_seconds``)."""
        if self.name:
            return self.name.replace(".", "_") + _PROMETHEUS_UNIT_SUFFIXES.get(self.unit, "")
        return self.exposed_name + "_total" if self.kind == COUNTER else self.exposed_name


# -- buckets, per kind of value ---------------------------------------------------------------------
# Sized by the series budget (docs/performance.md "Series budget"): each histogram series costs its bounds + 3
# (+Inf, _sum, _count) per label combination. Durations whose quantiles the dashboards and alerts show keep bounds
# 2-2.5x apart where their values live (a quantile read from a bucket [a, 2.5a] is off by at most 43 % from the
# bucket's middle: (r-1)/(r+1) for neighbouring bounds r apart); sizes, which dashboards show as means
# (``_sum / _count``, exact whatever the buckets), get bounds 4x apart.
#: Engine-internal durations (an engine step, an RPC, a model step, API-side work): 100 µs … 5 s, 1-2.5-5 between
#: 1 ms and 1 s (r ≤ 2.5), 10x below (100 µs … 1 ms) and 5x above (1 … 5 s).
STEP_SECONDS = (0.0001, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
#: Microsecond-scale engine work (a scheduler call, adding or aborting a request, an EPLB map update, a KV
#: transfer call): 10 µs … 1 s, 1-2.5-5 up to 25 ms (r ≤ 2.5), then 100 ms and 1 s.
FINE_SECONDS = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0)
#: vLLM's profiling scopes (``record_function_or_nullcontext``, opt-in: OPT_IN): 1 µs … 1 s, two bounds a decade
#: (1-3, r ≤ 3.3: the order of magnitude of each scope; a "schedule: allocate_slots" scope takes ~8 µs).
SCOPE_SECONDS = (0.000001, 0.000003, 0.00001, 0.00003, 0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0)
#: Per-token latencies (inter-token, time per output token, second token): 1 ms … 5 s (SLO quantiles: unchanged).
TOKEN_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0)
#: Request-level durations (time to first token, a whole generation or chat completion): 10 ms … 10 min.
REQUEST_SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
#: Numbers of requests (batch and queue sizes): 0, then powers of 4 up to 1024 (r = 4).
REQUESTS = (0, 1, 4, 16, 64, 256, 1024)
#: Numbers of tokens (per step, per iteration): 0, 1, then powers of 4 from 8 up to 32768 (r = 4).
TOKENS = (0, 1, 8, 32, 128, 512, 2048, 8192, 32768)

#: The series budget's opt-in families (docs/performance.md "Series budget"): documented and recorded like the rest,
#: but only where OTEL_VLLM_ASCEND_ENABLED_METRICS names them (``environment.disabled_metric_patterns``). Each is
#: fine-grained detail or a near-duplicate of a default family (named here, the reason docs/metrics.md states).
OPT_IN = MappingProxyType(
    {
        "record_function_or_nullcontext": "fine-grained: every profiling scope name x phase (~40 label combinations an "
        "engine, 28 a worker); npu:forward_duration and npu:kernel_launch time the forward pass by default",
        "engine_core:process_engine_step:duration": "near-duplicate of engine_core:engine_core_step:duration (plus "
        "queueing the step's outputs)",
        "async_llm:record_stats:duration": "detail: the time vLLM's own stat loggers take per engine update",
        "scheduler:running_queue_size": "duplicate: the sum over req_phase of running_phase_batch_size",
        "total_tokens": "duplicate: input + output of the same iteration",
        "batch_size": "duplicate on the API server of running_phase_batch_size (and vLLM's vllm:num_requests_running)",
        "waiting_batch_size": "duplicate on the API server of waiting_phase_batch_size (and vLLM's "
        "vllm:num_requests_waiting)",
    }
)

#: Named sets of opt-in families OTEL_VLLM_ASCEND_ENABLED_METRICS accepts besides names and patterns.
#: ``ms-service-metric``: the migration profile — the opt-in families ms-service-metric records by default, so its
#: Grafana dashboard and files keep their series: its dashboard (ms_service_metric/example/
#: MsServiceMetric-grafana-Dashboard.json) queries ``batch_size``, ``waiting_batch_size`` and
#: ``record_function_or_nullcontext``; its handlers record ``total_tokens`` (meta_handlers ``record``) and
#: ``scheduler:running_queue_size`` (``scheduler_scheduler_hooker``); its v1_metrics.yaml names
#: ``engine_core:process_engine_step:duration`` and ``async_llm:record_stats:duration``.
PROFILES = MappingProxyType(
    {
        "ms-service-metric": (
            "record_function_or_nullcontext",
            "batch_size",
            "waiting_batch_size",
            "total_tokens",
            "scheduler:running_queue_size",
            "engine_core:process_engine_step:duration",
            "async_llm:record_stats:duration",
        ),
    }
)

#: The series budget of the default set (docs/performance.md "Series budget"): our series (``vllm_profiling_*``) on
#: one engine's /metrics at TP=1, the worker's included; of those, recorded by one worker (each TP/PP worker adds as
#: many); the time the default set may add to one scrape of a single-engine server. The bench prints all three;
#: tests/e2e/test_catalogue.py checks the first two on a real scrape.
SERIES_BUDGET = 1500
WORKER_SERIES_BUDGET = 600
SCRAPE_BUDGET_MS = 20

#: Distinct ``name`` values of ``record_function_or_nullcontext`` per process; later names are ``other``.
MAX_SCOPE_NAMES = 64

#: ``threshold`` values of ``prefill_over_threshold_count`` (seconds, as label strings).
TTFT_THRESHOLDS = (("5s", 5.0), ("10s", 10.0), ("20s", 20.0))
#: EPLB placements (``phase`` of the per-layer EPLB gauges: the placement in use while the load was
#: collected, the one EPLB computed) and the statistics over MoE layers / EP ranks EPLB gauges give.
EPLB_PLACEMENTS = ("current", "update")
EPLB_STATS = ("mean", "max")


def eplb_hotness_seed(placement: str, stat: str) -> str:
    """The seed of an EPLB cycle's imbalance summary: the one place these names are spelled."""
    return f"eplb:expert_hotness:{placement}_{stat}"


#: The imbalance summaries of an EPLB cycle: each placement's mean and max over MoE layers.
EPLB_HOTNESS_SEEDS = tuple(eplb_hotness_seed(p, s) for p in EPLB_PLACEMENTS for s in EPLB_STATS)


def eplb_layer_load_seed(stat: str) -> str:
    """The seed of an EPLB cycle's per-layer load gauge (``stat`` over EP ranks)."""
    return f"eplb:layer_load:{stat}"


#: ``req_phase`` values: a request still computing its prompt (or recomputing after preemption), or decoding.
REQ_PHASES = ("prefill", "decode")


def _timer(seed, description, buckets=STEP_SECONDS, labels=STEP_LABELS):
    return MetricSpec(seed=seed, kind=HISTOGRAM, unit="s", description=description, labels=labels, buckets=buckets)


def _sizes(seed, unit, description, buckets, labels=STEP_LABELS):
    return MetricSpec(seed=seed, kind=HISTOGRAM, unit=unit, description=description, labels=labels, buckets=buckets)


def _gauge(seed, unit, description, labels=STEP_LABELS):
    return MetricSpec(seed=seed, kind=GAUGE, unit=unit, description=description, labels=labels)


def _counter(seed, unit, description, labels=STEP_LABELS):
    return MetricSpec(seed=seed, kind=COUNTER, unit=unit, description=description, labels=labels)


_API_STEP = STEP_LABELS + ("engine",)
#: What an "iteration" / "chunk" of the API server's per-iteration metrics is when vLLM runs several API
#: servers: an EngineCore sends each API server only its own requests' outputs of a step (vLLM 0.32
#: ``v1/core/sched/scheduler.py:2387-2391``, outputs keyed by ``client_index``).
_SHARE = (
    " With several API servers (--api-server-count > 1, vllm serve's default when --data-parallel-size > 1) "
    "each receives only its own requests' outputs of an engine step: an iteration is then one API server's "
    "share of a step, so the sums over API servers are the engine's totals, and the counts are the steps "
    "times the API servers that had outputs in them."
)

#: The first and largest part of the catalogue; ``CATALOGUE`` (at the end) joins it and the parts below.
CORE_CATALOGUE: tuple[MetricSpec, ...] = (
    # -- exception monitoring ------------------------------------------------------------------------
    _counter(
        "running_to_waiting_count",
        "{preemption}",
        "Running requests the scheduler preempted back to the waiting queue: +1 per "
        "Scheduler._preempt_request call, and per request a scheduler preempts without it (vllm-ascend's "
        "SchedulerDynamicBatch preempts inline), found in SchedulerOutput.preempted_req_ids or at the head of "
        "the waiting queue with status PREEMPTED, and each running request vllm-ascend's DyntraLBScheduler "
        "pauses for load balancing (its KV kept; vLLM records a PREEMPTED event); each preemption once. "
        "reset_prefix_cache's preemptions are not counted.",
    ),
    _counter(
        "scheduler:recompute_events",
        "{event}",
        "Requests whose KV cache was dropped, so that they must redo their prefill: preemptions of requests "
        "with computed tokens (as running_to_waiting_count counts them, DyntraLB's load-balancing pauses, "
        "which keep their KV, excepted), and requests vllm-ascend's "
        "RecomputeScheduler hands back to be recomputed elsewhere (PD decode nodes). An upper bound on "
        "recomputation: a preempted request's blocks go to the prefix cache, and with prefix caching (vLLM's "
        "default) its resume often finds most of them; scheduler:recomputed_tokens counts what is computed "
        "again.",
    ),
    _counter(
        "block_allocate_failures",
        "{failure}",
        "KVCacheManager.allocate_slots calls that found no room (returned None) or raised. Each failed "
        "call counts once, retries after a preemption included.",
    ),
    _counter(
        "rpc_errors",
        "{error}",
        "Failed executor collective_rpc calls (to workers in other processes, or in-process with one "
        "device), blocking or not: a non-blocking call's failure is counted when its future fails. "
        "exception_type is one of " + ", ".join(RPC_EXCEPTION_TYPES) + ".",
        labels=STEP_LABELS + ("exception_type",),
    ),
    _counter(
        "health_check_failed",
        "{failure}",
        "Health checks (GET /health) that found the engine dead: AsyncLLM.check_health raised.",
    ),
    _counter(
        "request_prefill_pending_nums",
        "{event}",
        "Times the scheduler became blocked on capacity: after a step no waiting request can be admitted "
        "(running requests at the admission limit: max_num_seqs on vLLM 0.23, less paused streaming sessions on 0.30; "
        "on 0.32+ max_num_active_seqs "
        "(default max_num_seqs), paused streaming sessions counting against it) while requests wait (as "
        "waiting_phase_batch_size counts them). On 0.34+ a full batch still starts async KV loads "
        "(--max-num-inflight-kv-loads): while async_kv_waiting has requests and vLLM's in-flight load limit "
        "admits another, the scheduler is not blocked. Counted once per episode (on the edge into that state).",
    ),
    MetricSpec(
        seed="instrumented_processes",
        kind=GAUGE,
        unit="{process}",
        description="Live vLLM processes whose metrics reach this endpoint, by process kind "
        "(api_server, engine_core, worker, eplb) and engine dp rank.",
        labels=("process", "dp", "role"),
        gauge_mode="livesum",
    ),
    # -- scheduler (EngineCore) -----------------------------------------------------------------------
    _timer("scheduler:duration", "Duration of one Scheduler.schedule call.", FINE_SECONDS),
    _sizes(
        "scheduler:batch_size",
        "{request}",
        "Requests scheduled in one step (entries of SchedulerOutput.num_scheduled_tokens).",
        REQUESTS,
    ),
    _sizes(
        "scheduler:running_queue_size",
        "{request}",
        "Requests in the running queue after a step was scheduled.",
        REQUESTS,
    ),
    _gauge(
        "scheduler:seqlen:sum",
        "{token}",
        "Context length summed over the requests one step scheduled: "
        "tokens computed before the step plus tokens scheduled in it (the KV the step attends over).",
    ),
    _gauge(
        "scheduler:seqlen:avg",
        "{token}",
        "scheduler:seqlen:sum divided by the number of requests the step scheduled.",
    ),
    _sizes(
        "scheduler:phase_batch_size",
        "{request}",
        "Requests one step scheduled, by req_phase: prefill "
        "(new, resumed after preemption, chunked-prefill continuation, recomputing) or decode.",
        REQUESTS,
        labels=STEP_LABELS + ("req_phase",),
    ),
    _sizes(
        "scheduler:phase_scheduled_tokens",
        "{token}",
        "Tokens one step scheduled, by req_phase.",
        TOKENS,
        labels=STEP_LABELS + ("req_phase",),
    ),
    _counter(
        "scheduler:phase_scheduled_token_counter",
        "{token}",
        "Tokens scheduled, by req_phase (cumulative; a step adds exactly what it scheduled).",
        labels=STEP_LABELS + ("req_phase",),
    ),
    _counter(
        "scheduler:recomputed_tokens",
        "{token}",
        "Tokens computed again after a preemption: at each resume of a preempted request, the tokens it had "
        "computed (or scheduled) before the preemption minus those its resume found already computed (prefix "
        "cache hits). For a request preempted without Scheduler._preempt_request (vllm-ascend's "
        "SchedulerDynamicBatch), the tokens computed before are taken as all of its tokens but the last "
        "sampled one (exact for a decoding request). reset_prefix_cache's preemptions and RecomputeScheduler "
        "hand-backs are not counted. phase: the step the request resumed in.",
    ),
    _sizes(
        "running_phase_batch_size",
        "{request}",
        "Requests in the running queue after a step was "
        "scheduled, by req_phase (prefill while the prompt is not yet computed).",
        REQUESTS,
        labels=STEP_LABELS + ("req_phase",),
    ),
    _sizes(
        "waiting_phase_batch_size",
        "{request}",
        "Waiting requests after a step was scheduled: the "
        "queues vLLM's Scheduler.get_request_counts() counts (waiting plus skipped_waiting on 0.23, plus "
        "kv_holding_waiting on 0.32+: requests waiting with KV blocks, e.g. P/D decode requests waiting for "
        "remote KV, streaming sessions waiting for input; plus async_kv_waiting on 0.34+: requests that may "
        "load their KV asynchronously and have not started). req_phase is always prefill: a waiting request "
        "has not computed its prompt (preemption resets what it had) or waits for its KV.",
        REQUESTS,
        labels=STEP_LABELS + ("req_phase",),
    ),
    _gauge(
        "total_kvcache_blocks",
        "{block}",
        "KV cache blocks of the engine (block_pool.num_gpu_blocks).",
    ),
    _gauge(
        "free_kvcache_blocks",
        "{block}",
        "Free KV cache blocks after the last step was scheduled.",
    ),
    _gauge(
        "allocated_kvcache_blocks",
        "{block}",
        "Allocated KV cache blocks after the last step was scheduled (total - free - the null block).",
    ),
    _timer(
        "scheduler:update_from_output:duration",
        "Duration of Scheduler.update_from_output (turning a step's model output into request outputs).",
        FINE_SECONDS,
    ),
    _timer(
        "scheduler:add_request:duration",
        "Duration of Scheduler.add_request.",
        FINE_SECONDS,
    ),
    # -- engine core loop -----------------------------------------------------------------------------
    _timer(
        "engine_core:engine_core_step:duration",
        "One engine step: schedule, execute, update "
        "(EngineCore.step, or step_with_batch_queue with async scheduling / pipeline parallelism), with the "
        "phase of the step it scheduled; phase idle when it scheduled nothing (an idle DP rank's step returns "
        "before scheduling; a batch-queue call with a full queue only waits for its oldest batch).",
    ),
    _timer(
        "engine_core:process_engine_step:duration",
        "One busy-loop engine step including queueing its "
        "outputs (EngineCoreProc._process_engine_step); phase as engine_core:engine_core_step:duration "
        "(idle when nothing was scheduled in it).",
    ),
    _timer(
        "engine_core:process_input_queue:duration",
        "Time one busy-loop pass spent on client requests "
        "(EngineCoreProc._process_input_queue), excluding the time it blocked idle: waiting for the first "
        "request, and again after each request that left the engine without work (a utility call, an abort). "
        "From vLLM 0.34 the adds, aborts and wake-ups handled while the previous step waited for its output "
        "(EngineCoreProc._wait_for_output) are added to the next pass's value.",
        FINE_SECONDS,
    ),
    # -- executor (EngineCore side) -------------------------------------------------------------------
    _timer(
        "executor:execute_model:duration",
        "From dispatching a step's execute_model RPC until the "
        "replying worker's model runner returned from execute_model: the RPC's transfer, the wait behind "
        "the worker's earlier work, and execute_model's host work (input preparation, launching the forward; "
        "the device may still be computing). The worker stamps that moment on its reply; the value does not "
        "depend on when the engine reads the reply (with async scheduling a step later). One host clock "
        "(CLOCK_MONOTONIC); absent for a worker on another machine, for steps that scheduled no tokens, and "
        "where the worker is not instrumented.",
    ),
    _timer(
        "executor:sample_tokens:duration",
        "From dispatching a step's sample_tokens RPC until its sampled "
        "tokens were on the worker's host, ready to send: without async scheduling, sample_tokens returned "
        "(it waits for the device); with async scheduling and worker processes (MultiprocExecutor), vLLM's "
        "output thread finished get_output (the device-to-host copy was done). Stamped by the worker, "
        "independent of when the engine reads the reply. Absent with async scheduling on the in-process "
        "executor (UniProcExecutor), which fetches the tokens only when the engine reads them, and where "
        "execute_model is absent.",
    ),
    # -- worker / model runner ------------------------------------------------------------------------
    _timer(
        "executor:model_runner_execute_model:duration",
        "Duration of the model runner's execute_model "
        "in the worker (input preparation, forward, post-processing; sampling follows in sample_tokens).",
    ),
    _timer(
        "executor:prepare_inputs:duration",
        "Duration of the model runner's input preparation.",
    ),
    _timer(
        "worker:model_runner_get_output:duration",
        "Duration of an async model runner output's "
        "get_output (async scheduling: waiting for the sampled tokens to reach the host, then building the "
        "output; model runner V1 and the NPU runner: AsyncGPUModelRunnerOutput, V2: AsyncOutput). It runs in "
        "vLLM's output thread while later steps run; phase: the step whose output it is.",
    ),
    _timer(
        "worker:model_inference:duration",
        "Target inference time of one step, the model runner's own "
        "work without scheduling, RPC or output processing. On a device with events (torch.npu / torch.cuda): "
        "device time from an event at the start of execute_model to one at the end of the step (sample_tokens "
        "returned, or execute_model returned the output), read without synchronising — the launched work "
        "itself, also with async scheduling where the host only launches. Without events (CPU): host time of "
        "execute_model plus sample_tokens, which compute synchronously there.",
    ),
    _timer(
        "record_function_or_nullcontext",
        "Duration of one vLLM profiling scope (the with-block of "
        "record_function_or_nullcontext, e.g. 'gpu_model_runner: forward', 'schedule: allocate_slots'); a "
        "block that raised is not recorded. Scheduler scopes carry the phase of the step they scheduled. "
        "Scopes named in OTEL_VLLM_ASCEND_DISABLED_SCOPES are not timed.",
        SCOPE_SECONDS,
        labels=STEP_LABELS + ("name",),
    ),
    _timer(
        "npu:forward_duration",
        "Forward time of one step: the model runner's forward scope, on the "
        "device timeline (device events, read without synchronising) where the device offers events, "
        "otherwise on the host (CPU: the forward computation itself). Model runners with the scope: V1 "
        "(GPU, CPU) and the NPU runner; model runner V2 has none: from vLLM 0.32 its forward runs from "
        "StepTimingCollector.forward_start() to execute_model's return (docs/metrics.md, by execution path).",
    ),
    _timer(
        "npu:kernel_launch",
        "Host time from the start of a step's forward scope to the end of its "
        "post-processing scope: launching the forward and post-processing work (absent on model runner V2, "
        "which has no such scopes and computes the logits while sampling).",
    ),
    _timer(
        "npu:non_forward_duration",
        "worker:model_inference:duration minus npu:forward_duration of the "
        "same step, both on one clock (device events where the device offers them, else the host): the step's "
        "time outside the forward pass. Steps without a forward (scope, or model runner V2's forward mark) are "
        "skipped.",
    ),
    # -- API server -----------------------------------------------------------------------------------
    _sizes(
        "batch_size",
        "{request}",
        "Running requests of an engine, per stats update it sends.",
        REQUESTS,
        labels=_API_STEP,
    ),
    _sizes(
        "waiting_batch_size",
        "{request}",
        "Waiting requests of an engine, per stats update (deferred / skipped "
        "waiting requests included, as in vllm:num_requests_waiting).",
        REQUESTS,
        labels=_API_STEP,
    ),
    _sizes(
        "num_spec_tokens",
        "{token}",
        "Draft tokens verified in one engine step (speculative decoding, after "
        "grammar-invalidated drafts; nothing is recorded for a step without drafts).",
        TOKENS,
        labels=_API_STEP,
    ),
    _sizes(
        "total_tokens",
        "{token}",
        "Prompt plus generated tokens of one iteration, as vLLM's stats count "
        "them: the full prompts of the requests that got their first token in it (prefix-cache hits and earlier "
        "chunks included) plus the tokens generated." + _SHARE,
        TOKENS,
        labels=_API_STEP,
    ),
    _sizes(
        "input",
        "{token}",
        "Full prompt lengths of the requests that got their first token in one iteration "
        "(prefix-cache hits and earlier prefill chunks included)." + _SHARE,
        TOKENS,
        labels=_API_STEP,
    ),
    _sizes("output", "{token}", "Tokens generated in one iteration." + _SHARE, TOKENS, labels=_API_STEP),
    _timer(
        "fine_grained_ttft",
        "Time to first token of each request (as vLLM's vllm:time_to_first_token_seconds, per request).",
        REQUEST_SECONDS,
        labels=_API_STEP,
    ),
    _timer(
        "fine_grained_tpot",
        "Mean time per output token of each finished request with at least two "
        "generated tokens (decode time / (generated tokens - 1)).",
        TOKEN_SECONDS,
        labels=_API_STEP,
    ),
    _timer(
        "second_token_latency",
        "Time from a request's first generated token to its second.",
        TOKEN_SECONDS,
        labels=_API_STEP,
    ),
    _counter(
        "decode_over_1s_count",
        "{output}",
        "Inter-token latencies over 1 s: vLLM takes one per request "
        "output after the first (the time since the request's previous output), so a speculative-decoding "
        "output carrying several tokens counts once; each latency counts once.",
        labels=_API_STEP,
    ),
    _counter(
        "prefill_over_threshold_count",
        "{request}",
        "Requests whose time to first token exceeded "
        f"threshold ({', '.join(name for name, _ in TTFT_THRESHOLDS)}; a request counts once under each threshold "
        "it exceeded).",
        labels=_API_STEP + ("threshold",),
    ),
    _timer(
        "async_llm:record_stats:duration",
        "Duration of StatLoggerManager.record (vLLM's stat loggers for one engine update).",
        labels=_API_STEP,
    ),
    _timer(
        "async_llm:abort_requests:duration",
        "Duration of aborting requests in the engine client (abort_requests_async, awaited).",
        FINE_SECONDS,
    ),
    _timer(
        "engine:async_add_request:duration",
        "Duration of AsyncLLM.add_request (awaited: input processing and sending the request to the engine).",
    ),
    _timer(
        "engine:generate:duration",
        "Duration of AsyncLLM.generate, from the call until its output stream ended (exhausted, failed or closed).",
        REQUEST_SECONDS,
    ),
    _timer(
        "server:create_chat_completion:duration",
        "Duration of a chat completion request, until the "
        "response is complete (a streaming response: until its stream ended).",
        REQUEST_SECONDS,
    ),
    _timer(
        "engine:tokenizer_encode",
        "Duration of InputProcessor.process_inputs: validating and building "
        "the engine request (and tokenizing raw prompts; chat and completion requests arrive already "
        "tokenized by vLLM's renderer).",
    ),
    _timer(
        "output_processor_duration",
        "Duration of OutputProcessor.process_outputs for one chunk of "
        "engine outputs (detokenization, request state updates); phase from the tokens of that chunk." + _SHARE,
        labels=_API_STEP,
    ),
    _sizes(
        "engine_core_outputs_len",
        "{output}",
        "Request outputs in one chunk handed to OutputProcessor.process_outputs." + _SHARE,
        REQUESTS,
        labels=_API_STEP,
    ),
    # -- vllm-ascend: EPLB ------------------------------------------------------------------------------
    # Recorded once per EPLB cycle by the EPLB process (forked from each NPU worker) of EP rank 0, the
    # rank that computes hotness in vllm-ascend; label ``rank`` is that EP rank. On the per-layer gauges
    # ``phase`` is NOT a step phase: ``current`` is the expert placement in use while the load was
    # collected, ``update`` the placement EPLB just computed and stored, evaluated on the same load (before /
    # after the rebalance; a layer whose computed placement EplbWorker rejects as invalid keeps its current
    # one). A layer's imbalance is max / mean over EP ranks of the rank's load, a rank's load being the sum
    # over its expert slots of the expert's hotness divided by the expert's replica count (vllm-ascend's
    # EplbWorker._compute_imbalance); a layer with no load at all counts as 1.0.
    *(
        _gauge(
            eplb_hotness_seed(which, stat),
            "1",
            f"{'Mean' if stat == 'mean' else 'Largest'} over MoE layers of the expert load imbalance "
            f"(eplb:expert_hotness:imbalance) of the {placement}, in the last EPLB cycle. phase=all.",
            labels=STEP_LABELS + ("rank",),
        )
        for which, placement in zip(
            EPLB_PLACEMENTS,
            ("placement in use while the load was collected", "placement EPLB computed, on the same load"),
            strict=True,
        )
        for stat in EPLB_STATS
    ),
    _gauge(
        "eplb:expert_hotness:imbalance",
        "1",
        "Expert load imbalance of one MoE layer in the last EPLB "
        "cycle: max over EP ranks of the rank's load divided by its mean (1.0: balanced; a layer with no "
        "load counts as 1.0). layer: index among the MoE layers, as EPLB numbers them. phase: current "
        "(placement in use while the load was collected) or update (placement EPLB computed; a layer whose "
        "computed placement EPLB rejects as invalid keeps its current one), not the step phase.",
        labels=STEP_LABELS + ("rank", "layer"),
    ),
    *(
        _gauge(
            eplb_layer_load_seed(stat),
            "{token}",
            f"{meaning} of one MoE layer's per-EP-rank load in the "
            "last EPLB cycle: token-to-expert routings counted during load collection, each expert's count "
            "split evenly over its replicas (as eplb:expert_hotness:imbalance counts them). phase: current "
            "or update placement (before / after the rebalance), not the step phase.",
            labels=STEP_LABELS + ("rank", "layer"),
        )
        for stat, meaning in (("mean", "Mean over EP ranks"), ("max", "Maximum over EP ranks (the busiest rank)"))
    ),
    # Worker side (each NPU worker applies a new placement, one MoE layer per step). No ``layer`` label:
    # the work per layer is alike (same expert shapes) and a label would multiply each histogram's series
    # by the MoE layer count (60 layers x ~20 buckets x 3 metrics per worker); eplb:layer_load shows
    # which layer is hot.
    _timer(
        "eplb:expert_weight_update:duration",
        "Host time of a D2DExpertWeightLoader.update_expert_map_and_"
        "weight call that applied one MoE layer of a new expert placement (req.wait() on the D2D transfers' "
        "work handles, then updating the expert map, the log2phy map and the received experts' weights). "
        "Host time, not device time: on device streams wait() makes the stream wait and copy_() is "
        "enqueued, so the call can return before the transfers and copies ran (not measured on NPU). "
        "Calls that found no transfer in flight do nothing and are not recorded. phase=all.",
    ),
    *(
        _timer(
            seed,
            f"Host time of VllmEplbAdaptor.{method} ({meaning}; a device tensor's copy_() is only "
            "enqueued on its stream). phase=all.",
            FINE_SECONDS,
        )
        for seed, method, meaning in (
            ("eplb:expert_map_update:duration", "do_update_expert_map", "one MoE layer's expert map replaced"),
            (
                "eplb:log2phy_map_update:duration",
                "do_update_log2phy_map",
                "one MoE layer's logical-to-physical expert map replaced",
            ),
            (
                "eplb:expert_weight_replace:duration",
                "do_update_expert_weight",
                "one received expert's weights copied into place",
            ),
        )
    ),
    # -- vllm-ascend: NPU workers, memory, utilization -----------------------------------------------------
    *(
        _gauge(
            f"engine:memory:{name}",
            unit,
            f"{meaning} Read once per worker after warm-up (or, when "
            "instrumented after start-up, at its first step) from what the worker stored; absent where the "
            "worker does not store it.",
        )
        for name, unit, meaning in (
            ("total_gb", "GiBy", "Device memory of the worker's device (init_snapshot.total_memory)."),
            (
                "utilization_ratio",
                "1",
                "Configured gpu_memory_utilization (vLLM 0.34+, where it defaults to None: the value vLLM "
                "resolved, cache_config.resolved_gpu_memory_utilization: 1.0 with the extensible KV cache, else "
                "0.92).",
            ),
            ("reserved_gb", "GiBy", "Memory vLLM may use on the device (total × gpu_memory_utilization)."),
            ("weights_gb", "GiBy", "Model weights (model_runner.model_memory_usage)."),
            (
                "kvcache_gb",
                "GiBy",
                "Memory given to the KV cache (available_kv_cache_memory_bytes; where the "
                "size was set explicitly, e.g. VLLM_CPU_KVCACHE_SPACE on CPU: cache_config.kv_cache_memory_bytes; "
                "vLLM 0.34's extensible KV cache, sized after warm-up: the memory its committed blocks hold, "
                "model_runner.extensible_kv_cache.physical_bytes, read when Worker.extend_kv_cache returns).",
            ),
            ("non_torch_gb", "GiBy", "Non-torch memory measured while profiling (NPU workers)."),
            ("activation_gb", "GiBy", "Peak activation memory measured while profiling."),
            ("graph_gb", "GiBy", "Memory of captured NPU graphs (NPU workers)."),
        )
    ),
    _gauge(
        "npu:utilization",
        "%",
        "Utilization of the worker's device (torch_npu's torch.npu.utilization, or "
        "torch.cuda.utilization on CUDA), read at each collection; absent where there is no device or the "
        "API does not answer. device: the device index.",
        labels=STEP_LABELS + ("device",),
    ),
)

# -- KV transfers, KV-cache writes and the exclusive time budget (handlers/kv_transfer.py, handlers/budget.py) --
_KV_LABELS = STEP_LABELS + ("direction", "connector")
#: ``direction`` values: into the KV cache (a load), out of it (a store), to or from another node.
KV_DIRECTIONS = ("h2d", "d2h", "remote")
#: ``stage`` values of ``engine_core:stage_seconds`` (handlers/budget.py says where each begins and ends).
ENGINE_STAGES = ("idle", "input", "schedule", "dispatch", "telemetry", "wait_workers", "update", "output", "other")
#: ``stage`` values of ``api_server:output_loop_stage_seconds``.
API_STAGES = ("wait_engine", "process", "other")
#: ``stage`` values of ``worker:stage_seconds`` (handlers/budget.py says where each begins and ends).
WORKER_STAGES = ("idle", "prepare_inputs", "forward", "wait_sample", "sample", "other")
_KV_CONNECTORS = (
    " connector: the connector's class name. phase: the phase of the worker step that submitted the transfer "
    "(OffloadingConnector queues a store in the step that produced its KV and submits it in the next step)."
)

KV_TRANSFER_CATALOGUE: tuple[MetricSpec, ...] = (
    _counter(
        "kv_transfer:bytes",
        "By",
        "Bytes of KV cache moved by a KV connector, by direction (h2d: loaded into the KV cache, d2h: stored "
        "out of it, remote: to or from another node). ExampleConnector: per layer and request, the tokens of "
        "its slot mapping times the layer's bytes per token (the tensor payload of the safetensors file it "
        "writes or reads). OffloadingConnector: each completed job's transfer_size (what "
        "vllm:kv_offload_{load,store}_bytes count). NixlConnector / MooncakeConnector (remote): the bytes of each "
        "transfer their stats record (vllm:nixl_bytes_transferred; Mooncake's sends). vllm-ascend: its Mooncake "
        "P2P / layerwise connectors' sum(length_list) per batch read or write (remote); AscendStoreConnector: the "
        "sizes of the keys a backend put (d2h) or loaded (h2d)." + _KV_CONNECTORS,
        labels=_KV_LABELS,
    ),
    _counter(
        "kv_transfer:count",
        "{transfer}",
        "KV transfers, by direction: ExampleConnector: one per file written or read (a request's layer); "
        "OffloadingConnector: one per completed job (as vllm:kv_offload_{load,store}_size counts them); "
        "NixlConnector: one per completed transfer handle; MooncakeConnector (vLLM's and vllm-ascend's): one per "
        "batch; AscendStoreConnector: one per key." + _KV_CONNECTORS,
        labels=_KV_LABELS,
    ),
    _timer(
        "kv_transfer:duration",
        "Duration of the KV transfers of one connector call, by direction. ExampleConnector: wall time of "
        "save_kv_layer (the layer's stores) or start_load_kv (the step's loads), which copy synchronously. "
        "OffloadingConnector: the transfer time its worker reports (device time on vLLM's CUDA/XPU worker) of "
        "the jobs one get_finished poll completed, one observation per poll and direction (split by bytes "
        "between phases); vLLM 0.23: per job. NixlConnector: NIXL's own xferDuration of the transfer; "
        "MooncakeConnector (vLLM's and vllm-ascend's), AscendStoreConnector: the wall time of the synchronous "
        "batch call." + _KV_CONNECTORS,
        FINE_SECONDS,
        labels=_KV_LABELS,
    ),
    _timer(
        "kv_transfer:blocking:duration",
        "Host time the worker step spent blocked in a connector's transfer calls, by direction: "
        "ExampleConnector's save_kv_layer and start_load_kv are synchronous, so all of their time blocks; "
        "OffloadingConnector (vLLM 0.32+): the host time of its offloading worker's submit_store (d2h), "
        "submit_load (h2d) and wait (the direction of the jobs waited for) calls made by start_kv_transfers and "
        "handle_preemptions, one observation per call and direction (not measured on vLLM 0.23)." + _KV_CONNECTORS,
        FINE_SECONDS,
        labels=_KV_LABELS,
    ),
    _counter(
        "kv_cache:write_bytes",
        "By",
        "Bytes written into the KV cache by the tokens each step schedules, by req_phase (prefill / decode): "
        "scheduled tokens times the KV bytes per token of the EngineCore's KVCacheConfig (over its attention "
        "groups, page_size_bytes / block_size times the group's layers; a worker's share of the heads under "
        "tensor parallelism). Prompt tokens found in the prefix cache are not scheduled, so not counted.",
        labels=STEP_LABELS + ("req_phase",),
    ),
    MetricSpec(
        seed="engine_core:stage_seconds",
        kind=COUNTER,
        unit="s",
        description="Exclusive time budget of the EngineCore busy loop: seconds spent in each stage, stages "
        "never overlapping, so that their sum is the loop's wall time since it started. stage is one of "
        + ", ".join(ENGINE_STAGES)
        + " (docs/time-budget.md says where each begins). The stage in progress counts up to each collection.",
        labels=("dp", "role", "stage"),
    ),
)
KV_TRANSFER_CATALOGUE += (
    MetricSpec(
        seed="api_server:output_loop_stage_seconds",
        kind=COUNTER,
        unit="s",
        description="Exclusive time budget of the API server's output loop (AsyncLLM's output handler): "
        "wait_engine (awaiting AsyncMPClient.get_output_async: the engine's next outputs, while other "
        "coroutines run), process (OutputProcessor.process_outputs, the same clock readings as "
        "output_processor_duration), other (the rest of the loop: stat logging, aborts, yields between "
        "chunks). Their sum is the loop's wall time since it started; the stage in progress counts up to "
        "each collection.",
        labels=("dp", "role", "stage"),
    ),
)
KV_TRANSFER_CATALOGUE += (
    MetricSpec(
        seed="worker:stage_seconds",
        kind=COUNTER,
        unit="s",
        description="Exclusive time budget of the worker's main thread (the model runner's steps and the waits "
        "between them; host time): seconds spent in each stage, stages never overlapping, so that their sum is "
        "the wall time since the worker's first step. stage is one of "
        + ", ".join(WORKER_STAGES)
        + " (docs/time-budget.md says where each begins, on model runner V2 too from vLLM 0.32). The stage in "
        "progress counts up to each collection.",
        labels=("dp", "role", "stage"),
    ),
)


def _stage_start(seed: str, counter: str) -> MetricSpec:
    """The start gauge of the time budget ``counter`` (named under it: the pattern that disables the
    counter, e.g. ``engine_core:stage_*``, disables it too)."""
    return MetricSpec(
        seed=seed,
        kind=GAUGE,
        unit="s",
        description=f"When the time budget {counter} started, in seconds since the Unix epoch (the system "
        "clock, read once at its first boundary): time() minus this is the wall time its stages sum to, up to "
        "the export interval. The earliest start when several processes share the labels.",
        labels=("dp", "role"),
        gauge_mode="livemin",
    )


#: Each time budget's counter → its start gauge (handlers/budget.py).
STAGE_STARTS = MappingProxyType(
    {
        "engine_core:stage_seconds": "engine_core:stage_start_time",
        "worker:stage_seconds": "worker:stage_start_time",
        "api_server:output_loop_stage_seconds": "api_server:output_loop_stage_start_time",
    }
)
KV_TRANSFER_CATALOGUE += tuple(_stage_start(start, counter) for counter, start in STAGE_STARTS.items())

# -- OpenTelemetry GenAI semantic conventions: server metrics -------------------------------------------------
# ``open-telemetry/semantic-conventions`` docs/gen-ai/gen-ai-metrics.md (status Development): names, units,
# advised bucket boundaries and attributes are the conventions'; these three are exposed under their own
# names, not ``vllm_profiling_*``. On /metrics only with OTEL_VLLM_ASCEND_GENAI_PROMETHEUS=true
# (``environment.genai_prometheus_enabled``); OTLP always carries them.

#: ``gen_ai.provider.name``: vLLM is not one of the conventions' well-known providers (a custom value is allowed).
GENAI_PROVIDER = "vllm"
#: ``gen_ai.operation.name`` by the prefix vLLM's OpenAI server gives a request id (vLLM 0.23-0.33:
#: ``chatcmpl-`` in OpenAIServingChat.create_chat_completion, ``cmpl-`` in OpenAIServingCompletion); any other
#: request (Responses API, offline LLM, other endpoints) carries ``GENAI_OTHER``.
GENAI_OPERATIONS = (("chatcmpl-", "chat"), ("cmpl-", "text_completion"))
GENAI_OTHER = "_OTHER"
GENAI_LABELS = (semconv.GEN_AI_OPERATION_NAME, semconv.GEN_AI_PROVIDER_NAME, semconv.GEN_AI_REQUEST_MODEL)
#: ``error.type`` (request.duration only): the finish reason of a request that vLLM finished as failed.
GENAI_ERROR_TYPES = ("abort", "error")
#: The conventions' advised ExplicitBucketBoundaries.
GENAI_REQUEST_SECONDS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
GENAI_TPOT_SECONDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
GENAI_TTFT_SECONDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)

#: Named bucket sets (the docs' names for them).
BUCKET_SETS = MappingProxyType(
    {
        "step seconds": STEP_SECONDS,
        "fine seconds": FINE_SECONDS,
        "scope seconds": SCOPE_SECONDS,
        "token seconds": TOKEN_SECONDS,
        "request seconds": REQUEST_SECONDS,
        "requests": REQUESTS,
        "tokens": TOKENS,
        "GenAI request seconds": GENAI_REQUEST_SECONDS,
        "GenAI TPOT seconds": GENAI_TPOT_SECONDS,
        "GenAI TTFT seconds": GENAI_TTFT_SECONDS,
    }
)

_GENAI_WHEN = (
    " Recorded when vLLM finishes the request (IterationStats.update_from_finished_request): a request the client "
    "abandoned, which vLLM drops without finishing, is not recorded. gen_ai.operation.name: chat "
    "(/v1/chat/completions), text_completion (/v1/completions), _OTHER (any other entry point); "
    "gen_ai.provider.name: vllm; gen_ai.request.model: the served model name (vLLM's model_name label)."
)


def _genai(name, description, buckets, labels=GENAI_LABELS):
    return MetricSpec(
        seed=name, kind=HISTOGRAM, unit="s", description=description, labels=labels, buckets=buckets, name=name
    )


GENAI_SERVER = (
    _genai(
        semconv.GEN_AI_SERVER_REQUEST_DURATION,
        "GenAI semantic conventions: a request's duration, arrival to its last output — vLLM's "
        "vllm:e2e_request_latency_seconds value, per finished request. error.type: abort or error for a request "
        "vLLM finished so (absent otherwise)." + _GENAI_WHEN,
        GENAI_REQUEST_SECONDS,
        labels=GENAI_LABELS + (semconv.ERROR_TYPE,),
    ),
    _genai(
        semconv.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN,
        "GenAI semantic conventions: a successful request's time per output token after the first, "
        "decode_time / (generated tokens - 1) — vLLM's vllm:request_time_per_output_token_seconds value, for "
        "requests of two tokens or more (vLLM observes 0 for shorter ones)." + _GENAI_WHEN,
        GENAI_TPOT_SECONDS,
    ),
    _genai(
        semconv.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN,
        "GenAI semantic conventions: a successful request's time to first token, arrival to its first token "
        "(queue and prefill) — vLLM's vllm:time_to_first_token_seconds value of that request." + _GENAI_WHEN,
        GENAI_TTFT_SECONDS,
    ),
)

# -- KV connectors' failures and weight offloading (handlers/kv_transfer.py, handlers/memory.py) ------------------
KV_CONNECTOR_CATALOGUE: tuple[MetricSpec, ...] = (
    _counter(
        "kv_transfer:failures",
        "{transfer}",
        "KV transfers a connector reported as failed, by direction and connector: NixlConnector's "
        "record_failed_transfer (a transfer handle that ended in neither DONE nor PROC, or a read that could not be "
        "posted; vLLM 0.32+'s vllm:nixl_num_failed_transfers also counts failed handshakes and notifications, "
        "these do not), MooncakeConnector's record_failed_transfer (a failed send) and record_failed_recv (a "
        "request whose remote KV load failed), vllm-ascend's Mooncake batch reads / writes that returned a negative "
        "code, AscendStore keys a get did not load, and (vLLM 0.34+) OffloadingConnector jobs its worker reported "
        "failed (OffloadingWorkerMetadata.failed_jobs: h2d loads, d2h stores). Only connectors that report "
        "failures are counted: see docs/time-budget.md." + _KV_CONNECTORS,
        labels=_KV_LABELS,
    ),
)
KV_CONNECTOR_CATALOGUE += (
    _gauge(
        "memory:weight_offload_bytes",
        "By",
        "Bytes of model weights a weight offloader keeps in host memory instead of the device (vLLM's "
        "--cpu-offload-gb / --offload-backend), per worker: UVAOffloader's cpu_offload_bytes after each "
        "wrap_modules (0 on vLLM's CPU build, whose parameters are already on CPU), PrefetchOffloader's and "
        "vllm-ascend's NPUPrefetchOffloader's total_offloaded_bytes after post_init. offloader: its class name. "
        "The host-to-device copies of offloaded weights are not counted (docs/time-budget.md says why).",
        labels=STEP_LABELS + ("offloader",),
    ),
)

# -- the package's own health (hooks/handler.py report, exported at each collection) ---------------------------
#: Labels of ``hook_errors``: the recording process's kind and engine, the hook (the hooked symbol's qualname, as
#: the target table or a hook file names it; bounded by them) and the place in its handler that failed (a fixed
#: string in the handler's code: ``before``, ``after``, ``error``, … or the name of the read that failed).
HOOK_ERROR_LABELS = ("process", "dp", "role", "hook", "where")
#: Labels of ``traces_dropped``: the API server's dp and role, and why the traces were lost.
TRACES_DROPPED_LABELS = ("dp", "role", "reason")
SELF_CATALOGUE: tuple[MetricSpec, ...] = (
    _counter(
        "hook_errors",
        "{failure}",
        "Failures of this package's hook handlers: +1 each time a handler (or one guarded read in it) raised. vLLM "
        "ran on unaffected and the original function ran once; what that handler (or read) records is missing for "
        "that call. hook: the hooked symbol (e.g. Scheduler.schedule); where: the place that failed (before, "
        "after, error, timed, future_done, collection, or the name of a read). The first failure of each (hook, "
        "where) is logged with its traceback. Absent while nothing fails (docs/deploy.md#vllmascendhookdegraded).",
        labels=HOOK_ERROR_LABELS,
    ),
)
#: The request traces' own health (recording/traces.py; docs/traces.md).
TRACES_CATALOGUE: tuple[MetricSpec, ...] = (
    _counter(
        "traces_dropped",
        "{request}",
        "Requests whose trace was lost (OTEL_VLLM_ASCEND_TRACES=true, docs/traces.md): reason inflight_full (more "
        "requests in flight than OTEL_VLLM_ASCEND_TRACES_MAX_INFLIGHT: the request was not followed), queue_full "
        "(more finished traces waiting for export than OTEL_BSP_MAX_QUEUE_SIZE) or export_failed (the exporter "
        "reported a failure). Requests that sampling did not keep are not counted. Absent while none is lost. From an "
        "EngineCore (OTEL_VLLM_ASCEND_STEP_TRACES=true, docs/steps.md): kept steps whose trace was lost.",
        labels=TRACES_DROPPED_LABELS,
    ),
)
#: The per-step records' own health (recording/step_records.py; docs/steps.md).
STEPS_CATALOGUE: tuple[MetricSpec, ...] = (
    _counter(
        "step_record_dropped",
        "{record}",
        "Per-step records lost (docs/steps.md; a sink on: OTEL_VLLM_ASCEND_STEPS_ZMQ, OTEL_VLLM_ASCEND_STEPS_FILE or "
        "OTEL_VLLM_ASCEND_STEPS_OTLP_LOGS), per EngineCore: reason queue_full (more completed steps waiting for the "
        "background thread than OTEL_VLLM_ASCEND_STEPS_QUEUE: the step was not slowed, its record not kept), "
        "zmq_full (a subscriber lagged OTEL_VLLM_ASCEND_STEPS_ZMQ_HWM messages behind: not sent), file_error (the "
        "JSON-lines write failed), otlp_full (OTEL_BLRP_MAX_QUEUE_SIZE records already waiting for the OTLP log "
        "exporter), otlp_error (the OTLP log exporter reported a failure) or "
        "incomplete (a step whose update_from_output never returned, or whose record could not be built). Absent "
        "while none is lost.",
        labels=TRACES_DROPPED_LABELS,
    ),
)
#: Every metric of the catalogue: its parts, in this order.
CATALOGUE: tuple[MetricSpec, ...] = (
    CORE_CATALOGUE
    + KV_TRANSFER_CATALOGUE
    + GENAI_SERVER
    + KV_CONNECTOR_CATALOGUE
    + TRACES_CATALOGUE
    + STEPS_CATALOGUE
    + SELF_CATALOGUE
)
#: Metrics about the package itself, fed by no row of the target table: every process that runs hooks records
#: them (``targets.recorded_in``), and a worker's carry its rank.
SELF_SEEDS = tuple(spec.seed for spec in SELF_CATALOGUE)

BY_SEED = {spec.seed: spec for spec in CATALOGUE}
#: What one EPLB cycle (EplbWorker.do_update) sets.
EPLB_CYCLE_SEEDS = (
    *EPLB_HOTNESS_SEEDS,
    "eplb:expert_hotness:imbalance",
    *(eplb_layer_load_seed(s) for s in EPLB_STATS),
)

RUNNING_TO_WAITING = BY_SEED["running_to_waiting_count"]
RECOMPUTE_EVENTS = BY_SEED["scheduler:recompute_events"]
RECOMPUTED_TOKENS = BY_SEED["scheduler:recomputed_tokens"]
BLOCK_ALLOCATE_FAILURES = BY_SEED["block_allocate_failures"]
RPC_ERRORS = BY_SEED["rpc_errors"]
INSTRUMENTED_PROCESSES = BY_SEED["instrumented_processes"]
HOOK_ERRORS = BY_SEED["hook_errors"]
TRACES_DROPPED = BY_SEED["traces_dropped"]
STEP_RECORD_DROPPED = BY_SEED["step_record_dropped"]
#: Every catalogue entry by its seed, a short alias of ``BY_SEED``: ``catalogue.M["scheduler:duration"]``.
M = BY_SEED


def defined() -> tuple:
    """Every metric this process knows now: the catalogue's and those users' hook files declared."""
    return (*CATALOGUE, *EXTRA.values())


SCOPE_NAME = "opentelemetry_instrumentation_vllm_ascend"

#: Metrics declared at run time (users' hook files: wiring/userfile.py): named, exported and given
#: Views like catalogue entries, but not part of the catalogue (nor of docs/metrics.md). Kept in
#: ``STATE.extra_metrics`` (a registration: see ``state``).
EXTRA: dict[str, MetricSpec] = STATE.extra_metrics
