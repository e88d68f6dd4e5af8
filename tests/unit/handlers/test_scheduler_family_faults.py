"""Narrow degradation of the scheduler hook family: each independent read of ``Schedule`` (after
``schedule()`` returns) and of ``PreemptRequest`` is broken in turn — a scheduler or SchedulerOutput
missing what that read needs — and the step then records exactly the metrics that do not depend on that
read, with the values the intact step records (the oracle: the same step with nothing broken), while the
failing read is reported once under its own name. The step's phase is set whatever fails after the
classification."""

from types import SimpleNamespace as NS

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from opentelemetry_instrumentation_vllm_ascend import catalogue, state
from opentelemetry_instrumentation_vllm_ascend.handlers import scheduler as scheduler_handlers
from opentelemetry_instrumentation_vllm_ascend.handlers.scheduler import PreemptRequest, Schedule
from opentelemetry_instrumentation_vllm_ascend.handlers.steps import PHASE_ATTRIBUTE
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import SYNC, wrap
from opentelemetry_instrumentation_vllm_ascend.recording import pipeline
from opentelemetry_instrumentation_vllm_ascend.state import STATE
from tests.conftest import Metrics
from tests.support.fakes import PlannedScheduler, instrumented, output, req

P = catalogue.PREFIX
RUNNING = {P + "scheduler:running_queue_size", P + "running_phase_batch_size"}
WAITING = {P + "waiting_phase_batch_size"}
PENDING = {P + "request_prefill_pending_nums"}
BLOCKS = {P + "total_kvcache_blocks", P + "free_kvcache_blocks", P + "allocated_kvcache_blocks"}
SEQLEN = {P + "scheduler:seqlen:sum", P + "scheduler:seqlen:avg"}
PHASE_SPLIT = {
    P + "scheduler:phase_batch_size",
    P + "scheduler:phase_scheduled_tokens",
    P + "scheduler:phase_scheduled_token_counter",
}
EVENTS = {P + "running_to_waiting_count", P + "scheduler:recompute_events"}
RECOMPUTED = {P + "scheduler:recomputed_tokens"}


class Raising:
    """Any use of it (truth, length, iteration) raises, as a read of a field of another shape would."""

    def __bool__(self):
        raise AttributeError("changed")

    __len__ = __iter__ = __bool__


def _baseline():
    """A mixed step (a new request, a chunk, a decode) of a scheduler with every queue, the KV blocks, and
    one request its output reports preempted (counted by _count_preemptions)."""
    requests = {
        "chunk": req(4, 10),
        "decode": req(12, 13, prompt=10),
        "victim": req(0, 21, prompt=10),  # preempted in this step: it had computed 20
    }
    requests["victim"].request_id = "victim"
    # Preempted in an earlier step with 20 tokens computed, resumed now (as vLLM 0.34 sends it: a new
    # request) with no prefix hit: 20 computed again. (Its state after schedule(): 20 computed.)
    requests["back"] = req(20, 21, prompt=10)
    out = output(requests, new=[("new", 6, 2), ("back", 20, 0)], cached=[("chunk", 4), ("decode", 1)])
    out.preempted_req_ids = {"victim"}
    out.recomputed_reqs = []
    running = [req(8, 8), req(8, 10), req(13, 14, prompt=10)]
    return requests, out, dict(running=running, waiting=[req(0, 3), req(0, 21)], max_num_running_reqs=3)


def _break_recomputed(s, out):
    out.recomputed_reqs = Raising()


def _break_preemptions(s, out):
    out.preempted_req_ids = Raising()


def _break_paused(s, out):
    s._lb_paused_req_ids = Raising()  # vllm-ascend DyntraLB's paused requests, of another shape


def _break_resumes(s, out):
    del s.requests["back"].num_computed_tokens


def _break_classification(s, out):
    del out.scheduled_cached_reqs.num_output_tokens


def _break_running(s, out):
    del s.running


def _break_waiting(s, out):
    s.waiting = Raising()


def _break_limit(s, out):
    del s.max_num_running_reqs


def _break_blocks(s, out):
    del s.kv_cache_manager.block_pool


def _break_seqlen(s, out):
    del out.scheduled_new_reqs[0].num_computed_tokens


FAULTS = {
    # fault: (read reported, metrics lost, phase of what stays)
    "recomputed_reqs": (_break_recomputed, set(), "mixed"),
    "preempted_req_ids": (_break_preemptions, EVENTS, "mixed"),
    "resumes": (_break_resumes, RECOMPUTED, "mixed"),
    "paused requests": (_break_paused, set(), "mixed"),
    "classify_step": (_break_classification, PHASE_SPLIT, "unknown"),
    "running queue": (_break_running, RUNNING | PENDING, "mixed"),
    "waiting queues": (_break_waiting, WAITING | PENDING, "mixed"),
    "admission limit": (_break_limit, PENDING, "mixed"),
    "_block_state": (_break_blocks, BLOCKS, "mixed"),
    "context length": (_break_seqlen, SEQLEN, "mixed"),
}


@pytest.fixture
def reports(monkeypatch):
    seen = []
    original = scheduler_handlers.report

    def recording(handler, where):
        seen.append((handler.name, where))
        original(handler, where)

    monkeypatch.setattr(scheduler_handlers, "report", recording)
    return seen


def _run(metrics, clock, utils, fault=None):
    """One step of the baseline scheduler (``fault`` applied) in a fresh process state and pipeline:
    (its SchedulerOutput, its points)."""
    state.reset()
    reader = InMemoryMetricReader()
    pipeline.reset(extra_readers=[reader])
    requests, out, kwargs = _baseline()
    s = instrumented()(clock, utils, requests, blocks=(100, 37), **kwargs)
    scheduler_handlers._preempted_of(s)["back"] = 20  # as PreemptRequest noted it
    if fault is not None:
        fault(s, out)
    s.plan = [(out, 0.0625, [("schedule: allocate_slots", 0.0625)])]
    assert s.schedule() is out
    return out, Metrics(reader).points()


def _relabel(points, phase):
    """The points with the step phase each series carries replaced by ``phase`` ("all" stays)."""
    return {
        metric: {
            tuple((k, phase if k == "phase" and v != "all" else v) for k, v in key): value
            for key, value in series.items()
        }
        for metric, series in points.items()
    }


def test_the_baseline_step_records_every_metric_the_faults_take_away(metrics, clock, utils, reports):
    _, points = _run(metrics, clock, utils)
    lost = set().union(*(f[1] for f in FAULTS.values()))
    assert lost <= set(points)
    mixed = (("dp", "0"), ("phase", "mixed"), ("role", "mixed"))
    assert points[P + "running_to_waiting_count"] == {mixed: 1}
    assert points[P + "scheduler:recomputed_tokens"] == {mixed: 20}
    assert points[P + "request_prefill_pending_nums"]  # blocked: 3 running of 3, 2 waiting
    assert reports == []


@pytest.mark.parametrize("where", list(FAULTS))
def test_one_failing_read_loses_only_its_metrics(metrics, clock, utils, reports, where):
    fault, lost, phase = FAULTS[where]
    _, baseline = _run(metrics, clock, utils)
    _, faulty = _run(metrics, clock, utils, fault)
    expected = _relabel({m: v for m, v in baseline.items() if m not in lost}, phase)
    # the failure itself is counted, once, under the read that failed
    errors = {(("dp", "0"), ("hook", "Schedule"), ("process", "engine_core"), ("role", "mixed"), ("where", where)): 1}
    expected[P + "hook_errors"] = errors
    assert faulty == expected
    assert reports == [("Schedule", where)]
    assert STATE.last_step_phase == phase


def test_a_failing_classification_still_sets_the_phase_the_workers_read(metrics, clock, utils, reports):
    out, _ = _run(metrics, clock, utils, _break_classification)
    assert getattr(out, PHASE_ATTRIBUTE) == "unknown"  # the workers do not classify it again (and fail)
    assert STATE.last_step_phase == "unknown"


def test_a_preempted_request_without_computed_tokens_still_counts_its_preemption(metrics, reports):
    class Odd(PlannedScheduler):
        pass

    Odd._preempt_request = wrap(PlannedScheduler._preempt_request, PreemptRequest(), SYNC)[0]
    Odd.schedule = wrap(PlannedScheduler.schedule, Schedule(), SYNC)[0]
    victim = NS(request_id="v")  # no num_computed_tokens
    s = Odd([([("preempt", victim)], lambda requests: output(requests, cached=[("d", 1)]))])
    s.requests["d"] = req(41, 42, prompt=10)  # a decode
    with pytest.raises(AttributeError):  # (the fake's own _preempt_request sets it: vLLM's would too)
        victim.num_computed_tokens  # noqa: B018
    s.schedule()
    attrs = (("dp", "0"), ("phase", "decode"), ("role", "mixed"))
    points = metrics.points()
    assert points[P + "running_to_waiting_count"] == {attrs: 1}
    assert P + "scheduler:recompute_events" not in points
    # (PlannedScheduler has no queues: Schedule's reads of them report too)
    assert [r for r in reports if r[0] == "PreemptRequest"] == [("PreemptRequest", "num_computed_tokens")]
