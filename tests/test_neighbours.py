"""Other vLLM instrumentations in the process (ms-service-metric, tapm-instrumentation-vllm, ddtrace): one
warning naming them and the symbols both wrap. Fakes stand for the neighbours (their packages are not test
dependencies); the wrapping is real: wrapt's FunctionWrapper and the package's own patch_method."""

from __future__ import annotations

import functools
import logging
import sys
import types

import pytest
import wrapt

from opentelemetry_instrumentation_vllm_ascend import neighbours
from opentelemetry_instrumentation_vllm_ascend.hooks.handler import Handler
from opentelemetry_instrumentation_vllm_ascend.hooks.patches import patch_method
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import SYNC


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(neighbours, "_warned", [False])


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
