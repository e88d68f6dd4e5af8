"""What each environment switch means, as docs/configuration.md says it: a one-line summary for the settings table
and the details below it (``docgen --configuration`` renders both). The names and defaults are environment.py's."""

from __future__ import annotations

from dataclasses import dataclass

from .. import catalogue
from .. import environment as env

#: The longest summary the settings table shows (tests/unit/cli/test_docgen.py holds every cell to it).
MAX_CELL = 120


@dataclass(frozen=True)
class Setting:
    #: The variable(s), as one row and one heading.
    names: tuple[str, ...]
    #: The default, as the table shows it.
    default: str
    #: One line: what the setting does.
    summary: str
    #: Paragraphs below the table (none: the summary says it all).
    details: tuple[str, ...] = ()


def _ms(value: int) -> str:
    return f"`{value}`"


_OPT_IN = len(catalogue.OPT_IN)
_ROOTS = ", ".join(f"`{root}`" for root in env.HOOK_MODULE_ROOTS[:-1]) + f" and `{env.HOOK_MODULE_ROOTS[-1]}`"

SETTINGS = (
    Setting(
        (env.ENABLED,),
        "unset",
        "`true`: instrument every vLLM process through the plugin; `false`: never; unset: where "
        "`opentelemetry-instrument` does.",
        (
            "`true`: every vLLM process is instrumented through the `vllm.general_plugins` entry point, with or "
            "without `opentelemetry-instrument`. `false`: never instrument (wins over everything, manual "
            "`instrument()` included). Unset: a process is instrumented when `opentelemetry-instrument` loads the "
            "instrumentor, or when its parent was instrumented (`instrument()` sets the variable to `true` for the "
            "processes vLLM spawns, and puts the operator's value back on `uninstrument()`).",
            "Accepted: `true`/`1`/`yes`/`on`, `false`/`0`/`no`/`off` (any case); any other value, the empty string "
            "included, counts as unset, with one warning naming the accepted values.",
        ),
    ),
    Setting(
        (env.DISABLED_INSTRUMENTATIONS,),
        "unset",
        f"Standard. Naming `{env.ENTRY_POINT_NAME}` (our entry point) or `*`: not instrumented, by "
        "`opentelemetry-instrument` or plugin.",
    ),
    Setting(
        (env.PROMETHEUS,),
        "`true`",
        "`false` turns our `/metrics` exposure off.",
        (
            f"It is on whatever `{env.METRICS_EXPORTER}` says, `none` included. An unrecognised value keeps the "
            "default, with one warning.",
        ),
    ),
    Setting(
        (env.GENAI_PROMETHEUS,),
        "`false`",
        "`true` also puts the GenAI conventions' `gen_ai.server.*` histograms on `/metrics` (OTLP always has them).",
        (
            "They are written as `gen_ai_server_time_to_first_token_seconds`, "
            "`gen_ai_server_time_per_output_token_seconds` and `gen_ai_server_request_duration_seconds`, with labels "
            "`gen_ai_operation_name`, `gen_ai_provider_name`, `gen_ai_request_model`, `error_type` (OpenTelemetry's "
            "OTLP→Prometheus naming). Off by default: vLLM's `/metrics` already shows the same values as "
            "`vllm:time_to_first_token_seconds`, `vllm:request_time_per_output_token_seconds` and "
            "`vllm:e2e_request_latency_seconds` (with vLLM's own buckets). See [GenAI semantic "
            f"conventions](#genai-semantic-conventions). Accepted values as for `{env.ENABLED}`.",
        ),
    ),
    Setting(
        (env.PROMETHEUS_INTERVAL_MS,),
        _ms(env.DEFAULT_PROMETHEUS_INTERVAL_MS),
        "How often (ms) each process writes its metrics for `/metrics`: bounds the staleness of EngineCore / worker "
        "data.",
        (
            f"Clamped to {env.MIN_INTERVAL_MS} ms … {env.MAX_INTERVAL_MS:,} ms (one day); a value that is not a "
            "positive integer means the default. Either is one warning. Staleness: see [Shutdown](#shutdown).",
        ),
    ),
    Setting(
        (env.SHUTDOWN_TIMEOUT_MS,),
        _ms(env.DEFAULT_SHUTDOWN_TIMEOUT_MS),
        "How long (ms) shutdown waits for metrics to be exported: at a process's exit, and when vLLM stops its "
        "processes.",
        (
            "It bounds a process's final export at exit (all its readers together: an unreachable collector delays "
            "the exit by this much, not by the exporter's own 10 s timeout), and how long the process that stops "
            "others (the API server stopping its EngineCores, an EngineCore its workers) waits for their export "
            "before vLLM's own stop proceeds (see [Shutdown](#shutdown)). Not a positive integer: the default; above "
            f"{env.MAX_SHUTDOWN_TIMEOUT_MS:,}: {env.MAX_SHUTDOWN_TIMEOUT_MS:,}; either is one warning.",
        ),
    ),
    Setting(
        (env.RECORDER,),
        "`fast`",
        "`fast`: the pre-aggregating recorder; `sdk`: the OTel SDK's own instruments and Views, for cross-checking.",
        (
            "`fast` is described in [performance.md](performance.md). `sdk` gives the same names, labels, buckets "
            "and output at about 15 times the cost of a timed call (performance.md, section A). Its Views are fixed "
            "at start: a hook-file metric first declared by `control reload` is not recorded until the next start "
            "(one log line).",
        ),
    ),
    Setting(
        (env.DISABLED_METRICS,),
        "unset",
        "Comma-separated metric names or shell-style patterns not to record; a hook that feeds only those is not "
        "installed.",
        (
            "Names with or without the `vllm_profiling_` prefix (e.g. `record_function_or_nullcontext,npu:*`). A "
            "hook that feeds only disabled metrics costs nothing (`check` lists it as disabled); hooks that keep "
            "context for others (the scheduler's step phase, process identity, the worker's step) stay installed. "
            "Use it to trim cost or series on large deployments.",
        ),
    ),
    Setting(
        (env.ENABLED_METRICS,),
        "unset",
        "Opt-in metrics to record: names or patterns, `*` all, `ms-service-metric` the migration profile.",
        (
            f"Comma-separated names or shell-style patterns, as for `{env.DISABLED_METRICS}`. The opt-in metrics are "
            "the families outside the default set's series budget ([performance.md](performance.md#series-budget)), "
            "marked **opt-in** in [metrics.md](metrics.md): `record_function_or_nullcontext` (vLLM's profiling "
            f"scopes) and {_OPT_IN - 1} duplicates of default families.",
            "`ms-service-metric` (any case; beside names and patterns) is the migration profile: the opt-in families "
            f"ms-service-metric records by default — today all {_OPT_IN} — so that its dashboard and hook files keep "
            "their series ([Migrating](#the-dashboard-one-switch)).",
            f"Unnamed opt-in metrics are off as if listed in `{env.DISABLED_METRICS}`, which still wins. With "
            "`record_function_or_nullcontext` off, only the forward, post-processing and sample scopes are timed "
            "(for the worker's forward and kernel-launch durations and its step budget).",
        ),
    ),
    Setting(
        (env.DISABLED_SCOPES,),
        "unset",
        "vLLM profiling scopes (names or patterns) not to time, e.g. `schedule: allocate_slots`, the costliest.",
        (
            "Comma-separated names or shell-style patterns of the scopes of `record_function_or_nullcontext(name)` "
            "(the `name` label of `vllm_profiling_record_function_or_nullcontext`). The scheduler enters `schedule: "
            "allocate_slots` once per running request, and it is the largest single cost on the EngineCore's "
            "critical path (see [performance.md](performance.md), section G).",
            "A disabled scope runs exactly as without us (vLLM's own nullcontext or profiler scope) and has no "
            "series. Disabling `gpu_model_runner: forward` / `forward` or `gpu_model_runner: postprocess` / `post "
            "process` also stops the worker's forward, non-forward and kernel-launch durations, which are measured "
            "from those scopes.",
        ),
    ),
    Setting(
        (env.TRACES,),
        "`false`",
        "`true`: a trace per request, built in the API server after the request ended ([traces.md](traces.md)).",
        (
            f"Exported through `{env.TRACES_EXPORTER}` (default `otlp`) and `OTEL_EXPORTER_OTLP_TRACES_*` / "
            f"`OTEL_EXPORTER_OTLP_*`, sampled by `OTEL_TRACES_SAMPLER`, plus the tail rules `{env.TRACES_KEEP}`, "
            f"`{env.TRACES_TTFT_THRESHOLD_MS}`, `{env.TRACES_E2E_THRESHOLD_MS}`, bounded by "
            f"`{env.TRACES_MAX_INFLIGHT}` and `OTEL_BSP_*`. Off: no trace hook is installed.",
        ),
    ),
    Setting(
        (env.STEPS_ZMQ, env.STEPS_FILE),
        "unset",
        "Per-step records ([steps.md](steps.md)) in each EngineCore: to a ZMQ PUB endpoint and / or a JSON-lines file.",
        (
            "One record per engine step that scheduled work. `…_ZMQ`: an endpoint to bind a PUB socket to "
            "(`tcp://*:20380`: the port plus the engine's dp index; `{dp}` is replaced), msgpack, wire-compatible with "
            "NVIDIA Dynamo's forward-pass metrics v1. `…_FILE`: JSON lines (`{dp}`, `{pid}` replaced; neither: "
            f"`-<pid>` before the extension), rotated past `{env.STEPS_FILE_MAX_BYTES}` (64 MiB) keeping "
            f"`{env.STEPS_FILE_BACKUPS}` (2) older files.",
            f"Bounded by `{env.STEPS_QUEUE}` (4096 records waiting) and `{env.STEPS_ZMQ_HWM}` (10000 messages a "
            f"subscriber may lag); `{env.STEPS_WORKER_ID}` sets the records' `worker_id` (`<hostname>:<pid>`). "
            "Losses: `vllm_profiling_step_record_dropped`. Every sink unset: no record is built.",
        ),
    ),
    Setting(
        (env.STEPS_OTLP_LOGS,),
        "unset",
        "`true`: each step record also as an OTLP log record, event `vllm_ascend.step` ([steps.md](steps.md)).",
        (
            "Through the OpenTelemetry logs SDK (a `BatchLogRecordProcessor`, `OTEL_BLRP_*`) and the OTLP log "
            "exporter `OTEL_EXPORTER_OTLP_LOGS_PROTOCOL` / `OTEL_EXPORTER_OTLP_PROTOCOL` choose (gRPC when unset), "
            "which reads its own `OTEL_EXPORTER_OTLP_[LOGS_]ENDPOINT`, headers, timeout and compression; the "
            "resource is the metrics'. The record's fields are the log record's attributes, nested keys dotted "
            "(`scheduled_requests.num_prefill_requests`). No exporter installed: one log line, the other sinks go on.",
        ),
    ),
    Setting(
        (env.STEP_TRACES,),
        "`false`",
        "`true`: a trace per slow engine step, linked to its requests' ([steps.md](steps.md#slow-step-traces)).",
        (
            "Exported from each EngineCore for each step a tail rule keeps, linked both ways to the request spans of "
            "the requests it carried.",
            f"Rules: `{env.STEP_TRACES_THRESHOLD_MS}` (unset: none), `{env.STEP_TRACES_P99_FACTOR}` (3 × the p99 of "
            f"the engine's last 1000 steps; `0`: none), `{env.STEP_TRACES_KEEP}` (`preempted,error`; `none`), at most "
            f"`{env.STEP_TRACES_PER_S}` (10) steps a second. Exported like request traces (`OTEL_TRACES_EXPORTER`, "
            "`OTEL_EXPORTER_OTLP_TRACES_*`). The links back need request traces on too.",
        ),
    ),
    Setting(
        (env.METRICS_EXPORTER,),
        "unset",
        "Standard. Each push exporter named (`otlp`, `otlp_proto_http`, `otlp_proto_grpc`, `console`): a reader in "
        "each process.",
        (
            "`prometheus` is accepted and means nothing more: the data is already on vLLM's `/metrics`, and no "
            "process opens a second HTTP port (that is what breaks stock OTel Prometheus under vLLM: each child fails "
            "to bind 9464).",
        ),
    ),
    Setting(
        ("OTEL_EXPORTER_OTLP_*",),
        "the SDK's",
        "Standard endpoint, headers, timeout, compression, certificates, temporality: per signal or general.",
        (
            "Each per signal (`OTEL_EXPORTER_OTLP_METRICS_…`) or general; `…_METRICS_TEMPORALITY_PREFERENCE` takes "
            "`cumulative`, `delta`, `lowmemory`. `otlp` is chosen as the OTel SDK's own configurator chooses it: by "
            f"`{env.OTLP_METRICS_PROTOCOL}`, else `{env.OTLP_PROTOCOL}` — `grpc` (the default, port 4317) or "
            "`http/protobuf` (port 4318, path `/v1/metrics`); `otlp_proto_http` / `otlp_proto_grpc` name one "
            "outright. Another protocol (`http/json`) is one warning and no push exporter.",
        ),
    ),
    Setting(
        (env.METRIC_EXPORT_INTERVAL,),
        _ms(env.DEFAULT_METRIC_EXPORT_INTERVAL_MS),
        "Standard push interval (ms), read once per process.",
        (
            f"Clamped like `{env.PROMETHEUS_INTERVAL_MS}` ({env.MIN_INTERVAL_MS} ms … one day; not a positive "
            "integer: the default; one warning).",
        ),
    ),
    Setting(
        (env.OTLP_HISTOGRAM_AGGREGATION,),
        "`explicit_bucket_histogram`",
        "Standard. `base2_exponential_bucket_histogram`: OTLP gets exponential histograms; `/metrics` keeps our "
        "buckets.",
        (
            "With exponential histograms the process records through the SDK's instruments: about 14 µs per "
            "histogram observation instead of 0.3 µs.",
        ),
    ),
    Setting(
        (env.METRICS_EXEMPLAR_FILTER,),
        "`trace_based`",
        "Standard. `always_off`: no exemplars on the request-level histograms; `trace_based` and `always_on` keep "
        "them.",
        (
            "With `always_off` the histograms' observations are still recorded. See [Exemplars](deploy.md#exemplars) "
            "in deploy.md.",
        ),
    ),
    Setting(
        ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"),
        "`service.name=vllm`",
        "Standard resource settings, on every process's metrics and traces; ours are added to them.",
    ),
    Setting(
        (env.PROMETHEUS_MULTIPROC_DIR,),
        "unset",
        "vLLM's own (it sets it with `--api-server-count > 1`): our per-process files go there, merged by vLLM.",
        ("See [`/metrics`](#metrics): vLLM's multiprocess registry merges them.",),
    ),
    Setting(
        (env.CONFIG,),
        "unset",
        "Comma-separated paths of your hook files (YAML, ms-service-metric's entry shape; [Hook files](#hook-files)).",
        (
            "Read in every process at start-up and on `control reload`; a file that cannot be read is one log line, "
            "the others load.",
        ),
    ),
    Setting(
        (env.CONFIG_MODULES,),
        "unset",
        f"Comma-separated top-level modules, besides {_ROOTS}, whose code hook files may hook.",
        (
            "For your own package, or a fork under another name. An entry naming any other module (`os:system`) is "
            "rejected.",
        ),
    ),
    Setting(
        (env.HOOK_SEMANTICS,),
        f"`{env.DEFAULT_SEMANTICS}`",
        f"`{env.INCUMBENT_SEMANTICS}`: hook-file metrics record by ms-service-metric's rules where they differ from "
        "ours.",
        (
            "Any case. Those rules: 1 where an expression raises or a histogram has no `expr`, a counter's increment "
            "≤ 0 adds 1 (see [Recording semantics](#recording-semantics)). Built-in metrics are not affected. Any "
            f"other value: `{env.DEFAULT_SEMANTICS}`, one warning.",
        ),
    ),
    Setting(
        (env.INITIAL_STATE,),
        "`on`",
        "`off`: the server starts with recording off (hooks installed, gated) until `control on`.",
        (
            "`python -m opentelemetry_instrumentation_vllm_ascend control on` turns it on ([Runtime "
            "control](#runtime-control)). Any other value: `on`, one warning.",
        ),
    ),
)
