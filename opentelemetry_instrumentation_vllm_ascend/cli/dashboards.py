"""Generates the Grafana dashboard, the Prometheus recording and alert rules and their Kubernetes
``PrometheusRule`` rendering from the metric catalogue (seeds, kinds and labels only), so that a renamed
metric cannot leave a stale panel or rule behind.

``python -m opentelemetry_instrumentation_vllm_ascend.cli.dashboards [ROOT]`` writes
``deploy/grafana/vllm-ascend.json``, ``deploy/prometheus/rules.yml`` and
``deploy/kubernetes/prometheusrule.yaml`` under ROOT (default: the current directory); a test fails when the
committed files differ from this output. Alert runbooks: docs/deploy.md.

The panels and rules are data: ``SECTIONS`` (rows of ``PanelSpec``, each a list of ``Query``), ``RECORDED_QUANTILES``
and ``SUM_RATES`` (recording rules) and ``ALERTS``. Small functions turn them into PromQL (``BUILDERS``), the
Grafana JSON (``dashboard``) and the rule groups (``rule_groups``); ``to_yaml`` writes YAML through pyyaml.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import yaml

from .. import catalogue, targets

#: Seeds whose metrics only vllm-ascend feeds (its EPLB adaptor, loader and forked EPLB process): their
#: panels are marked "Ascend only" and stay empty on vLLM without vllm-ascend.
ASCEND_ONLY_PREFIXES = ("eplb:",)

#: Panels whose series appear only once a rare event happened (a counter is first exported at its first
#: increment; some gauges are stored only by NPU workers): empty on a healthy CPU run, with the reason.
#: tests/unit/test_event_panels.py records their events through the real handlers and runs their queries on a real
#: Prometheus instead.
EVENT_ONLY = {
    "Health-check failures": "appears at the first failed health check (a dead engine)",
    "Degraded hooks (handler failures)": "appears at a hook's first failure (docs/deploy.md#vllmascendhookdegraded)",
    "Inter-token latency over 1 s / TTFT over threshold": "appears at the first slow token or first token",
    "Draft tokens verified per step": "speculative decoding only",
    "Device utilization": "torch.npu / torch.cuda utilization only (no CPU reading)",
    "KV transfers: bytes per second by direction": "a KV connector (offloading, P/D disaggregation) only",
    "KV transfers per second by direction": "a KV connector (offloading, P/D disaggregation) only",
    "KV transfer duration": "a KV connector (offloading, P/D disaggregation) only",
    "Step time blocked on KV transfers (seconds per second)": "a KV connector (offloading, P/D disaggregation) only",
    "KV transfer failures": "appears at a connector's first failed transfer (NIXL, Mooncake, vllm-ascend's)",
    "Weights offloaded to host memory": "--cpu-offload-gb or --offload-backend only",
}

#: Dashboard variables: (name, label, query). Every one is multi-valued with "All" = ``.*``, so a series that
#: lacks the label (``model`` exists only where the scrape config adds it) still matches.
VARIABLES = (
    ("job", "job", "label_values(vllm_profiling_instrumented_processes, job)"),
    ("instance", "instance", 'label_values(vllm_profiling_instrumented_processes{job=~"$job"}, instance)'),
    ("model", "model", 'label_values(vllm_profiling_instrumented_processes{job=~"$job"}, model)'),
    ("dp", "dp", 'label_values(vllm_profiling_instrumented_processes{job=~"$job", instance=~"$instance"}, dp)'),
    ("role", "role", 'label_values(vllm_profiling_instrumented_processes{job=~"$job", instance=~"$instance"}, role)'),
    ("phase", "phase", 'label_values(vllm_profiling_engine_core:engine_core_step:duration_count{job=~"$job"}, phase)'),
)
#: The trace data source variable (``${traces}``) the latency panels with exemplars link to: a data source variable
#: of this plugin type (Grafana's ``tempo``; set it to ``jaeger`` or ``zipkin`` in the dashboard's settings). The
#: exemplars' own links to their traces come from the Prometheus data source's exemplar setting (docs/deploy.md).
TRACES_VARIABLE = "traces"
TRACES_PLUGIN = "tempo"
#: Labels every query filters on: the scrape's (job, instance, model) and the catalogue's step labels a metric has.
SCRAPE_LABELS = ("job", "instance", "model")
FILTER_LABELS = ("dp", "role", "phase")
#: What the recording and alert rules group by (the dashboards' variables, without phase for ratios).
GROUP = ("job", "instance", "model", "dp", "role")
QUANTILES = (0.5, 0.9, 0.99)
#: The window of every recording rule.
WINDOW = "5m"


def spec(seed: str) -> catalogue.MetricSpec:
    """The catalogue's entry (a KeyError here is a stale panel: the generator and its test fail)."""
    return catalogue.BY_SEED[seed]


def ascend_only(seed: str) -> bool:
    return seed.startswith(ASCEND_ONLY_PREFIXES)


def selector(seed: str) -> str:
    labels = set(targets.all_labels(spec(seed)))
    parts = [f'{label}=~"${label}"' for label in SCRAPE_LABELS]
    parts += [f'{label}=~"${label}"' for label in FILTER_LABELS if label in labels]
    return "{" + ", ".join(parts) + "}"


def _by(labels) -> str:
    return "sum by (" + ", ".join(labels) + ")"


def quantile(seed: str, q: float, by=("instance", "dp", "phase"), window="$__rate_interval") -> str:
    s = spec(seed)
    assert s.kind == catalogue.HISTOGRAM, seed
    return f"histogram_quantile({q:g}, {_by(('le', *by))} (rate({s.prometheus_name}_bucket{selector(seed)}[{window}])))"


def mean(seed: str, by=("instance", "dp", "phase")) -> str:
    """Mean of a histogram's observations; no series where nothing was observed (0/0 filtered)."""
    s = spec(seed)
    assert s.kind == catalogue.HISTOGRAM, seed
    sel = selector(seed)
    return (
        f"{_by(by)} (rate({s.prometheus_name}_sum{sel}[$__rate_interval]))"
        f" / ({_by(by)} (rate({s.prometheus_name}_count{sel}[$__rate_interval])) > 0)"
    )


def sum_rate(seed: str, by=("instance", "dp")) -> str:
    """Per second: a counter's increments, or a histogram's observed values (tokens per second)."""
    s = spec(seed)
    name = s.prometheus_name + ("_sum" if s.kind == catalogue.HISTOGRAM else "")
    assert s.kind != catalogue.GAUGE, seed
    return f"{_by(by)} (rate({name}{selector(seed)}[$__rate_interval]))"


def increase(seed: str, by=("instance", "dp")) -> str:
    s = spec(seed)
    assert s.kind == catalogue.COUNTER, seed
    return f"{_by(by)} (increase({s.prometheus_name}{selector(seed)}[$__rate_interval]))"


def gauge(seed: str, by=("instance", "dp"), agg="max") -> str:
    s = spec(seed)
    assert s.kind == catalogue.GAUGE, seed
    return f"{agg} by ({', '.join(by)}) ({s.prometheus_name}{selector(seed)})"


# -- dashboard: panels as data ---------------------------------------------------------------------------------
BY_DP = ("instance", "dp")
BY_PHASE = ("instance", "dp", "phase")
_LEG = "{{instance}} dp={{dp}}"
_LEG_PHASE = "{{instance}} dp={{dp}} {{phase}}"


@dataclass(frozen=True)
class Query:
    """One row of a panel's queries: its legend, how its PromQL is built (a key of ``BUILDERS``), from which
    seeds, grouped by which labels (and, for a gauge, with which aggregation)."""

    legend: str
    how: str
    seeds: tuple[str, ...]
    by: tuple[str, ...] = BY_DP
    agg: str = "max"


def query(legend: str, how: str, *seeds: str, by: tuple[str, ...] = BY_DP, agg: str = "max") -> Query:
    return Query(legend, how, seeds, by, agg)


def _memory_selector(q: Query) -> str:
    """Every GiB gauge whose seed starts with ``q.seeds[0]``, by name (the scrape labels and dp, role filter)."""
    labels = [f'__name__=~"{catalogue.PREFIX}{q.seeds[0]}.*_gb"']
    labels += [f'{label}=~"${label}"' for label in (*SCRAPE_LABELS, "dp", "role")]
    return "{" + ", ".join(labels) + "}"


#: How a query's targets, (legend, PromQL), are built from it.
BUILDERS: MappingProxyType[str, Callable[[Query], list[tuple[str, str]]]] = MappingProxyType(
    {
        "rate": lambda q: [(q.legend, sum_rate(q.seeds[0], q.by))],
        "rates": lambda q: [(q.legend, " + ".join(sum_rate(seed, q.by) for seed in q.seeds))],
        "increase": lambda q: [(q.legend, increase(q.seeds[0], q.by))],
        "gauge": lambda q: [(q.legend, gauge(q.seeds[0], q.by, q.agg))],
        "mean": lambda q: [(q.legend, mean(q.seeds[0], q.by))],
        "p90": lambda q: [(q.legend, quantile(q.seeds[0], 0.9, q.by))],
        "quantiles": lambda q: [(f"p{x * 100:g} {q.legend}", quantile(q.seeds[0], x, q.by)) for x in QUANTILES],
        "gib_gauges": lambda q: [(q.legend, _memory_selector(q))],
    }
)


def query_seeds(q: Query) -> tuple[str, ...]:
    """The catalogue seeds a query reads (a ``gib_gauges`` query: every GiB gauge under its seed prefix)."""
    if q.how == "gib_gauges":
        return tuple(s.seed for s in catalogue.CATALOGUE if s.seed.startswith(q.seeds[0]) and s.unit == "GiBy")
    return q.seeds


@dataclass(frozen=True)
class PanelSpec:
    """A panel as data. ``description`` None: the catalogue's description of the first seed; ``note`` goes
    before the description."""

    title: str
    unit: str
    queries: tuple[Query, ...]
    description: str | None = None
    note: str = ""
    #: The histogram carries exemplars (``recording.record_exemplar``): its last query shows them, linked to traces.
    exemplars: bool = False


def panel(
    title: str, unit: str, *queries: Query, description: str | None = None, note: str = "", exemplars: bool = False
) -> PanelSpec:
    return PanelSpec(title, unit, queries, description, note, exemplars)


def quantiles(
    title: str, seed: str, by: tuple[str, ...] = BY_PHASE, legend: str = _LEG_PHASE, exemplars: bool = False
) -> PanelSpec:
    """p50, p90 and p99 of one histogram (in seconds)."""
    return panel(title, "s", query(legend, "quantiles", seed, by=by), exemplars=exemplars)


_EPLB_TRANSFERS = (
    "eplb:expert_weight_update:duration",
    "eplb:expert_map_update:duration",
    "eplb:log2phy_map_update:duration",
    "eplb:expert_weight_replace:duration",
)

OVERVIEW = (
    panel(
        "Output tokens per second (TPS)",
        "short",
        query(_LEG, "rate", "output"),
        query(f"total {_LEG}", "rates", "input", "output"),
        description="Generated tokens per second (rate of the output histogram's sum), and prompt plus generated"
        " (input + output: what the opt-in total_tokens records).",
    ),
    panel("Input tokens per second", "short", query(_LEG, "rate", "input")),
    quantiles("Time to first token (TTFT)", "fine_grained_ttft", BY_DP, _LEG, exemplars=True),
    quantiles("Time per output token (TPOT)", "fine_grained_tpot", BY_DP, _LEG, exemplars=True),
    quantiles("Second-token latency", "second_token_latency", BY_DP, _LEG),
    panel(
        "Sequence length per step (mean context)",
        "short",
        query(_LEG_PHASE, "gauge", "scheduler:seqlen:avg", by=BY_PHASE),
    ),
    panel(
        "KV cache blocks",
        "short",
        query(f"allocated {_LEG}", "gauge", "allocated_kvcache_blocks"),
        query(f"free {_LEG}", "gauge", "free_kvcache_blocks"),
        query(f"total {_LEG}", "gauge", "total_kvcache_blocks"),
        description="KV cache blocks of each engine after the last scheduled step.",
    ),
    panel(
        "Instrumented processes",
        "short",
        query(
            "{{instance}} {{process}} dp={{dp}}",
            "gauge",
            "instrumented_processes",
            by=("instance", "process", "dp"),
            agg="sum",
        ),
    ),
)
STAGE_LATENCY = (
    quantiles("Engine step", "engine_core:engine_core_step:duration"),
    quantiles("Scheduler.schedule", "scheduler:duration"),
    quantiles("Scheduler.update_from_output (post process)", "scheduler:update_from_output:duration"),
    quantiles("execute_model RPC (as the engine sees it)", "executor:execute_model:duration"),
    quantiles("sample_tokens RPC (sample_token)", "executor:sample_tokens:duration"),
    quantiles("Model runner execute_model (worker)", "executor:model_runner_execute_model:duration"),
    quantiles("Prepare inputs (worker)", "executor:prepare_inputs:duration"),
    quantiles("Target inference time (worker)", "worker:model_inference:duration"),
    quantiles("npu:forward_duration", "npu:forward_duration"),
    quantiles("npu:kernel_launch", "npu:kernel_launch"),
    quantiles("npu:non_forward_duration", "npu:non_forward_duration"),
    panel(
        "Profiling scopes, p90 (opt-in: OTEL_VLLM_ASCEND_ENABLED_METRICS=record_function_or_nullcontext)",
        "s",
        query("{{name}} {{instance}} dp={{dp}}", "p90", "record_function_or_nullcontext", by=(*BY_DP, "name")),
        note="Opt-in (series budget): empty unless OTEL_VLLM_ASCEND_ENABLED_METRICS names it. ",
    ),
    quantiles("Output processing (API server)", "output_processor_duration", BY_DP, _LEG),
)
STAGE_BUDGET = (
    panel(
        "EngineCore busy loop: seconds per second by stage",
        "percentunit",
        query("{{stage}} " + _LEG, "rate", "engine_core:stage_seconds", by=(*BY_DP, "stage")),
    ),
    panel(
        "Worker step: seconds per second by stage",
        "percentunit",
        query("{{stage}} " + _LEG + " rank={{rank}}", "rate", "worker:stage_seconds", by=(*BY_DP, "rank", "stage")),
    ),
    panel(
        "API server output loop: seconds per second by stage",
        "percentunit",
        query("{{stage}} " + _LEG, "rate", "api_server:output_loop_stage_seconds", by=(*BY_DP, "stage")),
    ),
    panel(
        "KV-cache writes per second by request phase",
        "Bps",
        query("{{req_phase}} " + _LEG, "rate", "kv_cache:write_bytes", by=(*BY_DP, "req_phase")),
    ),
    panel(
        "KV transfers: bytes per second by direction",
        "Bps",
        query(
            "{{direction}} {{connector}} " + _LEG, "rate", "kv_transfer:bytes", by=(*BY_DP, "direction", "connector")
        ),
    ),
    panel(
        "KV transfers per second by direction",
        "ops",
        query(
            "{{direction}} {{connector}} " + _LEG, "rate", "kv_transfer:count", by=(*BY_DP, "direction", "connector")
        ),
    ),
    quantiles("KV transfer duration", "kv_transfer:duration", (*BY_DP, "direction"), _LEG + " {{direction}}"),
    panel(
        "Step time blocked on KV transfers (seconds per second)",
        "percentunit",
        query(_LEG_PHASE, "rate", "kv_transfer:blocking:duration", by=BY_PHASE),
    ),
    panel(
        "KV transfer failures",
        "short",
        query(
            "{{direction}} {{connector}} " + _LEG,
            "increase",
            "kv_transfer:failures",
            by=(*BY_DP, "direction", "connector"),
        ),
    ),
)
SCHEDULING = (
    panel(
        "Batch size per step (mean)",
        "short",
        query("{{role}} " + _LEG_PHASE, "mean", "scheduler:batch_size", by=("instance", "dp", "role", "phase")),
    ),
    panel(
        "Scheduled tokens per second by request phase",
        "short",
        query(
            "{{req_phase}} {{role}} " + _LEG,
            "rate",
            "scheduler:phase_scheduled_token_counter",
            by=("instance", "dp", "role", "req_phase"),
        ),
    ),
    panel(
        "Running and waiting requests (mean per step)",
        "short",
        query("running {{req_phase}} " + _LEG, "mean", "running_phase_batch_size", by=(*BY_DP, "req_phase")),
        query("waiting {{req_phase}} " + _LEG, "mean", "waiting_phase_batch_size", by=(*BY_DP, "req_phase")),
        description="Requests in the running and waiting queues after each step, by request phase.",
    ),
    panel(
        "Recompute after preemption",
        "short",
        query(f"tokens/s {_LEG}", "rate", "scheduler:recomputed_tokens"),
        query(f"events/s {_LEG}", "rate", "scheduler:recompute_events"),
    ),
    panel("Draft tokens verified per step", "short", query(_LEG, "mean", "num_spec_tokens")),
)
EPLB = (
    panel(
        "Expert load imbalance, placement in use vs computed",
        "short",
        *(
            query(f"{placement} {stat} {_LEG}", "gauge", catalogue.eplb_hotness_seed(placement, stat))
            for placement in catalogue.EPLB_PLACEMENTS
            for stat in catalogue.EPLB_STATS
        ),
        description="Imbalance (max/mean over EP ranks, 1.0 = balanced) of the placement in use and of the one"
        " EPLB computed.",
    ),
    panel(
        "Imbalance per MoE layer",
        "short",
        query("layer {{layer}} " + _LEG, "gauge", "eplb:expert_hotness:imbalance", by=(*BY_DP, "layer")),
    ),
    panel(
        "Busiest EP rank's load per layer",
        "short",
        query("layer {{layer}} " + _LEG, "gauge", catalogue.eplb_layer_load_seed("max"), by=(*BY_DP, "layer")),
    ),
    panel(
        "Expert transfer times, p90",
        "s",
        *(query(f"{seed.split(':')[1]} {_LEG}", "p90", seed) for seed in _EPLB_TRANSFERS),
        description="Host time of one MoE layer's expert weight/map update in a rebalance.",
    ),
)
EXCEPTIONS = (
    panel(
        "Preemptions (running → waiting)",
        "short",
        query(_LEG_PHASE, "increase", "running_to_waiting_count", by=BY_PHASE),
    ),
    panel("KV block allocation failures", "short", query(_LEG, "increase", "block_allocate_failures")),
    panel(
        "Worker RPC errors",
        "short",
        query("{{exception_type}} " + _LEG, "increase", "rpc_errors", by=(*BY_DP, "exception_type")),
    ),
    panel("Scheduler blocked on capacity", "short", query(_LEG, "increase", "request_prefill_pending_nums")),
    panel("Health-check failures", "short", query(_LEG, "increase", "health_check_failed")),
    panel(
        "Degraded hooks (handler failures)",
        "short",
        query(
            "{{process}} {{hook}} in {{where}} " + _LEG,
            "increase",
            "hook_errors",
            by=(*BY_DP, "process", "hook", "where"),
        ),
    ),
    panel(
        "Inter-token latency over 1 s / TTFT over threshold",
        "short",
        query(f"ITL > 1 s {_LEG}", "increase", "decode_over_1s_count"),
        query("TTFT > {{threshold}} " + _LEG, "increase", "prefill_over_threshold_count", by=(*BY_DP, "threshold")),
        description="Slow tokens, counted by the API server.",
    ),
)
MEMORY = (
    panel(
        "Worker device memory (after warm-up)",
        "decgbytes",
        query("{{__name__}} {{instance}} dp={{dp}} rank={{rank}}", "gib_gauges", "engine:memory:"),
        description="Memory breakdown each worker stored after warm-up (GiB).",
    ),
    panel(
        "Device utilization", "percent", query("{{device}} " + _LEG, "gauge", "npu:utilization", by=(*BY_DP, "device"))
    ),
    panel(
        "Weights offloaded to host memory",
        "bytes",
        query("{{offloader}} " + _LEG, "gauge", "memory:weight_offload_bytes", by=(*BY_DP, "offloader"), agg="sum"),
    ),
)
#: The dashboard's rows (the design's 总览 / 阶段时延 / 调度与角色 / EPLB / 异常), then memory.
SECTIONS = (
    ("Overview (总览)", OVERVIEW),
    ("Stage latency (阶段时延)", STAGE_LATENCY),
    ("Where the time goes: stage budget and KV transfers", STAGE_BUDGET),
    ("Scheduling and roles (调度与角色)", SCHEDULING),
    ("EPLB (Ascend only)", EPLB),
    ("Exceptions (异常)", EXCEPTIONS),
    ("Memory and device", MEMORY),
)


@dataclass
class Panel:
    """A panel with its queries built: what the dashboard JSON and the tests read."""

    title: str
    unit: str
    #: (legend, PromQL)
    targets: list[tuple[str, str]]
    seeds: tuple[str, ...]
    description: str = ""
    kind: str = "timeseries"
    extra: dict = field(default_factory=dict)
    exemplars: bool = False

    @property
    def ascend_only(self) -> bool:
        return all(ascend_only(s) for s in self.seeds)


def build_panel(p: PanelSpec) -> Panel:
    """A panel's targets, seeds and description from its spec (a KeyError is a stale seed)."""
    seeds = tuple(dict.fromkeys(seed for q in p.queries for seed in query_seeds(q)))
    description = spec(seeds[0]).description if p.description is None else p.description
    targets = [target for q in p.queries for target in BUILDERS[q.how](q)]
    return Panel(p.title, p.unit, targets, seeds, p.note + description, exemplars=p.exemplars)


def sections() -> list[tuple[str, list[Panel]]]:
    """The dashboard's rows and their panels, built from ``SECTIONS``."""
    return [(title, [build_panel(p) for p in specs]) for title, specs in SECTIONS]


def _datasource() -> dict:
    return {"type": "prometheus", "uid": "${datasource}"}


def _template(name: str, label: str, query: str) -> dict:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": _datasource(),
        "query": {"query": query, "refId": f"var-{name}"},
        "definition": query,
        "refresh": 2,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
    }


def _templating() -> dict:
    source = {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus", "current": {}}
    traces = {
        "name": TRACES_VARIABLE,
        "label": "Traces data source",
        "type": "datasource",
        "query": TRACES_PLUGIN,
        "current": {},
        "description": "Where the traces of the latency panels' exemplars are (Tempo, Jaeger, …: edit the variable's "
        "type to match).",
    }
    return {"list": [source] + [_template(*v) for v in VARIABLES] + [traces]}


def _traces_link() -> dict:
    """The panel link to the ``${traces}`` data source in Explore over the panel's time range."""
    source = "${" + TRACES_VARIABLE + "}"
    left = json.dumps({"datasource": source, "range": {"from": "${__from}", "to": "${__to}"}}, separators=(",", ":"))
    return {"title": f"Traces ({source})", "url": "/explore?left=" + left, "targetBlank": True}


def _description(p: Panel) -> str:
    description = p.description
    if p.ascend_only:
        description = "Ascend only (vllm-ascend's EPLB). " + description
    if p.title in EVENT_ONLY:
        description = f"Empty until it happens: {EVENT_ONLY[p.title]}. " + description
    if p.exemplars:
        description += (
            " Exemplars (the dots; Prometheus with --enable-feature=exemplar-storage) are requests of exported "
            "traces: a dot's trace_id opens its trace in the traces data source."
        )
    return description


def _panel_json(p: Panel, pid: int, grid: dict) -> dict:
    targets: list[dict] = [
        {"datasource": _datasource(), "expr": expr, "legendFormat": legend, "refId": chr(ord("A") + k)}
        for k, (legend, expr) in enumerate(p.targets)
    ]
    extra: dict = {}
    if p.exemplars:
        targets[-1]["exemplar"] = True  # one query's (the p99's): they all select the same series
        extra["links"] = [_traces_link()]
    return {
        "id": pid,
        "type": p.kind,
        "title": p.title + (" [Ascend only]" if p.ascend_only else ""),
        "description": _description(p),
        "datasource": _datasource(),
        "gridPos": grid,
        "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": targets,
        **extra,
    }


def _layout(rows: list[tuple[str, list[Panel]]]) -> list[dict]:
    """Each row's header (1 high), then its panels three to a line (8 by 8); ids in order from 1."""
    out: list[dict] = []
    y = 0
    for title, items in rows:
        row_grid = {"h": 1, "w": 24, "x": 0, "y": y}
        out.append({"id": len(out) + 1, "type": "row", "title": title, "collapsed": False, "gridPos": row_grid})
        y += 1
        for i, p in enumerate(items):
            out.append(_panel_json(p, len(out) + 1, {"h": 8, "w": 8, "x": (i % 3) * 8, "y": y + (i // 3) * 8}))
        y += ((len(items) + 2) // 3) * 8
    return out


def dashboard() -> dict:
    return {
        "title": "vLLM (Ascend) profiling",
        "uid": "vllm-ascend-profiling",
        "description": "Generated by python -m opentelemetry_instrumentation_vllm_ascend.cli.dashboards; do not edit.",
        "tags": ["vllm", "vllm-ascend", "opentelemetry"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "templating": _templating(),
        "panels": _layout(sections()),
        "annotations": {"list": []},
    }


# -- rules as data ---------------------------------------------------------------------------------------------
#: Histograms whose quantiles the dashboards show and the rules record (as ``record_name(seed, "p90_5m")`` …).
RECORDED_QUANTILES = (
    "fine_grained_ttft",
    "fine_grained_tpot",
    "engine_core:engine_core_step:duration",
    "scheduler:duration",
    "executor:execute_model:duration",
    "executor:model_runner_execute_model:duration",
    "worker:model_inference:duration",
)


def record_name(seed: str, what: str) -> str:
    return "vllm_ascend:" + seed.replace(":", "_") + ":" + what


def _g(extra: tuple[str, ...] = ()) -> str:
    return ", ".join((*GROUP, *extra))


def _metric(seed: str, suffix: str = "") -> str:
    return spec(seed).prometheus_name + suffix


@dataclass(frozen=True)
class SumRate:
    """A recording rule over ``WINDOW``: the summed rate of a (seed, suffix) series, divided, where ``per`` is
    given, by the summed rate of another (whose zeros are dropped: silent on no traffic)."""

    record: str
    rate_of: tuple[str, str]
    per: tuple[str, str] | None = None
    extra_group: tuple[str, ...] = ()


_STEP = "engine_core:engine_core_step:duration"
#: The recording rules besides the quantiles (their names end in ``_{WINDOW}``).
SUM_RATES = (
    SumRate(record_name(_STEP, "mean"), (_STEP, "_sum"), (_STEP, "_count"), ("phase",)),
    SumRate("vllm_ascend:scheduler_step_share:ratio", ("scheduler:duration", "_sum"), (_STEP, "_sum")),
    SumRate(record_name("running_to_waiting_count", "rate"), ("running_to_waiting_count", "")),
    SumRate(record_name("output", "tokens_per_second"), ("output", "_sum")),
)


def _quantile_rule(seed: str, q: float) -> dict:
    return {
        "record": record_name(seed, f"p{q * 100:g}_{WINDOW}"),
        "expr": f"histogram_quantile({q:g}, sum by ({_g(('phase', 'le'))}) "
        f"(rate({_metric(seed, '_bucket')}[{WINDOW}])))",
    }


def _sum_rate_rule(r: SumRate) -> dict:
    by = _g(r.extra_group)
    expr = f"sum by ({by}) (rate({_metric(*r.rate_of)}[{WINDOW}]))"
    if r.per is not None:
        expr += f" / (sum by ({by}) (rate({_metric(*r.per)}[{WINDOW}])) > 0)"
    return {"record": f"{r.record}_{WINDOW}", "expr": expr}


def recording_rules() -> list[dict]:
    quantile_rules = [_quantile_rule(seed, q) for seed in RECORDED_QUANTILES for q in QUANTILES]
    return quantile_rules + [_sum_rate_rule(r) for r in SUM_RATES]


#: Thresholds the alerts use (documented in docs/deploy.md, with the runbooks).
PREEMPTIONS_PER_5M = 5
ALLOCATION_FAILURES_PER_S = 1 / 60
STEP_REGRESSION = 1.5
SCHEDULER_SHARE = 0.3
EPLB_IMBALANCE = 1.5
RUNBOOK = "docs/deploy.md#"  # the runbook of each alert: its section in docs/deploy.md


def _any_event(counter: str, by: str) -> str:
    """A counter that rose in the last 5 minutes, or a series that appeared in them: a counter is first exported
    at its first increment, and ``increase()`` cannot see the step from "no series" to 1."""
    return (
        f"(sum by ({by}) (increase({counter}[5m])) > 0)"
        f" or (sum by ({by}) ({counter}) > 0 unless sum by ({by}) ({counter} offset 5m))"
    )


def _with_births(counter: str, fn: str = "increase") -> str:
    """Per series, ``fn`` (``increase`` or ``rate``) of a counter over the last 5 minutes, or, for a series that
    appeared in them, its whole value (as an increase, or per second of the window): a counter is first exported
    at its first increment, so a series born mid-window starts above 0 and ``increase()`` loses its first scrape's
    value. Series that existed 5 minutes ago take the ``fn`` branch; the others the value branch."""
    born = f"({counter} unless {counter} offset 5m)"
    if fn == "rate":
        born = f"({born} / 300)"
    return f"(({fn}({counter}[5m]) and {counter} offset 5m) or {born})"


def _event(seed: str, *labels: str) -> Callable[[str], str]:
    """An alert's expression: any event of a counter, by the rules' group and ``labels``."""
    return lambda g: _any_event(_metric(seed), ", ".join((g, *labels)))


@dataclass(frozen=True)
class Alert:
    """An alert as data; ``expr`` builds its PromQL from the group-by list (``GROUP``, joined)."""

    name: str
    expr: Callable[[str], str]
    for_: str | None
    severity: str
    summary: str


_STEP_P90 = record_name(_STEP, f"p90_{WINDOW}")
_PROCESSES = "instrumented_processes"
#: The placement in use (EPLB_PLACEMENTS[0]): the one EPLB chose at its previous rebalance.
_EPLB_IN_USE = catalogue.eplb_hotness_seed(catalogue.EPLB_PLACEMENTS[0], "max")
ALERTS = (
    Alert(
        "VLLMAscendPreemptionStorm",
        lambda g: f"sum by ({g}) {_with_births(_metric('running_to_waiting_count'))} > {PREEMPTIONS_PER_5M}",
        "1m",
        "warning",
        "{{ $labels.instance }} dp={{ $labels.dp }}: {{ $value | humanize }} preemptions in 5 minutes"
        " (KV cache too small for the load).",
    ),
    Alert(
        "VLLMAscendKVBlockAllocationFailures",
        lambda g: (
            f"sum by ({g}) {_with_births(_metric('block_allocate_failures'), 'rate')} > {ALLOCATION_FAILURES_PER_S:.6g}"
        ),
        "5m",
        "warning",
        "{{ $labels.instance }} dp={{ $labels.dp }}: KV block allocations keep failing ({{ $value | humanize }}/s).",
    ),
    Alert(
        "VLLMAscendWorkerRPCError",
        _event("rpc_errors", "exception_type"),
        None,
        "critical",
        "{{ $labels.instance }} dp={{ $labels.dp }}: executor RPC to the workers failed"
        " ({{ $labels.exception_type }}).",
    ),
    Alert(
        "VLLMAscendHealthCheckFailed",
        _event("health_check_failed"),
        None,
        "critical",
        "{{ $labels.instance }}: /health found the engine dead.",
    ),
    Alert(
        "VLLMAscendStepTimeRegression",
        lambda g: f"{_STEP_P90} > {STEP_REGRESSION:g} * ({_STEP_P90} offset 1d)",
        "15m",
        "warning",
        "{{ $labels.instance }} dp={{ $labels.dp }} {{ $labels.phase }}: p90 engine step"
        " {{ $value | humanizeDuration }}, over 1.5x the same hour yesterday.",
    ),
    Alert(
        "VLLMAscendSchedulerShareHigh",
        lambda g: f"vllm_ascend:scheduler_step_share:ratio_{WINDOW} > {SCHEDULER_SHARE:g}",
        "10m",
        "warning",
        "{{ $labels.instance }} dp={{ $labels.dp }}: the scheduler takes {{ $value | humanizePercentage }}"
        " of the engine step.",
    ),
    Alert(
        "VLLMAscendEPLBImbalanceHigh",
        lambda g: f"max by ({g}) ({_metric(_EPLB_IN_USE)}) > {EPLB_IMBALANCE:g}",
        "30m",
        "warning",
        "{{ $labels.instance }} dp={{ $labels.dp }}: expert load imbalance {{ $value | humanize }}"
        " with the placement EPLB chose.",
    ),
    Alert(
        "VLLMAscendInstrumentationAbsent",
        lambda g: f'absent({_metric(_PROCESSES)}{{process="engine_core"}})',
        "10m",
        "critical",
        "No engine-core process reports vllm_profiling_ metrics to this Prometheus.",
    ),
    Alert(
        "VLLMAscendInstrumentationVanished",
        lambda g: (
            f"max by (job, instance) ({_metric(_PROCESSES)} offset 1h)"
            f" unless max by (job, instance) ({_metric(_PROCESSES)})"
        ),
        "10m",
        "warning",
        "{{ $labels.instance }} reported vllm_profiling_ metrics an hour ago and reports none now.",
    ),
    Alert(
        "VLLMAscendKVTransferFailures",
        _event("kv_transfer:failures", "direction", "connector"),
        None,
        "warning",
        "{{ $labels.instance }} dp={{ $labels.dp }}: {{ $labels.connector }} reported failed KV transfers"
        " ({{ $labels.direction }}).",
    ),
    Alert(
        "VLLMAscendHookDegraded",
        # every failure of a handler (or of one guarded read in it) counts; the rank of a worker is summed over
        _event("hook_errors", "process", "hook", "where"),
        None,
        "warning",
        "{{ $labels.instance }} dp={{ $labels.dp }} {{ $labels.process }}: the instrumentation's hook"
        " {{ $labels.hook }} failed in {{ $labels.where }}; the metrics it feeds are partly missing"
        " (vLLM is unaffected).",
    ),
)


def _alert_rule(a: Alert) -> dict:
    rule: dict = {"alert": a.name, "expr": a.expr(_g())}
    if a.for_:
        rule["for"] = a.for_
    rule["labels"] = {"severity": a.severity}
    rule["annotations"] = {"summary": a.summary, "runbook": RUNBOOK + a.name.lower()}
    return rule


def alert_rules() -> list[dict]:
    return [_alert_rule(a) for a in ALERTS]


def rule_groups() -> dict:
    return {
        "groups": [
            {"name": "vllm-ascend-recording", "rules": recording_rules()},
            {"name": "vllm-ascend-alerts", "rules": alert_rules()},
        ]
    }


def prometheus_rule() -> dict:
    """The rules as a prometheus-operator ``PrometheusRule``."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "vllm-ascend", "labels": {"app.kubernetes.io/name": "vllm-ascend"}},
        "spec": rule_groups(),
    }


# -- files ------------------------------------------------------------------------------------------------------
class _Quoted(str):
    """A string value the YAML is to show double-quoted (keys stay plain)."""


class _Dumper(yaml.SafeDumper):
    """The safe dumper, with a block sequence indented under its key (``rules:\\n  - record: …``)."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        return super().increase_indent(flow, False)


_Dumper.add_representer(_Quoted, lambda dumper, s: dumper.represent_scalar("tag:yaml.org,2002:str", str(s), style='"'))


def _quote_values(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _quote_values(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_quote_values(v) for v in value]
    return _Quoted(value) if isinstance(value, str) else value


def to_yaml(value: Any) -> str:
    """Block YAML, keys in their order, every string value double-quoted on one line (an expression is never
    folded), non-ASCII characters as they are."""
    return yaml.dump(
        _quote_values(value),
        Dumper=_Dumper,
        default_flow_style=False,
        sort_keys=False,
        allow_unicode=True,
        indent=2,
        width=2**31 - 1,
    )


HEADER = "# Generated by python -m opentelemetry_instrumentation_vllm_ascend.cli.dashboards; do not edit.\n"


def render() -> dict[str, str]:
    """{path relative to the repository root: file text}."""
    return {
        "deploy/grafana/vllm-ascend.json": json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n",
        "deploy/prometheus/rules.yml": HEADER + to_yaml(rule_groups()),
        "deploy/kubernetes/prometheusrule.yaml": HEADER + to_yaml(prometheus_rule()),
    }


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    root = argv[0] if argv else "."
    for path, text in render().items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as f:
            f.write(text)
        print(full)
    return 0


if __name__ == "__main__":
    sys.exit(main())
