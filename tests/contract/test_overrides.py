"""Contract over subclasses: a hook on a base class never sees the calls of a subclass that overrides
the hooked method without calling the base's. In the source of every supported version (``supported.py``: each vLLM
release; each vllm-ascend release together with the vLLM it runs on), every class that
subclasses a hooked target's class (transitively) and defines the hooked method without calling the
base's must have a row of its own or an entry, with its reason, in ``targets.UNCOVERED_OVERRIDES``."""

import functools

import pytest
from packaging.version import Version

from opentelemetry_instrumentation_vllm_ascend import targets
from opentelemetry_instrumentation_vllm_ascend.wiring.installer import in_range
from tests.contract.test_vllm import tree_for
from tests.support.contract import (
    ASCEND_PAIRS,
    VLLM_VERSIONS,
    SourceTree,
    ascend_tree,
    ascend_vllm,
    overrides_without_base_call,
)

_PREFIX = "vllm-ascend "
#: The trees: each vLLM release, then each vllm-ascend release (named "vllm-ascend VERSION") over its vLLM.
ASCEND_NAMES = tuple(_PREFIX + ascend for ascend, _ in ASCEND_PAIRS)
ASCEND = ASCEND_NAMES[0]  # the oldest supported vllm-ascend (the overrides known there are listed below)
TREES = VLLM_VERSIONS + ASCEND_NAMES


def tree_of(name: str) -> SourceTree:
    return ascend_tree(name[len(_PREFIX) :]) if name.startswith(_PREFIX) else tree_for(name)


def _versions(name: str) -> tuple[Version, Version | None]:
    """(vLLM, vllm-ascend or None) of a tree."""
    if name.startswith(_PREFIX):
        ascend = name[len(_PREFIX) :]
        return Version(ascend_vllm(ascend)), Version(ascend)
    return Version(name), None


def _applies(row, name: str) -> bool:
    """The row (a target or an uncovered override) exists in this tree's versions."""
    vllm, ascend = _versions(name)
    if not in_range(vllm, row.vllm):
        return False
    if row.vllm_ascend is None:
        return True
    return ascend is not None and in_range(ascend, row.vllm_ascend)


def _canonical(tree: SourceTree, symbol: str) -> str:
    """``module:Class.method`` with the module where the class is defined (a row may name it through a
    module that imports it)."""
    module, qualname = symbol.split(":")
    cls, method = qualname.rsplit(".", 1)
    found = tree.find_class(module, cls)
    return f"{found[0]}:{found[1].name}.{method}" if found is not None else symbol


@functools.cache
def overrides(name: str) -> dict[str, str]:
    """{override without the base's call: the hooked symbol it bypasses} in one tree."""
    tree = tree_of(name)
    out = {}
    for target in targets.TARGETS:
        if target.owner_qualname is None or target.attribute is None or not _applies(target, name):
            continue
        for symbol in overrides_without_base_call(tree, target.module, target.owner_qualname, target.attribute):
            out.setdefault(symbol, target.symbol)
    return out


@pytest.mark.parametrize("name", TREES)
def test_every_override_that_bypasses_a_hook_has_a_row_or_a_reason(name):
    tree = tree_of(name)
    rows = {
        _canonical(tree, t.symbol)
        for t in targets.TARGETS
        if t.owner_qualname is not None and t.attribute is not None and _applies(t, name)
    }
    listed = {u.symbol: u for u in targets.UNCOVERED_OVERRIDES if _applies(u, name)}
    found = overrides(name)
    missing = sorted(
        f"{symbol} (bypasses {hooked})"
        for symbol, hooked in found.items()
        if symbol not in rows and symbol not in listed
    )
    assert missing == [], f"{name}: {missing}"
    # An entry of the table names what it bypasses truly, in the versions it claims.
    for symbol, entry in listed.items():
        assert found.get(symbol) == entry.hooked, (name, symbol)


def test_the_known_bypassing_overrides_are_found_and_have_rows():
    """vllm-ascend's overrides known to bypass a hook (RecomputeScheduler's update_from_output and
    add_request, the 310P runner's _prepare_inputs, the NPU model runner V2's prepare_inputs,
    SchedulerDynamicBatch's schedule) are what the search reports, and each has its own row."""
    found = overrides(ASCEND)
    expected = {
        "vllm_ascend.core.recompute_scheduler:RecomputeScheduler.update_from_output": "vllm.v1.core.sched.scheduler:Scheduler.update_from_output",
        "vllm_ascend.core.recompute_scheduler:RecomputeScheduler.add_request": "vllm.v1.core.sched.scheduler:Scheduler.add_request",
        "vllm_ascend._310p.model_runner_310p:NPUModelRunner310._prepare_inputs": "vllm.v1.worker.gpu_model_runner:GPUModelRunner._prepare_inputs",
        "vllm_ascend.worker.v2.model_runner:NPUModelRunner.prepare_inputs": "vllm.v1.worker.gpu.model_runner:GPUModelRunner.prepare_inputs",
        "vllm_ascend.core.scheduler_dynamic_batch:SchedulerDynamicBatch.schedule": "vllm.v1.core.sched.scheduler:Scheduler.schedule",
    }
    assert {s: found.get(s) for s in expected} == expected
    symbols = {t.symbol for t in targets.TARGETS}
    assert set(expected) <= symbols


def test_every_uncovered_override_is_still_in_some_supported_version():
    """No stale entries: each listed override exists, without the base's call, where it claims."""
    for entry in targets.UNCOVERED_OVERRIDES:
        names = [n for n in TREES if _applies(entry, n)]
        assert names, entry.symbol
        assert all(overrides(n).get(entry.symbol) == entry.hooked for n in names), entry.symbol
        assert entry.reason.strip()


def test_the_search_follows_imports_and_ignores_overrides_that_call_the_base():
    tree = SourceTree(
        {
            "vllm/__init__.py": "",
            "vllm/base.py": "class A:\n    def f(self, x):\n        return x\n",
            "vllm/one.py": (
                "from vllm.base import A\n"
                "class B(A):\n    def f(self, x):\n        return 1\n"  # bypasses
                "class C(B):\n    def f(self, x):\n        return super().f(x)\n"  # calls the base's
                "class D(B):\n    pass\n"  # inherits B's
                "class E(D):\n    f = staticmethod(len)\n"  # replaces it by assignment
            ),
            "vllm/two.py": (
                "import vllm.base as base\n"
                "if True:\n    from vllm import one\n"
                "class F(base.A):\n    def f(self, x):\n        return base.A.f(self, x)\n"  # explicit base call
                "class G(one.D):\n    async def f(self, x):\n        return 2\n"  # through a module import
            ),
            "tests/test_x.py": "from vllm.base import A\nclass H(A):\n    def f(self, x):\n        return 3\n",
        }
    )
    assert overrides_without_base_call(tree, "vllm.base", "A", "f") == ["vllm.one:B.f", "vllm.one:E.f", "vllm.two:G.f"]
    assert {n.name for _, n in tree.subclasses("vllm.base", "A")} == {"B", "C", "D", "E", "F", "G"}
