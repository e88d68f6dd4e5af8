"""A short human summary of one /metrics scrape: where an engine step's time goes, the exception counters
beside vLLM's own, which processes reported, which hooks degraded (``hook_errors``), and where the dashboards
are.
``python -m opentelemetry_instrumentation_vllm_ascend summary --url http://host:8000`` prints it for any
running server; the demo prints it after its load."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from .. import catalogue

P = catalogue.PREFIX

#: The engine step and, under it, the parts the engine core times: (label, seed).
STEP = "engine_core:engine_core_step:duration"
STEP_PARTS = (
    ("schedule", "scheduler:duration"),
    ("execute_model RPC", "executor:execute_model:duration"),
    ("sample_tokens RPC", "executor:sample_tokens:duration"),
    ("update_from_output", "scheduler:update_from_output:duration"),
)
#: What the step's time holds besides the parts above, printed as "other" (the step's measured total less the parts'
#: measured totals) so the shares add to 100 %.
STEP_REST = "the engine core's own work between them: grammar bitmask, outputs, stats"
#: In the workers, the model runner's execute_model and the two parts of it that are timed: (label, seed). What is
#: left of execute_model (post-processing, bookkeeping) is printed as "other"; sample_tokens follows
#: execute_model and is not part of it.
WORKER = "executor:model_runner_execute_model:duration"
WORKER_PARTS = (
    ("prepare inputs", "executor:prepare_inputs:duration"),
    ("forward", "npu:forward_duration"),
)
#: Model inference outside the forward pass (``worker:model_inference:duration`` minus ``npu:forward_duration`` of
#: the same step): input preparation, post-processing and sample_tokens together. It overlaps "prepare inputs" and
#: reaches past execute_model, so it is printed as a mean per step, not as a share of execute_model.
NON_FORWARD = "npu:non_forward_duration"
#: Our exception counters and the vLLM counter that counts the same thing, where there is one.
EXCEPTIONS = (
    ("preemptions", "running_to_waiting_count", "vllm:num_preemptions_total"),
    ("recompute events", "scheduler:recompute_events", None),
    ("KV block allocation failures", "block_allocate_failures", None),
    ("worker RPC errors", "rpc_errors", None),
    ("health-check failures", "health_check_failed", None),
    ("scheduler blocked on capacity", "request_prefill_pending_nums", None),
)
#: What a degraded hook means and what to do (the VLLMAscendHookDegraded alert's runbook).
RUNBOOK = "docs/deploy.md#vllmascendhookdegraded"
#: The installed package generates the dashboard and rules (cli/dashboards.py); deploy/ and docs/ are files of the
#: source repository, not of the wheel.
WHERE = (
    "`python -m opentelemetry_instrumentation_vllm_ascend.cli.dashboards DIR` writes the Grafana dashboard "
    "DIR/deploy/grafana/vllm-ascend.json and the rules DIR/deploy/prometheus/rules.yml "
    "(DIR/deploy/kubernetes/prometheusrule.yaml for the Prometheus Operator); the same files, the fleet configs "
    "and the alerts' runbooks (docs/deploy.md) are in the source repository"
)


def parse(text: str) -> list[tuple[str, dict, float]]:
    return [(s.name, dict(s.labels), s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def _sum(samples, name: str, keep=lambda labels: True) -> float:
    return sum(v for n, labels, v in samples if n == name and keep(labels))


def _busy(labels) -> bool:
    return labels.get("phase") != "idle"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3g} ms"


def summarize(text: str) -> list[str]:
    s = parse(text)
    lines = []
    count = _sum(s, P + STEP + "_count", _busy)
    total = _sum(s, P + STEP + "_sum", _busy)
    if count:
        lines.append(f"Engine steps: {count:g} (idle steps left out), mean {_ms(total / count)}; of the step time:")
        timed = 0.0
        for label, seed in STEP_PARTS:
            part = _sum(s, P + seed + "_sum", _busy)
            n = _sum(s, P + seed + "_count", _busy)
            if n:
                timed += part
                lines.append(f"  {label:<20} {100 * part / total:5.1f}%  (mean {_ms(part / n)} x {n:g})")
        if total - timed >= 0:  # (overlapping parts, as with the batch queue, leave no rest to show)
            lines.append(f"  {'other':<20} {100 * (total - timed) / total:5.1f}%  ({STEP_REST})")
        w_count = _sum(s, P + WORKER + "_count", _busy)
        w_total = _sum(s, P + WORKER + "_sum", _busy)
        if w_count:
            lines.append(f"  in the workers: execute_model mean {_ms(w_total / w_count)}; of it:")
            parts = []
            for label, seed in WORKER_PARTS:
                part = _sum(s, P + seed + "_sum", _busy)
                if _sum(s, P + seed + "_count", _busy):
                    parts.append(part)
                    lines.append(f"    {label:<18} {100 * part / w_total:5.1f}%")
            rest = w_total - sum(parts)
            if len(parts) == len(WORKER_PARTS) and rest >= 0:
                lines.append(f"    {'other':<18} {100 * rest / w_total:5.1f}%  (post-processing, bookkeeping)")
            n = _sum(s, P + NON_FORWARD + "_count", _busy)
            if n:
                mean = _ms(_sum(s, P + NON_FORWARD + "_sum", _busy) / n)
                lines.append(
                    f"  in the workers, outside the forward pass: mean {mean} a step "
                    "(prepare inputs, post-processing and sample_tokens; not a share of execute_model)"
                )
    else:
        lines.append("Engine steps: none recorded yet (no load, or the engine core is not instrumented).")
    lines.append("Exceptions (ours | vLLM's own):")
    for label, seed, theirs in EXCEPTIONS:
        ours = _sum(s, P + seed + "_total")
        line = f"  {label:<30} {ours:g}"
        if theirs:
            line += f" | {theirs} {_sum(s, theirs):g}"
        lines.append(line)
    processes: dict[str, float] = {}
    for name, labels, value in s:
        if name == catalogue.INSTRUMENTED_PROCESSES.prometheus_name and value:
            key = f"{labels.get('process', '?')} dp={labels.get('dp', '?')}"
            processes[key] = processes.get(key, 0) + value
    reported = ", ".join(f"{k} x{v:g}" for k, v in sorted(processes.items())) or "none"
    lines.append(f"Processes reporting: {reported}")
    lines += degraded_hooks(s)
    lines.append("Where to look: " + WHERE)
    return lines


def degraded_hooks(s) -> list[str]:
    """The hooks whose handlers failed (``hook_errors``): one line per (process kind, dp, hook, place), most
    failures first, summed over ranks and roles; a runbook pointer when there is any."""
    failures: dict[tuple, float] = {}
    for name, labels, value in s:
        if name == catalogue.HOOK_ERRORS.prometheus_name and value:
            key = (labels.get("process", "?"), labels.get("dp", "?"), labels.get("hook", "?"), labels.get("where", "?"))
            failures[key] = failures.get(key, 0) + value
    if not failures:
        return ["Degraded hooks: none (no handler failed)"]
    lines = [f"Degraded hooks ({catalogue.HOOK_ERRORS.prometheus_name}; runbook: {RUNBOOK}):"]
    for (process, dp, hook, where), n in sorted(failures.items(), key=lambda item: (-item[1], item[0])):
        lines.append(f"  {process} dp={dp}  {hook} failed in {where}: {n:g} time(s)")
    return lines


def fetch(url: str, timeout: float = 30.0) -> str:
    url = url.rstrip("/")
    if not url.endswith("/metrics"):
        url += "/metrics"
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()
