"""Contract with vllm-ascend's source: every target gated by vllm-ascend's version exists with the
parameters its handler reads, every attribute handlers read from vllm-ascend objects is defined, and
the fakes the handler tests use have the real classes' shape. The 0.23.0.post1 sdist is downloaded
at test time (``pip download --no-deps --no-binary :all: --no-build-isolation``: its metadata step
needs setuptools_scm and SOC_VERSION), cached, parsed and never imported."""

import os
import subprocess
import sys

import pytest

from opentelemetry_instrumentation_vllm_ascend import targets
from opentelemetry_instrumentation_vllm_ascend.contract import SourceTree, check_read, check_target
from opentelemetry_instrumentation_vllm_ascend.installer import in_range

from packaging.version import Version

VERSION = "0.23.0.post1"
CACHE = os.environ.get("OTEL_VLLM_ASCEND_WHEEL_CACHE",
                       os.path.join(os.path.expanduser("~"), ".cache", "otel-vllm-ascend-wheels"))


def sdist() -> str:
    os.makedirs(CACHE, exist_ok=True)
    name = f"vllm_ascend-{VERSION}.tar.gz"
    path = os.path.join(CACHE, name)
    if not os.path.exists(path):
        env = dict(os.environ, SOC_VERSION=os.environ.get("SOC_VERSION", "ascend910b1"))
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        "--no-build-isolation", "-q", "-d", CACHE, f"vllm-ascend=={VERSION}"],
                       check=True, timeout=1200, env=env)
    return path


@pytest.fixture(scope="module")
def tree():
    """vllm-ascend's source together with the vLLM it runs on (0.23.0): its classes subclass vLLM's, and
    attributes they inherit are looked up in the bases."""
    from test_contract_vllm import wheel

    ascend = SourceTree.from_archive(sdist(), strip_prefix=True)
    vllm = SourceTree.from_archive(wheel("0.23.0"))
    return SourceTree({**vllm.files, **ascend.files})


ASCEND_TARGETS = [t for t in targets.TARGETS if t.vllm_ascend is not None]


def test_there_are_ascend_targets():
    assert len(ASCEND_TARGETS) >= 9


def test_every_ascend_target_exists_with_the_parameters_its_handler_reads(tree):
    problems = []
    for target in ASCEND_TARGETS:
        if in_range(Version("0.23.0"), target.vllm_ascend):
            problems += check_target(tree, target)
    assert problems == []


def test_every_attribute_handlers_read_from_vllm_ascend_exists(tree):
    problems = [p for read in targets.READS if read.module.startswith("vllm_ascend")
                for p in check_read(tree, read)]
    assert problems == []


def test_ascend_schedulers_reimplement_schedule_and_recompute_scheduler_reports_recomputed_requests(tree):
    """Why each Ascend scheduler has its own row: its schedule() is its own, not the base's."""
    for module, cls in (("vllm_ascend.core.recompute_scheduler", "RecomputeScheduler"),
                        ("vllm_ascend.core.scheduler_dynamic_batch", "SchedulerDynamicBatch"),
                        ("vllm_ascend.core.scheduler_profiling_chunk", "ProfilingChunkScheduler"),
                        ("vllm_ascend.patch.platform.patch_balance_schedule", "BalanceScheduler")):
        found = tree.find_class(module, cls)
        assert found is not None, cls
        assert any(getattr(n, "name", None) == "schedule" for n in found[1].body), cls
    source = tree.files["vllm_ascend/core/recompute_scheduler.py"]
    assert "recomputed_reqs.append(" in source and "recomputed_reqs=recomputed_reqs" in source


def test_npu_runner_sets_attn_state_in_prepare_inputs(tree):
    source = tree.files["vllm_ascend/worker/model_runner_v1.py"]
    assert "self.attn_state = attn_state" in source
    for scope in ('"prepare input"', '"forward"', '"post process"', '"sample_token"'):
        assert f"record_function_or_nullcontext({scope})" in source, scope
    # vllm-ascend imports the scope function from vLLM: our _PROFILER_FUNC factory reaches it.
    assert "from vllm.v1.utils import" in source and "record_function_or_nullcontext" in source
