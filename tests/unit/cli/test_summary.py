"""The summary of a /metrics text (cli/summary.py) and the ``summary --url`` subcommand: a real
prometheus_client exposition with hand-chosen observations; the printed shares are computed by hand."""

from __future__ import annotations

import http.server
import importlib
import re
import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from opentelemetry_instrumentation_vllm_ascend.cli import main as cli
from opentelemetry_instrumentation_vllm_ascend.cli import summary
from opentelemetry_instrumentation_vllm_ascend.cli.summary import summarize

P = "vllm_profiling_"


def exposition() -> str:
    r = CollectorRegistry()
    labels = ["dp", "role", "phase"]

    def hist(seed, *values, phase="decode"):
        h = Histogram(P + seed, "x", labels, registry=r, buckets=(0.001, 0.01, 0.1, 1.0))
        for v in values:
            h.labels("0", "mixed", phase).observe(v)
        return h

    step = hist("engine_core:engine_core_step:duration", 0.010, 0.030)  # 40 ms in 2 steps: mean 20 ms
    step.labels("0", "mixed", "idle").observe(5.0)  # idle steps are left out
    hist("scheduler:duration", 0.001, 0.003)  # 4 ms of 40: 10 %
    hist("executor:execute_model:duration", 0.008, 0.022)  # 30 ms: 75 %
    hist("executor:model_runner_execute_model:duration", 0.010, 0.010)  # 20 ms in the workers
    hist("executor:prepare_inputs:duration", 0.001, 0.002)  # 3 of 20: 15 %
    hist("npu:forward_duration", 0.006, 0.009)  # 15 of 20: 75 %; the rest of execute_model 2 of 20: 10 %
    hist("npu:non_forward_duration", 0.004, 0.005)  # outside the forward: 9 ms in 2 steps, mean 4.5 ms
    c = Counter(P + "running_to_waiting_count", "x", labels, registry=r)
    c.labels("0", "mixed", "decode").inc(7)
    Counter("vllm:num_preemptions", "x", ["engine"], registry=r).labels("0").inc(7)
    g = Gauge(P + "instrumented_processes", "x", ["process", "dp", "role"], registry=r)
    g.labels("engine_core", "0", "mixed").set(1)
    g.labels("worker", "0", "mixed").set(2)
    return generate_latest(r).decode()


def test_summary_lines():
    lines = summarize(exposition())
    text = "\n".join(lines)
    assert lines[0] == "Engine steps: 2 (idle steps left out), mean 20 ms; of the step time:"
    assert "  schedule              10.0%  (mean 2 ms x 2)" in lines
    assert "  execute_model RPC     75.0%  (mean 15 ms x 2)" in lines
    rest = lines.index("  execute_model RPC     75.0%  (mean 15 ms x 2)") + 1  # 40 - 4 - 30 = 6 ms of 40: 15 %
    assert lines[rest] == f"  other                 15.0%  ({summary.STEP_REST})"
    assert "  in the workers: execute_model mean 10 ms; of it:" in lines
    worker = lines.index("  in the workers: execute_model mean 10 ms; of it:")
    assert lines[worker + 1 : worker + 5] == [
        "    prepare inputs      15.0%",
        "    forward             75.0%",
        "    other               10.0%  (post-processing, bookkeeping)",
        "  in the workers, outside the forward pass: mean 4.5 ms a step "
        "(prepare inputs, post-processing and sample_tokens; not a share of execute_model)",
    ]
    assert "  preemptions                    7 | vllm:num_preemptions_total 7" in lines
    assert "  worker RPC errors              0" in lines
    assert "Processes reporting: engine_core dp=0 x1, worker dp=0 x2" in lines
    assert "deploy/grafana/vllm-ascend.json" in text and "docs/deploy.md" in text


def test_summary_lists_degraded_hooks_summed_over_ranks_most_failures_first():
    r = CollectorRegistry()
    c = Counter(P + "hook_errors", "x", ["process", "dp", "role", "hook", "where", "rank"], registry=r)
    c.labels("engine_core", "0", "mixed", "Scheduler.schedule", "resumed_req_ids", "").inc(280)
    c.labels("worker", "0", "mixed", "GPUModelRunner.execute_model", "after", "0").inc(2)
    c.labels("worker", "0", "mixed", "GPUModelRunner.execute_model", "after", "1").inc(3)
    lines = summarize(exposition() + generate_latest(r).decode())
    start = lines.index(
        "Degraded hooks (vllm_profiling_hook_errors_total; runbook: docs/deploy.md#vllmascendhookdegraded):"
    )
    assert lines[start + 1 : start + 3] == [
        "  engine_core dp=0  Scheduler.schedule failed in resumed_req_ids: 280 time(s)",
        "  worker dp=0  GPUModelRunner.execute_model failed in after: 5 time(s)",
    ]
    assert "Degraded hooks: none (no handler failed)" in summarize(exposition())


def test_where_to_look_names_files_the_installed_package_writes(tmp_path):
    """The summary's pointer works from a wheel: the command it names writes every DIR/... file it names."""
    command = re.search(r"`python -m ([\w.]+) DIR`", summary.WHERE).group(1)
    named = re.findall(r"DIR/([\w./-]+\.(?:json|yml|yaml))", summary.WHERE)
    assert len(named) == 3
    module = importlib.import_module(command)
    assert module.main([str(tmp_path)]) == 0
    for path in named:
        assert (tmp_path / path).read_text() == module.render()[path]


def test_summary_shows_no_rest_where_the_parts_overlap():
    """With the batch queue the RPC waits overlap the next step's schedule: parts summing past the step leave no
    rest row (a negative share would be a wrong number)."""
    r = CollectorRegistry()
    for seed, value in (("engine_core:engine_core_step:duration", 0.010), ("executor:execute_model:duration", 0.012)):
        Histogram(P + seed, "x", ["phase"], registry=r).labels("decode").observe(value)
    lines = summarize(generate_latest(r).decode())
    assert lines[1] == "  execute_model RPC    120.0%  (mean 12 ms x 1)"
    assert not any(line.startswith("  other") for line in lines)


def test_summary_of_an_idle_server():
    assert summarize("")[0].startswith("Engine steps: none recorded yet")


def test_summary_subcommand_reads_a_server(capsys):
    body = exposition().encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/metrics" else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert cli.main(["summary", "--url", f"http://127.0.0.1:{server.server_address[1]}"]) == 0
    finally:
        server.shutdown()
    assert capsys.readouterr().out.splitlines() == summarize(exposition())
    assert cli.main(["summary", "--url", "http://127.0.0.1:9/"]) == 2
