"""Generates the Grafana dashboard, the Prometheus recording and alert rules and their Kubernetes
``PrometheusRule`` rendering from the metric catalogue (seeds, kinds and labels only), so that a renamed
metric cannot leave a stale panel or rule behind.

``python -m opentelemetry_instrumentation_vllm_ascend.cli.dashboards [ROOT]`` writes
``deploy/grafana/vllm-ascend.json``, ``deploy/prometheus/rules.yml`` and
``deploy/kubernetes/prometheusrule.yaml`` under ROOT (default: the current directory); a test fails when the
committed files differ from this output. Alert runbooks: docs/deploy.md.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field

from .. import catalogue

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
    labels = set(spec(seed).all_labels)
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


@dataclass
class Panel:
    title: str
    unit: str
    #: (legend, PromQL)
    targets: list[tuple[str, str]]
    seeds: tuple[str, ...]
    description: str = ""
    kind: str = "timeseries"
    extra: dict = field(default_factory=dict)

    @property
    def ascend_only(self) -> bool:
        return all(ascend_only(s) for s in self.seeds)


def _quantile_panel(title: str, seed: str, by=("instance", "dp", "phase"), legend="{{instance}} dp={{dp}} {{phase}}"):
    return Panel(
        title,
        "s",
        [(f"p{q * 100:g} {legend}", quantile(seed, q, by)) for q in QUANTILES],
        (seed,),
        spec(seed).description,
    )


_LEG = "{{instance}} dp={{dp}}"
_LEG_PHASE = "{{instance}} dp={{dp}} {{phase}}"


def sections() -> list[tuple[str, list[Panel]]]:
    """The dashboard's rows (the design's 总览 / 阶段时延 / 调度与角色 / EPLB / 异常), then memory."""
    overview = [
        Panel(
            "Output tokens per second (TPS)",
            "short",
            [(_LEG, sum_rate("output")), (f"total {_LEG}", f"{sum_rate('input')} + {sum_rate('output')}")],
            ("output", "input"),
            "Generated tokens per second (rate of the output histogram's sum), and prompt plus generated (input +"
            " output: what the opt-in total_tokens records).",
        ),
        Panel(
            "Input tokens per second",
            "short",
            [(_LEG, sum_rate("input"))],
            ("input",),
            spec("input").description,
        ),
        _quantile_panel("Time to first token (TTFT)", "fine_grained_ttft", ("instance", "dp"), _LEG),
        _quantile_panel("Time per output token (TPOT)", "fine_grained_tpot", ("instance", "dp"), _LEG),
        _quantile_panel("Second-token latency", "second_token_latency", ("instance", "dp"), _LEG),
        Panel(
            "Sequence length per step (mean context)",
            "short",
            [(_LEG_PHASE, gauge("scheduler:seqlen:avg", ("instance", "dp", "phase")))],
            ("scheduler:seqlen:avg",),
            spec("scheduler:seqlen:avg").description,
        ),
        Panel(
            "KV cache blocks",
            "short",
            [
                (f"allocated {_LEG}", gauge("allocated_kvcache_blocks")),
                (f"free {_LEG}", gauge("free_kvcache_blocks")),
                (f"total {_LEG}", gauge("total_kvcache_blocks")),
            ],
            ("allocated_kvcache_blocks", "free_kvcache_blocks", "total_kvcache_blocks"),
            "KV cache blocks of each engine after the last scheduled step.",
        ),
        Panel(
            "Instrumented processes",
            "short",
            [
                (
                    "{{instance}} {{process}} dp={{dp}}",
                    gauge("instrumented_processes", ("instance", "process", "dp"), agg="sum"),
                )
            ],
            ("instrumented_processes",),
            spec("instrumented_processes").description,
        ),
    ]
    stage = [
        _quantile_panel("Engine step", "engine_core:engine_core_step:duration"),
        _quantile_panel("Scheduler.schedule", "scheduler:duration"),
        _quantile_panel("Scheduler.update_from_output (post process)", "scheduler:update_from_output:duration"),
        _quantile_panel("execute_model RPC (as the engine sees it)", "executor:execute_model:duration"),
        _quantile_panel("sample_tokens RPC (sample_token)", "executor:sample_tokens:duration"),
        _quantile_panel("Model runner execute_model (worker)", "executor:model_runner_execute_model:duration"),
        _quantile_panel("Prepare inputs (worker)", "executor:prepare_inputs:duration"),
        _quantile_panel("Target inference time (worker)", "worker:model_inference:duration"),
        _quantile_panel("npu:forward_duration", "npu:forward_duration"),
        _quantile_panel("npu:kernel_launch", "npu:kernel_launch"),
        _quantile_panel("npu:non_forward_duration", "npu:non_forward_duration"),
        Panel(
            "Profiling scopes, p90 (opt-in: OTEL_VLLM_ASCEND_ENABLED_METRICS=record_function_or_nullcontext)",
            "s",
            [
                (
                    "{{name}} {{instance}} dp={{dp}}",
                    quantile("record_function_or_nullcontext", 0.9, ("instance", "dp", "name")),
                )
            ],
            ("record_function_or_nullcontext",),
            "Opt-in (series budget): empty unless OTEL_VLLM_ASCEND_ENABLED_METRICS names it. "
            + spec("record_function_or_nullcontext").description,
        ),
        _quantile_panel("Output processing (API server)", "output_processor_duration", ("instance", "dp"), _LEG),
    ]
    scheduling = [
        Panel(
            "Batch size per step (mean)",
            "short",
            [(f"{{{{role}}}} {_LEG_PHASE}", mean("scheduler:batch_size", ("instance", "dp", "role", "phase")))],
            ("scheduler:batch_size",),
            spec("scheduler:batch_size").description,
        ),
        Panel(
            "Scheduled tokens per second by request phase",
            "short",
            [
                (
                    "{{req_phase}} {{role}} " + _LEG,
                    sum_rate("scheduler:phase_scheduled_token_counter", ("instance", "dp", "role", "req_phase")),
                )
            ],
            ("scheduler:phase_scheduled_token_counter",),
            spec("scheduler:phase_scheduled_token_counter").description,
        ),
        Panel(
            "Running and waiting requests (mean per step)",
            "short",
            [
                (
                    "running {{req_phase}} " + _LEG,
                    mean("running_phase_batch_size", ("instance", "dp", "req_phase")),
                ),
                (
                    "waiting {{req_phase}} " + _LEG,
                    mean("waiting_phase_batch_size", ("instance", "dp", "req_phase")),
                ),
            ],
            ("running_phase_batch_size", "waiting_phase_batch_size"),
            "Requests in the running and waiting queues after each step, by request phase.",
        ),
        Panel(
            "Recompute after preemption",
            "short",
            [
                (f"tokens/s {_LEG}", sum_rate("scheduler:recomputed_tokens")),
                (f"events/s {_LEG}", sum_rate("scheduler:recompute_events")),
            ],
            ("scheduler:recomputed_tokens", "scheduler:recompute_events"),
            spec("scheduler:recomputed_tokens").description,
        ),
        Panel(
            "Draft tokens verified per step",
            "short",
            [(_LEG, mean("num_spec_tokens", ("instance", "dp")))],
            ("num_spec_tokens",),
            spec("num_spec_tokens").description,
        ),
    ]
    eplb = [
        Panel(
            "Expert load imbalance, placement in use vs computed",
            "short",
            [
                (f"{placement} {stat} {_LEG}", gauge(catalogue.eplb_hotness_seed(placement, stat)))
                for placement in catalogue.EPLB_PLACEMENTS
                for stat in catalogue.EPLB_STATS
            ],
            catalogue.EPLB_HOTNESS_SEEDS,
            "Imbalance (max/mean over EP ranks, 1.0 = balanced) of the placement in use and of the one EPLB computed.",
        ),
        Panel(
            "Imbalance per MoE layer",
            "short",
            [("layer {{layer}} " + _LEG, gauge("eplb:expert_hotness:imbalance", ("instance", "dp", "layer")))],
            ("eplb:expert_hotness:imbalance",),
            spec("eplb:expert_hotness:imbalance").description,
        ),
        Panel(
            "Busiest EP rank's load per layer",
            "short",
            [("layer {{layer}} " + _LEG, gauge(catalogue.eplb_layer_load_seed("max"), ("instance", "dp", "layer")))],
            (catalogue.eplb_layer_load_seed("max"),),
            spec(catalogue.eplb_layer_load_seed("max")).description,
        ),
        Panel(
            "Expert transfer times, p90",
            "s",
            [
                (
                    f"{seed.split(':')[1]} {_LEG}",
                    quantile(seed, 0.9, ("instance", "dp")),
                )
                for seed in (
                    "eplb:expert_weight_update:duration",
                    "eplb:expert_map_update:duration",
                    "eplb:log2phy_map_update:duration",
                    "eplb:expert_weight_replace:duration",
                )
            ],
            (
                "eplb:expert_weight_update:duration",
                "eplb:expert_map_update:duration",
                "eplb:log2phy_map_update:duration",
                "eplb:expert_weight_replace:duration",
            ),
            "Host time of one MoE layer's expert weight/map update in a rebalance.",
        ),
    ]
    exceptions = [
        Panel(
            "Preemptions (running → waiting)",
            "short",
            [(_LEG_PHASE, increase("running_to_waiting_count", ("instance", "dp", "phase")))],
            ("running_to_waiting_count",),
            spec("running_to_waiting_count").description,
        ),
        Panel(
            "KV block allocation failures",
            "short",
            [(_LEG, increase("block_allocate_failures"))],
            ("block_allocate_failures",),
            spec("block_allocate_failures").description,
        ),
        Panel(
            "Worker RPC errors",
            "short",
            [("{{exception_type}} " + _LEG, increase("rpc_errors", ("instance", "dp", "exception_type")))],
            ("rpc_errors",),
            spec("rpc_errors").description,
        ),
        Panel(
            "Scheduler blocked on capacity",
            "short",
            [(_LEG, increase("request_prefill_pending_nums"))],
            ("request_prefill_pending_nums",),
            spec("request_prefill_pending_nums").description,
        ),
        Panel(
            "Health-check failures",
            "short",
            [(_LEG, increase("health_check_failed"))],
            ("health_check_failed",),
            spec("health_check_failed").description,
        ),
        Panel(
            "Degraded hooks (handler failures)",
            "short",
            [
                (
                    "{{process}} {{hook}} in {{where}} " + _LEG,
                    increase("hook_errors", ("instance", "dp", "process", "hook", "where")),
                )
            ],
            ("hook_errors",),
            spec("hook_errors").description,
        ),
        Panel(
            "Inter-token latency over 1 s / TTFT over threshold",
            "short",
            [
                (f"ITL > 1 s {_LEG}", increase("decode_over_1s_count")),
                (
                    "TTFT > {{threshold}} " + _LEG,
                    increase("prefill_over_threshold_count", ("instance", "dp", "threshold")),
                ),
            ],
            ("decode_over_1s_count", "prefill_over_threshold_count"),
            "Slow tokens, counted by the API server.",
        ),
    ]
    memory = [
        Panel(
            "Worker device memory (after warm-up)",
            "decgbytes",
            [
                (
                    "{{__name__}} {{instance}} dp={{dp}} rank={{rank}}",
                    '{__name__=~"vllm_profiling_engine:memory:.*_gb", job=~"$job", instance=~"$instance", '
                    'model=~"$model", dp=~"$dp", role=~"$role"}',
                )
            ],
            tuple(s.seed for s in catalogue.CATALOGUE if s.seed.startswith("engine:memory:") and s.unit == "GiBy"),
            "Memory breakdown each worker stored after warm-up (GiB).",
        ),
        Panel(
            "Device utilization",
            "percent",
            [("{{device}} " + _LEG, gauge("npu:utilization", ("instance", "dp", "device")))],
            ("npu:utilization",),
            spec("npu:utilization").description,
        ),
        Panel(
            "Weights offloaded to host memory",
            "bytes",
            [("{{offloader}} " + _LEG, gauge("memory:weight_offload_bytes", ("instance", "dp", "offloader"), "sum"))],
            ("memory:weight_offload_bytes",),
            spec("memory:weight_offload_bytes").description,
        ),
    ]
    budget = [
        Panel(
            "EngineCore busy loop: seconds per second by stage",
            "percentunit",
            [
                (
                    "{{stage}} " + _LEG,
                    sum_rate("engine_core:stage_seconds", ("instance", "dp", "stage")),
                )
            ],
            ("engine_core:stage_seconds",),
            spec("engine_core:stage_seconds").description,
        ),
        Panel(
            "Worker step: seconds per second by stage",
            "percentunit",
            [
                (
                    "{{stage}} " + _LEG + " rank={{rank}}",
                    sum_rate("worker:stage_seconds", ("instance", "dp", "rank", "stage")),
                )
            ],
            ("worker:stage_seconds",),
            spec("worker:stage_seconds").description,
        ),
        Panel(
            "API server output loop: seconds per second by stage",
            "percentunit",
            [
                (
                    "{{stage}} " + _LEG,
                    sum_rate("api_server:output_loop_stage_seconds", ("instance", "dp", "stage")),
                )
            ],
            ("api_server:output_loop_stage_seconds",),
            spec("api_server:output_loop_stage_seconds").description,
        ),
        Panel(
            "KV-cache writes per second by request phase",
            "Bps",
            [("{{req_phase}} " + _LEG, sum_rate("kv_cache:write_bytes", ("instance", "dp", "req_phase")))],
            ("kv_cache:write_bytes",),
            spec("kv_cache:write_bytes").description,
        ),
        Panel(
            "KV transfers: bytes per second by direction",
            "Bps",
            [
                (
                    "{{direction}} {{connector}} " + _LEG,
                    sum_rate("kv_transfer:bytes", ("instance", "dp", "direction", "connector")),
                )
            ],
            ("kv_transfer:bytes",),
            spec("kv_transfer:bytes").description,
        ),
        Panel(
            "KV transfers per second by direction",
            "ops",
            [
                (
                    "{{direction}} {{connector}} " + _LEG,
                    sum_rate("kv_transfer:count", ("instance", "dp", "direction", "connector")),
                )
            ],
            ("kv_transfer:count",),
            spec("kv_transfer:count").description,
        ),
        _quantile_panel(
            "KV transfer duration",
            "kv_transfer:duration",
            ("instance", "dp", "direction"),
            "{{instance}} dp={{dp}} {{direction}}",
        ),
        Panel(
            "Step time blocked on KV transfers (seconds per second)",
            "percentunit",
            [(_LEG_PHASE, sum_rate("kv_transfer:blocking:duration", ("instance", "dp", "phase")))],
            ("kv_transfer:blocking:duration",),
            spec("kv_transfer:blocking:duration").description,
        ),
        Panel(
            "KV transfer failures",
            "short",
            [
                (
                    "{{direction}} {{connector}} " + _LEG,
                    increase("kv_transfer:failures", ("instance", "dp", "direction", "connector")),
                )
            ],
            ("kv_transfer:failures",),
            spec("kv_transfer:failures").description,
        ),
    ]
    return [
        ("Overview (总览)", overview),
        ("Stage latency (阶段时延)", stage),
        ("Where the time goes: stage budget and KV transfers", budget),
        ("Scheduling and roles (调度与角色)", scheduling),
        ("EPLB (Ascend only)", eplb),
        ("Exceptions (异常)", exceptions),
        ("Memory and device", memory),
    ]


def _template(name, label, query):
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "query": {"query": query, "refId": f"var-{name}"},
        "definition": query,
        "refresh": 2,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
    }


def dashboard() -> dict:
    panels, y, pid = [], 0, 1
    for title, items in sections():
        panels.append(
            {"id": pid, "type": "row", "title": title, "collapsed": False, "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}}
        )
        pid, y = pid + 1, y + 1
        for i, p in enumerate(items):
            description = p.description
            if p.ascend_only:
                description = "Ascend only (vllm-ascend's EPLB). " + description
            if p.title in EVENT_ONLY:
                description = f"Empty until it happens: {EVENT_ONLY[p.title]}. " + description
            panels.append(
                {
                    "id": pid,
                    "type": p.kind,
                    "title": p.title + (" [Ascend only]" if p.ascend_only else ""),
                    "description": description,
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "gridPos": {"h": 8, "w": 8, "x": (i % 3) * 8, "y": y + (i // 3) * 8},
                    "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
                    "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
                    "targets": [
                        {
                            "datasource": {"type": "prometheus", "uid": "${datasource}"},
                            "expr": expr,
                            "legendFormat": legend,
                            "refId": chr(ord("A") + k),
                        }
                        for k, (legend, expr) in enumerate(p.targets)
                    ],
                }
            )
            pid += 1
        y += ((len(items) + 2) // 3) * 8
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
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                }
            ]
            + [_template(*v) for v in VARIABLES]
        },
        "panels": panels,
        "annotations": {"list": []},
    }


# -- rules ---------------------------------------------------------------------------------------------------
#: Histograms whose quantiles the dashboards show and the rules record: (seed, record base name).
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


def _g(extra=()) -> str:
    return ", ".join((*GROUP, *extra))


def recording_rules() -> list[dict]:
    rules = []
    for seed in RECORDED_QUANTILES:
        s = spec(seed)
        for q in QUANTILES:
            rules.append(
                {
                    "record": record_name(seed, f"p{q * 100:g}_{WINDOW}"),
                    "expr": f"histogram_quantile({q:g}, sum by ({_g(('phase', 'le'))}) "
                    f"(rate({s.prometheus_name}_bucket[{WINDOW}])))",
                }
            )
    step = spec("engine_core:engine_core_step:duration").prometheus_name
    sched = spec("scheduler:duration").prometheus_name
    preempt = spec("running_to_waiting_count").prometheus_name
    rules += [
        {
            "record": record_name("engine_core:engine_core_step:duration", f"mean_{WINDOW}"),
            "expr": f"sum by ({_g(('phase',))}) (rate({step}_sum[{WINDOW}]))"
            f" / (sum by ({_g(('phase',))}) (rate({step}_count[{WINDOW}])) > 0)",
        },
        {
            # Silent on no traffic: the denominator is dropped where no step ran.
            "record": f"vllm_ascend:scheduler_step_share:ratio_{WINDOW}",
            "expr": f"sum by ({_g()}) (rate({sched}_sum[{WINDOW}]))"
            f" / (sum by ({_g()}) (rate({step}_sum[{WINDOW}])) > 0)",
        },
        {
            "record": record_name("running_to_waiting_count", f"rate_{WINDOW}"),
            "expr": f"sum by ({_g()}) (rate({preempt}[{WINDOW}]))",
        },
        {
            "record": record_name("output", f"tokens_per_second_{WINDOW}"),
            "expr": f"sum by ({_g()}) (rate({spec('output').prometheus_name}_sum[{WINDOW}]))",
        },
    ]
    return rules


#: Thresholds the alerts use (documented in docs/deploy.md, with the runbooks).
PREEMPTIONS_PER_5M = 5
ALLOCATION_FAILURES_PER_S = 1 / 60
STEP_REGRESSION = 1.5
SCHEDULER_SHARE = 0.3
EPLB_IMBALANCE = 1.5
RUNBOOK = "docs/deploy.md#"  # the runbook of each alert: its section in docs/deploy.md


def _alert(name, expr, for_, severity, summary):
    rule = {"alert": name, "expr": expr}
    if for_:
        rule["for"] = for_
    rule["labels"] = {"severity": severity}
    rule["annotations"] = {"summary": summary, "runbook": RUNBOOK + name.lower()}
    return rule


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


def alert_rules() -> list[dict]:
    g = _g()
    gauge_name = spec("instrumented_processes").prometheus_name
    p90 = record_name("engine_core:engine_core_step:duration", f"p90_{WINDOW}")
    return [
        _alert(
            "VLLMAscendPreemptionStorm",
            f"sum by ({g}) {_with_births(spec('running_to_waiting_count').prometheus_name)} > {PREEMPTIONS_PER_5M}",
            "1m",
            "warning",
            "{{ $labels.instance }} dp={{ $labels.dp }}: {{ $value | humanize }} preemptions in 5 minutes"
            " (KV cache too small for the load).",
        ),
        _alert(
            "VLLMAscendKVBlockAllocationFailures",
            f"sum by ({g}) {_with_births(spec('block_allocate_failures').prometheus_name, 'rate')}"
            f" > {ALLOCATION_FAILURES_PER_S:.6g}",
            "5m",
            "warning",
            "{{ $labels.instance }} dp={{ $labels.dp }}: KV block allocations keep failing"
            " ({{ $value | humanize }}/s).",
        ),
        _alert(
            "VLLMAscendWorkerRPCError",
            _any_event(spec("rpc_errors").prometheus_name, f"{g}, exception_type"),
            None,
            "critical",
            "{{ $labels.instance }} dp={{ $labels.dp }}: executor RPC to the workers failed"
            " ({{ $labels.exception_type }}).",
        ),
        _alert(
            "VLLMAscendHealthCheckFailed",
            _any_event(spec("health_check_failed").prometheus_name, g),
            None,
            "critical",
            "{{ $labels.instance }}: /health found the engine dead.",
        ),
        _alert(
            "VLLMAscendStepTimeRegression",
            f"{p90} > {STEP_REGRESSION:g} * ({p90} offset 1d)",
            "15m",
            "warning",
            "{{ $labels.instance }} dp={{ $labels.dp }} {{ $labels.phase }}: p90 engine step"
            " {{ $value | humanizeDuration }}, over 1.5x the same hour yesterday.",
        ),
        _alert(
            "VLLMAscendSchedulerShareHigh",
            f"vllm_ascend:scheduler_step_share:ratio_{WINDOW} > {SCHEDULER_SHARE:g}",
            "10m",
            "warning",
            "{{ $labels.instance }} dp={{ $labels.dp }}: the scheduler takes {{ $value | humanizePercentage }}"
            " of the engine step.",
        ),
        _alert(
            "VLLMAscendEPLBImbalanceHigh",
            # The placement in use (EPLB_PLACEMENTS[0]): the one EPLB chose at its previous rebalance.
            f"max by ({g}) ({spec(catalogue.eplb_hotness_seed(catalogue.EPLB_PLACEMENTS[0], 'max')).prometheus_name})"
            f" > {EPLB_IMBALANCE:g}",
            "30m",
            "warning",
            "{{ $labels.instance }} dp={{ $labels.dp }}: expert load imbalance {{ $value | humanize }}"
            " with the placement EPLB chose.",
        ),
        _alert(
            "VLLMAscendInstrumentationAbsent",
            f'absent({gauge_name}{{process="engine_core"}})',
            "10m",
            "critical",
            "No engine-core process reports vllm_profiling_ metrics to this Prometheus.",
        ),
        _alert(
            "VLLMAscendInstrumentationVanished",
            f"max by (job, instance) ({gauge_name} offset 1h) unless max by (job, instance) ({gauge_name})",
            "10m",
            "warning",
            "{{ $labels.instance }} reported vllm_profiling_ metrics an hour ago and reports none now.",
        ),
        _alert(
            "VLLMAscendKVTransferFailures",
            _any_event(spec("kv_transfer:failures").prometheus_name, f"{g}, direction, connector"),
            None,
            "warning",
            "{{ $labels.instance }} dp={{ $labels.dp }}: {{ $labels.connector }} reported failed KV transfers"
            " ({{ $labels.direction }}).",
        ),
        _alert(
            "VLLMAscendHookDegraded",
            # every failure of a handler (or of one guarded read in it) counts; the rank of a worker is summed over
            _any_event(spec("hook_errors").prometheus_name, f"{g}, process, hook, where"),
            None,
            "warning",
            "{{ $labels.instance }} dp={{ $labels.dp }} {{ $labels.process }}: the instrumentation's hook"
            " {{ $labels.hook }} failed in {{ $labels.where }}; the metrics it feeds are partly missing"
            " (vLLM is unaffected).",
        ),
    ]


def rule_groups() -> dict:
    return {
        "groups": [
            {"name": "vllm-ascend-recording", "rules": recording_rules()},
            {"name": "vllm-ascend-alerts", "rules": alert_rules()},
        ]
    }


def _yaml(value, indent=0) -> list[str]:
    """A small YAML emitter for the rules' shapes: dicts, lists of dicts, strings (JSON-quoted, which is valid
    YAML) and numbers."""
    pad = "  " * indent
    lines = []
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, (dict, list)) and v:
                lines.append(f"{pad}{k}:")
                lines += _yaml(v, indent + 1)
            else:
                lines.append(f"{pad}{k}: {_scalar(v)}")
    elif isinstance(value, list):
        for item in value:
            sub = _yaml(item, indent + 1)
            lines.append(f"{pad}- {sub[0].lstrip()}")
            lines += sub[1:]
    else:
        lines.append(pad + _scalar(value))
    return lines


def _scalar(v) -> str:
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if v == {}:
        return "{}"
    if v == []:
        return "[]"
    return json.dumps(v)


HEADER = "# Generated by python -m opentelemetry_instrumentation_vllm_ascend.cli.dashboards; do not edit.\n"


def render() -> dict[str, str]:
    """{path relative to the repository root: file text}."""
    rules = rule_groups()
    k8s = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "vllm-ascend", "labels": {"app.kubernetes.io/name": "vllm-ascend"}},
        "spec": rules,
    }
    return {
        "deploy/grafana/vllm-ascend.json": json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n",
        "deploy/prometheus/rules.yml": HEADER + "\n".join(_yaml(rules)) + "\n",
        "deploy/kubernetes/prometheusrule.yaml": HEADER + "\n".join(_yaml(k8s)) + "\n",
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
