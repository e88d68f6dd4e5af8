"""Every environment switch the package reads, in one place (what each means for users: cli/settings.py, rendered
into docs/configuration.md)."""

from __future__ import annotations

import os

from .state import STATE

#: The one documented switch. ``true``: instrument every vLLM process (API server, EngineCore, workers)
#: through the ``vllm.general_plugins`` entry point, even without ``opentelemetry-instrument``.
#: ``false``: never instrument, whatever else is configured. Unset: the plugin instruments a process
#: only when its parent was instrumented (``instrument()`` sets the variable to ``true`` so that the
#: processes vLLM spawns inherit it).
ENABLED = "OTEL_VLLM_ASCEND_ENABLED"

#: ``false`` turns the vLLM ``/metrics`` exposure off (default ``true``, whatever OTEL_METRICS_EXPORTER says).
PROMETHEUS = "OTEL_VLLM_ASCEND_PROMETHEUS"

#: ``true`` also writes the GenAI semantic conventions' ``gen_ai.server.*`` histograms to ``/metrics`` (as
#: ``gen_ai_server_*_seconds``); default ``false``: OTLP only (vLLM's ``/metrics`` already has the same values
#: as ``vllm:time_to_first_token_seconds`` etc.).
GENAI_PROMETHEUS = "OTEL_VLLM_ASCEND_GENAI_PROMETHEUS"

#: How often each process writes its metrics for ``/metrics`` (milliseconds, default 2000). This bounds
#: the staleness of EngineCore/worker data on ``/metrics``.
PROMETHEUS_INTERVAL_MS = "OTEL_VLLM_ASCEND_PROMETHEUS_INTERVAL_MS"

#: Which recorder sits behind the recording layer: ``fast`` (default; pre-aggregating, hands standard
#: OTel MetricsData to the same readers) or ``sdk`` (the OTel SDK's own instruments and Views).
RECORDER = "OTEL_VLLM_ASCEND_RECORDER"
#: Comma-separated catalogue names or shell-style patterns (``record_function_or_nullcontext``,
#: ``npu:*``, ``eplb:*``) of metrics not to record. A hook that feeds only disabled metrics is not
#: installed at all (no cost); the rest of a hook's metrics are recorded as usual.
DISABLED_METRICS = "OTEL_VLLM_ASCEND_DISABLED_METRICS"
#: Comma-separated catalogue names or shell-style patterns of the opt-in metrics (``catalogue.OPT_IN``, the
#: series budget's: ``record_function_or_nullcontext``, duplicates of default ones) to record; ``*``: all of them.
#: Unnamed opt-in metrics are off as if listed in OTEL_VLLM_ASCEND_DISABLED_METRICS (which still wins).
ENABLED_METRICS = "OTEL_VLLM_ASCEND_ENABLED_METRICS"
#: How a hook file's metrics record where ms-service-metric records differently (docs/configuration.md "Recording
#: semantics"): ``default`` (ours: a failing expression skips its sample, a histogram without ``expr`` records the
#: duration) or ``ms-service-metric`` (the incumbent's: 1 there, a counter's increment <= 0 adds 1, a timer's
#: ``expr`` unused, a gauge without ``expr`` sets 1).
HOOK_SEMANTICS = "OTEL_VLLM_ASCEND_HOOK_SEMANTICS"
DEFAULT_SEMANTICS, INCUMBENT_SEMANTICS = "default", "ms-service-metric"
#: Comma-separated names or shell-style patterns of vLLM profiling scopes
#: (``record_function_or_nullcontext(name)``) not to time: such a scope runs exactly as without us.
#: For the hot ones, e.g. the scheduler's per-request "schedule: allocate_slots".
DISABLED_SCOPES = "OTEL_VLLM_ASCEND_DISABLED_SCOPES"

#: Internal, set by the first instrumented process for its children: where per-process metric files go
#: when PROMETHEUS_MULTIPROC_DIR is unset, and which process created that directory.
FILES_DIR = "_OTEL_VLLM_ASCEND_FILES_DIR"
ROOT_PID = "_OTEL_VLLM_ASCEND_ROOT_PID"
#: Internal, set by the first instrumented process for its children: the name of this process tree
#: (random), in the names of the sockets its processes take flush requests on (shutdown.py).
TREE = "_OTEL_VLLM_ASCEND_TREE"

#: Users' hook files: comma-separated paths of YAML files in ms-service-metric's entry shape
#: (wiring/userfile.py, docs/configuration.md "Hook files").
CONFIG = "OTEL_VLLM_ASCEND_CONFIG"
#: Module roots, besides vLLM's, vllm-ascend's and SGLang's, that hook files may name (comma-separated).
CONFIG_MODULES = "OTEL_VLLM_ASCEND_CONFIG_MODULES"
#: The module roots hook files name without it.
HOOK_MODULE_ROOTS = ("vllm", "vllm_ascend", "sglang")
#: ``off``: a server starts with recording off (``python -m opentelemetry_instrumentation_vllm_ascend
#: control on`` turns it on); ``on`` (default).
INITIAL_STATE = "OTEL_VLLM_ASCEND_INITIAL_STATE"
#: Internal, set by the first instrumented process for its children when it made a private control
#: directory of its own (no files directory: PROMETHEUS_MULTIPROC_DIR set, or /metrics off).
CONTROL_DIR = "_OTEL_VLLM_ASCEND_CONTROL_DIR"

#: How long a process's final export may take at exit, and how long the process that stops others
#: (the API server stopping its EngineCores) waits for theirs, in milliseconds (default 1000).
SHUTDOWN_TIMEOUT_MS = "OTEL_VLLM_ASCEND_SHUTDOWN_TIMEOUT_MS"
DEFAULT_SHUTDOWN_TIMEOUT_MS = 1000
MAX_SHUTDOWN_TIMEOUT_MS = 60_000

#: ``true`` builds a trace per request in the API server from what vLLM already sends it (docs/traces.md); default
#: ``false``: no trace hook is installed. Not OTEL_TRACES_EXPORTER: opentelemetry-instrument's distro sets that to
#: ``otlp`` for every program it runs.
TRACES = "OTEL_VLLM_ASCEND_TRACES"
#: Tail rules: a request whose head sampling decision was "drop" is still exported (as a new root linked to its
#: parent) when it crossed one of these thresholds (milliseconds; unset: no such rule) ...
TRACES_TTFT_THRESHOLD_MS = "OTEL_VLLM_ASCEND_TRACES_TTFT_THRESHOLD_MS"
TRACES_E2E_THRESHOLD_MS = "OTEL_VLLM_ASCEND_TRACES_E2E_THRESHOLD_MS"
#: ... or ended in one of these outcomes (comma-separated from ``error``, ``abort``, ``preempted``; default all
#: three; ``none``: no outcome rule).
TRACES_KEEP = "OTEL_VLLM_ASCEND_TRACES_KEEP"
TRACES_KEEP_CHOICES = ("error", "abort", "preempted")
#: At most this many requests followed at once (default 65536); a request beyond it gets no trace (counted).
TRACES_MAX_INFLIGHT = "OTEL_VLLM_ASCEND_TRACES_MAX_INFLIGHT"
DEFAULT_TRACES_MAX_INFLIGHT = 65_536
#: The per-step records (docs/steps.md), each sink off unless set. ``STEPS_ZMQ``: a ZMQ endpoint the EngineCore
#: binds a PUB socket to (``tcp://*:20380``: one port per DP rank, the port plus the engine's dp index; ``{dp}`` in
#: any endpoint is replaced by it), msgpack records wire-compatible with NVIDIA Dynamo's forward-pass metrics v1.
STEPS_ZMQ = "OTEL_VLLM_ASCEND_STEPS_ZMQ"
#: ``STEPS_FILE``: a JSON-lines file per EngineCore (``{dp}`` / ``{pid}`` replaced; without either, ``-<pid>`` goes
#: before the extension), rotated past ``STEPS_FILE_MAX_BYTES`` (default 64 MiB) keeping ``STEPS_FILE_BACKUPS``
#: older files (default 2).
STEPS_FILE = "OTEL_VLLM_ASCEND_STEPS_FILE"
STEPS_FILE_MAX_BYTES = "OTEL_VLLM_ASCEND_STEPS_FILE_MAX_BYTES"
STEPS_FILE_BACKUPS = "OTEL_VLLM_ASCEND_STEPS_FILE_BACKUPS"
#: Records waiting for the background thread at most (default 4096; beyond: dropped, counted).
STEPS_QUEUE = "OTEL_VLLM_ASCEND_STEPS_QUEUE"
#: Messages a ZMQ subscriber may lag behind (its pipe's high-water mark, default 10000; beyond: dropped, counted).
STEPS_ZMQ_HWM = "OTEL_VLLM_ASCEND_STEPS_ZMQ_HWM"
#: The records' ``worker_id`` (Dynamo's; default ``<hostname>:<pid>``).
STEPS_WORKER_ID = "OTEL_VLLM_ASCEND_STEPS_WORKER_ID"
#: ``true``: each record also as an OTLP log record (event ``vllm_ascend.step``), through the logs SDK and the OTLP
#: log exporter ``OTEL_EXPORTER_OTLP_[LOGS_]*`` choose.
STEPS_OTLP_LOGS = "OTEL_VLLM_ASCEND_STEPS_OTLP_LOGS"
#: Slow-step traces (docs/steps.md#slow-step-traces), ``true`` to turn on: a trace per step a tail rule keeps, from
#: each EngineCore. Rules: above ``_THRESHOLD_MS``; above ``_P99_FACTOR`` (default 3, ``0``: no such rule) times the
#: recent p99; a preemption or a failed executor call (``_KEEP``); at most ``_PER_S`` (default 10) a second.
STEP_TRACES = "OTEL_VLLM_ASCEND_STEP_TRACES"
STEP_TRACES_THRESHOLD_MS = "OTEL_VLLM_ASCEND_STEP_TRACES_THRESHOLD_MS"
STEP_TRACES_P99_FACTOR = "OTEL_VLLM_ASCEND_STEP_TRACES_P99_FACTOR"
STEP_TRACES_KEEP = "OTEL_VLLM_ASCEND_STEP_TRACES_KEEP"
STEP_TRACES_KEEP_CHOICES = ("preempted", "error")
STEP_TRACES_PER_S = "OTEL_VLLM_ASCEND_STEP_TRACES_PER_S"
TRACES_EXPORTER = "OTEL_TRACES_EXPORTER"
OTLP_TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
OTLP_LOGS_PROTOCOL = "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL"
#: The standard batch span processor settings, applied to finished requests waiting for export.
BSP_MAX_QUEUE_SIZE = "OTEL_BSP_MAX_QUEUE_SIZE"
BSP_SCHEDULE_DELAY = "OTEL_BSP_SCHEDULE_DELAY"
BSP_MAX_EXPORT_BATCH_SIZE = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"

#: Standard variables we honour.
DISABLED_INSTRUMENTATIONS = "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS"
PROMETHEUS_MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"
METRICS_EXPORTER = "OTEL_METRICS_EXPORTER"
#: The OTLP protocol ("grpc", "http/protobuf"): the metrics signal's own setting, else the general one.
OTLP_METRICS_PROTOCOL = "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"
OTLP_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
METRIC_EXPORT_INTERVAL = "OTEL_METRIC_EXPORT_INTERVAL"
#: The OTLP metrics exporters' histogram aggregation (``explicit_bucket_histogram`` default,
#: ``base2_exponential_bucket_histogram``), read by the exporter itself; /metrics keeps explicit buckets.
OTLP_HISTOGRAM_AGGREGATION = "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION"
#: The SDK's exemplar filter (``trace_based`` default, ``always_on``, ``always_off``): ``always_off`` keeps
#: exemplars off histograms (``recording.record_exemplar`` then records the observation only).
METRICS_EXEMPLAR_FILTER = "OTEL_METRICS_EXEMPLAR_FILTER"

#: Entry-point name under ``opentelemetry_instrumentor``; the name OTEL_PYTHON_DISABLED_INSTRUMENTATIONS matches.
ENTRY_POINT_NAME = "vllm_ascend"

DEFAULT_PROMETHEUS_INTERVAL_MS = 2000

_TRUE = frozenset(("1", "true", "yes", "on"))
_FALSE = frozenset(("0", "false", "no", "off"))


#: (variable, value) pairs already warned about: one log line per bad value, not one per read.
_WARNED = STATE.warned


def warn_once(key: tuple, message: str, *args) -> None:
    """Log ``message % args`` as a warning the first time ``key`` (a setting and its bad value) comes
    up in this process, and never again: a setting read at every pipeline build or record stays one
    log line."""
    if key in _WARNED:
        return
    _WARNED.add(key)
    import logging

    logging.getLogger(__name__).warning(message, *args)


def flag(name: str) -> bool | None:
    """``True``/``False`` for a recognised boolean value, ``None`` when unset or unrecognised (an
    unrecognised value — ``2``, ``enabled``, an empty string — is treated as unset, with one warning
    naming the accepted values)."""
    raw = os.environ.get(name)
    if raw is None:
        return None
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    warn_once(
        (name, raw),
        "opentelemetry-instrumentation-vllm-ascend: %s=%r is not a boolean (accepted: %s / %s); treated as unset",
        name,
        raw,
        ", ".join(sorted(_TRUE)),
        ", ".join(sorted(_FALSE)),
    )
    return None


def disabled_by_otel() -> bool:
    names = {n.strip() for n in os.environ.get(DISABLED_INSTRUMENTATIONS, "").split(",")}
    return "*" in names or ENTRY_POINT_NAME in names


def prometheus_enabled() -> bool:
    return flag(PROMETHEUS) is not False


def genai_prometheus_enabled() -> bool:
    return flag(GENAI_PROMETHEUS) is True


#: The range every export interval is clamped to (ms): at least 100 ms (an exporter writing more often
#: only burns CPU), at most one day (threading.TIMEOUT_MAX is far above, but a reader thread waiting
#: longer than that exports nothing an operator would wait for).
MIN_INTERVAL_MS = 100
MAX_INTERVAL_MS = 86_400_000
DEFAULT_METRIC_EXPORT_INTERVAL_MS = 60_000  # the OTel SDK's default for OTEL_METRIC_EXPORT_INTERVAL


def integer(name: str, default: int, low: int, high: int | None = None, *, clamp: bool = False, unit: str = "") -> int:
    """An integer setting from ``name``: ``default`` when unset. With one warning: ``default`` when it is not an
    integer or is below ``low`` (``clamp``: when not a positive integer, and ``low`` when positive but below it);
    ``high`` when above it."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value: int | None = int(raw)
    except ValueError:
        value = None
    if value is None or value < (1 if clamp else low):
        positive = clamp or low == 1
        using, why = default, "is not a positive integer" if positive else f"is not an integer of at least {low}"
    elif value < low:
        using, why = low, f"is below {low}{unit}"
    elif high is not None and value > high:
        using, why = high, f"is above {high}{unit}"
    else:
        return value
    warn_once((name, raw), "opentelemetry-instrumentation-vllm-ascend: %s=%r %s; using %d", name, raw, why, using)
    return using


def _milliseconds(name: str, default: int, low: int, high: int) -> int:
    """A duration in milliseconds from ``name``: ``default`` when unset, or (with one warning) when not
    a positive integer; clamped, with one warning, to [low, high]."""
    return integer(name, default, low, high, clamp=True, unit=" ms")


def interval_ms(name: str, default: int) -> int:
    """An export interval (ms) from ``name``, clamped to [MIN_INTERVAL_MS, MAX_INTERVAL_MS] (one day)."""
    return _milliseconds(name, default, MIN_INTERVAL_MS, MAX_INTERVAL_MS)


def shutdown_timeout_ms() -> int:
    """OTEL_VLLM_ASCEND_SHUTDOWN_TIMEOUT_MS: 1000 when unset or not a positive integer, at most one
    minute (one warning otherwise)."""
    return _milliseconds(SHUTDOWN_TIMEOUT_MS, DEFAULT_SHUTDOWN_TIMEOUT_MS, 1, MAX_SHUTDOWN_TIMEOUT_MS)


def metrics_files_dir() -> str | None:
    """Where this process writes its metric files for ``/metrics``: PROMETHEUS_MULTIPROC_DIR when set
    (vLLM's own registry then merges them), else the directory the first instrumented process made."""
    return os.environ.get(PROMETHEUS_MULTIPROC_DIR) or os.environ.get(FILES_DIR) or None


def hook_module_roots() -> tuple[str, ...]:
    """The top-level modules whose code hook files may hook: vLLM's, vllm-ascend's, SGLang's, and those
    OTEL_VLLM_ASCEND_CONFIG_MODULES names."""
    return HOOK_MODULE_ROOTS + tuple(n for n in _comma_list(CONFIG_MODULES) if n not in HOOK_MODULE_ROOTS)


def otlp_exporter_names() -> list[str]:
    """Names from OTEL_METRICS_EXPORTER that need a push exporter. ``prometheus`` is served through
    vLLM's /metrics instead (never a second HTTP server per process), ``none`` means nothing."""
    return [n for n in _comma_list(METRICS_EXPORTER) if n not in ("none", "prometheus")]


def exemplars_enabled() -> bool:
    """Whether histograms keep exemplars: unless OTEL_METRICS_EXEMPLAR_FILTER is ``always_off`` (the SDK's
    ``trace_based`` and ``always_on`` both keep those ``recording.record_exemplar`` offers: its trace is sampled)."""
    return os.environ.get(METRICS_EXEMPLAR_FILTER, "trace_based").strip().lower() != "always_off"


def exponential_histograms() -> bool:
    """Whether OTLP metrics exporters take base-2 exponential histograms: the value the exporter compares, exactly."""
    return os.environ.get(OTLP_HISTOGRAM_AGGREGATION) == "base2_exponential_bucket_histogram"


def recorder() -> str:
    value = os.environ.get(RECORDER, "fast").strip().lower()
    if value not in ("fast", "sdk"):
        warn_once(
            (RECORDER, value),
            "opentelemetry-instrumentation-vllm-ascend: %s=%r is neither fast nor sdk; using fast",
            RECORDER,
            value,
        )
        return "fast"
    return value


def _comma_list(variable: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in os.environ.get(variable, "").split(",") if p.strip())


def disabled_metric_patterns() -> tuple[str, ...]:
    """OTEL_VLLM_ASCEND_DISABLED_METRICS's patterns, then the opt-in metrics OTEL_VLLM_ASCEND_ENABLED_METRICS
    does not name (exact seeds)."""
    from .catalogue import OPT_IN

    return _comma_list(DISABLED_METRICS) + tuple(seed for seed in OPT_IN if opt_in_off(seed))


def opt_in_off(seed: str) -> bool:
    """Whether ``seed`` is an opt-in metric OTEL_VLLM_ASCEND_ENABLED_METRICS does not name (off by default)."""
    from .catalogue import OPT_IN

    enabled = enabled_metric_patterns()
    return seed in OPT_IN and not (enabled and metric_disabled(seed, enabled))


def enabled_metric_patterns() -> tuple[str, ...]:
    """OTEL_VLLM_ASCEND_ENABLED_METRICS's names and patterns, a profile name (``catalogue.PROFILES``: ``ms-service-
    metric``, any case) replaced by the families it names."""
    from .catalogue import PROFILES

    out: list[str] = []
    for item in _comma_list(ENABLED_METRICS):
        out.extend(PROFILES.get(item.lower(), (item,)))
    return tuple(out)


def hook_semantics() -> str:
    """OTEL_VLLM_ASCEND_HOOK_SEMANTICS: ``default`` or ``ms-service-metric`` (any case); unset or anything else:
    ``default`` (anything else with one warning)."""
    raw = os.environ.get(HOOK_SEMANTICS)
    if raw is None:
        return DEFAULT_SEMANTICS
    value = raw.strip().lower()
    if value in (DEFAULT_SEMANTICS, INCUMBENT_SEMANTICS):
        return value
    warn_once(
        (HOOK_SEMANTICS, raw),
        "opentelemetry-instrumentation-vllm-ascend: %s=%r is neither %s nor %s; using %s",
        HOOK_SEMANTICS,
        raw,
        DEFAULT_SEMANTICS,
        INCUMBENT_SEMANTICS,
        DEFAULT_SEMANTICS,
    )
    return DEFAULT_SEMANTICS


def disabled_scope_patterns() -> tuple[str, ...]:
    return _comma_list(DISABLED_SCOPES)


def metric_disabled(seed: str, patterns: tuple[str, ...] | None = None) -> bool:
    """Whether the catalogue metric ``seed`` (with or without the ``vllm_profiling_`` prefix in the
    pattern) is switched off by OTEL_VLLM_ASCEND_DISABLED_METRICS, or is an opt-in metric not enabled by
    OTEL_VLLM_ASCEND_ENABLED_METRICS (``patterns``: match these instead)."""
    import fnmatch

    for pattern in disabled_metric_patterns() if patterns is None else patterns:
        if pattern.startswith("vllm_profiling_"):
            pattern = pattern[len("vllm_profiling_") :]
        if fnmatch.fnmatchcase(seed, pattern):
            return True
    return False


def traces_enabled() -> bool:
    """OTEL_VLLM_ASCEND_TRACES is true (default false)."""
    return flag(TRACES) is True


def positive_int(name: str, default: int) -> int:
    """A positive integer from ``name``: ``default`` when unset or (with one warning) not a positive integer."""
    return integer(name, default, 1)


def threshold_seconds(name: str) -> float | None:
    """A threshold in milliseconds from ``name``, in seconds; None when unset or (one warning) not a number >= 0."""
    value = number(name, None, "a number of milliseconds")
    return value / 1000.0 if value is not None else None


def number(name: str, default: float | None, what: str = "a number >= 0") -> float | None:
    """A finite number >= 0 from ``name``: ``default`` when unset or (one warning) not such a number."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if 0 <= value < float("inf"):
        return value
    warn_once((name, raw), "opentelemetry-instrumentation-vllm-ascend: %s=%r is not %s; ignored", name, raw, what)
    return default


def traces_keep(name: str = TRACES_KEEP, choices: tuple = TRACES_KEEP_CHOICES) -> frozenset:
    """OTEL_VLLM_ASCEND_TRACES_KEEP (or ``name``): the outcomes kept whatever head sampling said (default all of
    ``choices``; ``none``: no outcome)."""
    raw = os.environ.get(name)
    if raw is None:
        return frozenset(choices)
    names = {n.strip().lower() for n in raw.split(",") if n.strip()}
    unknown = names - set(choices) - {"none"}
    if unknown:
        warn_once(
            (name, raw),
            "opentelemetry-instrumentation-vllm-ascend: %s=%r: unknown %s ignored (known: %s)",
            name,
            raw,
            ", ".join(sorted(unknown)),
            ", ".join(choices),
        )
    return frozenset(names & set(choices))


def trace_exporter_names() -> list[str]:
    """Names from OTEL_TRACES_EXPORTER (default ``otlp``, the SDK's); ``none`` means nothing."""
    names = _comma_list(TRACES_EXPORTER) if os.environ.get(TRACES_EXPORTER) is not None else ("otlp",)
    return [n for n in names if n != "none"]
