"""The scheduler hooks on a real vLLM Scheduler (the installed vLLM, in process, instrumented with
``instrument()``), checked against vLLM's own accounting: its waiting count
(``get_request_counts()``), its admission rule, its per-request preemption count, its prefix-cache
statistics of resumed requests, and its profiling scopes."""

import pytest

pytest.importorskip("vllm")

from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402

from opentelemetry_instrumentation_vllm_ascend import catalogue, context, environment  # noqa: E402
from opentelemetry_instrumentation_vllm_ascend.cli.demo import tiny_model  # noqa: E402
from opentelemetry_instrumentation_vllm_ascend.handlers import scheduler as scheduler_handlers  # noqa: E402
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import SYNC, wrap  # noqa: E402
from tests.conftest import Metrics, instrumented  # noqa: E402
from tests.support.process import set_process

P = catalogue.PREFIX


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model.build(str(tmp_path_factory.mktemp("tiny-llama")))


@pytest.fixture
def metrics(monkeypatch):
    for name in (
        environment.ENABLED,
        environment.PROMETHEUS_MULTIPROC_DIR,
        environment.FILES_DIR,
        environment.METRICS_EXPORTER,
    ):
        monkeypatch.delenv(name, raising=False)
    reader = InMemoryMetricReader()
    saved = (context.PROCESS.process, context.PROCESS.dp, context.PROCESS.role)
    try:
        with instrumented(monkeypatch, metric_readers=[reader]):
            set_process("engine_core", "0", "mixed")
            yield Metrics(reader)
    finally:
        set_process(*saved)


def build(
    model_path, *, blocks=64, max_num_seqs=4, max_num_active_seqs=None, prefix_caching=False, budget=64, cls=None
):
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    model_config = ModelConfig(model=model_path, dtype="float32", max_model_len=256, skip_tokenizer_init=True)
    extra = {} if max_num_active_seqs is None else {"max_num_active_seqs": max_num_active_seqs}
    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=256,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
        **extra,
    )
    cache_config = CacheConfig(block_size=16, cache_dtype="auto", enable_prefix_caching=prefix_caching)
    cache_config.num_gpu_blocks = blocks
    config = VllmConfig(model_config=model_config, scheduler_config=scheduler_config, cache_config=cache_config)
    spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    return (cls or Scheduler)(
        vllm_config=config,
        kv_cache_config=kv,
        log_stats=True,
        structured_output_manager=StructuredOutputManager(config),
        block_size=16,
    )


def request(req_id, prompt_len, max_tokens, seed=0, hashed=False):
    """A request with a distinct prompt (``hashed``: with the block hasher prefix caching needs, as
    the EngineCore builds it)."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    hasher = None
    if hashed:
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        init_none_hash(sha256)
        hasher = get_request_block_hasher(16, sha256)
    return Request(
        request_id=req_id,
        prompt_token_ids=[(seed * 31 + k * 7) % 400 + 4 for k in range(prompt_len)],
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        pooling_params=None,
        block_hasher=hasher,
    )


def finish_step(scheduler, output):
    """The model's output for a step: one sampled token per request that finished its prompt."""
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(output.num_scheduled_tokens)
    sampled = []
    for req_id in ids:
        req = scheduler.requests[req_id]
        sampled.append([7] if req.num_computed_tokens >= req.num_tokens else [])
    scheduler.update_from_output(
        output,
        ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled),
    )


def total(points, seed, index=None):
    """Sum over a metric's series: a counter's value, or a histogram's (count, sum)[index]."""
    series = points.get(P + seed, {})
    return sum(v if index is None else v[index] for v in series.values())


def test_waiting_counts_the_queues_vllm_counts(model, metrics):
    """A P/D decode request waiting for its remote KV sits in kv_holding_waiting (vLLM 0.32+), which
    vLLM counts as waiting: so does waiting_phase_batch_size, step by step."""
    from vllm.v1.request import RequestStatus

    scheduler = build(model)
    scheduler.add_request(request("r0", 20, 5))
    scheduler.add_request(request("r1", 20, 5, seed=1))
    remote = request("remote", 20, 5, seed=2)
    remote.status = RequestStatus.WAITING_FOR_REMOTE_KVS  # as a P/D decode node gets it
    scheduler.add_request(remote)
    scheduler.add_request(request("late", 20, 5, seed=3))
    assert len(getattr(scheduler, "kv_holding_waiting", scheduler.waiting)) >= 1
    expected = []
    for _ in range(4):
        output = scheduler.schedule()
        expected.append(scheduler.get_request_counts()[1])
        finish_step(scheduler, output)
    assert expected[0] >= 1
    points = metrics.points()
    assert total(points, "waiting_phase_batch_size", 0) == 4
    assert total(points, "waiting_phase_batch_size", 1) == sum(expected)


def test_blocked_uses_vllms_admission_limit(model, metrics):
    """max_num_active_seqs (vLLM 0.32+) admits fewer requests than max_num_seqs: two run, one waits,
    nothing more can be admitted — one blocked episode, as vLLM's own admission rule says."""
    scheduler = build(model, max_num_seqs=4, max_num_active_seqs=2)
    for i in range(3):
        scheduler.add_request(request(f"r{i}", 16, 8, seed=i))
    blocked_steps = 0
    for _ in range(3):
        output = scheduler.schedule()
        running = len(scheduler.running) + getattr(scheduler, "num_waiting_for_streaming_input", 0)
        blocked_steps += scheduler.get_request_counts()[1] > 0 and running >= scheduler.max_num_active_reqs
        finish_step(scheduler, output)
    assert blocked_steps == 3  # one episode, every step of it blocked
    assert total(metrics.points(), "request_prefill_pending_nums") == 1


def run_until_done(scheduler, requests, steps=400, on_step=None):
    for r in requests:
        scheduler.add_request(r)
    for _ in range(steps):
        if not scheduler.has_requests():
            return
        before = {r.request_id: r.num_computed_tokens for r in scheduler.running}
        output = scheduler.schedule()
        if on_step is not None:
            on_step(output, before)
        finish_step(scheduler, output)
    raise AssertionError("requests did not finish")


def test_preemptions_equal_vllms_own_count(model, metrics):
    scheduler = build(model, blocks=14, max_num_seqs=6, budget=128)
    requests = [request(f"r{i}", 30, 40, seed=i) for i in range(6)]
    run_until_done(scheduler, requests)
    preemptions = sum(r.num_preemptions for r in requests)  # vLLM's per-request count
    assert preemptions >= 3
    points = metrics.points()
    assert total(points, "running_to_waiting_count") == preemptions
    assert total(points, "scheduler:recompute_events") == preemptions


def test_allocation_failures_equal_the_none_results_the_scheduler_got(model, metrics):
    """``KVCacheManager.allocate_slots`` runs as a copy of vLLM's own function that reports its None
    results (hooks/rewrite.py), not under a wrapper. Oracle: a counter between the scheduler and its
    manager sees every result the scheduler got; each None is one ``block_allocate_failures``, and a
    success is none."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    assert "_otel_on_none" in KVCacheManager.allocate_slots.__code__.co_freevars  # the copy is installed
    scheduler = build(model, blocks=14, max_num_seqs=6, budget=128)
    manager = scheduler.kv_cache_manager
    results = {"none": 0, "blocks": 0}
    copy = manager.allocate_slots  # bound to the class's copy

    def counted(*args, **kwargs):
        result = copy(*args, **kwargs)
        results["none" if result is None else "blocks"] += 1
        return result

    manager.allocate_slots = counted  # the instance attribute the scheduler calls
    requests = [request(f"r{i}", 30, 40, seed=i) for i in range(6)]
    run_until_done(scheduler, requests)
    assert results["none"] >= 3 and results["blocks"] > 100
    assert sum(r.num_preemptions for r in requests) >= 1  # the failures made vLLM preempt
    assert total(metrics.points(), "block_allocate_failures") == results["none"]


def _inline_preempting_scheduler():
    """A scheduler that preempts as vllm-ascend's SchedulerDynamicBatch does — inline, without
    _preempt_request: it frees the last running request, marks it PREEMPTED with no computed tokens
    and puts it back at the head of the waiting queue, and its output does not report it."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import RequestStatus

    class InlinePreempting(Scheduler):
        preempt_at = ()
        inline = 0
        step_no = 0

        def schedule(self, *args, **kwargs):
            self.step_no += 1
            victim = None
            if self.step_no in self.preempt_at and self.running:
                victim = self.running.pop()
                self.kv_cache_manager.free(victim)
                self.encoder_cache_manager.free(victim)
                self.computed_at_preemption.append(victim.num_computed_tokens)
                victim.status = RequestStatus.PREEMPTED
                victim.num_computed_tokens = 0
                self.inline += 1
            output = super().schedule(*args, **kwargs)
            if victim is not None:  # not resumed in the step that preempted it
                self.waiting.prepend_request(victim)
            output.preempted_req_ids = None  # SchedulerDynamicBatch's output has none
            return output

    # Hooked on its own schedule(), as the target table hooks SchedulerDynamicBatch's.
    InlinePreempting.schedule = wrap(InlinePreempting.schedule, scheduler_handlers.Schedule(), SYNC)[0]
    return InlinePreempting


def test_inline_preemptions_are_counted_once(model, metrics):
    cls = _inline_preempting_scheduler()
    scheduler = build(model, blocks=64, max_num_seqs=4, budget=128, cls=cls)
    cls.preempt_at = (5, 9)
    scheduler.computed_at_preemption = []
    requests = [request(f"r{i}", 20, 12, seed=i) for i in range(3)]
    run_until_done(scheduler, requests)
    assert scheduler.inline == 2
    assert sum(r.num_preemptions for r in requests) == 0  # none went through _preempt_request
    points = metrics.points()
    assert total(points, "running_to_waiting_count") == 2
    assert total(points, "scheduler:recompute_events") == 2
    # Without prefix caching a resume recomputes all that its request had computed (decoding requests:
    # all their tokens but the last sampled one).
    assert len(scheduler.computed_at_preemption) == 2 and min(scheduler.computed_at_preemption) > 20
    assert total(points, "scheduler:recomputed_tokens") == sum(scheduler.computed_at_preemption)


def test_recomputed_tokens_are_what_the_prefix_cache_did_not_give_back(model, metrics):
    """With prefix caching (vLLM's default) a preempted request's blocks go to the cache, and its
    resume finds the full blocks still there: recompute_events counts the preemption, recomputed_tokens
    only the tokens computed again, as vLLM's own prefix-cache statistics of preempted requests say."""
    scheduler = build(model, blocks=14, max_num_seqs=6, budget=128, prefix_caching=True)
    requests = [request(f"r{i}", 30, 40, seed=i, hashed=True) for i in range(6)]
    oracle = {"recomputed": 0, "hits": 0, "resumes": 0}
    preempted_before: dict = {}

    def on_step(output, before):
        for req_id in output.preempted_req_ids or ():
            preempted_before[req_id] = before[req_id]
        stats = scheduler.kv_cache_manager.prefix_cache_stats  # this step's admissions (reset each step)
        resumed = [r for r in output.num_scheduled_tokens if r in preempted_before]
        oracle["recomputed"] += sum(preempted_before.pop(r) for r in resumed) - stats.preempted_hits
        oracle["hits"] += stats.preempted_hits
        oracle["resumes"] += len(resumed)

    run_until_done(scheduler, requests, on_step=on_step)
    preemptions = sum(r.num_preemptions for r in requests)
    assert preemptions >= 3 and oracle["resumes"] == preemptions
    assert oracle["hits"] > 0  # resumes did find their own blocks
    points = metrics.points()
    assert total(points, "scheduler:recompute_events") == preemptions
    assert total(points, "scheduler:recomputed_tokens") == oracle["recomputed"]


def test_allocate_slots_scopes_fall_mostly_above_the_first_bucket(model, metrics):
    """vLLM's per-request "schedule: allocate_slots" scope lasts microseconds: its buckets resolve it."""
    scheduler = build(model, blocks=64, max_num_seqs=8, budget=256)
    run_until_done(scheduler, [request(f"r{i}", 20, 30, seed=i) for i in range(8)])
    series = metrics.points()[P + "record_function_or_nullcontext"]
    counts = [0] * 64
    observations = 0
    for key, (count, _sum, buckets) in series.items():
        if dict(key)["name"] == "schedule: allocate_slots":
            observations += count
            for i, n in enumerate(buckets):
                counts[i] += n
    assert observations >= 100
    assert counts[0] < observations / 2


def test_reset_prefix_cache_preemptions_are_not_counted_when_the_next_step_reports_them(model, metrics):
    """reset_prefix_cache(reset_running_requests=True) preempts every running request between steps;
    vLLM 0.32+ reports those in the next step's preempted_req_ids (and counts them in
    num_preemptions): they are bookkeeping, not memory pressure, and are counted nowhere."""
    scheduler = build(model, blocks=64, max_num_seqs=4, budget=128, prefix_caching=True)
    requests = [request(f"r{i}", 20, 10, seed=i, hashed=True) for i in range(3)]
    for r in requests:
        scheduler.add_request(r)
    for _ in range(3):
        finish_step(scheduler, scheduler.schedule())
    assert scheduler.reset_prefix_cache(reset_running_requests=True)
    output = scheduler.schedule()
    reported = output.preempted_req_ids or set()
    finish_step(scheduler, output)
    run_until_done(scheduler, [])
    assert sum(r.num_preemptions for r in requests) == 3
    if hasattr(scheduler, "reset_preempted_req_ids"):  # 0.32+: the next step reports them
        assert len(reported) == 3
    points = metrics.points()
    assert total(points, "running_to_waiting_count") == 0
    assert total(points, "scheduler:recompute_events") == 0
    assert total(points, "scheduler:recomputed_tokens") == 0
