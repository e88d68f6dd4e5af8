"""What the scheduler hook relies on, in the source of every supported version (``supported.VLLM``): the
queues vLLM counts as waiting and the limit it admits waiting requests against
(``handlers.scheduler._queue_state``), where a resumed request is sent to the workers
(``handlers.steps.classify_step``), and where a scheduler that preempts without ``_preempt_request`` puts
the request (``handlers.scheduler._count_preemptions``)."""

import ast

import pytest

from tests.contract.test_overrides import ASCEND_NAMES, TREES, tree_of
from tests.support.contract import SourceTree, calls_base

SCHED = "vllm.v1.core.sched.scheduler"
VLLM = [n for n in TREES if n not in ASCEND_NAMES]


def method(tree: SourceTree, module: str, cls: str, name: str):
    found = tree.find_class(module, cls)
    assert found is not None, f"{module}:{cls}"
    return next(n for n in found[1].body if isinstance(n, ast.FunctionDef) and n.name == name)


def self_attributes_in_len_calls(node) -> set[str]:
    return {
        call.args[0].attr
        for call in ast.walk(node)
        if isinstance(call, ast.Call)
        and getattr(call.func, "id", None) == "len"
        and call.args
        and isinstance(call.args[0], ast.Attribute)
        and getattr(call.args[0].value, "id", None) == "self"
    }


@pytest.mark.parametrize("name", VLLM)
def test_waiting_is_what_get_request_counts_counts(name):
    tree = tree_of(name)
    counts = method(tree, SCHED, "Scheduler", "get_request_counts")
    returned = next(n.value for n in ast.walk(counts) if isinstance(n, ast.Return))
    assert isinstance(returned, ast.Tuple) and len(returned.elts) == 2
    members = tree.members(SCHED, "Scheduler")
    # _queue_state counts waiting plus kv_holding_waiting where the scheduler has it, else skipped_waiting,
    # plus async_kv_waiting where it has it (0.34+).
    held = "kv_holding_waiting" if "kv_holding_waiting" in members else "skipped_waiting"
    assert held in members
    queues = {"waiting", held} | ({"async_kv_waiting"} & set(members))
    assert self_attributes_in_len_calls(returned.elts[1]) == queues, name
    assert self_attributes_in_len_calls(returned.elts[0]) == {"running"}, name


@pytest.mark.parametrize("name", VLLM)
def test_waiting_requests_are_admitted_against_the_limit_the_hook_uses(name):
    tree = tree_of(name)
    source = ast.unparse(method(tree, SCHED, "Scheduler", "schedule"))
    members = tree.members(SCHED, "Scheduler")
    if "async_kv_waiting" in members:  # 0.34+: a full batch (or budget) still starts async KV loads
        assert "num_running = len(self.running) + self.num_waiting_for_streaming_input" in source, name
        assert "loads_only = num_running >= self.max_num_active_reqs or token_budget <= 0" in source, name
        assert "request_queue = self.async_kv_waiting" in source, name  # … taken from async_kv_waiting only
        # … while vLLM's own in-flight limit admits them: what _queue_state asks when the batch is full.
        assert "if load_kv_async and (not self._admits_inflight_kv_load()) or" in source, name
        admits = method(tree, SCHED, "Scheduler", "_admits_inflight_kv_load")
        assert [a.arg for a in admits.args.args] == ["self"], name
    elif "max_num_active_reqs" in members:  # 0.32, 0.33
        assert "num_running = len(self.running) + self.num_waiting_for_streaming_input" in source, name
        assert "if num_running >= self.max_num_active_reqs:" in source, name
    elif "num_running = len(self.running) + self.num_waiting_for_streaming_input" in source:  # 0.30
        # Paused streaming sessions hold a slot against max_num_running_reqs: the hook subtracts them there
        # (handlers.scheduler.STREAMING_HOLDS_A_SLOT, set from targets.STREAMING_HOLDS_A_SLOT).
        assert "if num_running >= self.max_num_running_reqs:" in source, name
    else:  # 0.23
        assert "if len(self.running) == self.max_num_running_reqs:" in source, name


@pytest.mark.parametrize("name", VLLM)
def test_resumed_requests_are_listed_or_sent_as_new(name):
    """classify_step counts a resumed request's tokens as prefill: up to 0.33 it is a cached request named
    in ``CachedRequestData.resumed_req_ids``; where that field is gone (0.34+) schedule() sends it in
    ``scheduled_new_reqs`` like a new request (a preempted request is admitted from the waiting queues)."""
    tree = tree_of(name)
    fields = tree.members("vllm.v1.core.sched.output", "CachedRequestData")
    assert {"req_ids", "num_computed_tokens", "num_output_tokens"} <= set(fields), name
    if "resumed_req_ids" in fields:
        return
    source = ast.unparse(method(tree, SCHED, "Scheduler", "schedule"))
    assert "if request.status not in (RequestStatus.WAITING, RequestStatus.PREEMPTED):" in source, name
    assert "scheduled_new_reqs.append(request)" in source, name


@pytest.mark.parametrize("name", TREES)
def test_schedulers_that_preempt_without_preempt_request_put_the_request_at_the_head_of_waiting(name):
    """Every scheduler whose schedule() marks a request PREEMPTED itself, instead of calling
    _preempt_request, prepends it to ``self.waiting`` (where _count_preemptions looks); vLLM's FCFS
    queue prepends at its head."""
    tree = tree_of(name)
    inline = []
    for module, node in tree.subclasses(SCHED, "Scheduler"):
        schedule = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "schedule"), None)
        if schedule is None:
            continue
        source = ast.unparse(schedule)
        if ".status = RequestStatus.PREEMPTED" in source and "_preempt_request(" not in source:
            inline.append(f"{module}:{node.name}")
            assert "self.waiting.prepend_request(" in source, (name, node.name)
    if name in ASCEND_NAMES and tree.module("vllm_ascend.core.scheduler_dynamic_batch") is None:
        assert inline == [], name  # vllm-ascend 0.30 removed SchedulerDynamicBatch, the one that did
    elif name in ASCEND_NAMES:
        assert inline == ["vllm_ascend.core.scheduler_dynamic_batch:SchedulerDynamicBatch"]
        # … and its output does not report them (preempted_req_ids is not passed).
        source = ast.unparse(
            method(tree, "vllm_ascend.core.scheduler_dynamic_batch", "SchedulerDynamicBatch", "schedule")
        )
        assert "SchedulerOutput(" in source and "preempted_req_ids" not in source
    queue = method(tree, "vllm.v1.core.sched.request_queue", "FCFSRequestQueue", "prepend_request")
    assert "self.appendleft(request)" in ast.unparse(queue)


def _functions(node: ast.ClassDef) -> dict:
    return {n.name: n for n in node.body if isinstance(n, ast.FunctionDef)}


def _guarded_records(function, kind: str) -> list[str]:
    """The ``record_event(EngineCoreEventType.<kind>, …)`` calls of ``function`` that run under ``if
    self.log_stats`` (vLLM's switch of engine events), unparsed."""
    found = []
    for node in ast.walk(function):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("self.log_stats", "self.kv_cache_manager.log_stats"):
            for call in ast.walk(node):
                if (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "record_event"
                    and call.args
                    and ast.unparse(call.args[0]) == f"EngineCoreEventType.{kind}"
                ):
                    found.append(ast.unparse(call))
    return found


#: vllm-ascend 0.30's schedulers with a schedule() of their own: (inline preemptions, _preempt_request calls).
_ASCEND_030_SCHEDULES = {
    "vllm_ascend.core.dyntra_lb_scheduler:DyntraLBScheduler": (0, 1),
    "vllm_ascend.core.recompute_scheduler:RecomputeScheduler": (0, 0),
    "vllm_ascend.core.scheduler_profiling_chunk:ProfilingChunkScheduler": (0, 1),
    "vllm_ascend.patch.platform.patch_balance_schedule:BalanceScheduler": (0, 1),
}


@pytest.mark.parametrize("name", TREES)
def test_every_scheduler_records_the_engine_events_request_traces_are_built_from(name):
    """Request traces (handlers/traces.py, docs/traces.md) count a request's preemptions and place its queued /
    scheduled / preempted spans from the EngineCore's QUEUED / SCHEDULED / PREEMPTED events. Every Scheduler
    subclass of the tree (vllm-ascend's SchedulerDynamicBatch, RecomputeScheduler, ProfilingChunkScheduler and
    the BalanceScheduler patch included) records them where it preempts, schedules and queues: a schedule() of
    its own records SCHEDULED for each request it takes in from waiting, and PREEMPTED for each request it
    preempts, inline (SchedulerDynamicBatch) or through the base ``_preempt_request``, which records it; an
    add_request of its own records QUEUED; an update_from_output of its own sends each request's events."""
    tree = tree_of(name)
    _, base = tree.find_class(SCHED, "Scheduler")
    base_methods = _functions(base)
    assert _guarded_records(base_methods["_preempt_request"], "PREEMPTED"), name
    assert _guarded_records(base_methods["schedule"], "SCHEDULED"), name
    assert _guarded_records(base_methods["add_request"], "QUEUED"), name
    seen = {}
    for module, node in tree.subclasses(SCHED, "Scheduler"):
        methods = _functions(node)
        # the base's, which records PREEMPTED (or an override that calls it: 0.30's DyntraLBPolicyMixin)
        assert "_preempt_request" not in methods or calls_base(methods["_preempt_request"], "_preempt_request"), (
            name,
            node.name,
        )
        schedule = methods.get("schedule")
        delegates = schedule is not None and "scheduled_timestamp" not in ast.unparse(schedule)
        if delegates:  # it only wraps the base's (vLLM's DiffusionAsyncScheduler)
            assert "super().schedule(" in ast.unparse(schedule), (name, node.name)
        elif schedule is not None:
            source = ast.unparse(schedule)
            inline = source.count(".status = RequestStatus.PREEMPTED")
            through_base = source.count("self._preempt_request(")
            seen[f"{module}:{node.name}"] = (inline, through_base)
            assert len(_guarded_records(schedule, "PREEMPTED")) == inline, (name, node.name)
            assert _guarded_records(schedule, "SCHEDULED") == [
                "request.record_event(EngineCoreEventType.SCHEDULED, scheduled_timestamp)"
            ], (name, node.name)
        add = methods.get("add_request")
        if add is not None:
            assert _guarded_records(add, "QUEUED") or "super().add_request(" in ast.unparse(add), (name, node.name)
        update = methods.get("update_from_output")
        if update is not None and not calls_base(update, "update_from_output"):  # (0.30's recompute calls it)
            outputs = [
                call
                for call in ast.walk(update)
                if isinstance(call, ast.Call) and ast.unparse(call.func) == "EngineCoreOutput"
            ]
            with_request = [c for c in outputs if "request." in ast.unparse(c)]
            assert with_request, (name, node.name)
            assert all(
                any(k.arg == "events" and ast.unparse(k.value) == "request.take_events()" for k in c.keywords)
                for c in with_request
            ), (name, node.name)
    if name in ASCEND_NAMES and name != ASCEND_NAMES[0]:
        assert seen == _ASCEND_030_SCHEDULES, name
        # RecomputeScheduler preempts through its _preempt_or_recompute, which calls the base _preempt_request
        # when it preempts (and records no PREEMPTED when it hands the request back to the prefill node).
        recompute = ast.unparse(method(tree, "vllm_ascend.core.recompute_scheduler", "RecomputeScheduler", "schedule"))
        assert "self._preempt_or_recompute(" in recompute, name
        helper = method(tree, "vllm_ascend.core.recompute_scheduler", "RecomputeScheduler", "_preempt_or_recompute")
        assert calls_base(helper, "_preempt_request"), name
    elif name in ASCEND_NAMES:
        # (inline preemptions, _preempt_request calls) of each scheduler with a schedule() of its own
        assert seen == {
            "vllm_ascend.core.scheduler_dynamic_batch:SchedulerDynamicBatch": (1, 0),
            "vllm_ascend.core.recompute_scheduler:RecomputeScheduler": (0, 2),
            "vllm_ascend.core.scheduler_profiling_chunk:ProfilingChunkScheduler": (0, 1),
            "vllm_ascend.patch.platform.patch_balance_schedule:BalanceScheduler": (0, 1),
        }, name


def test_the_recompute_scheduler_hands_requests_back_as_a_stop_not_a_preemption():
    """vllm-ascend's RecomputeScheduler, on a KV consumer (P/D decode instance) whose connector does not offload
    the victim's KV, does not preempt it: it frees it and hands it back to the P/D proxy as a finished output
    (``FinishReason.STOP``, ``stop_reason="recomputed"``, no PREEMPTED event; the proxy resubmits it as a new
    request). Request traces mark that end (``vllm.request.recomputed``, handlers/traces.py) by its stop
    reason."""
    from opentelemetry_instrumentation_vllm_ascend.handlers import traces

    tree = tree_of(ASCEND_NAMES[0])
    module = "vllm_ascend.core.recompute_scheduler"
    update = ast.unparse(method(tree, module, "RecomputeScheduler", "update_from_output"))
    expected = f"stop_reason={traces.RECOMPUTED!r}"
    assert "finish_reason=FinishReason.STOP" in update and expected in update
    schedule = ast.unparse(method(tree, module, "RecomputeScheduler", "schedule"))
    offload = "self._preempt_request(recomputed_req, scheduled_timestamp)"  # the connector offloaded its KV
    fallback = schedule[schedule.index(offload) + len(offload) : schedule.index("recomputed_reqs.append(")]
    assert "self.kv_cache_manager.free(recomputed_req)" in fallback
    assert "record_event" not in fallback and "_preempt_request" not in fallback
