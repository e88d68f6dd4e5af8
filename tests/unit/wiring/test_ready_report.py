"""Targets that never resolve are reported once, when vLLM is ready to serve (issue 38, deliverable 5): at the
end of a ready point (``installer.READY_POINTS``: ``AsyncMPClient.__init__`` in an API server, ``EngineCoreProc.__init__``
in an EngineCore, ``WorkerProc.__init__`` in a worker process), one log line names each target this process
expects that never resolved and the metrics lost with it. Expected: its process kind runs here, it is not gated
off, its execution path is the one taken. Never resolved: hooking failed, or its module does not exist; a module
that exists but was never imported (a feature the server does not use) is not reported. A package of fake
modules stands in for vLLM's; the ready points themselves are checked in every supported vLLM's source."""

import logging
import sys
import textwrap

import pytest

from opentelemetry_instrumentation_vllm_ascend import paths, targets
from opentelemetry_instrumentation_vllm_ascend.wiring import installer as installer_module
from opentelemetry_instrumentation_vllm_ascend.wiring.declarative import TIMER, Measure
from opentelemetry_instrumentation_vllm_ascend.wiring.installer import Installer, module_exists
from tests.support.contract import VLLM_VERSIONS, check_target, vllm_tree
from tests.support.process import set_process

PKG = "otel_ready_fake"


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    root = tmp_path / PKG
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "engine.py").write_text(
        textwrap.dedent(
            """
            class Engine:
                inits = 0
                def __init__(self):
                    Engine.inits += 1
            class Scheduler:
                def schedule(self):
                    return 1
            """
        )
    )
    (root / "runner_v2.py").write_text("class Runner:\n    def execute_model(self):\n        return 2\n")
    (root / "unused_feature.py").write_text("class Connector:\n    def save(self):\n        pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield PKG
    for name in [n for n in sys.modules if n == PKG or n.startswith(PKG + ".")]:
        del sys.modules[name]


def _row(module, qualname, process, feeds, **kwargs):
    return targets.Target(
        f"{PKG}.{module}",
        qualname,
        "sync_timer",
        measures=tuple(Measure(seed, TIMER) for seed in feeds),
        process=process,
        **kwargs,
    )


ROWS = {
    # reported: a symbol missing, and a module that does not exist (the EngineCore's own rows)
    "missing_symbol": _row("engine", "Scheduler.gone", "engine_core", ("scheduler:duration",)),
    "missing_module": _row("removed", "Core.step", "engine_core", ("engine_core:engine_core_step:duration",)),
    # reported: the worker this EngineCore hosts (its rank label), on the path whose targets resolved here
    "missing_on_path": _row("runner_v2_gone", "Runner.sample_tokens", "worker", ("npu:forward_duration",), path="mrv2"),
    # not reported: resolves; exists but never imported; another process kind; another path; gated off
    "resolves_on_path": _row(
        "runner_v2", "Runner.execute_model", "worker", ("executor:prepare_inputs:duration",), path="mrv2"
    ),
    "unused_feature": _row("unused_feature", "Connector.save", "engine_core", ("kv_transfer:duration",)),
    "api_server": _row("removed_api", "Api.f", "api_server", ("e2e_request_latency",)),
    "other_path": _row("runner_v1_removed", "Runner.execute_model", "worker", ("worker:stage_seconds",), path="mrv1"),
    "gated": _row("removed_gated", "Old.f", "engine_core", ("scheduler:batch_size",), vllm=">=99"),
}
REPORTED = ("missing_symbol", "missing_module", "missing_on_path")


def test_targets_that_never_resolved_are_one_log_line_when_the_engine_is_ready(fake_vllm, monkeypatch, caplog):
    pytest.importorskip("vllm", reason="the vllm= gate reads the installed vLLM's version")
    # The worker path cannot be told from the environment: the one whose targets resolved here counts.
    detected = paths.Configuration({"scheduling": "sync", "worker": None, "executor": None, "frontend": None}, {})
    monkeypatch.setattr(installer_module, "configuration", lambda overrides=None: detected)
    set_process("engine_core", "0", "kv_both", rank="0")  # an EngineCore hosting its worker (uniproc)
    installer = Installer(list(ROWS.values()), ready_points=[(f"{PKG}.engine", "Engine.__init__", "engine_core")])
    installer.install()
    try:
        import otel_ready_fake.engine as engine
        import otel_ready_fake.runner_v2  # noqa: F401  (the worker's runner: its row resolves)

        assert installer.status[ROWS["resolves_on_path"].symbol] == installer_module.RESOLVED
        assert installer.status[ROWS["missing_symbol"].symbol] == installer_module.MISSING
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            engine.Engine()  # ready: the report
            engine.Engine()  # once per process
        assert engine.Engine.inits == 2  # the original ran once per call
        lines = [r.getMessage() for r in caplog.records if "never resolved" in r.getMessage()]
        assert len(lines) == 1, lines
        (line,) = lines
        assert "ready to serve in this engine_core process, but 3 hook target(s)" in line
        for key, row in ROWS.items():
            assert (row.symbol in line) == (key in REPORTED), key
        assert f"{ROWS['missing_symbol'].symbol} (cannot be hooked; metrics lost: scheduler:duration)" in line
        assert (
            f"{ROWS['missing_module'].symbol} (module {PKG}.removed does not exist; "
            "metrics lost: engine_core:engine_core_step:duration)"
        ) in line
        assert f"{ROWS['missing_on_path'].symbol} (module {PKG}.runner_v2_gone does not exist" in line
    finally:
        installer.uninstall()
        set_process("unknown", "unknown", "unknown")


def test_on_the_v2_npu_runner_model_runner_v2s_rows_are_expected_too(fake_vllm, tmp_path, monkeypatch, caplog):
    """vllm-ascend's V2 NPU runner (npu_v2) extends model runner V2: where both paths' rows resolve, the worker path
    is npu_v2 (not "cannot tell"), and a V2 row that never resolved is reported there; a V1 row is not."""
    (tmp_path / PKG / "npu_v2.py").write_text("class NPURunner:\n    def prepare_inputs(self):\n        return 3\n")
    npu_row = _row("npu_v2", "NPURunner.prepare_inputs", "worker", ("executor:prepare_inputs:duration",), path="npu_v2")
    rows = [npu_row, ROWS["resolves_on_path"], ROWS["missing_on_path"], ROWS["other_path"]]
    detected = paths.Configuration({"scheduling": "sync", "worker": None, "executor": None, "frontend": None}, {})
    monkeypatch.setattr(installer_module, "configuration", lambda overrides=None: detected)
    set_process("worker", "0", "kv_both", rank="0")
    installer = Installer(rows, ready_points=[(f"{PKG}.engine", "Engine.__init__", "worker")])
    installer.install()
    try:
        import otel_ready_fake.engine as engine
        import otel_ready_fake.npu_v2  # noqa: F401
        import otel_ready_fake.runner_v2  # noqa: F401

        assert installer.status[npu_row.symbol] == installer_module.RESOLVED
        assert [t.symbol for t, _ in installer.unresolved("worker")] == [ROWS["missing_on_path"].symbol]
        with caplog.at_level(logging.WARNING):
            engine.Engine()
        (line,) = [r.getMessage() for r in caplog.records if "never resolved" in r.getMessage()]
        assert ROWS["missing_on_path"].symbol in line and ROWS["other_path"].symbol not in line
    finally:
        installer.uninstall()
        set_process("unknown", "unknown", "unknown")


def test_an_api_server_reports_only_its_own_rows(fake_vllm, caplog):
    set_process("api_server", "0", "kv_both")
    installer = Installer(list(ROWS.values()), ready_points=[(f"{PKG}.engine", "Engine.__init__", "api_server")])
    installer.install()
    try:
        import otel_ready_fake.engine as engine

        with caplog.at_level(logging.WARNING):
            engine.Engine()
        (line,) = [r.getMessage() for r in caplog.records if "never resolved" in r.getMessage()]
        assert "1 hook target(s)" in line and ROWS["api_server"].symbol in line
    finally:
        installer.uninstall()
        set_process("unknown", "unknown", "unknown")


def test_nothing_is_said_when_everything_expected_resolved(fake_vllm, caplog):
    rows = [ROWS["resolves_on_path"], ROWS["unused_feature"]]
    set_process("worker", "0", "kv_both", rank="0")
    installer = Installer(rows, ready_points=[(f"{PKG}.engine", "Engine.__init__", "worker")])
    installer.install()
    try:
        import otel_ready_fake.engine as engine
        import otel_ready_fake.runner_v2  # noqa: F401

        with caplog.at_level(logging.WARNING):
            engine.Engine()
        assert not [r for r in caplog.records if "never resolved" in r.getMessage()]
        assert installer.reported
    finally:
        installer.uninstall()
        set_process("unknown", "unknown", "unknown")


def test_module_exists_imports_nothing(fake_vllm):
    import otel_ready_fake  # noqa: F401  (the parent package: imported)

    assert module_exists(f"{PKG}.unused_feature") is True
    assert f"{PKG}.unused_feature" not in sys.modules
    assert module_exists(f"{PKG}.removed") is False
    assert module_exists(f"{PKG}.removed.deeper") is False
    assert module_exists("otel_no_such_top_level.x") is None  # no parent imported: cannot tell


@pytest.mark.parametrize("version", VLLM_VERSIONS)
def test_the_ready_points_exist_in_every_supported_vllm(version):
    tree = vllm_tree(version)
    problems = []
    for module, qualname, _ in installer_module.READY_POINTS:
        problems += check_target(tree, targets.Target(module, qualname, "sync"))
    assert problems == [], version


def test_the_ready_points_hook_the_installed_vllm(caplog):
    """On the installed vLLM: each ready point's class is wrapped when its module loads, and unwrapped."""
    import importlib

    pytest.importorskip("vllm")
    installer = Installer([], ready_points=installer_module.READY_POINTS)
    installer.install()
    patches = list(installer.patches)
    try:
        for module, _, _ in installer_module.READY_POINTS:
            importlib.import_module(module)
        patches = list(installer.patches)
        assert sorted(f"{p.owner.__module__}:{p.owner.__qualname__}.{p.attribute}" for p in patches) == sorted(
            f"{module}:{qualname}" for module, qualname, _ in installer_module.READY_POINTS
        )
        assert all(p.owner.__dict__[p.attribute] is p.wrapper for p in patches)
    finally:
        installer.uninstall()
    assert installer.patches == [] and all(p.owner.__dict__[p.attribute] is p.original for p in patches)


IMPORT_FINDER_AHEAD = textwrap.dedent(
    """
    import json, sys
    site, root = sys.argv[1], sys.argv[2]
    sys.path[:0] = [root, site]
    import wrapt.importer
    from opentelemetry_instrumentation_vllm_ascend import targets
    from opentelemetry_instrumentation_vllm_ascend.wiring import installer as installer_module
    from opentelemetry_instrumentation_vllm_ascend.wiring.declarative import TIMER, Measure
    from ms_service_metric.core.module.symbol_watcher import SymbolWatcher

    row = targets.Target("otel_finder_fake.sched", "Scheduler.schedule", "sync_timer",
                         measures=(Measure("scheduler:duration", TIMER),), process="engine_core")
    installer = installer_module.Installer([row], ready_points=[])
    installer.install()                     # our post-import hook waits for otel_finder_fake.sched
    watcher = SymbolWatcher()               # ms-service-metric's own finder, as its vLLM plugin starts it
    watcher.watch_module("otel_finder_fake.sched", lambda event: None)
    watcher.start()
    ahead = type(sys.meta_path[0]).__name__
    import otel_finder_fake.sched as sched
    before = installer.status[row.symbol]
    hooked = installer.catch_up()
    first = isinstance(sys.meta_path[0], wrapt.importer.ImportHookFinder)
    print(json.dumps({"ahead": ahead, "before": before, "hooked": hooked, "after": installer.status[row.symbol],
                      "first": first, "wrapped": sched.Scheduler.__dict__["schedule"] is not sched.ORIGINAL,
                      "result": sched.Scheduler().schedule(), "calls": sched.CALLS,
                      "again": installer.catch_up()}))
    """
)


def test_targets_imported_past_our_hook_by_ms_service_metrics_finder_are_hooked_at_catch_up(tmp_path):
    """ms-service-metric 26.0.0's vLLM plugin puts its ``SymbolWatchFinder`` at ``sys.meta_path[0]``: for a module it
    watches it answers the import itself (``PathFinder``), so wrapt's finder, and our post-import hook, never see it
    (measured on the live server: every ``Scheduler`` row of ours silent beside it). The real finder (the registry's
    release, ``source_archives.incumbent_site``), in a subprocess: the target stays pending after the import;
    ``catch_up`` (run where vLLM has loaded its plugins and at each ready point) puts wrapt's finder first again and
    hooks it; the original then runs once per call; a second ``catch_up`` does nothing."""
    pytest.importorskip("jsonschema", reason="the incumbent imports jsonschema without declaring it")
    import json
    import subprocess

    from tests.support.source_archives import incumbent_site

    package = tmp_path / "otel_finder_fake"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "sched.py").write_text(
        "CALLS = [0]\nclass Scheduler:\n    def schedule(self):\n        CALLS[0] += 1\n        return 7\n"
        "ORIGINAL = Scheduler.__dict__['schedule']\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_FINDER_AHEAD, incumbent_site(), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {
        "ahead": "SymbolWatchFinder",
        "before": installer_module.PENDING,
        "hooked": 1,
        "after": installer_module.RESOLVED,
        "first": True,
        "wrapped": True,
        "result": 7,
        "calls": [1],
        "again": 0,
    }
