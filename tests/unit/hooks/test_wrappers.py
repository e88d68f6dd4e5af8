"""Never break the host: for every wrapper kind, a handler that raises anywhere leaves the target's
result, exception and call count exactly as without the wrapper (the original runs once)."""

import asyncio
import concurrent.futures
import logging

import pytest

from opentelemetry_instrumentation_vllm_ascend.hooks import codegen, futures, patches, wrappers
from opentelemetry_instrumentation_vllm_ascend.hooks.handler import Handler
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import ASYNC_GENERATOR, COROUTINE, FUTURE, SYNC
from opentelemetry_instrumentation_vllm_ascend.state import STATE


class Boom(Exception):
    pass


class RaisingHandler(Handler):
    """Raises from the method named ``where`` (or all of them)."""

    def __init__(self, where):
        self.where = where
        self.name = f"raising-{where}"
        self.seen = []

    def _maybe(self, what):
        self.seen.append(what)
        if self.where in (what, "all"):
            raise RuntimeError(f"handler bug in {what}")

    def before(self, args, kwargs):
        self._maybe("before")
        return "state"

    def after(self, state, args, kwargs, result):
        self._maybe("after")

    def error(self, state, args, kwargs, exc):
        self._maybe("error")

    def future_done(self, state, args, kwargs, future):
        self._maybe("future_done")


WHERE = ["before", "after", "error", "future_done", "all"]


class Target:
    def __init__(self):
        self.calls = 0


def make_sync(fail):
    t = Target()

    def original(x, *, y=1):
        t.calls += 1
        if fail:
            raise Boom(x)
        return x + y

    return t, original


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("fail", [False, True])
def test_sync(where, fail, caplog):
    t, original = make_sync(fail)
    wrapped, _ = wrappers.wrap(original, RaisingHandler(where), SYNC)
    if fail:
        with pytest.raises(Boom) as info:
            wrapped(3, y=4)
        assert info.value.args == (3,)
    else:
        assert wrapped(3, y=4) == 7
    assert t.calls == 1
    assert wrapped.__name__ == "original" and wrapped.__wrapped__ is original


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("fail", [False, True])
def test_coroutine(where, fail):
    t = Target()

    async def original(x):
        t.calls += 1
        await asyncio.sleep(0)
        if fail:
            raise Boom(x)
        return x * 2

    wrapped, _ = wrappers.wrap(original, RaisingHandler(where), COROUTINE)
    if fail:
        with pytest.raises(Boom):
            asyncio.run(wrapped(5))
    else:
        assert asyncio.run(wrapped(5)) == 10
    assert t.calls == 1


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("fail_at", [None, 0, 2])
def test_async_generator(where, fail_at):
    t = Target()

    async def original(n):
        t.calls += 1
        for i in range(n):
            if i == fail_at:
                raise Boom(i)
            yield i
            await asyncio.sleep(0)

    wrapped, _ = wrappers.wrap(original, RaisingHandler(where), ASYNC_GENERATOR)

    async def consume():
        return [i async for i in wrapped(4)]

    if fail_at is None:
        assert asyncio.run(consume()) == [0, 1, 2, 3]
    else:
        with pytest.raises(Boom) as info:
            asyncio.run(consume())
        assert info.value.args == (fail_at,)
    assert t.calls == 1


def test_async_generator_asend_athrow_aclose_are_delegated():
    log = []

    async def original():
        try:
            got = yield 1
            log.append(("got", got))
            try:
                yield 2
            except ValueError as exc:
                log.append(("thrown", str(exc)))
                yield 3
            yield 4
        finally:
            log.append("finally")

    handler = RaisingHandler("none")
    wrapped, _ = wrappers.wrap(original, handler, ASYNC_GENERATOR)

    async def drive():
        agen = wrapped()
        assert await agen.__anext__() == 1
        assert await agen.asend("hello") == 2
        assert await agen.athrow(ValueError("x")) == 3
        await agen.aclose()

    asyncio.run(drive())
    assert log == [("got", "hello"), ("thrown", "x"), "finally"]
    # An early close ends the measurement as an error (GeneratorExit), once.
    assert handler.seen == ["before", "error"]


def test_async_generator_dropped_unfinished_ends_once_as_closed():
    """A stream its consumer abandons without closing is closed by the event loop's async-generator
    finalizer (here at loop shutdown): the real generator runs its cleanup, the handler sees one
    early end."""
    log, kept = [], []

    async def original():
        try:
            yield 1
            yield 2
        finally:
            log.append("finally")

    handler = RaisingHandler("none")
    wrapped, _ = wrappers.wrap(original, handler, ASYNC_GENERATOR)

    async def take_one():
        agen = wrapped()
        assert await agen.__anext__() == 1
        kept.append(agen)

    asyncio.run(take_one())
    assert log == ["finally"]
    assert handler.seen == ["before", "error"]


def test_async_generator_times_to_exhaustion():
    """The handler's end comes after the last item, not when the generator object is created."""
    events = []

    class Recorder(Handler):
        def before(self, args, kwargs):
            events.append("before")

        def after(self, state, args, kwargs, result):
            events.append("after")

    async def original():
        for i in range(3):
            events.append(f"yield {i}")
            yield i

    wrapped, _ = wrappers.wrap(original, Recorder(), ASYNC_GENERATOR)

    async def consume():
        agen = wrapped()
        events.append("created")
        return [i async for i in agen]

    assert asyncio.run(consume()) == [0, 1, 2]
    assert events == ["before", "created", "yield 0", "yield 1", "yield 2", "after"]


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("outcome", ["value", "future_ok", "future_fail", "raise"])
def test_future_returning(where, outcome):
    t = Target()
    future = concurrent.futures.Future()

    def original(non_block):
        t.calls += 1
        if outcome == "raise":
            raise Boom("sync")
        return future if non_block else 42

    handler = RaisingHandler(where)
    wrapped, _ = wrappers.wrap(original, handler, FUTURE)
    if outcome == "raise":
        with pytest.raises(Boom):
            wrapped(True)
    elif outcome == "value":
        assert wrapped(False) == 42
    else:
        got = wrapped(True)
        assert got is future
        if outcome == "future_ok":
            future.set_result("reply")
            assert got.result() == "reply"
        else:
            future.set_exception(Boom("later"))
            with pytest.raises(Boom):
                got.result()
    assert t.calls == 1
    if outcome.startswith("future") and where not in ("before", "all"):
        assert "future_done" in handler.seen


def test_handler_failure_is_logged_once(caplog):
    t, original = make_sync(False)
    wrapped, _ = wrappers.wrap(original, RaisingHandler("after"), SYNC)
    with caplog.at_level(logging.WARNING, logger="opentelemetry_instrumentation_vllm_ascend.hooks.handler"):
        for _ in range(5):
            assert wrapped(1) == 2
    messages = [r for r in caplog.records if "raising-after" in r.getMessage()]
    assert len(messages) == 1
    assert "vLLM continues unaffected" in messages[0].getMessage()
    assert messages[0].exc_info is not None
    assert t.calls == 5


class Base:
    def step(self, x):
        return ("base", x)


class Rebound(Base):
    """Stands for a vllm-ascend class rebound over the module's name."""


def test_patch_original_class_and_foreign_wrapper_on_top():
    import types

    module = types.ModuleType("fake_vllm_mod")
    Base.__module__ = "fake_vllm_mod"
    module.Base = Rebound  # the module name now points at a subclass
    owner = patches.original_class(module, "Base")
    assert owner is Base

    calls = []

    class Count(Handler):
        def before(self, args, kwargs):
            calls.append(args[1])

    original = Base.__dict__["step"]
    patch = patches.patch_method(owner, "step", Count(), SYNC)
    assert Rebound().step(1) == ("base", 1) and calls == [1]

    # Someone (vllm-ascend) assigns its own wrapper over ours; removing ours must keep theirs.
    ours = Base.step

    def theirs(self, x):
        return ("theirs",) + ours(self, x)

    Base.step = theirs
    patch.remove()
    assert Base.__dict__["step"] is theirs
    assert Rebound().step(2) == ("theirs", "base", 2)
    assert calls == [1]  # ours now only calls through
    Base.step = original


def test_patch_then_remove_restores_exactly():
    class C:
        def m(self):
            return 1

    original = C.__dict__["m"]
    patch = patches.patch_method(C, "m", Handler(), SYNC)
    assert C.__dict__["m"] is not original and C().m() == 1
    patch.remove()
    assert C.__dict__["m"] is original


class RaisingTimer(Handler):
    name = "raising-timer"

    def __init__(self, raise_it):
        self.raise_it = raise_it
        self.durations = []

    def timed(self, seconds, args, kwargs, result):
        self.durations.append((seconds, result))
        if self.raise_it:
            raise RuntimeError("timer bug")


@pytest.mark.parametrize("raise_it", [False, True])
@pytest.mark.parametrize("fail", [False, True])
def test_sync_timer(raise_it, fail):
    t, original = make_sync(fail)
    handler = RaisingTimer(raise_it)
    wrapped, _ = wrappers.wrap(original, handler, wrappers.SYNC_TIMER)
    if fail:
        with pytest.raises(Boom):
            wrapped(3, y=4)
        assert handler.durations == []  # failed calls are not timed
    else:
        assert wrapped(3, y=4) == 7
        ((seconds, result),) = handler.durations
        assert seconds >= 0 and result == 7
    assert t.calls == 1


@pytest.mark.parametrize("raise_it", [False, True])
@pytest.mark.parametrize("fail", [False, True])
def test_coroutine_timer_times_to_completion(raise_it, fail):
    t = Target()

    async def original(x):
        t.calls += 1
        await asyncio.sleep(0.02)
        if fail:
            raise Boom(x)
        return x * 2

    handler = RaisingTimer(raise_it)
    wrapped, _ = wrappers.wrap(original, handler, wrappers.COROUTINE_TIMER)
    if fail:
        with pytest.raises(Boom):
            asyncio.run(wrapped(5))
        assert handler.durations == []
    else:
        assert asyncio.run(wrapped(5)) == 10
        ((seconds, result),) = handler.durations
        assert seconds >= 0.02 and result == 10  # the awaited sleep is inside the measurement
    assert t.calls == 1


@pytest.mark.parametrize("where", ["none", "future_done"])
@pytest.mark.parametrize(
    "outcome, completes_later",
    [
        ("result", False),
        ("exception", False),
        ("done_before_return", False),
        ("result", True),
        ("exception", True),
    ],
)
def test_future_class_delivers_completion_once(where, outcome, completes_later):
    class Fut(concurrent.futures.Future):
        pass

    before = dict(Fut.__dict__)
    installed = patches.hook_future_class(Fut, completes_later=completes_later)
    handler = RaisingHandler(where)
    calls = []

    def original():
        calls.append(1)
        f = Fut()
        if outcome == "done_before_return":
            f.set_result("early")
        return f

    wrapped, _ = wrappers.wrap(original, handler, FUTURE)
    f = wrapped()
    if outcome == "result":
        f.set_result("late")
        assert f.result() == "late"
    elif outcome == "exception":
        f.set_exception(Boom("late"))
        with pytest.raises(Boom):
            f.result()
    else:
        assert f.result() == "early"
    with pytest.raises(concurrent.futures.InvalidStateError):
        f.set_result("again")  # the inherited behaviour is untouched
    assert handler.seen.count("future_done") == 1 and calls == [1]
    assert futures.PENDING not in vars(f)  # taken off the future when delivered
    for p in installed:
        p.remove()
    assert dict(Fut.__dict__) == before
    assert Fut not in STATE.completion_hooked and Fut not in STATE.completes_later


class NoArgs(Handler):
    """A handler that never reads args: eligible for a wrapper with the target's own signature."""

    name = "no-args"
    reads_args = 0

    def __init__(self, raise_it=False):
        self.raise_it = raise_it
        self.seen = []

    def after(self, state, args, kwargs, result):
        self.seen.append(("after", args, kwargs, result))
        if self.raise_it:
            raise RuntimeError("after bug")

    def error(self, state, args, kwargs, exc):
        self.seen.append(("error", type(exc).__name__))
        if self.raise_it:
            raise RuntimeError("error bug")

    def timed(self, seconds, args, kwargs, result):
        self.seen.append(("timed", result))
        if self.raise_it:
            raise RuntimeError("timed bug")


SENTINEL = object()


def target(self, a, b=SENTINEL, /, c=[1], *, d, e=None):  # noqa: B006 - the default's identity matters
    if a == "boom":
        raise Boom(a)
    return (a, b, c, d, e)


@pytest.mark.parametrize("kind", [SYNC, wrappers.SYNC_TIMER])
@pytest.mark.parametrize("raise_it", [False, True])
def test_signature_preserving_wrapper(kind, raise_it):
    handler = NoArgs(raise_it)
    wrapped, _ = wrappers.wrap(target, handler, kind)
    assert wrapped.__code__.co_varnames[:6] == ("self", "a", "b", "c", "d", "e")  # the target's own signature
    assert wrapped.__defaults__[0] is SENTINEL and wrapped.__defaults__[1] is target.__defaults__[1]
    got = wrapped(None, "x", d=4)
    assert got == ("x", SENTINEL, [1], 4, None) and got[2] is target.__defaults__[1]
    assert wrapped(None, "x", 2, c=3, d=4, e=5) == ("x", 2, 3, 4, 5)
    with pytest.raises(TypeError):
        wrapped(None, "x", b=2, d=4)  # b is positional-only, as in the target
    with pytest.raises(TypeError):
        wrapped(None, "x")  # d is required, as in the target
    with pytest.raises(Boom):
        wrapped(None, "boom", d=1)
    if kind == SYNC:
        assert handler.seen[0] == ("after", (), None, ("x", SENTINEL, [1], 4, None))
        assert ("error", "Boom") in handler.seen
    else:
        assert [s[0] for s in handler.seen] == ["timed", "timed"]  # the failed call is not timed


def test_after_only_on_none_and_varargs_fallback():
    class OnNone(NoArgs):
        after_only_on_none = True

    h = OnNone()

    def alloc(self, n, lookahead=0):
        return None if n > 10 else n

    wrapped, _ = wrappers.wrap(alloc, h, SYNC)
    assert wrapped(None, 1, lookahead=2) == 1
    assert wrapped(None, 11) is None
    assert h.seen == [("after", (), None, None)]

    def varargs(*args, **kwargs):
        return args, kwargs

    generic, _ = wrappers.wrap(varargs, NoArgs(), SYNC)
    assert generic(1, x=2) == ((1,), {"x": 2})


def test_after_if_spares_the_after_call_unless_true_or_failing():
    class Guarded(Handler):
        reads_args = 2  # self, n
        after_if = "n.bit_length() == 2 and _otel_result > 0"

        def __init__(self):
            self.seen = []

        def after(self, state, args, kwargs, result):
            self.seen.append(args[1])

    h = Guarded()

    def target(self, n, extra=0):
        return n

    wrapped, _ = wrappers.wrap(target, h, SYNC)
    assert [wrapped(None, n) for n in (1, 2, 3, 4)] == [1, 2, 3, 4]
    assert wrapped(None, "x") == "x"  # the guard raises (no bit_length): after decides, the call is unaffected
    assert h.seen == [2, 3, "x"]

    class Unguarded(Guarded):
        reads_args = None  # generic wrapper: no parameter names, so no guard: after sees every call

    u = Unguarded()
    generic, _ = wrappers.wrap(target, u, SYNC)
    assert [generic(None, n) for n in (1, 2)] == [1, 2]
    assert u.seen == [1, 2]


def test_signature_preserving_coroutine_timer():
    handler = NoArgs()

    async def original(self, x, *, scale=2):
        await asyncio.sleep(0)
        return x * scale

    wrapped, _ = wrappers.wrap(original, handler, wrappers.COROUTINE_TIMER)
    assert wrapped.__code__.co_varnames[:3] == ("self", "x", "scale")
    assert asyncio.run(wrapped(None, 3)) == 6 and asyncio.run(wrapped(None, 3, scale=3)) == 9
    assert handler.seen == [("timed", 6), ("timed", 9)]


def test_signature_wrapper_errors_name_the_target():
    def allocate_slots(self, request, n):
        return n

    wrapped, _ = wrappers.wrap(allocate_slots, NoArgs(), SYNC)
    with pytest.raises(TypeError, match="allocate_slots"):
        wrapped(None, 1)


class Head(Handler):
    """Reads the first two arguments only: gets exactly those, however the caller passed them."""

    name = "head"
    reads_args = 2

    def __init__(self, where="none"):
        self.where = where
        self.seen = []

    def before(self, args, kwargs):
        self.seen.append(("before", args, kwargs))
        if self.where == "before":
            raise RuntimeError("bug")
        return args[1]

    def after(self, state, args, kwargs, result):
        self.seen.append(("after", state, result))
        if self.where == "after":
            raise RuntimeError("bug")

    def error(self, state, args, kwargs, exc):
        self.seen.append(("error", state, type(exc).__name__))
        if self.where == "error":
            raise RuntimeError("bug")


@pytest.mark.parametrize("where", ["none", "before", "after", "error"])
def test_leading_arguments_wrapper(where):
    calls = []

    def collective_rpc(self, method, timeout=None, args=(), non_block=False):
        calls.append(method)
        if method == "boom":
            raise Boom(method)
        return (method, timeout, args, non_block)

    h = Head(where)
    wrapped, _ = wrappers.wrap(collective_rpc, h, SYNC)
    assert wrapped.__code__.co_varnames[:5] == ("self", "method", "timeout", "args", "non_block")
    assert wrapped("ex", method="execute_model", non_block=True) == ("execute_model", None, (), True)
    with pytest.raises(Boom):
        wrapped("ex", "boom")
    assert calls == ["execute_model", "boom"]
    assert h.seen[0] == ("before", ("ex", "execute_model"), None)
    if where != "before":
        assert ("after", "execute_model", ("execute_model", None, (), True)) in h.seen
        assert ("error", "boom", "Boom") in h.seen


def test_a_traceback_through_a_generated_wrapper_shows_its_source_lines():
    """Generated wrappers have no file: their source is registered in linecache, so a traceback through
    one shows the line that called the original (here: the line of the signature-preserving template)."""
    import traceback

    def target(self, n):
        raise ValueError(n)

    class Reads(Handler):
        reads_args = 1

    wrapped, _ = wrappers.wrap(target, Reads(), SYNC)
    with pytest.raises(ValueError) as info:
        wrapped(None, 3)
    frames = traceback.extract_tb(info.tb)
    ours = [f for f in frames if f.filename.startswith("<otel-vllm-ascend wrapper of")]
    assert len(ours) == 1
    assert ours[0].line == "_otel_result = _otel_original(self, n)"
    assert "_otel_original(self, n)" in "".join(traceback.format_tb(info.tb))


def test_an_uninstalled_wrapper_s_source_leaves_linecache_and_one_wrapped_over_keeps_it():
    """Removing a patch drops its wrapper's lines from linecache (nothing runs them any more); a wrapper
    another library wrapped over stays as a call-through and keeps them. A hooked future class's
    completion functions (real source files) are never dropped."""
    import linecache

    class Engine:
        def step(self, n):
            return n

    class Other:
        def step(self, n):
            return n

    restored = patches.patch_method(Engine, "step", Handler(), SYNC)
    kept = patches.patch_method(Other, "step", Handler(), SYNC)
    names = [p.wrapper.__code__.co_filename for p in (restored, kept)]
    assert all(name.startswith(codegen.FILENAME_PREFIX) and name in linecache.cache for name in names)
    wrapped_over = kept.wrapper
    Other.step = lambda self, n, _ours=wrapped_over: _ours(self, n) + 1  # someone else's wrapper on top
    restored.remove()
    kept.remove()
    assert Engine().step(2) == 2 and Other().step(2) == 3
    assert names[0] not in linecache.cache and linecache.getlines(names[0]) == []
    assert "def _otel_vllm_ascend_wrapper(" in "".join(linecache.getlines(names[1]))  # tracebacks show it

    class Fut(concurrent.futures.Future):
        pass

    completions = patches.hook_future_class(Fut)
    source = completions[0].wrapper.__code__.co_filename
    assert source == patches.__file__
    linecache.getlines(source)  # loaded, as a traceback through it would
    for patch in completions:
        patch.remove()
    assert source in linecache.cache


class BeforeOnly(Handler):
    """A boundary mark (the stage budget's, the deferred records' trigger): only ``before``."""

    name = "before-only"
    reads_args = 1

    def __init__(self, fail):
        self.fail = fail
        self.seen = []

    def before(self, args, kwargs):
        self.seen.append(args)
        if self.fail:
            raise RuntimeError("handler bug in before")
        return "state nobody reads"


@pytest.mark.parametrize("fail_handler", [False, True])
@pytest.mark.parametrize("fail", [False, True])
def test_a_before_only_handler_gets_a_wrapper_that_calls_nothing_after(fail_handler, fail, caplog):
    """Its wrapper calls ``before`` with the leading arguments, then the original once, and returns or raises
    what the original did; ``after`` and ``error`` (the base class's no-ops) are not called; a failing
    ``before`` is logged once. A coroutine gets the same shape."""
    t, original = make_sync(fail)
    handler = BeforeOnly(fail_handler)
    wrapped, hook = wrappers.wrap(original, handler, SYNC)
    assert "_otel_handler.after" not in "".join(__import__("linecache").getlines(wrapped.__code__.co_filename))
    with caplog.at_level(logging.WARNING, logger="opentelemetry_instrumentation_vllm_ascend.hooks.handler"):
        for _ in range(2):
            if fail:
                with pytest.raises(Boom):
                    wrapped(3, y=4)
            else:
                assert wrapped(3, y=4) == 7
    assert t.calls == 2 and handler.seen == [(3,), (3,)]
    assert len([r for r in caplog.records if "before-only" in r.getMessage()]) == (1 if fail_handler else 0)
    hook.handler = None  # removed under a foreign wrapper: calls straight through
    if not fail:
        assert wrapped(3, y=4) == 7 and handler.seen == [(3,), (3,)]

    async def coroutine(x):
        await asyncio.sleep(0)
        return x * 2

    wrapped_coroutine, _ = wrappers.wrap(coroutine, BeforeOnly(fail_handler), COROUTINE)
    assert asyncio.run(wrapped_coroutine(5)) == 10
