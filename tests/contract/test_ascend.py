"""Contract with vllm-ascend's source: every target gated by vllm-ascend's version exists with the
parameters its handler reads, every attribute handlers read from vllm-ascend objects is defined, and
the fakes the handler tests use have the real classes' shape. Each vllm-ascend release of
``supported.VLLM_ASCEND`` (and the drift canary's) is downloaded at test time (``source_archives``,
cached), parsed over the vLLM it runs on and never imported."""

import re

import pytest
from packaging.version import Version

from opentelemetry_instrumentation_vllm_ascend import targets
from opentelemetry_instrumentation_vllm_ascend.wiring.installer import in_range
from tests.support.contract import (
    ASCEND_VERSIONS,
    READS,
    ascend_tree,
    ascend_vllm,
    check_read,
    check_target,
    fake_problems,
)


@pytest.fixture(scope="module", params=ASCEND_VERSIONS)
def version(request):
    return request.param


@pytest.fixture(scope="module")
def tree(version):
    """vllm-ascend's source together with the vLLM it runs on: its classes subclass vLLM's, and
    attributes they inherit are looked up in the bases."""
    return ascend_tree(version)


ASCEND_TARGETS = [t for t in targets.TARGETS if t.vllm_ascend is not None]


def test_there_are_ascend_targets():
    assert len(ASCEND_TARGETS) >= 9


def test_every_ascend_target_exists_with_the_parameters_its_handler_reads(tree, version):
    problems = []
    for target in ASCEND_TARGETS:
        if in_range(Version(version), target.vllm_ascend) and in_range(Version(ascend_vllm(version)), target.vllm):
            problems += check_target(tree, target)
    assert problems == []


def test_every_attribute_handlers_read_from_vllm_ascend_exists(tree):
    problems = [p for read in READS if read.module.startswith("vllm_ascend") for p in check_read(tree, read)]
    assert problems == []


def test_ascend_schedulers_reimplement_schedule_and_recompute_scheduler_reports_recomputed_requests(tree, version):
    """Why each Ascend scheduler has its own row: its schedule() is its own, not the base's (each ``schedule``
    row of this release's vllm-ascend: 0.30 removed SchedulerDynamicBatch, whose row is gated off there)."""
    rows = [
        t
        for t in ASCEND_TARGETS
        if t.attribute == "schedule" and t.handler == "scheduler:Schedule" and in_range(Version(version), t.vllm_ascend)
    ]
    assert len(rows) >= 4
    for row in rows:
        found = tree.find_class(row.module, row.owner_qualname)
        assert found is not None, row.symbol
        assert any(getattr(n, "name", None) == "schedule" for n in found[1].body), row.symbol
    source = tree.files["vllm_ascend/core/recompute_scheduler.py"]
    assert "recomputed_reqs.append(" in source and re.search(r"recomputed_reqs=(self\._)?recomputed_reqs", source)


def test_npu_runner_sets_attn_state_in_prepare_inputs(tree):
    source = tree.files["vllm_ascend/worker/model_runner_v1.py"]
    assert "self.attn_state = attn_state" in source
    for scope in ('"prepare input"', '"forward"', '"post process"', '"sample_token"'):
        assert f"record_function_or_nullcontext({scope})" in source, scope
    # vllm-ascend imports the scope function from vLLM: our _PROFILER_FUNC factory reaches it.
    assert "from vllm.v1.utils import" in source and "record_function_or_nullcontext" in source


# -- the fakes the handler tests use have the real classes' shape ----------------------------------------


def _fakes():
    """(fake class, an instance or None, real module, real class, names the fake adds for the test only)."""
    from tests.support import fakes as t

    runner = t.npu_runner(t.AscendAttentionState.DecodeOnly)
    return [
        (
            t.FakeEplbWorker,
            t.FakeEplbWorker({}, 0, None),
            "vllm_ascend.eplb.core.eplb_worker",
            "EplbWorker",
            {"computes_hotness", "new_placement"},
        ),
        (
            t.FakeAdaptor,
            t.FakeAdaptor(),
            "vllm_ascend.eplb.adaptor.vllm_adaptor",
            "VllmEplbAdaptor",
            {"calls"},
        ),
        (
            t.FakeLoader,
            t.FakeLoader(None),
            "vllm_ascend.eplb.core.eplb_device_transfer_loader",
            "D2DExpertWeightLoader",
            set(),
        ),
        (type(runner), runner, "vllm_ascend.worker.model_runner_v1", "NPUModelRunner", set()),
        (
            t.RecomputeScheduler,
            t.RecomputeScheduler(0),
            "vllm_ascend.core.recompute_scheduler",
            "RecomputeScheduler",
            {"recomputed", "nested", "base_schedule"},
        ),
    ]


def test_fakes_have_the_real_classes_methods_and_attributes(tree):
    assert fake_problems(tree, _fakes()) == []


def test_fake_enums_match_the_real_ones(tree):
    from tests.support import fakes as t

    for fake, module, cls in (
        (t.AscendAttentionState, "vllm_ascend.attention.attention_v1", "AscendAttentionState"),
        (
            t.ExpertWeightUpdateState,
            "vllm_ascend.eplb.core.eplb_device_transfer_loader",
            "ExpertWeightUpdateState",
        ),
    ):
        members = tree.members(module, cls)
        assert {m.name for m in fake} <= set(members), cls
