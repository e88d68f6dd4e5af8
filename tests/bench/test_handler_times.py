"""Section G3 of ``tox -e bench-e2e`` (benchmarks/real_scheduler.py): handler methods timed from inside the steps by
shims that time each call and leave the original's behaviour and the class as they were."""

import pytest

from benchmarks import real_scheduler


class Handler:
    def before(self, args, kwargs):
        return args[0] * 2

    def after(self, state, args, kwargs, result):
        raise ValueError(state)


def test_shims_time_every_call_keep_results_and_exceptions_and_restore_the_class():
    originals = dict(Handler.__dict__)
    times, restore = real_scheduler.timing_shims([(Handler, "before"), (Handler, "after")])
    handler = Handler()
    assert [handler.before((i,), {}) for i in range(3)] == [0, 2, 4]
    with pytest.raises(ValueError, match="7"):
        handler.after(7, (), {}, None)
    assert [len(times["Handler.before"]), len(times["Handler.after"])] == [3, 1]
    assert all(0 <= t < 1 for ts in times.values() for t in ts)
    restore()
    assert Handler.__dict__["before"] is originals["before"] and Handler.__dict__["after"] is originals["after"]


def test_g3_times_the_handlers_the_scheduler_hook_has():
    """The methods G3 names exist on the handler classes (a renamed one would fail the bench, not the tests)."""
    from opentelemetry_instrumentation_vllm_ascend.handlers import scheduler

    for module, cls, name in real_scheduler.CRITICAL_HANDLERS + (real_scheduler.FLUSH_HANDLER,):
        assert module == "scheduler" and name in vars(getattr(scheduler, cls))
