"""ms-service-metric's handlers (the incumbent this package replaces) and what each becomes here: the one
table hook files (wiring/userfile.py) map ``handler:`` through, and docs/configuration.md ("Incumbent
handlers") is generated from (cli/docgen.py). Nothing a file names is imported or run: a handler is
known by its name only.

Sources: ms-service-metric master (GitHub mirror Cztk5380/msserviceprofiler, commit cf79a1ce, 2026-06-13),
ms_service_metric/adapters/vllm/handlers/{metric_handlers,meta_handlers}.py and handlers/builtin.py; its
26.0.0 release (commit 59503858); and the older msServiceProfiler paths of the same handlers,
ms_service_profiler/patcher/vllm/handlers/v1/{metric_handlers,meta_handlers}.py, whose other handler modules
(batch, kvcache, model, request, mtp; v0; SGLang) write trace spans, not metrics.

The in-tree incumbent of vllm-ascend 0.30.0rc2 (its sdist: ``setup.py`` registers the ``ms_service_metric.providers``
entry point ``vllm-ascend = vllm_ascend.observability:get_metric_provider``, whose hook files are
``vllm_ascend/observability/config/{base,eplb}_metrics.yaml``) names two more handler modules:
``ms_service_metric.provider_handlers`` (ms-service-metric master, github.com/Ascend/msserviceprofiler commit
4439a0e4: a lazy re-export, by the same name, of five of the handlers above, and only those; the 26.0.0 wheel has no
``provider_handlers``, no ``provider_api`` and no provider discovery, so under 26.0.0 the provider is never loaded)
and ``vllm_ascend.observability.handlers`` (vllm-ascend's own copy of the EPLB hotness handler, on ``provider_api``).

How the incumbent runs an entry (core/handler.py ``MetricHandler.get_hook_func``): with ``metrics:``, the
handler is called as a *factory* ``handler(metrics, is_async=...)`` that returns the hook; without, the
handler is the hook. So a handler that records the entry's metrics (``phase_all_handler``, the
``*_phase_handler`` family, ``default_handler``) only chooses the ``phase`` label of those metrics; a handler
with fixed metrics of its own records nothing when given ``metrics:`` (its factory call fails and the hook
passes through)."""

from __future__ import annotations

from dataclasses import dataclass

from .. import catalogue

#: Where the incumbent's handlers live: its current package, and the older msServiceProfiler's.
CURRENT = "ms_service_metric.adapters.vllm.handlers."
OLDER = "ms_service_profiler.patcher.vllm.handlers.v1."
OLDER_V0 = "ms_service_profiler.patcher.vllm.handlers.v0."
OLDER_SGLANG = "ms_service_profiler.patcher.sglang.handlers."
GENERIC = "ms_service_metric."
#: ms-service-metric's stable re-exports for framework providers (``module:function`` prefix; see ``Handler.also``).
PROVIDER = "ms_service_metric.provider_handlers:"
#: vllm-ascend's own handlers, which its provider (vllm-ascend >= 0.30) hands to ms-service-metric.
ASCEND_OWN = "vllm_ascend.observability."

#: Fates of a handler here.
BUILT_IN = "built-in"  # records fixed metrics of its own: the built-in hooks of this package record them
IDENTITY = "identity"  # sets dp / role (no metric): every hook here takes them from the process identity
METRICS = "metrics"  # records the entry's ``metrics:`` (it only chooses their phase): they load as without it
SELECT = "select"  # records those of the entry's ``metrics:`` it knows by name, each from a fixed value
REJECTED = "rejected"  # records nothing this package can record: the reason says what to write instead

#: The expression the incumbent's value of a SELECT metric that is not a built-in one amounts to.
GIB = "1073741824"

STEP_PHASE = "the phase of the step most recently scheduled in its process (`unknown` where none is)"


@dataclass(frozen=True)
class Handler:
    """One incumbent handler (``names`` under each of ``packages``: ``module:function``, ``module:*`` for all of a
    module's) and its fate here. ``here``: our built-in that measures it (BUILT_IN, IDENTITY), what happens to
    the entry's metrics (METRICS, SELECT), or why not and what to write instead (REJECTED). ``records``: the
    seeds its fixed metrics are (BUILT_IN). ``phase``: the ``phase`` label it gives the entry's metrics
    (METRICS). ``values``: ``(metric name, expr)`` it records by name (SELECT; expr ``""``: a built-in metric).
    ``differences``: what differs from the incumbent, in words. ``also``: whole ``module:function`` paths of the
    same function under another name (``ms_service_metric.provider_handlers`` re-exports it unchanged)."""

    names: tuple[str, ...]
    packages: tuple[str, ...]
    fate: str
    here: str
    records: tuple[str, ...] = ()
    phase: str = ""
    values: tuple[tuple[str, str], ...] = ()
    differences: tuple[str, ...] = ()
    also: tuple[str, ...] = ()

    def paths(self) -> tuple[str, ...]:
        return tuple(package + name for package in self.packages for name in self.names) + self.also

    def matches(self, path: str) -> bool:
        for full in self.paths():
            if full.endswith(":*") and path.startswith(full[:-1]) or full == path:
                return True
        return False


_BOTH = (CURRENT, OLDER)
_KV_BLOCKS = ("total_kvcache_blocks", "free_kvcache_blocks", "allocated_kvcache_blocks")
_MEMORY = (
    "total_gb",
    "utilization_ratio",
    "reserved_gb",
    "weights_gb",
    "kvcache_gb",
    "non_torch_gb",
    "activation_gb",
    "graph_gb",
)
#: What differs for the EPLB hotness gauges from the incumbent's handler (ms-service-metric's and vllm-ascend's copy).
_EPLB_HOTNESS = (
    "the incumbent reads `latest_expert_hotness` of EP rank 0 after the call and records nothing where it is "
    "missing; here rank 0 records vllm-ascend's lists where the call set them, else the same arithmetic on the "
    "gathered load and the old / new placements",
    "a MoE layer without load: `eplb:expert_hotness:imbalance` 1.0 here (and so counted in the means and maxima); "
    "the incumbent records vllm-ascend's NaN",
    'a layer whose computed placement EplbWorker refuses: `eplb:expert_hotness:imbalance{phase="update"}` and the '
    "update summaries are of the placement kept; the incumbent records vllm-ascend's value for the refused one",
)
_TIMER_INSTEAD = "to time the symbol, write `metrics: [{name: <yours>, type: timer}]` without `handler`"

HANDLERS: tuple[Handler, ...] = (
    # -- identity (dp, role): no metric -------------------------------------------------------------------
    Handler(
        ("meta_handlers:init_data_parallel", "meta_handlers:init_data_parallel_worker"),
        _BOTH,
        IDENTITY,
        "the process identity (`dp`, `role`, `rank`) every hook takes from vLLM's config (docs/labels.md)",
        also=(PROVIDER + "init_data_parallel_worker",),
    ),
    Handler(
        ("meta_handlers:record_dp_rank",),
        (CURRENT,),
        IDENTITY,
        "`dp` on every series from the process identity",
        differences=("no `dp` is carried through `SchedulerStats.kv_connector_stats` (each process knows its own)",),
    ),
    # -- fixed metrics of their own ------------------------------------------------------------------------
    Handler(
        ("meta_handlers:make_stats",),
        _BOTH,
        BUILT_IN,
        "`Scheduler.schedule` (KV cache blocks and phase queue sizes per step)",
        records=(*_KV_BLOCKS, "running_phase_batch_size", "waiting_phase_batch_size"),
        differences=(
            "`total_kvcache_blocks`, `free_kvcache_blocks`, `allocated_kvcache_blocks` are gauges; ms-service-metric "
            "26.0.0 recorded them as histograms in timer buckets (their `_bucket`/`_sum`/`_count` series are gone; "
            "its later source records gauges too)",
        ),
    ),
    Handler(
        ("meta_handlers:record",),
        _BOTH,
        BUILT_IN,
        "the API server's `StatLoggerManager.record` hook (iteration metrics per engine)",
        records=(
            "batch_size",
            "waiting_batch_size",
            "num_spec_tokens",
            "total_tokens",
            "input",
            "output",
            "fine_grained_ttft",
            "fine_grained_tpot",
        ),
        differences=(
            "ms-service-metric 26.0.0 recorded `second_token_latency` here as the iteration's first inter-token "
            "latency; here it is each request's first-to-second token time, at `IterationStats.update_from_output` "
            "(as `iteration_stats_update_from_output_hooker` does)",
        ),
    ),
    Handler(
        ("meta_handlers:iteration_stats_update_from_output_hooker",),
        (CURRENT,),
        BUILT_IN,
        "`IterationStats.update_from_output` (`second_token_latency`) and `StatLoggerManager.record` (slow counts)",
        records=("second_token_latency", "decode_over_1s_count", "prefill_over_threshold_count"),
        differences=(
            "`decode_over_1s_count`, `prefill_over_threshold_count`: ms-service-metric re-counts the iteration's "
            "whole list after every request (a slow token counted once per request of the iteration); here each "
            "latency counts once",
        ),
    ),
    Handler(
        ("metric_handlers:scheduler_scheduler_hooker",),
        _BOTH,
        BUILT_IN,
        "`Scheduler.schedule` (scheduler duration, batch, sequence length and phase metrics per step)",
        records=(
            "scheduler:duration",
            "scheduler:batch_size",
            "scheduler:running_queue_size",
            "scheduler:seqlen:avg",
            "scheduler:seqlen:sum",
            "scheduler:phase_batch_size",
            "scheduler:phase_scheduled_tokens",
            "scheduler:phase_scheduled_token_counter",
            "request_prefill_pending_nums",
        ),
        also=(PROVIDER + "scheduler_scheduler_hooker",),
    ),
    Handler(
        ("metric_handlers:scheduler_preempt_request_hooker",),
        (CURRENT,),
        BUILT_IN,
        "`Scheduler._preempt_request` and the schedulers' inline preemptions",
        records=("running_to_waiting_count", "scheduler:recompute_events"),
    ),
    Handler(
        ("metric_handlers:block_allocate_failure_hooker",),
        (CURRENT,),
        BUILT_IN,
        "`KVCacheManager.allocate_slots`",
        records=("block_allocate_failures",),
    ),
    Handler(
        ("metric_handlers:rpc_error_hooker",),
        (CURRENT,),
        BUILT_IN,
        "the executors' `collective_rpc` hooks",
        records=("rpc_errors",),
        differences=(
            "`rpc_errors`: `exception_type` is one of timeout, executor_failed, worker_failed, cancelled, other "
            "(ms-service-metric: the exception's class name), and a non-blocking call's failure counts too",
        ),
    ),
    Handler(
        ("metric_handlers:engine_core_pending_hooker",),
        (CURRENT,),
        BUILT_IN,
        "`Scheduler.schedule` (the edge into a capacity-blocked step)",
        records=("request_prefill_pending_nums",),
    ),
    Handler(
        ("metric_handlers:health_engine_client_hooker", "metric_handlers:health_check_failed_hooker"),
        (CURRENT,),
        BUILT_IN,
        "`AsyncLLM.check_health`",
        records=("health_check_failed",),
    ),
    Handler(
        ("metric_handlers:eplb_do_update_hotness_handler",),
        (CURRENT,),
        BUILT_IN,
        "`EplbWorker.do_update`",
        records=(*catalogue.EPLB_HOTNESS_SEEDS, "eplb:expert_hotness:imbalance"),
        differences=(
            *_EPLB_HOTNESS,
            'the four summary gauges carry `dp`, `role` and `phase="all"` too (ms-service-metric: `rank` only)',
        ),
    ),
    Handler(
        ("handlers:eplb_do_update_hotness_handler",),
        (ASCEND_OWN,),
        BUILT_IN,
        "`EplbWorker.do_update`",
        records=(*catalogue.EPLB_HOTNESS_SEEDS, "eplb:expert_hotness:imbalance"),
        differences=(
            *_EPLB_HOTNESS,
            "`dp` and `role` are on every series too (vllm-ascend's handler: `rank` and `phase`, `layer` on the "
            "imbalance)",
        ),
    ),
    Handler(
        ("metric_handlers:runner_get_output_hooker",),
        _BOTH,
        BUILT_IN,
        "the model runner hooks (`get_output`, and the `npu:*` step timings it fed)",
        records=("worker:model_runner_get_output:duration",),
    ),
    Handler(
        ("metric_handlers:record_function_timer_hook", "metric_handlers:record_function_timer_hook_vllm_ascend"),
        _BOTH,
        BUILT_IN,
        "the `record_function_or_nullcontext` scope factory (vllm-ascend times its scopes through it since v0.13)",
        records=("record_function_or_nullcontext",),
    ),
    # -- factories of the entry's own metrics: only the phase label differs ---------------------------------
    Handler(
        ("metric_handlers:phase_all_handler",),
        (CURRENT,),
        METRICS,
        "the entry's metrics, as without `handler`",
        phase='`phase="all"`',
        also=(PROVIDER + "phase_all_handler",),
    ),
    Handler(
        ("metric_handlers:process_outputs_phase_handler", "metric_handlers:record_stats_phase_handler"),
        (CURRENT,),
        METRICS,
        "the entry's metrics, as without `handler`",
        phase="the phase of the API server's iteration (prefill, decode or mixed)",
    ),
    Handler(
        ("metric_handlers:abort_requests_phase_handler",),
        (CURRENT,),
        METRICS,
        "the entry's metrics, as without `handler`",
        phase="the phase of the API server's last iteration",
    ),
    Handler(
        ("metric_handlers:model_runner_phase_handler",),
        (CURRENT,),
        METRICS,
        "the entry's metrics, as without `handler`",
        phase="the phase of the worker's batch (else the PD role)",
        also=(PROVIDER + "model_runner_phase_handler",),
    ),
    Handler(
        ("metric_handlers:engine_core_phase_handler", "metric_handlers:executor_execute_model_phase_handler"),
        (CURRENT,),
        METRICS,
        "the entry's metrics, as without `handler`",
        phase="the phase of the last scheduled batch",
    ),
    Handler(
        ("handlers:default_handler", "handlers.builtin:default_handler"),
        (GENERIC,),
        METRICS,
        "the entry's metrics, as without `handler` (it is the handler of an entry without one)",
        phase="the process's last phase (`mixed` until one is set)",
    ),
    # -- fixed values picked by the entry's metric names ----------------------------------------------------
    Handler(
        ("metric_handlers:engine_memory_phase_handler",),
        (CURRENT,),
        SELECT,
        "the built-in `engine:memory:*` gauges the entry names, read once per worker after warm-up",
        values=tuple((f"engine:memory:{m}", "") for m in _MEMORY),
        differences=("recorded without switching the metrics on before start-up",),
        also=(PROVIDER + "engine_memory_phase_handler",),
    ),
    Handler(
        ("metric_handlers:runtime_memory_phase_handler",),
        (CURRENT,),
        SELECT,
        "gauges of the entry's symbol with the handler's values as expressions",
        phase='`phase="all"`',
        values=(
            ("engine:memory:torch_reserved_gb", f"round(self.torch_reserved / {GIB}, 2)"),
            ("engine:memory:torch_allocated_gb", f"round(self.torch_allocated / {GIB}, 2)"),
        ),
        differences=(
            "`NPUWorker.profile_memory` exists only in some vllm-ascend versions (removed again upstream): where it "
            "does not, the entry's symbol cannot be hooked",
        ),
    ),
    # -- msServiceProfiler's tracing handlers: spans, not metrics ---------------------------------------------
    Handler(
        tuple(
            f"{m}:*"
            for m in ("batch_handlers", "kvcache_handlers", "model_handlers", "request_handlers", "mtp_handlers")
        ),
        (OLDER, OLDER_V0),
        REJECTED,
        f"a tracing handler of msServiceProfiler (trace spans, no metric): {_TIMER_INSTEAD}",
    ),
    Handler(
        ("model_handlers:*", "request_handlers:*", "scheduler_handlers:*", "torch_profiler:*"),
        (OLDER_SGLANG,),
        REJECTED,
        f"a tracing handler of msServiceProfiler (trace spans, no metric): {_TIMER_INSTEAD}",
    ),
    Handler(
        ("torch_profiler:*",),
        ("ms_service_profiler.patcher.vllm.handlers.",),
        REJECTED,
        "msServiceProfiler's torch profiler control (no metric): profile with vLLM's own `--profiler-config`",
    ),
)

#: What a built-in metric times differently from the incumbent's hook of the same name (seed -> words).
TIMED_DIFFERENTLY: tuple[tuple[str, str], ...] = (
    (
        "engine:generate:duration",
        "the whole output stream, until it ended; ms-service-metric timed the async generator's creation (about a "
        "microsecond)",
    ),
    (
        "executor:execute_model:duration",
        "until the worker's model runner returned from execute_model; ms-service-metric timed the non-blocking RPC "
        "dispatch only",
    ),
    (
        "executor:sample_tokens:duration",
        "until the sampled tokens were on the worker's host; ms-service-metric timed the (non-blocking) RPC call",
    ),
    (
        "engine_core:process_input_queue:duration",
        "without the time the engine blocked idle on its input queue; ms-service-metric included it",
    ),
    (
        "engine_core:engine_core_step:duration",
        "EngineCore.step and step_with_batch_queue (async scheduling, pipeline parallelism); ms-service-metric "
        "hooked step only",
    ),
    (
        "server:create_chat_completion:duration",
        "until the response is complete (a stream: until it ended); ms-service-metric timed until the handler "
        "returned (a stream: its creation), at a module vLLM moved in 0.23",
    ),
)


def find(path: str) -> Handler | None:
    """The table's row for the ``handler:`` value ``path``, or None."""
    for row in HANDLERS:
        if row.matches(path):
            return row
    return None


def timed_differently(seed: str) -> str | None:
    for name, words in TIMED_DIFFERENTLY:
        if name == seed:
            return words
    return None
