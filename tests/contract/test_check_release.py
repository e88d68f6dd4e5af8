"""``check --vllm VERSION|PATH``: the target table against a release that is not installed, read from its source.
A copy of vLLM 0.33.0's sdist tree with one hooked method renamed away exits 1 naming that symbol and the metrics
it costs (the target row's feeds that no other target feeds); the real sdist exits 0; a vllm-ascend sdist is read
over the vLLM it runs on; a release that cannot be found exits 2. It runs where vLLM cannot be imported at all (a
subprocess whose import system refuses vllm, vllm_ascend and torch), and never tries to."""

import json
import os
import subprocess
import sys
import tarfile

import pytest

from opentelemetry_instrumentation_vllm_ascend import catalogue, source, targets
from opentelemetry_instrumentation_vllm_ascend.cli import main as cli
from tests.support.source_archives import sdist

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REMOVED = "vllm.v1.core.sched.scheduler:Scheduler.update_from_output"


def _unpack(tmp_path, version: str = "0.33.0") -> str:
    """vLLM ``version``'s sdist tree (its PKG-INFO and the ``vllm`` package's Python files) under ``tmp_path``."""
    with tarfile.open(sdist("vllm", version)) as archive:
        members = [
            m
            for m in archive.getmembers()
            if m.isfile()
            and (m.name.endswith("/PKG-INFO") and m.name.count("/") == 1 or "/vllm/" in m.name)
            and (m.name.endswith(".py") or m.name.endswith("PKG-INFO"))
        ]
        archive.extractall(tmp_path, members=members, filter="data")
    return str(tmp_path / f"vllm-{version}")


@pytest.fixture(scope="module")
def release_without_a_hooked_method(tmp_path_factory):
    root = _unpack(tmp_path_factory.mktemp("release"))
    path = os.path.join(root, "vllm", "v1", "core", "sched", "scheduler.py")
    with open(path) as f:
        text = f.read()
    assert text.count("    def update_from_output(") == 1
    with open(path, "w") as f:
        f.write(text.replace("    def update_from_output(", "    def update_from_output_renamed("))
    return root


def test_a_release_without_a_hooked_method_exits_1_naming_it_and_its_metrics(release_without_a_hooked_method, capsys):
    assert source.release_version(release_without_a_hooked_method, "vllm") == "0.33.0"  # from its directory name
    assert cli.main(["check", "--vllm", release_without_a_hooked_method, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["vllm"] == "0.33.0" and report["ok"] is False
    (row,) = [t for t in targets.TARGETS if t.symbol == REMOVED]
    others = {seed for t in targets.TARGETS if t.symbol != REMOVED and t.vllm_ascend is None for seed in t.feeds}
    expected_costs = sorted(f"vllm_profiling_{seed}" for seed in row.feeds if seed not in others)
    assert expected_costs  # the oracle: the metrics only this row feeds (update_from_output's own)
    assert report["missing"] == [
        {
            "symbol": REMOVED,
            "detail": f"{REMOVED} is not defined on Scheduler",
            "path": "",
            "expected": True,
            "costs": expected_costs,
        }
    ]
    by_symbol = {r["symbol"]: r for r in report["targets"]}
    assert by_symbol[REMOVED]["status"] == "missing"
    assert by_symbol["vllm.v1.core.sched.scheduler:Scheduler.schedule"]["status"] == "resolved"
    metrics = {m["metric"]: m for m in report["metrics"]}
    for name in expected_costs:
        assert metrics[name]["status"] == "not hooked", name
    assert cli.main(["check", "--vllm", release_without_a_hooked_method]) == 1
    text = capsys.readouterr().out
    assert f"MISSING {REMOVED}: {REMOVED} is not defined on Scheduler; costs {', '.join(expected_costs)}" in text
    assert "1 expected and missing" in text


def test_the_real_sdist_exits_0(capsys):
    assert cli.main(["check", "--vllm", sdist("vllm", "0.33.0"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["missing"] == [] and report["vllm"] == "0.33.0"
    assert report["configuration"]["scheduling"]["path"] == "batch_queue"  # vLLM's default off the CPU build
    statuses = {r["symbol"]: r["status"] for r in report["targets"]}
    assert statuses["vllm.v1.engine.core:EngineCore.log_iteration_details"] == "gated off by version"
    assert statuses["vllm_ascend.worker.model_runner_v1:NPUModelRunner.execute_model"].startswith("dormant")
    assert set(report["by_path"]) >= {"mrv1", "mrv2", "npu", "sync", "batch_queue"}
    mrv2 = report["by_path"]["mrv2"]
    # model runner V2 feeds the forward from its own forward mark (vLLM 0.32+), not the kernel launch
    assert mrv2["absent"] == ["vllm_profiling_npu:kernel_launch"] and mrv2["lost_to_missing_targets"] == []


def test_a_version_is_read_from_the_cache_like_the_contract_tests(capsys):
    """``--vllm 0.33.0``: the archive of OTEL_VLLM_ASCEND_SOURCE_CACHE (fetched from pip's index when absent)."""
    assert cli.main(["check", "--vllm", "0.33.0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["source"]["vllm"].endswith("vllm-0.33.0.tar.gz")


def test_vllm_ascend_is_read_over_the_vllm_it_runs_on(capsys):
    code = cli.main(["check", "--vllm-ascend", sdist("vllm-ascend", "0.23.0.post1"), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert (report["vllm"], report["vllm_ascend"]) == ("0.23.0", "0.23.0.post1")
    assert report["configuration"]["worker"]["path"] == "npu"
    statuses = {r["symbol"]: r for r in report["targets"]}
    npu = statuses["vllm_ascend.worker.model_runner_v1:NPUModelRunner.execute_model"]
    assert npu["status"] == "resolved" and npu["expected"] is True
    assert statuses["vllm.v1.worker.gpu_model_runner:GPUModelRunner.execute_model"]["expected"] is False
    assert code == (1 if report["missing"] else 0)
    assert report["missing"] == []


def test_what_cannot_be_found_exits_2(tmp_path, monkeypatch, capsys):
    assert cli.main(["check", "--vllm", "no-such-thing"]) == 2
    monkeypatch.setenv("OTEL_VLLM_ASCEND_SOURCE_CACHE", str(tmp_path))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens there
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    assert cli.main(["check", "--vllm", "0.99.0"]) == 2
    assert "cannot fetch vllm 0.99.0" in capsys.readouterr().err
    (tmp_path / "tree").mkdir()
    assert cli.main(["check", "--vllm", str(tmp_path / "tree")]) == 2  # no version to tell


_NO_VLLM = """
import importlib.abc, sys
tried = []
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("vllm", "vllm_ascend", "torch"):
            tried.append(name)
            raise ImportError(f"{name} is not installed here")
sys.meta_path.insert(0, Refuse())
from opentelemetry_instrumentation_vllm_ascend.cli import main as cli
code = cli.main(["check", "--vllm", sys.argv[1], "--json"])
print("TRIED", tried, file=sys.stderr)
sys.exit(code)
"""


@pytest.mark.parametrize("which", ["broken", "real"])
def test_it_works_where_vllm_cannot_be_imported(which, release_without_a_hooked_method):
    given = release_without_a_hooked_method if which == "broken" else sdist("vllm", "0.33.0")
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run([sys.executable, "-c", _NO_VLLM, given], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == (1 if which == "broken" else 0), done.stderr[-3000:]
    assert "TRIED []" in done.stderr  # never even tried to import vLLM
    report = json.loads(done.stdout)
    assert [m["symbol"] for m in report["missing"]] == ([REMOVED] if which == "broken" else [])


def test_a_releases_version_and_files_are_read_from_any_of_its_forms(tmp_path):
    """A wheel (its METADATA), a source tree (its PKG-INFO, else the package's generated _version.py), a
    package directory itself: each gives the release's version and the package's Python files."""
    import zipfile

    wheel = tmp_path / "dist" / "vllm-9.1.0-cp38-abi3-manylinux1_x86_64.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("vllm/__init__.py", "")
        z.writestr("vllm/v1/core.py", "class A:\n    pass\n")
        z.writestr("vllm-9.1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: vllm\nVersion: 9.1.0\n")
    renamed = tmp_path / "dist" / "nightly.whl"
    wheel.rename(renamed)
    assert source.release_version(str(renamed), "vllm") == "9.1.0"  # no version in its name: METADATA
    assert sorted(source.SourceTree.from_path(str(renamed)).files) == ["vllm/__init__.py", "vllm/v1/core.py"]
    tree = tmp_path / "checkout"
    (tree / "vllm" / "v1").mkdir(parents=True)
    (tree / "vllm" / "__init__.py").write_text("")
    (tree / "vllm" / "v1" / "core.py").write_text("class A:\n    pass\n")
    (tree / "vllm" / "_version.py").write_text("__version__ = version = '9.2.0.dev3'\n")
    assert source.release_version(str(tree), "vllm") == "9.2.0.dev3"
    (tree / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 9.2.0\n")
    assert source.release_version(str(tree), "vllm") == "9.2.0"
    assert source.release_version(str(tree / "vllm"), "vllm") == "9.2.0"  # the package directory itself
    assert source.SourceTree.from_path(str(tree / "vllm")).find_class("vllm.v1.core", "A") is not None
    assert source.SourceTree.from_path(str(tree)).find_class("vllm.v1.core", "A") is not None
    assert source.release_version(str(tree), "vllm-ascend") is None


_HOOK_FILE = """\
- symbol: vllm.v1.core.sched.scheduler:Scheduler.add_request
  metrics: [{name: custom:calls, type: counter}]
- symbol: vllm.v1.core.sched.scheduler:Scheduler.add_request
  max_version: "0.29.0"
  metrics: [{name: custom:old, type: counter}]
- symbol: vllm.v1.engine.core:EngineCore.log_iteration_details
  metrics: [{name: custom:gone, type: counter}]
- symbol: vllm.v1.core.sched.scheduler:Scheduler.add_request
  metrics: [{name: custom:x, type: gauge, expr: requests.n}]
- symbol: vllm_ascend.core.recompute_scheduler:RecomputeScheduler.schedule
  metrics: [{name: custom:ascend, type: counter}]
"""


def test_check_vllm_with_config_checks_the_file_against_that_releases_source(tmp_path, capsys):
    """``check --vllm X --config F`` reads F: each entry gated by X's version (not the installed one), its symbol
    looked up in X's source (vLLM 0.30 has no log_iteration_details: rejected), its expressions against the
    function's parameters there (add_request(self, request): ``requests`` is none of them); a vllm_ascend symbol
    without --vllm-ascend is not resolved. A rejected entry makes it exit 1."""
    hook_file = tmp_path / "hooks.yaml"
    hook_file.write_text(_HOOK_FILE)
    assert cli.main(["check", "--vllm", sdist("vllm", "0.30.0"), "--json", "--config", str(hook_file)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["missing"] == [] and report["ok"] is False  # only the hook file fails it
    assert [(e["entry"], e["status"]) for e in report["hook_files"]] == [
        (1, "loaded"),
        (2, "gated"),
        (3, "rejected"),
        (4, "rejected"),
        (5, "loaded"),
    ]
    reasons = [e["reason"] for e in report["hook_files"]]
    assert "vLLM 0.30.0 is outside <=0.29.0" in reasons[1]
    assert reasons[2] == (
        "cannot hook: vllm.v1.engine.core:EngineCore.log_iteration_details is not in this release's source"
    )
    assert "reads 'requests', not a parameter of vllm.v1.core.sched.scheduler:Scheduler.add_request" in reasons[3]
    assert reasons[4].endswith("(not resolved: no --vllm-ascend given)")
    # The same entries over vllm-ascend 0.30.0rc2 resolve its scheduler; the text form lists the verdicts first.
    assert cli.main(["check", "--vllm-ascend", sdist("vllm-ascend", "0.30.0rc2"), "--config", str(hook_file)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("Hook files:\n")
    assert "entries: 2 loaded, 1 gated, 2 rejected" in out or "entries: 1 gated, 2 loaded, 2 rejected" in out
    good = tmp_path / "good.yaml"
    good.write_text(_HOOK_FILE.split("- symbol: vllm.v1.engine.core")[0])
    assert cli.main(["check", "--vllm", sdist("vllm", "0.30.0"), "--config", str(good)]) == 0


def test_check_calls_the_gen_ai_metrics_and_hook_errors_fed_by_what_feeds_them(capsys):
    """The ``gen_ai.server.*`` metrics are exposed under their own names (no prefix): their rows' feeds name them so
    and they are fed where IterationStats.update_from_finished_request resolves; ``hook_errors`` is the package's
    own (every hook feeds it, no row does): fed, never "no target feeds it"."""
    assert cli.main(["check", "--vllm", sdist("vllm", "0.30.0"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    metrics = {m["metric"]: m for m in report["metrics"]}
    genai = [spec.exposed_name for spec in catalogue.GENAI_SERVER]
    assert genai and all(name.startswith("gen_ai.server.") for name in genai)
    (row,) = [t for t in report["targets"] if t["symbol"].endswith("IterationStats.update_from_finished_request")]
    assert row["status"] == "resolved" and set(genai) <= set(row["feeds"])
    assert not any(name.startswith("vllm_profiling_gen_ai") for t in report["targets"] for name in t["feeds"])
    for name in genai:
        assert metrics[name]["status"] == "fed", metrics[name]
    hook_errors = metrics[catalogue.HOOK_ERRORS.exposed_name]
    assert hook_errors["status"] == "fed" and "no target feeds it" not in hook_errors["detail"], hook_errors
