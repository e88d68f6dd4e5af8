"""The "no room" hook without a wrapper frame (hooks/rewrite.py): a copy of the target whose own returns
tell the handler of a None result and whose exceptions tell it of a failure — and otherwise behaves
exactly as the target: same results (the same objects), same exceptions and tracebacks, same
defaults; anything it cannot copy exactly gets the ordinary wrapper."""

import os
import sys
import traceback

import pytest

from opentelemetry_instrumentation_vllm_ascend.hooks import codegen, patches, rewrite, wrappers
from opentelemetry_instrumentation_vllm_ascend.hooks.handler import Handler, Hook
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import SYNC
from opentelemetry_instrumentation_vllm_ascend.state import STATE


class OnNone(Handler):
    after_only_on_none = True
    reads_args = 0

    def __init__(self):
        self.seen = []

    def after(self, state, args, kwargs, result):
        self.seen.append(("after", args, kwargs, result))

    def error(self, state, args, kwargs, exc):
        self.seen.append(("error", type(exc).__name__))


class Boom(Exception):
    pass


SENTINEL = object()
EVALUATED = []


class Pool:
    """Every way a function can end: ``return None``, a bare ``return``, falling off the end, a value
    that is None only at run time, a value, a raise; a nested function's own returns."""

    def allocate(self, n, lookahead=0, *, blocks=SENTINEL, extra=()):
        def nested():
            return None  # not the target's return

        nested()
        if n == 0:
            return None
        if n == 1:
            return
        if n == 2:
            EVALUATED.append(n)
            return {}.get("missing")  # None at run time, evaluated once
        if n == 3:
            raise Boom("no room")
        if n == 4:
            return blocks
        if n == 5:
            EVALUATED.append(n)
            return [n, lookahead, extra]
        if n == 6:
            pass  # falls off the end


def copied(handler=None):
    handler = handler or OnNone()
    wrapped, hook = wrappers.wrap(Pool.allocate, handler, SYNC)
    return wrapped, hook, handler


def test_it_is_a_copy_of_the_target_not_a_wrapper():
    wrapped, _, _ = copied()
    assert wrapped.__code__.co_filename == __file__  # not a generated wrapper's pseudo file
    assert wrapped.__code__.co_firstlineno == Pool.allocate.__code__.co_firstlineno
    assert wrapped.__defaults__ is Pool.allocate.__defaults__
    assert wrapped.__kwdefaults__ is Pool.allocate.__kwdefaults__
    assert wrapped.__annotations__ is Pool.allocate.__annotations__
    assert wrapped.__name__ == "allocate" and wrapped.__qualname__ == "Pool.allocate"
    assert wrapped.__globals__ is Pool.allocate.__globals__
    assert wrapped.__wrapped__ is Pool.allocate


def test_none_results_and_failures_reach_the_handler_and_nothing_else_does():
    wrapped, _, handler = copied()
    pool = Pool()
    EVALUATED.clear()
    assert wrapped(pool, 0) is None
    assert wrapped(pool, 1) is None
    assert wrapped(pool, 2) is None
    assert wrapped(pool, 6) is None
    assert wrapped(pool, 4) is SENTINEL  # the default object itself
    marker = object()
    assert wrapped(pool, 4, blocks=marker) is marker
    assert wrapped(pool, 5, 7, extra=(1,)) == [5, 7, (1,)]
    with pytest.raises(Boom, match="no room"):
        wrapped(pool, 3)
    assert EVALUATED == [2, 5]  # each returned expression evaluated once
    assert handler.seen == [("after", (), None, None)] * 4 + [("error", "Boom")]


def test_a_raise_keeps_its_traceback_lines():
    wrapped, _, _ = copied()
    with pytest.raises(Boom) as caught:
        wrapped(Pool(), 3)
    frame = traceback.extract_tb(caught.value.__traceback__)[-1]
    assert frame.filename == __file__ and frame.name == "allocate"
    assert frame.line == 'raise Boom("no room")'


def test_a_failing_handler_is_reported_once_and_the_result_is_unchanged(caplog):
    class Failing(OnNone):
        name = "rewrite-failing"

        def after(self, state, args, kwargs, result):
            raise RuntimeError("handler bug")

        def error(self, state, args, kwargs, exc):
            raise RuntimeError("handler bug")

    STATE.reported.discard(("rewrite-failing", "after"))
    STATE.reported.discard(("rewrite-failing", "error"))
    wrapped, _, _ = copied(Failing())
    assert [wrapped(Pool(), 0) for _ in range(3)] == [None] * 3
    with pytest.raises(Boom):
        wrapped(Pool(), 3)
    failures = [r for r in caplog.records if "rewrite-failing" in r.getMessage()]
    assert [r.getMessage().split(" failed in ")[1].split(";")[0] for r in failures] == ["after", "error"]


def test_switched_off_or_removed_it_only_runs_the_target():
    wrapped, hook, handler = copied()
    hook.handler = None
    assert wrapped(Pool(), 0) is None
    with pytest.raises(Boom):
        wrapped(Pool(), 3)
    assert handler.seen == []


def test_patch_and_remove_restore_the_class():
    class Owner:
        def allocate(self, n):
            return None if n else self

    original = Owner.__dict__["allocate"]
    handler = OnNone()
    patch = patches.patch_method(Owner, "allocate", handler, SYNC)
    assert Owner.__dict__["allocate"].__code__.co_filename == __file__
    owner = Owner()
    assert owner.allocate(0) is owner and owner.allocate(1) is None
    assert handler.seen == [("after", (), None, None)]
    patch.remove()
    assert Owner.__dict__["allocate"] is original


def _closure_target():
    outer = 1

    def uses_closure(self, n):
        return None if n else outer

    return uses_closure


class _Base:
    def allocate(self, n):
        return n


class _UsesSuper(_Base):
    def allocate(self, n):
        return super().allocate(n)


def _decorator(function):
    return function


class _Decorated:
    @_decorator
    def allocate(self, n):
        return n


def _generator(self, n):
    yield n


def _clash(self, n):
    _otel_v = n
    return _otel_v


_exec_namespace: dict = {}
exec("def no_source(self, n):\n    return n\n", _exec_namespace)


@pytest.mark.parametrize(
    "target",
    [
        _closure_target(),
        _UsesSuper.allocate,
        _Decorated.allocate,
        _generator,
        _clash,
        _exec_namespace["no_source"],
        len,
    ],
    ids=["closure", "super", "decorated", "generator", "our-name", "no-source", "builtin"],
)
def test_what_cannot_be_copied_exactly_gets_the_ordinary_wrapper(target):
    assert rewrite.none_returns(target, Hook(OnNone())) is None
    if target is len:
        return
    wrapped, _ = wrappers.wrap(target, OnNone(), SYNC)
    assert wrapped.__code__.co_filename.startswith(codegen.FILENAME_PREFIX)


def test_handlers_that_read_arguments_or_guard_keep_the_wrapper():
    class Reads(OnNone):
        reads_args = 2

    wrapped, _ = wrappers.wrap(Pool.allocate, Reads(), SYNC)
    assert wrapped.__code__.co_filename.startswith(codegen.FILENAME_PREFIX)


def test_the_installed_vllm_allocate_slots_is_copied():
    """vLLM's own KVCacheManager.allocate_slots (the per-request hook of the default set) takes the
    copy, compiled under vLLM's own file name; the contract tests check that every supported version's
    source can be copied (test_contract_vllm), and the end-to-end tests count its failures on a real
    server (test_e2e)."""
    kv_cache_manager = pytest.importorskip("vllm.v1.core.kv_cache_manager")
    from opentelemetry_instrumentation_vllm_ascend.handlers.kv_cache import AllocateSlots

    original = kv_cache_manager.KVCacheManager.allocate_slots
    copy = rewrite.none_returns(original, Hook(AllocateSlots()))
    assert copy is not None
    assert os.path.samefile(copy.__code__.co_filename, sys.modules[original.__module__].__file__)
    assert copy.__code__.co_firstlineno == original.__code__.co_firstlineno


def test_a_source_file_edited_since_import_is_not_copied(tmp_path, monkeypatch):
    """The copy is compiled from the file: where the file no longer holds the running function (edited
    or replaced after import: an upgrade under a running server), the ordinary wrapper is used."""
    import importlib
    import linecache

    path = tmp_path / "edited_target.py"
    path.write_text("def allocate(self, n):\n    return None if n else self\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("edited_target")
    assert rewrite.none_returns(module.allocate, Hook(OnNone())) is not None
    path.write_text("def allocate(self, n):\n    return self\n")
    linecache.checkcache(str(path))
    assert rewrite.none_returns(module.allocate, Hook(OnNone())) is None
    sys.modules.pop("edited_target", None)
