"""Other vLLM instrumentations in the process (ms-service-metric, tapm-instrumentation-vllm, ddtrace): one
warning naming them and the symbols both wrap, and one more at the first collection if more was found since.
Fakes stand for tapm and ddtrace (their packages are not test dependencies); ms-service-metric is its real 26.0.0
wheel (the release tox -e bench pins, fetched into the source cache as tests/support/source_archives.py fetches it), its
own hook chain and bytecode injection patching a class. Our side is real: the package's patch_method, and wrapt's
FunctionWrapper for a neighbour that uses it. The once-per-process memory is state.STATE's, which the suite's
autouse fixture resets (state.reset()) around every test."""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import sys
import types

import pytest
import wrapt

from opentelemetry_instrumentation_vllm_ascend import neighbours, state
from opentelemetry_instrumentation_vllm_ascend.hooks.handler import Handler
from opentelemetry_instrumentation_vllm_ascend.hooks.patches import patch_method
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import SYNC
from opentelemetry_instrumentation_vllm_ascend.recording import pipeline
from opentelemetry_instrumentation_vllm_ascend.state import STATE
from tests.support import source_archives

#: ms-service-metric's dependency for its bytecode injection (pure Python), a release that supports Python 3.10+.
BYTECODE = ("bytecode", "0.19.1")


def make_class():
    class Scheduler:
        def schedule(self):
            return "scheduled"

        def update_from_output(self, out):
            return out

        def add_request(self, r):
            return r

    Scheduler.__module__ = "vllm.v1.core.sched.scheduler"
    return Scheduler


def foreign_wrapper(module: str):
    """A wrapt FunctionWrapper whose wrapper function is defined in ``module`` (as a neighbour's would be)."""
    namespace: dict = {"__name__": module}
    exec("def wrapper(wrapped, instance, args, kwargs):\n    return wrapped(*args, **kwargs)\n", namespace)
    return namespace["wrapper"]


def functools_wrapper(module: str, fn):
    namespace: dict = {"__name__": module, "functools": functools, "fn": fn}
    exec(
        "@functools.wraps(fn)\ndef wrapped(*a, **k):\n    return fn(*a, **k)\n",
        namespace,
    )
    return namespace["wrapped"]


def test_names_neighbours_and_the_double_wrapped_symbols(caplog):
    cls = make_class()
    # ms-service-metric wrapped schedule before us (wrapt, the way it patches), so ours sits over theirs.
    wrapt.wrap_function_wrapper(cls, "schedule", foreign_wrapper("ms_service_metric.core.hook"))
    ours = [patch_method(cls, name, Handler(), SYNC) for name in ("schedule", "update_from_output", "add_request")]
    # ddtrace wraps update_from_output after us (functools.wraps over our wrapper).
    cls.update_from_output = functools_wrapper(
        "ddtrace.contrib.internal.vllm.patch", cls.__dict__["update_from_output"]
    )
    # As in sys.modules: a loaded submodule's packages have their entries too.
    modules = {
        "ms_service_metric": types.ModuleType("ms_service_metric"),
        "ddtrace.contrib.internal.vllm": 1,
        "ddtrace.contrib.internal.vllm.patch": 1,
    }
    with caplog.at_level(logging.WARNING, logger=neighbours.__name__):
        assert neighbours.check(ours, modules) is True
        assert neighbours.check(ours, modules) is False  # once per process
    [record] = [r for r in caplog.records if r.name == neighbours.__name__]
    message = record.getMessage()
    assert "ms-service-metric, ddtrace vLLM integration" in message
    assert "vllm.v1.core.sched.scheduler:make_class.<locals>.Scheduler.schedule (ms-service-metric)" in message
    assert "Scheduler.update_from_output (ddtrace vLLM integration)" in message
    assert "add_request" not in message
    # Everything still runs exactly once through every layer.
    assert cls().schedule() == "scheduled" and cls().update_from_output(3) == 3


def test_a_functools_decorator_of_vllm_itself_is_not_a_neighbour():
    cls = make_class()
    cls.schedule = functools_wrapper("vllm.utils", cls.schedule)
    ours = [patch_method(cls, "schedule", Handler(), SYNC)]
    found = neighbours.loaded({"opentelemetry.instrumentation.vllm": 1})
    assert [n.name for n in found] == ["tapm-instrumentation-vllm"]
    assert neighbours.double_wrapped(ours, found) == {}


def test_silent_without_neighbours(caplog):
    cls = make_class()
    ours = [patch_method(cls, "schedule", Handler(), SYNC)]
    with caplog.at_level(logging.WARNING):
        assert neighbours.check(ours, {"vllm": 1, "opentelemetry.instrumentation.openai": 1}) is False
    assert not caplog.records
    # ... and on the real sys.modules of this test process (none of them is installed here).
    assert neighbours.loaded() == [] or all(n.modules[0].split(".")[0] in sys.modules for n in neighbours.loaded())


def test_never_raises():
    class Broken:
        owner = property(lambda self: 1 / 0)

    assert neighbours.check([Broken()], {"ms_service_metric": 1}) is True


def warnings_logged(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == neighbours.__name__]


def test_rechecks_once_at_the_first_collection(caplog):
    """The neighbour's package is loaded before it patched anything: the first warning finds no symbol; the
    re-check after it patched names the symbol, once; nothing more after."""
    cls = make_class()
    ours = [patch_method(cls, "schedule", Handler(), SYNC)]
    modules = {"ddtrace.contrib.internal.vllm": 1}
    with caplog.at_level(logging.WARNING, logger=neighbours.__name__):
        assert neighbours.check(ours, modules) is True
        cls.schedule = functools_wrapper("ddtrace.contrib.internal.vllm.patch", cls.__dict__["schedule"])
        assert neighbours.check(ours, modules) is False  # check itself stays once per process
        assert neighbours.recheck(modules) is True
        assert neighbours.recheck(modules) is False  # the re-check runs once
    first, later = warnings_logged(caplog)
    assert first.endswith("double-wrapped symbols: none found yet")
    assert "(looked again at the first metrics collection)" in later
    assert "Scheduler.schedule (ddtrace vLLM integration)" in later


def test_recheck_is_silent_when_nothing_new(caplog):
    cls = make_class()
    wrapt.wrap_function_wrapper(cls, "schedule", foreign_wrapper("ms_service_metric.core.hook"))
    ours = [patch_method(cls, "schedule", Handler(), SYNC)]
    with caplog.at_level(logging.WARNING, logger=neighbours.__name__):
        assert neighbours.check(ours, {"ms_service_metric": 1}) is True
        assert neighbours.recheck({"ms_service_metric": 1}) is False
    assert len(warnings_logged(caplog)) == 1


def test_the_once_per_process_memory_is_state_reset_by_state_reset(caplog):
    """What was reported lives in state.STATE: a fresh process (state.reset(), as a forked child runs it) warns
    again; the installer's patch list is kept (a registration), so its re-check still sees the patches."""
    cls = make_class()
    wrapt.wrap_function_wrapper(cls, "schedule", foreign_wrapper("ms_service_metric.core.hook"))
    ours = [patch_method(cls, "schedule", Handler(), SYNC)]
    modules = {"ms_service_metric": 1}
    assert neighbours.check(ours, modules) is True
    assert STATE.neighbours_reported is not None and STATE.neighbour_patches is ours
    state.reset()
    assert STATE.neighbours_reported is None and not STATE.neighbours_rechecked and STATE.neighbour_patches is ours
    with caplog.at_level(logging.WARNING, logger=neighbours.__name__):
        assert neighbours.recheck(modules) is True
    assert "Scheduler.schedule (ms-service-metric)" in warnings_logged(caplog)[0]
    assert not hasattr(neighbours, "_warned")


def test_a_collection_runs_the_recheck(metrics, caplog):
    """The first collection of the real pipeline (here the in-memory reader's) runs the re-check, once."""
    cls = make_class()
    ours = [patch_method(cls, "schedule", Handler(), SYNC)]
    neighbours.check(ours, {})
    pipeline.get()  # built (a process builds it at its first record)
    cls.schedule = functools_wrapper("tapm_hook_vllm.hooks", cls.__dict__["schedule"])
    sys.modules["tapm_hook_vllm"] = types.ModuleType("tapm_hook_vllm")
    try:
        with caplog.at_level(logging.WARNING, logger=neighbours.__name__):
            metrics.points()
            metrics.points()
    finally:
        del sys.modules["tapm_hook_vllm"]
    assert STATE.neighbours_rechecked
    [message] = warnings_logged(caplog)
    assert "Scheduler.schedule (tapm-instrumentation-vllm)" in message


# -- the real ms-service-metric 26.0.0 --------------------------------------------------------------------------
@pytest.fixture
def ms_service_metric(monkeypatch):
    """Its wheel (and bytecode's) on sys.path, as a zip import; its modules gone from sys.modules afterwards."""
    pytest.importorskip("jsonschema", reason="ms-service-metric imports it (tox -e bench and the py env have it)")
    for project in (source_archives.INCUMBENT, BYTECODE):
        monkeypatch.syspath_prepend(source_archives.wheel(*project))
    try:
        yield types.SimpleNamespace(
            hook_chain=importlib.import_module("ms_service_metric.core.hook.hook_chain"),
            inject=importlib.import_module("ms_service_metric.core.hook.inject"),
        )
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] in ("ms_service_metric", "bytecode")]:
            del sys.modules[name]


@pytest.fixture
def vllm_module():
    """A module holding a Scheduler class, importable by name (ms-service-metric finds a target's owner by
    importing its ``__module__``)."""
    module = types.ModuleType("fake_vllm_sched_for_neighbours")
    exec(
        "class Scheduler:\n    def schedule(self, n=1):\n        out = n + 1\n        return out\n",
        module.__dict__,
    )
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


def ms_hook(ms, cls, attribute: str, calls: list):
    """ms-service-metric's own registration of a wrap handler on ``cls.attribute`` (what its Symbol does for a
    hook file entry): get_chain, add_chain_node (its HookHelper replaces the attribute), set_hook_func."""
    chain = ms.hook_chain.get_chain(getattr(cls, attribute))
    node = chain.add_chain_node(insert_at_head=True)

    def handler(*args, **kwargs):
        calls.append("ms")
        return node.call_prev(*args, **kwargs)

    node.set_hook_func(handler)
    return chain


@pytest.mark.parametrize("order", ["theirs over ours", "ours over theirs"])
def test_real_ms_service_metric_hook_chain_is_detected(ms_service_metric, vllm_module, caplog, order):
    cls, calls = vllm_module.Scheduler, []
    if order == "theirs over ours":
        ours = [patch_method(cls, "schedule", Handler(), SYNC)]
        ms_hook(ms_service_metric, cls, "schedule", calls)
    else:
        ms_hook(ms_service_metric, cls, "schedule", calls)
        ours = [patch_method(cls, "schedule", Handler(), SYNC)]
    # Its hook leaves no __wrapped__: its execute_hook_chain, with _hook_chain.ori_func.
    assert not hasattr(cls.__dict__["schedule"] if order == "theirs over ours" else ours[0].original, "__wrapped__")
    with caplog.at_level(logging.WARNING, logger=neighbours.__name__):
        assert neighbours.check(ours) is True  # the real sys.modules, where its import put ms_service_metric
    [message] = warnings_logged(caplog)
    assert f"{vllm_module.__name__}:Scheduler.schedule (ms-service-metric)" in message
    assert cls().schedule(2) == 3 and calls == ["ms"]  # both layers ran, the original once


def test_real_ms_service_metric_injected_code_is_detected(ms_service_metric, vllm_module, caplog):
    """Its bytecode injection (inject_function, for handlers that read locals) returns a new function with the
    original's name, module and code plus calls to its hooks: no wrapper layer, no __wrapped__; its copied globals
    hold its hook functions."""
    cls, seen = vllm_module.Scheduler, []

    @contextlib.contextmanager
    def handler(ctx):
        yield
        seen.append(ctx.return_value)

    injected = ms_service_metric.inject.inject_function(cls.__dict__["schedule"], [handler])
    assert injected.__globals__["__name__"] == vllm_module.__name__ and not hasattr(injected, "__wrapped__")
    cls.schedule = injected
    ours = [patch_method(cls, "schedule", Handler(), SYNC)]
    with caplog.at_level(logging.WARNING, logger=neighbours.__name__):
        assert neighbours.check(ours) is True
    assert f"{vllm_module.__name__}:Scheduler.schedule (ms-service-metric)" in warnings_logged(caplog)[0]
    assert cls().schedule(4) == 5 and seen == [5]


def test_real_ms_service_metric_patching_after_the_first_warning_is_found_by_the_recheck(
    ms_service_metric, vllm_module, caplog
):
    """Its package is imported (vLLM loads its plugin) before its hooks go in: the first warning names it
    without symbols; the re-check at the first collection names the symbol."""
    cls, calls = vllm_module.Scheduler, []
    ours = [patch_method(cls, "schedule", Handler(), SYNC)]
    with caplog.at_level(logging.WARNING, logger=neighbours.__name__):
        assert neighbours.check(ours) is True
        ms_hook(ms_service_metric, cls, "schedule", calls)
        assert neighbours.recheck() is True
    first, later = warnings_logged(caplog)
    assert first.endswith("none found yet")
    assert f"{vllm_module.__name__}:Scheduler.schedule (ms-service-metric)" in later


def test_the_warning_names_the_prefixes_each_side_writes(caplog):
    """With ms-service-metric loaded: the one warning says which Prometheus names are ours (catalogue.py's
    prefixes), which are ms-service-metric's (its adapter's VLLM_METRICS_PREFIX), and that both write the
    shared ``vllm_profiling_`` prefix."""
    from opentelemetry_instrumentation_vllm_ascend import catalogue

    adapter = types.ModuleType(neighbours._MSM_PREFIX_MODULE)
    adapter.VLLM_METRICS_PREFIX = "vllm_profiling"  # as ms-service-metric 26.0.0 sets it
    modules = {"ms_service_metric": types.ModuleType("ms_service_metric"), neighbours._MSM_PREFIX_MODULE: adapter}
    with caplog.at_level(logging.WARNING, logger=neighbours.__name__):
        assert neighbours.check([], modules) is True
    [message] = warnings_logged(caplog)
    ours = sorted(
        {
            "_".join(s.prometheus_name.split("_")[:2]) + "_"
            if not s.prometheus_name.startswith(catalogue.PREFIX)
            else catalogue.PREFIX
            for s in catalogue.CATALOGUE
        }
    )
    assert ours == ["gen_ai_", "vllm_profiling_"]
    assert "Names: this instrumentation gen_ai_*, vllm_profiling_*; ms-service-metric vllm_profiling_*" in message
    assert "both write vllm_profiling_*" in message


def test_names_without_ms_service_metric_name_only_ours():
    text = neighbours.owned_names([neighbours.NEIGHBOURS[2]], {})
    assert text == "Names: this instrumentation gen_ai_*, vllm_profiling_*"
    assert neighbours.incumbent_prefix({}) == "vllm_profiling_"


def test_ms_service_metric_26_discovers_no_providers():
    """vllm-ascend 0.30.0rc2 registers an ``ms_service_metric.providers`` entry point (its in-tree hook files), but
    ms-service-metric 26.0.0, the registry's only release, never reads that group, nor any entry point: no module of
    its wheel names the group or an entry-point or metadata API. So, beside 26.0.0, vllm-ascend's provider is never
    loaded and only the incumbent's own vLLM hook files run (docs/deploy.md, "Beside ms-service-metric")."""
    import zipfile

    with zipfile.ZipFile(source_archives.wheel(*source_archives.INCUMBENT)) as archive:
        sources = {
            name: archive.read(name).decode("utf-8")
            for name in archive.namelist()
            if name.startswith("ms_service_metric/") and name.endswith(".py")
        }
        entry_points = archive.read("ms_service_metric-26.0.0.dist-info/entry_points.txt").decode()
    assert len(sources) > 30 and "ms_service_metric/adapters/vllm/adapter.py" in sources  # the whole package
    for needle in ("providers", "entry_points", "importlib.metadata", "importlib_metadata", "pkg_resources"):
        assert [name for name, text in sources.items() if needle in text] == [], needle
    # What it registers itself: its CLI and its vLLM plugin, no provider group.
    assert "[vllm.general_plugins]" in entry_points and "providers" not in entry_points
