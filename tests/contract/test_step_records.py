"""The per-step records (docs/steps.md) on vLLM's *real* Scheduler, in a subprocess
(``tests/support/step_records_run.py``: real_scheduler_run's preempting load, both sinks on, a real ZMQ SUB socket
on an ipc endpoint): our ZMQ bytes decode, strictly, with a msgspec Struct declared here from NVIDIA Dynamo's
published forward-pass metrics v1 schema (``dynamo/common/forward_pass_metrics.py``: field names, types, defaults;
the frames ``[topic, 8-byte big-endian sequence, msgpack payload]`` of its publisher thread); one record per
non-idle step, in order; each record's token sums equal what that step's SchedulerOutput scheduled, split into
prefill and decode by the oracle's rule; its preemptions equal vLLM's ``preempted_req_ids`` of that step, and
their total vLLM's own PREEMPTED events and per-request counts; 0 records lost at the clean stop; the JSON lines
carry the same records."""

import json
import os
import subprocess
import sys

import pytest

vllm = pytest.importorskip("vllm")
msgspec = pytest.importorskip("msgspec")

from opentelemetry_instrumentation_vllm_ascend import supported  # noqa: E402
from opentelemetry_instrumentation_vllm_ascend.cli.demo import tiny_model  # noqa: E402
from tests.support.source_archives import importable  # noqa: E402

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")
ROOT = os.path.dirname(os.path.dirname(HERE))


# -- Dynamo's forward-pass metrics v1, as its schema publishes them (declared here, not imported) ------------------
class ScheduledRequestMetrics(msgspec.Struct, frozen=True, gc=False):
    num_prefill_requests: int = 0
    sum_prefill_tokens: int = 0
    var_prefill_length: float = 0.0
    sum_prefill_kv_tokens: int = 0
    num_decode_requests: int = 0
    sum_decode_kv_tokens: int = 0
    var_decode_kv_tokens: float = 0.0


class QueuedRequestMetrics(msgspec.Struct, frozen=True, gc=False):
    num_prefill_requests: int = 0
    sum_prefill_tokens: int = 0
    var_prefill_length: float = 0.0
    num_decode_requests: int = 0
    sum_decode_kv_tokens: int = 0
    var_decode_kv_tokens: float = 0.0


class ForwardPassMetrics(msgspec.Struct, frozen=True, gc=False):
    version: int = 1
    worker_id: str = ""
    dp_rank: int = 0
    counter_id: int = 0
    wall_time: float = 0.0
    scheduled_requests: ScheduledRequestMetrics = ScheduledRequestMetrics()
    queued_requests: QueuedRequestMetrics = QueuedRequestMetrics()


INSTALLED = vllm.__version__.split("+")[0]
#: The live release (installed) and the newest (0.34: resumed requests come back among the new ones).
VERSIONS = sorted({supported.LIVE, supported.NEWEST}, key=lambda v: tuple(int(p) for p in v.split(".")[:3]))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model.build(str(tmp_path_factory.mktemp("tiny-llama")))


@pytest.fixture(scope="module", params=VERSIONS)
def result(request, model, tmp_path_factory):
    version = request.param
    where = tmp_path_factory.mktemp("steps")
    path = [ROOT, HERE]
    args = [sys.executable, os.path.join(HERE, "step_records_run.py"), model]
    if version != INSTALLED:
        path.insert(0, importable(version))
        args.append("--triton")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(path),
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "OTEL_VLLM_ASCEND_STEPS_ZMQ": f"ipc://{where}/steps.sock",
        "OTEL_VLLM_ASCEND_STEPS_FILE": f"{where}/steps-{{pid}}.jsonl",
    }
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300, cwd=HERE)
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["vllm"].split("+")[0] == version
    return out


def _decoded(result) -> list:
    decoder = msgspec.msgpack.Decoder(type=ForwardPassMetrics, strict=True)
    records = []
    for number, (topic, seq, payload) in enumerate(result["frames"]):
        assert bytes.fromhex(topic) == b""
        assert int.from_bytes(bytes.fromhex(seq), "big") == number  # Dynamo's sequence frame: 0, 1, 2, …
        records.append(decoder.decode(bytes.fromhex(payload)))
    return records


def _variance(values: list) -> float:
    if not values:
        return 0.0
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / len(values)


def test_zmq_bytes_decode_strictly_with_dynamos_v1_struct_one_per_non_idle_step(result):
    assert result["failures"] == []
    records = _decoded(result)
    steps = result["steps"]
    assert len(records) == len(steps) == result["written"] == result["sent"]  # 0 lost at the clean stop
    assert [r.version for r in records] == [1] * len(records)
    counters = [r.counter_id for r in records]
    assert counters == sorted(set(counters))  # monotonic step counter
    for record, step in zip(records, steps):
        scheduled, queued = record.scheduled_requests, record.queued_requests
        assert scheduled.num_prefill_requests == len(step["prefill_lengths"])
        assert scheduled.sum_prefill_tokens == step["prefill_tokens"]
        assert scheduled.var_prefill_length == pytest.approx(_variance(step["prefill_lengths"]))
        assert scheduled.sum_prefill_kv_tokens == step["prefill_kv"]
        assert scheduled.num_decode_requests == len(step["decode_kv"])
        assert scheduled.sum_decode_kv_tokens == sum(step["decode_kv"])
        assert scheduled.var_decode_kv_tokens == pytest.approx(_variance(step["decode_kv"]))
        assert queued.num_prefill_requests == len(step["queued_prefill"])
        assert queued.sum_prefill_tokens == sum(step["queued_prefill"])
        assert queued.var_prefill_length == pytest.approx(_variance(step["queued_prefill"]))
        assert queued.num_decode_requests == len(step["queued_decode"])
        assert queued.sum_decode_kv_tokens == sum(step["queued_decode"])
        assert queued.var_decode_kv_tokens == pytest.approx(_variance(step["queued_decode"]))
        assert record.wall_time > 0
    # The load has prefill, decode and mixed steps, queues, and preempts.
    assert any(s["prefill_tokens"] and s["decode_tokens"] for s in steps)
    assert any(s["decode_tokens"] and not s["prefill_tokens"] for s in steps)
    assert any(s["queued_decode"] for s in steps) and any(s["queued_prefill"] for s in steps)
    assert sum(s["preempted"] for s in steps) > 0


def test_each_record_matches_what_its_step_scheduled_and_preempted(result):
    payloads = [msgspec.msgpack.decode(bytes.fromhex(frame[2])) for frame in result["frames"]]
    for record, step in zip(payloads, result["steps"]):
        ours = record["otel_vllm_ascend"]
        assert record["scheduled_requests"]["sum_prefill_tokens"] + ours["sum_decode_tokens"] == step["total"]
        assert ours["sum_decode_tokens"] == step["decode_tokens"]
        assert ours["preemptions"] == step["preempted"]  # vLLM's preempted_req_ids of that step
        assert ours["phase"] in ("prefill", "decode", "mixed")
        assert ours["kv_blocks_total"] == 16 and 0 <= ours["kv_blocks_used"] <= 15
        assert ours["schedule_s"] >= 0 and ours["execute_s"] >= 0 and ours["update_s"] >= 0
        assert ours["vllm_version"] == result["vllm"]
    total_preemptions = sum(r["otel_vllm_ascend"]["preemptions"] for r in payloads)
    assert total_preemptions == result["preempted_events"] == result["num_preemptions"] > 0


def test_the_json_lines_carry_the_same_records(result):
    payloads = [msgspec.msgpack.decode(bytes.fromhex(frame[2])) for frame in result["frames"]]
    assert result["lines"] == json.loads(json.dumps(payloads))


def test_nothing_dropped(result):
    assert "vllm_profiling_step_record_dropped" not in result["points"]
