"""The metric catalogue: the single source of truth for every metric this package records.

Each entry gives the seed name (the name the design and the incumbent use), kind, unit, buckets,
labels and meaning. From it come the OTel instrument names, the SDK Views that rename instruments to
``vllm_profiling_<seed name>`` (colons kept), the Prometheus exposition names and ``docs/metrics.md``.

Units: OTLP carries each metric's unit in its ``unit`` field. Prometheus names carry **no unit
suffix** (``vllm_profiling_executor:execute_model:duration_bucket``, not ``…_seconds_bucket``) so
that existing ``vllm_profiling_…`` dashboards keep working; every duration is in seconds, and the
unit is stated in each metric's HELP text and in docs/metrics.md. Counters get ``_total``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PREFIX = "vllm_profiling_"
INSTRUMENT_PREFIX = "vllm_ascend."

COUNTER = "counter"
HISTOGRAM = "histogram"
GAUGE = "gauge"

# The labels every step-scoped series carries.
STEP_LABELS = ("dp", "role", "phase")

#: ``exception_type`` values of ``rpc_errors`` (anything else is ``other``); see handlers/executor.py.
RPC_EXCEPTION_TYPES = ("timeout", "executor_failed", "worker_failed", "cancelled", "other")

#: Values of ``phase`` for step-scoped series. prefill/decode/mixed describe the tokens the step
#: scheduled; ``idle`` is a step that scheduled none; ``unknown`` an event outside any scheduling step.
PHASES = ("prefill", "decode", "mixed", "idle", "unknown")

#: ``role`` from ``kv_transfer_config.kv_role``.
ROLES = {"kv_producer": "prefill", "kv_consumer": "decode", "kv_both": "mixed", None: "mixed"}

#: Process kinds (label ``process`` and resource attribute ``vllm.process.role``).
PROCESS_KINDS = ("api_server", "engine_core", "worker", "eplb", "unknown")


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
    #: Where the value is recorded, for docs: (process, hooked symbol).
    recorded_in: str = ""
    hooked: tuple[str, ...] = field(default_factory=tuple)

    @property
    def instrument_name(self) -> str:
        """OTel instrument name (the API forbids ':'; a View restores the seed name)."""
        return INSTRUMENT_PREFIX + self.seed.replace(":", ".")

    @property
    def exposed_name(self) -> str:
        """The View's name: what OTLP receives and, sanitised, what /metrics shows."""
        return PREFIX + self.seed

    @property
    def prometheus_name(self) -> str:
        """The sample name on /metrics (counters end in ``_total``; histograms add _bucket/_sum/_count)."""
        return self.exposed_name + "_total" if self.kind == COUNTER else self.exposed_name


CATALOGUE: tuple[MetricSpec, ...] = (
    MetricSpec(
        seed="running_to_waiting_count",
        kind=COUNTER,
        unit="{preemption}",
        description="Running requests the scheduler preempted back to the waiting queue "
        "(+1 per Scheduler._preempt_request call while scheduling; reset_prefix_cache is not counted).",
        recorded_in="engine_core",
        hooked=("vllm.v1.core.sched.scheduler:Scheduler._preempt_request",),
    ),
    MetricSpec(
        seed="scheduler:recompute_events",
        kind=COUNTER,
        unit="{event}",
        description="Preemptions that threw away computed KV cache, so the request's tokens must be "
        "computed again when it resumes (vLLM v1 has no swap: every preemption of a request with "
        "computed tokens).",
        recorded_in="engine_core",
        hooked=("vllm.v1.core.sched.scheduler:Scheduler._preempt_request",),
    ),
    MetricSpec(
        seed="block_allocate_failures",
        kind=COUNTER,
        unit="{failure}",
        description="KVCacheManager.allocate_slots calls that found no room (returned None) or raised. "
        "Each failed call counts once, retries after a preemption included.",
        recorded_in="engine_core",
        hooked=("vllm.v1.core.kv_cache_manager:KVCacheManager.allocate_slots",),
    ),
    MetricSpec(
        seed="rpc_errors",
        kind=COUNTER,
        unit="{error}",
        description="Failed executor collective_rpc calls (to workers in other processes, or in-process "
        "with one device), blocking or not: a non-blocking call's failure is counted when its future "
        "fails. exception_type is one of "
        + ", ".join(RPC_EXCEPTION_TYPES) + ".",
        labels=STEP_LABELS + ("exception_type",),
        recorded_in="engine_core",
        hooked=(
            "vllm.v1.executor.multiproc_executor:MultiprocExecutor.collective_rpc",
            "vllm.v1.executor.uniproc_executor:UniProcExecutor.collective_rpc",
        ),
    ),
    MetricSpec(
        seed="instrumented_processes",
        kind=GAUGE,
        unit="{process}",
        description="Live vLLM processes whose metrics reach this endpoint, by process kind "
        "(api_server, engine_core, worker, eplb) and engine dp rank.",
        labels=("process", "dp", "role"),
        gauge_mode="livesum",
        recorded_in="every process",
        hooked=(
            "vllm.v1.engine.async_llm:AsyncLLM.__init__",
            "vllm.v1.executor.abstract:Executor.__init__",
            "vllm.v1.worker.worker_base:WorkerBase.__init__",
        ),
    ),
)

BY_SEED = {spec.seed: spec for spec in CATALOGUE}

RUNNING_TO_WAITING = BY_SEED["running_to_waiting_count"]
RECOMPUTE_EVENTS = BY_SEED["scheduler:recompute_events"]
BLOCK_ALLOCATE_FAILURES = BY_SEED["block_allocate_failures"]
RPC_ERRORS = BY_SEED["rpc_errors"]
INSTRUMENTED_PROCESSES = BY_SEED["instrumented_processes"]


def views():
    """SDK Views: rename each instrument to its catalogue name, fix its buckets, and keep only the
    catalogue's labels (bounded cardinality whatever a handler passes)."""
    from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

    result = []
    for spec in CATALOGUE:
        aggregation = None
        if spec.kind == HISTOGRAM:
            aggregation = ExplicitBucketHistogramAggregation(list(spec.buckets or ()), record_min_max=True)
        kwargs = {"aggregation": aggregation} if aggregation is not None else {}
        result.append(
            View(
                instrument_name=spec.instrument_name,
                meter_name=SCOPE_NAME,
                name=spec.exposed_name,
                description=spec.description,
                attribute_keys=set(spec.labels),
                **kwargs,
            )
        )
    return result


SCOPE_NAME = "opentelemetry_instrumentation_vllm_ascend"
