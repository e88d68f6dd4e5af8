"""Test doubles shaped like vLLM's and vllm-ascend's objects (requests, SchedulerOutputs, schedulers,
executors, the ``vllm.v1.utils`` profiling-scope module, torch's record_function, the NPU model runner,
the Ascend schedulers, EPLB's worker, adaptor and loader, the Mooncake / AscendStore KV transfer classes)
and an injectable clock, shared by the handler tests and the contract tests that check their shape
against the real source; plus the helpers that spell expected series (label keys, bucket counts)."""

import concurrent.futures
import enum
import types
from types import SimpleNamespace as NS

from opentelemetry_instrumentation_vllm_ascend import catalogue, kinds, recording, targets
from opentelemetry_instrumentation_vllm_ascend.handlers import ascend, scheduler
from opentelemetry_instrumentation_vllm_ascend.handlers.model_runner import SampleTokens
from opentelemetry_instrumentation_vllm_ascend.hooks import codegen
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import SYNC, SYNC_TIMER, wrap
from opentelemetry_instrumentation_vllm_ascend.state import STATE
from opentelemetry_instrumentation_vllm_ascend.wiring import declarative

#: The catalogue kind each measure kind records into.
CATALOGUE_KIND = {
    declarative.TIMER: "histogram",
    declarative.COUNTER: "counter",
    declarative.HISTOGRAM: "histogram",
    declarative.GAUGE: "gauge",
}

S, R, T = catalogue.STEP_SECONDS, catalogue.REQUESTS, catalogue.TOKENS
F = catalogue.FINE_SECONDS  # µs-scale timers: scheduler calls, add_request, the input queue
SC = catalogue.SCOPE_SECONDS  # vLLM's profiling scopes
ALL_LABELS = {"dp": "0", "role": "mixed", "phase": "all"}


def name(seed):
    return catalogue.PREFIX + seed


def counts(bounds, **hits):
    """Bucket counts of a histogram with ``bounds``: ``b3=2`` puts 2 in bucket 3, (bounds[2], bounds[3]]."""
    out = [0] * (len(bounds) + 1)
    for key, n in hits.items():
        out[int(key[1:])] = n
    return tuple(out)


def step(phase, **extra):
    return {"dp": "0", "role": "mixed", "phase": phase, **extra}


def key(**attrs):
    return tuple(sorted(attrs.items()))


class Clock:
    """perf_counter stand-in: tests advance ``t`` by exact binary fractions, so every duration, sum and
    bucket is hand-computable. ``reads`` counts the readings taken."""

    def __init__(self, t: float = 100.0):
        self.t = t
        self.reads = 0

    def __call__(self):
        self.reads += 1
        return self.t


class Boundaries:
    """Stands in for a time budget's boundary function (``budget.ENGINE_TO`` & co.): calls the real one and
    notes the clock's read count at each boundary, so that a test can check what each boundary cost in clock
    readings (``reads_per_boundary``: the readings since the previous boundary, the first since ``start``) and
    that the boundary itself reads no clock (``inside``)."""

    def __init__(self, clock: Clock, to):
        self.clock = clock
        self.to = to
        self.start = clock.reads
        self.marks: list[int] = []
        self.stages: list[int] = []
        self.inside = 0

    def __call__(self, stage, now):
        before = self.clock.reads
        self.to(stage, now)
        self.inside += self.clock.reads - before
        self.marks.append(self.clock.reads)
        self.stages.append(stage)

    def reads_per_boundary(self) -> list[int]:
        return [mark - previous for previous, mark in zip([self.start] + self.marks, self.marks)]


def patch_clock(monkeypatch, *modules) -> Clock:
    """A Clock read as ``perf_counter`` by the timer wrappers (``codegen``: bound when wrapped) and by
    the handler ``modules`` that read the clock themselves."""
    c = Clock()
    monkeypatch.setattr(codegen, "perf_counter", c)
    for module in modules:
        monkeypatch.setattr(module, "perf_counter", c)
    return c


# -- a stand-in for vllm.v1.utils: vLLM's own record_function_or_nullcontext --------------------------

_UTILS_SOURCE = """
import contextlib

CUSTOM_SCOPES = False  # envs.VLLM_CUSTOM_SCOPES_FOR_PROFILING
record_function = None  # torch.profiler.record_function
_PROFILER_FUNC = None


def record_function_or_nullcontext(name):
    global _PROFILER_FUNC

    # fast path assume it is set
    if _PROFILER_FUNC is not None:
        return _PROFILER_FUNC(name)

    func = contextlib.nullcontext
    if CUSTOM_SCOPES:
        func = record_function

    _PROFILER_FUNC = func
    return func(name)
"""


def fake_utils(record_function=None):
    module = types.ModuleType("fake_vllm_v1_utils")
    exec(_UTILS_SOURCE, module.__dict__)
    if record_function is not None:
        module.CUSTOM_SCOPES = True
        module.record_function = record_function
    return module


class RecordFunction:
    """torch.profiler.record_function stand-in: logs what it is entered and exited with."""

    log = None

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        self.log.append(("enter", self.name))
        return self

    def __exit__(self, exc_type, exc, tb):
        self.log.append(("exit", self.name, exc_type))
        return False


# -- SchedulerOutput-shaped objects ---------------------------------------------------------------------


def req(computed, num_tokens, prompt=None, request_id=None):
    """A Request: tokens computed so far, tokens known (prompt + outputs), prompt length."""
    return NS(
        num_computed_tokens=computed,
        num_tokens=num_tokens,
        request_id=request_id,
        num_prompt_tokens=num_tokens if prompt is None else prompt,
    )


def output(requests, new=(), cached=(), resumed=()):
    """A SchedulerOutput. ``new``: new requests, each an id (1 token scheduled), ``(id, scheduled)``
    or ``(id, scheduled, computed before the step)`` (computed: the prefix-cache hit, 0 unless given);
    ``cached``: ``(id, scheduled)``, whose CachedRequestData numbers are taken from ``requests`` as
    they were *before* the step; ``resumed``: ids of cached requests resumed after a preemption."""
    new = [(n, 1, 0) if isinstance(n, str) else (n[0], n[1], n[2] if len(n) > 2 else 0) for n in new]
    ids = [rid for rid, _ in cached]
    scheduled = {rid: n for rid, n, _ in new} | dict(cached)
    return NS(
        num_scheduled_tokens=scheduled,
        total_num_scheduled_tokens=sum(scheduled.values()),
        scheduled_new_reqs=[NS(req_id=rid, num_computed_tokens=computed) for rid, _, computed in new],
        scheduled_cached_reqs=NS(
            req_ids=ids,
            resumed_req_ids=set(resumed),
            num_computed_tokens=[requests[rid].num_computed_tokens for rid in ids],
            num_output_tokens=[requests[rid].num_tokens - requests[rid].num_prompt_tokens for rid in ids],
        ),
    )


def idle_output():
    return output({})


# -- schedulers --------------------------------------------------------------------------------------


class BlockPool:
    def __init__(self, total, free):
        self.num_gpu_blocks = total
        self.free = free

    def get_num_free_blocks(self):
        return self.free


class FakeScheduler:
    """The parts of vllm.v1.core.sched.scheduler.Scheduler the handlers read."""

    def __init__(
        self, clock, utils=None, requests=None, running=(), waiting=(), max_num_running_reqs=8, blocks=(100, 37)
    ):
        self.clock = clock
        self.utils = utils
        self.requests = requests or {}
        self.running = list(running)
        self.waiting = list(waiting)
        self.max_num_running_reqs = max_num_running_reqs
        self.kv_cache_manager = NS(block_pool=BlockPool(*blocks))
        self.plan = []
        self.during = None

    def schedule(self):
        out, seconds, scopes = self.plan.pop(0)
        for scope, scope_seconds in scopes:
            with self.utils.record_function_or_nullcontext(scope):
                self.clock.t += scope_seconds
        self.clock.t += seconds
        if self.during is not None:
            self.during()
        if isinstance(out, BaseException):
            raise out
        return out

    def update_from_output(self, scheduler_output, model_runner_output):
        self.clock.t += model_runner_output
        if model_runner_output < 0:
            raise RuntimeError("update failed")
        return {}

    def add_request(self, request):
        self.clock.t += request
        if request < 0:
            raise ValueError("bad request")


def instrumented(cls=FakeScheduler):
    """``cls`` with the scheduler handlers wrapped around schedule, update_from_output and add_request."""
    return type(
        "Instrumented" + cls.__name__,
        (cls,),
        {
            "schedule": wrap(cls.schedule, scheduler.Schedule(), SYNC)[0],
            "update_from_output": wrap(cls.update_from_output, scheduler.UpdateFromOutput(), SYNC)[0],
            "add_request": wrap(
                cls.add_request, handler_of("vllm.v1.core.sched.scheduler:Scheduler.add_request"), SYNC_TIMER
            )[0],
        },
    )


class FakeKV:
    def __init__(self, results):
        self.results = list(results)

    def allocate_slots(self, request, num_new_tokens, **kw):
        r = self.results.pop(0)
        if isinstance(r, Exception):
            raise r
        return r


class PlannedScheduler:
    """The parts of vllm.v1.core.sched.scheduler.Scheduler the handlers touch."""

    def __init__(self, plan):
        # plan: list of steps; each: (events, output builder called with self.requests)
        self.plan = list(plan)
        self.requests = {}
        self.kv_cache_manager = FakeKV([])

    def _preempt_request(self, request, timestamp, drop_stale_output=False):
        request.num_computed_tokens = 0

    def reset_prefix_cache(self, reset_running_requests=False):
        for r in list(self.requests.values()):
            self._preempt_request(r, 0.0, drop_stale_output=True)
        return True

    def schedule(self):
        events, build = self.plan.pop(0)
        for kind, arg in events:
            if kind == "preempt":
                self._preempt_request(arg, 0.0)
            elif kind == "alloc":
                self.kv_cache_manager.allocate_slots(arg, 1)
        return build(self.requests)


# -- executors ---------------------------------------------------------------------------------------


class FakeExecutor:
    """collective_rpc of vLLM's executors. Each call takes ``cost`` seconds of ``clock`` to dispatch,
    then raises ``fail`` if set, or "Executor failed." for method ``dead`` (vLLM's message when the
    executor died). Non-blocking: a plain Future (kept in ``futures``) the test completes. Blocking:
    ``replies[method]``, or for a method in ``times_out`` the TimeoutError vLLM's RPC raises."""

    def __init__(self, clock=None, cost=0.0, times_out=()):
        self.clock = clock
        self.cost = cost
        self.times_out = set(times_out)
        self.calls = 0
        self.futures = []
        self.fail = None
        self.replies = {}

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None, non_block=False, unique_reply_rank=None):
        self.calls += 1
        if self.clock is not None:
            self.clock.t += self.cost
        if self.fail is not None:
            raise self.fail
        if method == "dead":
            raise RuntimeError("Executor failed.")
        if non_block:
            future = concurrent.futures.Future()
            self.futures.append(future)
            return future
        if method in self.times_out:
            raise TimeoutError(f"RPC call to {method} timed out.")
        return self.replies.get(method)


# -- vllm-ascend: NPU model runner, Ascend schedulers (tests/contract/test_ascend.py checks their shape) ---


class AscendAttentionState(enum.Enum):  # vllm_ascend.attention.attention_v1
    PrefillNoCache = 0
    PrefillCacheHit = 1
    DecodeOnly = 2
    ChunkedPrefill = 3
    SpecDecoding = 4


def npu_runner(attn_state):
    class NPUModelRunner:
        def __init__(self):
            self.requests = {}
            self.attn_state = None

        def _prepare_inputs(self, scheduler_output, num_scheduled_tokens=None):
            self.attn_state = attn_state

        def execute_model(self, scheduler_output, intermediate_tensors=None):
            self._prepare_inputs(scheduler_output)
            return None

        def sample_tokens(self, grammar_output):
            return "output"

    NPUModelRunner.execute_model = wrap(NPUModelRunner.execute_model, ascend.NPUExecuteModel(), SYNC)[0]
    NPUModelRunner._prepare_inputs = wrap(NPUModelRunner._prepare_inputs, ascend.NPUPrepareInputs(), SYNC_TIMER)[0]
    NPUModelRunner.sample_tokens = wrap(NPUModelRunner.sample_tokens, SampleTokens(), SYNC)[0]
    return NPUModelRunner()


class RecomputeScheduler:
    """The parts of vllm_ascend.core.recompute_scheduler.RecomputeScheduler the handlers touch."""

    def __init__(self, recomputed, nested=False):
        self.requests = {"d": req(41, 42, prompt=40)}  # decoding (2 outputs)
        self.running, self.waiting = [], []
        self.max_num_running_reqs = 8
        self.kv_cache_manager = NS(block_pool=NS(num_gpu_blocks=9, get_num_free_blocks=lambda: 4))
        self.recomputed = recomputed
        self.nested = nested

    def base_schedule(self):
        out = output(self.requests, cached=[("d", 1)])
        out.recomputed_reqs = [NS(request_id=f"r{i}") for i in range(self.recomputed)]
        return out

    def schedule(self):
        return self.base_schedule()


# -- vllm-ascend 0.23.0.post1's EPLB: EplbWorker (policy replaced by a fixed answer), adaptor, loader ------


class FakeEplbWorker:
    """``vllm_ascend.eplb.core.eplb_worker.EplbWorker`` (0.23.0.post1) as far as ``do_update`` goes, its
    code copied (the placement checks and update-info packing left out). This is the version with
    ``latest_expert_hotness`` (computed on EP rank 0 only)."""

    computes_hotness = True

    def __init__(self, shared_dict, rank_id, new_placement, policy_type=2):
        self.shared_dict = shared_dict
        self.old_expert_maps = None
        self.rank_id = rank_id
        self.multi_stage = policy_type == 3
        self.new_placement = new_placement

    def do_update(self):
        import numpy as np
        import torch

        if self.old_expert_maps is None:
            self.old_expert_maps = self.get_init_expert_maps()
            if self.old_expert_maps is not None:
                self.num_local_experts = self.old_expert_maps.max() + 1
            else:
                raise ValueError("Failed to get expert_maps from shared_dict.")
        load_info = self.fetch_and_sum_load_info()
        if load_info is None:
            return
        old_placement = self.global2local(self.old_expert_maps, self.num_local_experts)
        new_placement = torch.tensor(self.new_placement)  # the policy's answer
        if self.rank_id == 0 and self.computes_hotness:
            if self.multi_stage:
                hotness = self._calculate_hotness(old_placement, load_info.sum(0))
            else:
                hotness = self._calculate_hotness(old_placement, load_info)
            with np.errstate(invalid="ignore"):  # 0 / 0 on a layer without load, as in vllm-ascend
                current_mean, current_max, current_imbalance_list = self._compute_imbalance(
                    old_placement, hotness, return_list=True
                )
                update_mean, update_max, update_imbalance_list = self._compute_imbalance(
                    new_placement, hotness, return_list=True
                )
            self.latest_expert_hotness = {
                "current_mean": current_mean,
                "current_max": current_max,
                "update_mean": update_mean,
                "update_max": update_max,
                "current_imbalance_list": current_imbalance_list,
                "update_imbalance_list": update_imbalance_list,
            }
        new_expert_maps = self.local2global(new_placement)
        self.shared_dict["expert_maps"] = new_expert_maps
        self.old_expert_maps = new_expert_maps
        return [("update info of layer", layer) for layer in range(new_expert_maps.shape[0])]

    def get_init_expert_maps(self):
        return self.shared_dict.get("expert_maps", None)

    def fetch_and_sum_load_info(self):
        return self.shared_dict.get("moe_load", None)

    def global2local(self, placement, E_local):
        import torch

        L, G, _ = placement.shape
        pt_local = torch.full((L, G, E_local), fill_value=-1, dtype=torch.long, device=placement.device)
        valid = placement >= 0
        l_idx, g_idx, k_idx = valid.nonzero(as_tuple=True)
        slot_idx = placement[l_idx, g_idx, k_idx]
        pt_local[l_idx, g_idx, slot_idx] = k_idx
        return pt_local

    def local2global(self, placement_local):
        import torch

        L, G, E_local = placement_local.shape
        max_id = torch.max(placement_local)
        E_global = (max_id + 1).item() if max_id >= 0 else 0
        placement_global = torch.full((L, G, E_global), fill_value=-1, dtype=torch.long)
        valid = placement_local >= 0
        l_idx, g_idx, slot_idx = valid.nonzero(as_tuple=True)
        gid_idx = placement_local[l_idx, g_idx, slot_idx]
        placement_global[l_idx, g_idx, gid_idx] = slot_idx
        return placement_global

    @staticmethod
    def _compute_imbalance(deployment_all_layer, hotness_all_layer, return_list=False):
        import numpy as np

        imbalance_list = []
        deployment_all_layer = np.array(deployment_all_layer)
        for deployment, hotness in zip(deployment_all_layer, hotness_all_layer):
            counts = np.bincount(deployment.reshape(-1), minlength=hotness.shape[0])
            unit_hotness = np.divide(hotness, counts, out=np.zeros_like(hotness, dtype=float), where=counts != 0)
            stage_load = unit_hotness[deployment].sum(-1)
            stage_par = stage_load.max() / stage_load.mean()
            imbalance_list.append(stage_par)
        max_val = max(imbalance_list)
        mean_val = sum(imbalance_list) / len(imbalance_list)
        if return_list:
            return mean_val, max_val, imbalance_list
        return mean_val, max_val

    @staticmethod
    def _calculate_hotness(deployment_all_layer, moe_load_all_layer):
        import numpy as np

        hotnesses = []
        num_of_expert = deployment_all_layer.shape[1] * deployment_all_layer.shape[2]
        for deployment, rank_load in zip(deployment_all_layer, moe_load_all_layer.numpy()):
            hotness = np.zeros(num_of_expert, dtype=rank_load.dtype)
            np.add.at(hotness, deployment.ravel(), rank_load.ravel())
            hotnesses.append(hotness)
        return np.array(hotnesses)


class FakeEplbWorkerWithoutHotness(FakeEplbWorker):
    """A vllm-ascend without ``latest_expert_hotness`` (before v0.21.0rc1): do_update computes none."""

    computes_hotness = False


class ExpertWeightUpdateState(enum.Enum):
    WAITING = 0
    READY = 1
    TRANSFERRING = 2


class FakeAdaptor:
    """``VllmEplbAdaptor``'s update methods (signatures of 0.23.0.post1)."""

    def __init__(self):
        self.calls = []
        self.num_moe_layers = 2

    def do_update_expert_map(self, layer_id, updated_expert_map):
        self.calls.append(("map", layer_id))

    def do_update_expert_weight(self, layer_id, local_expert_to_replace, buffer_tensor_id):
        self.calls.append(("weight", layer_id, local_expert_to_replace, buffer_tensor_id))

    def do_update_log2phy_map(self, layer_id, updated_log2phy_map):
        self.calls.append(("log2phy", layer_id))


class FakeLoader:
    """``D2DExpertWeightLoader.update_expert_map_and_weight`` of 0.23.0.post1 (profiling scope and logs
    left out)."""

    def __init__(self, adaptor):
        self.eplb_adaptor = adaptor
        self.comm_op_list = None
        self.updated_expert_map = None
        self.updated_log2phy_map = None
        self.layer_id = -1
        self.state = ExpertWeightUpdateState.WAITING
        self.recv_expert_list = []

    def update_expert_map_and_weight(self, reqs):
        if self.state != ExpertWeightUpdateState.TRANSFERRING:
            return
        if reqs:
            for req in reqs:
                req.wait()
        if self.comm_op_list is not None:
            self.comm_op_list = None
        self.eplb_adaptor.do_update_expert_map(self.layer_id, self.updated_expert_map)
        self.eplb_adaptor.do_update_log2phy_map(self.layer_id, self.updated_log2phy_map)
        for local_expert_to_replace, buffer_tensor_id in self.recv_expert_list:
            self.eplb_adaptor.do_update_expert_weight(self.layer_id, local_expert_to_replace, buffer_tensor_id)
        self.recv_expert_list = []
        self.updated_expert_map = None
        self.layer_id = -1
        self.state = ExpertWeightUpdateState.WAITING


# -- vllm-ascend's KV transfers: Mooncake P2P threads, AscendStore backends (tests/contract/test_kv_ascend.py) ---


class TransferEngine:
    """Mooncake's TransferEngine (C++; the calls vllm-ascend makes): returns ``ret`` (negative: failed)."""

    def __init__(self, ret=0):
        self.ret = ret
        self.calls = []

    def batch_transfer_sync_read(self, session_id, src, dst, lengths):
        self.calls.append(("read", session_id, list(lengths)))
        return self.ret

    def batch_transfer_sync_write(self, session_id, src, dst, lengths):
        self.calls.append(("write", session_id, list(lengths)))
        return self.ret

    def get_rpc_port(self):
        return 12345


class KVCacheRecvingThread:
    """vllm-ascend's receiving thread: ``_transfer_kv_cache_all_groups`` pulls one request's blocks with one
    ``batch_transfer_sync_read`` and raises on a negative return, as the real one does."""

    def __init__(self, tp_rank, tp_size, _prefill_pp_size, engine):
        self.tp_rank = tp_rank
        self.engine = engine

    def _transfer_kv_cache_all_groups(self, req_meta):
        ret = self.engine.batch_transfer_sync_read(
            req_meta["session"], req_meta["src"], req_meta["dst"], req_meta["len"]
        )
        if ret < 0:
            raise RuntimeError(f"Mooncake transfer failed, ret: {ret}")


class KVCacheSendingLayerThread:
    def __init__(self, engine):
        self.engine = engine


class MooncakeBackend:
    """An AscendStore backend: ``put`` returns nothing, ``get`` a code per key (0: loaded) or None."""

    def __init__(self, codes=None):
        self.codes = codes
        self.puts = []

    def put(self, keys, addrs, sizes):
        self.puts.append(list(keys))

    def get(self, keys, addrs, sizes):
        return self.codes


class MemcacheBackend(MooncakeBackend):
    def put(self, key, addr, size):
        self.puts.append(list(key))

    def get(self, key, addr, size):
        return self.codes


# -- the EngineCore busy loop -------------------------------------------------------------------------------------


def busy_loop_engine(core, advance, scheduler, executor, *, batch_queue: bool, output_put: float, on_request):
    """A stand-in EngineCoreProc class running vLLM's own loop functions (``core``: ``vllm.v1.engine.core``) over
    the given scheduler and executor instances' classes; every call it makes advances the clock by ``advance``:
    a blocking input-queue read 0.5 s (a client request then arrives), a client request 0.0078125 s (then
    ``on_request(engine)``), each output put ``output_put``. ``batch_queue``: async scheduling with a queue of 2
    (``step_with_batch_queue``), else ``step``. Tests hook the methods they time on the returned class."""
    import queue
    from collections import deque

    real = core.EngineCoreProc

    class InputQueue(queue.Queue):
        def get(self, block=True, timeout=None):
            if block and self.empty():
                advance(0.5)  # blocked until a client request arrives
                return ("ADD", None)
            return super().get(block, timeout)

    class OutputQueue:
        def put_nowait(self, item):
            advance(output_put)

    class Engine:
        step = real.step
        has_work = real.has_work
        is_running = real.is_running
        post_step = real.post_step
        _notify_idle_state_callbacks = real._notify_idle_state_callbacks
        _process_aborts_queue = real._process_aborts_queue
        _should_throttle_prefills = real._should_throttle_prefills
        capture_iteration_details = real.capture_iteration_details
        log_error_detail = real.log_error_detail
        _attach_iteration_details = real._attach_iteration_details
        _attach_weight_version = real._attach_weight_version

        def __init__(self):
            self.scheduler = scheduler
            self.model_executor = executor
            self.input_queue = InputQueue()
            self.output_queue = OutputQueue()
            self.aborts_queue = queue.Queue()
            self.process_input_queue_block = True
            self._idle_state_callbacks = []
            self.engines_running = False
            self.batch_queue_size = 2 if batch_queue else 1
            self.batch_queue = deque(maxlen=2) if batch_queue else None
            self.shutdown_state = core.EngineShutdownState.RUNNING
            self.is_pooling_model = self.is_mm_encoder_only = self.check_for_draft_tokens = False
            self.async_scheduling = batch_queue
            self.log_stats = False
            self._weight_version = None
            self.vllm_config = NS(observability_config=NS(enable_logging_iteration_details=False))

        @property
        def step_fn(self):
            return self.step_with_batch_queue if batch_queue else self.step

        def _handle_client_request(self, request_type, request):
            advance(0.0078125)
            on_request(self)

    return Engine


def waiting() -> list:
    """(metric seed, value, phase label) of each observation left for later (``recording.record_later``), oldest
    first."""
    return [(spec.seed, value, labels[2]) for spec, value, labels in STATE.deferred_values]


def record_waiting() -> None:
    """Record what waits, as the engine's flush does (``recording.run_deferred``): nothing waits after it."""
    recording.run_deferred()
    assert not STATE.deferred_values


# -- model runner V2 (vllm/v1/worker/gpu/, vLLM 0.32+) ---------------------------------------------------------


class FakeStepTiming:
    """vLLM's ``StepTimingCollector`` (``vllm/v1/worker/gpu/async_utils.py``, 0.32+): execute_model calls
    ``record_batch`` then ``forward_start`` right before the model (tests/contract/test_mrv2.py checks the shape)."""

    def record_batch(self, input_batch, full_cudagraph):
        pass

    def forward_start(self):
        pass


class FakeRunnerV2:
    """Model runner V2's ``GPUModelRunner`` (``vllm/v1/worker/gpu/model_runner.py``) in the order its execute_model
    and sample_tokens call what the hooks rely on (tests/contract/test_mrv2.py checks that order in the source):
    update the requests, ``prepare_inputs``, the attention metadata, ``step_timing.forward_start()``, the model,
    ``kv_connector.finish_forward()`` and the step's state, return None; sample_tokens: ``self.sample(…)`` (logits,
    grammar bitmask, sampler) between its own work. ``plan``: host seconds of each part (``clock``), ``device_ms``
    and ``device_sample_ms``: the device's (an event class's clock, ``event``)."""

    def __init__(self, clock, event=None):
        self.clock = clock
        self.event = event
        self.plan: dict = {}
        self.step_timing = FakeStepTiming()

    def execute_model(self, scheduler_output, intermediate_tensors=None, dummy_run=False):
        p, clock = self.plan, self.clock
        clock.t += p.get("update", 0.0)  # finish / free / add / update requests
        if p.get("no_forward") and not dummy_run:  # total_num_scheduled_tokens == 0: kv_connector.no_forward
            return p.get("result")
        if not dummy_run:
            self.prepare_inputs(scheduler_output)
        clock.t += p.get("attn", 0.0)  # prepare_attn, model inputs
        self.step_timing.record_batch(None, False)
        self.step_timing.forward_start()
        clock.t += p.get("forward", 0.0)
        if self.event is not None:
            self.event.device_ms += p.get("device_ms", 0.0)
        clock.t += p.get("finish", 0.0)  # kv_connector.finish_forward(), ExecuteModelState
        return None if dummy_run else p.get("result")

    def prepare_inputs(self, scheduler_output):
        self.clock.t += self.plan.get("prepare", 0.0)

    def sample(self, hidden_states, input_batch, grammar_output):
        self.clock.t += self.plan.get("sample", 0.0)
        if self.event is not None:
            self.event.device_ms += self.plan.get("device_sample_ms", 0.0)
        return None, None, None

    def sample_tokens(self, grammar_output):
        self.clock.t += self.plan.get("pre_sample", 0.0)
        self.sample(None, None, grammar_output)
        self.clock.t += self.plan.get("post_sample", 0.0)  # postprocess, drafting, the output
        return self.plan.get("sampled", "sampled")


#: (fake, module, class, names only the tests use) of the V2 fakes, for the contract test.
MRV2_FAKES = (
    (FakeRunnerV2, "vllm.v1.worker.gpu.model_runner", "GPUModelRunner", ("clock", "event", "plan")),
    (FakeStepTiming, "vllm.v1.worker.gpu.async_utils", "StepTimingCollector", ()),
)


def instrumented_v2(monkeypatch, runner_handler="model_runner:ExecuteModelV2"):
    """``FakeRunnerV2`` wrapped as the MRV2 rows of targets.py wrap vLLM's (each row's own handler, built by
    ``declarative.load_handler``); ``STATE.mrv2_forward_marked`` (which building the forward-mark row's handler sets)
    is restored after the test."""
    from opentelemetry_instrumentation_vllm_ascend import targets
    from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import wrap
    from opentelemetry_instrumentation_vllm_ascend.state import STATE

    monkeypatch.setattr(STATE, "mrv2_forward_marked", STATE.mrv2_forward_marked)
    rows = {t.symbol: t for t in targets.TARGETS}
    v2 = "vllm.v1.worker.gpu.model_runner:GPUModelRunner."

    def wrapped(cls, method, row):
        return wrap(getattr(cls, method), declarative.load_handler(row), row.kind)[0]

    execute = rows[v2 + "execute_model"]
    if runner_handler != execute.handler:
        import dataclasses

        execute = dataclasses.replace(execute, handler=runner_handler)
    timing = type(
        "Timing",
        (FakeStepTiming,),
        {
            "forward_start": wrapped(
                FakeStepTiming,
                "forward_start",
                rows["vllm.v1.worker.gpu.async_utils:StepTimingCollector.forward_start"],
            )
        },
    )
    runner = type(
        "RunnerV2",
        (FakeRunnerV2,),
        {
            "execute_model": wrapped(FakeRunnerV2, "execute_model", execute),
            "prepare_inputs": wrapped(FakeRunnerV2, "prepare_inputs", rows[v2 + "prepare_inputs"]),
            "sample": wrapped(FakeRunnerV2, "sample", rows[v2 + "sample"]),
            "sample_tokens": wrapped(FakeRunnerV2, "sample_tokens", rows[v2 + "sample_tokens"]),
        },
    )
    return runner, timing


class FakeNPURunnerV2(FakeRunnerV2):
    """vllm-ascend 0.30.0rc2's V2 NPU runner (``vllm_ascend/worker/v2/model_runner.py``: ``NPUModelRunner``, a
    subclass of V2's ``GPUModelRunner``), in the order its overrides call what the hooks rely on
    (tests/contract/test_mrv2_npu.py checks that order in its source): execute_model does NPU work (the KV
    connector's preemption stores) before V2's and more (joining auxiliary work, draft KV, KVPP) after it;
    prepare_inputs is its own, never V2's; sample computes the logits itself with LM-head TP, else calls V2's;
    sample_tokens does its own work before V2's. ``plan`` keys: ``npu_pre``, ``npu_post``, ``npu_pre_sample``,
    ``lmhead_tp``."""

    def execute_model(self, scheduler_output, intermediate_tensors=None, dummy_run=False):
        self.clock.t += self.plan.get("npu_pre", 0.0)
        output = super().execute_model(scheduler_output, intermediate_tensors=intermediate_tensors, dummy_run=dummy_run)
        self.clock.t += self.plan.get("npu_post", 0.0)
        return output

    def prepare_inputs(self, scheduler_output):
        self.clock.t += self.plan.get("prepare", 0.0)

    def sample(self, hidden_states, input_batch, grammar_output):
        if not self.plan.get("lmhead_tp"):
            return super().sample(hidden_states, input_batch, grammar_output)
        self.clock.t += self.plan.get("sample", 0.0)  # its own logits, grammar bitmask, sampler
        return None, None, None

    def sample_tokens(self, grammar_output):
        self.clock.t += self.plan.get("npu_pre_sample", 0.0)  # PCP layout, draft states
        return super().sample_tokens(grammar_output)


MRV2_NPU_FAKES = (
    (FakeNPURunnerV2, "vllm_ascend.worker.v2.model_runner", "NPUModelRunner", ("clock", "event", "plan")),
)


def instrumented_npu_v2(monkeypatch):
    """``FakeNPURunnerV2`` over ``instrumented_v2``'s runner: V2's methods wrapped by V2's rows, the NPU runner's by
    its own rows (the vllm-ascend rows of targets.py, each with its handler), as the installer patches both classes;
    its ``super()`` calls reach V2's wrapped methods. Returns (runner class, timing class)."""
    from opentelemetry_instrumentation_vllm_ascend import targets
    from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import wrap

    base, timing = instrumented_v2(monkeypatch)
    rows = {t.symbol: t for t in targets.TARGETS}
    npu = "vllm_ascend.worker.v2.model_runner:NPUModelRunner."
    own = type(
        "NPUWrapped",
        (FakeNPURunnerV2,),
        {
            method: wrap(
                getattr(FakeNPURunnerV2, method), declarative.load_handler(rows[npu + method]), rows[npu + method].kind
            )[0]
            for method in ("execute_model", "prepare_inputs", "sample")
        },
    )
    return type("NPURunnerV2", (own, base), {}), timing


# -- rows: the handler a row builds, and what is wrong with a declarative row ---------------------------


def handler_of(symbol: str):
    """The handler the installer builds for the table's row of ``symbol`` ("module:Class.method"): what the
    tests wrap their vLLM-shaped classes with."""
    return declarative.load_handler(next(t for t in targets.TARGETS if t.symbol == symbol))


def problems(target, catalogue_by_seed) -> list[str]:
    """What is wrong with a declarative row (empty when it is sound): unknown metrics, a measure whose
    kind does not match its metric, a timer on a wrapper kind that does not time, a value that is not
    a parameter, labels the declarative handler cannot fill."""
    out = []
    if target.handler and target.measures:
        out.append(f"{target.symbol}: a row has either a handler or measures, not both")
    timing = (kinds.SYNC_TIMER, kinds.COROUTINE_TIMER, kinds.ASYNC_GENERATOR, kinds.COROUTINE_STREAM)
    if target.measures and target.kind not in timing + (kinds.SYNC, kinds.COROUTINE):
        out.append(f"{target.symbol}: measures need a sync/coroutine/stream wrapper kind, not {target.kind}")
    for m in target.measures:
        spec = m.spec if m.spec is not None else catalogue_by_seed.get(m.metric)
        if spec is None:
            out.append(f"{target.symbol}: {m.metric} is not in the catalogue")
            continue
        if m.kind not in declarative.MEASURE_KINDS:
            out.append(f"{target.symbol}: {m.metric}: unknown measure kind {m.kind!r}")
        elif CATALOGUE_KIND[m.kind] != spec.kind:
            out.append(f"{target.symbol}: {m.metric} is a {spec.kind}, the measure a {m.kind}")
        engine_step = m.phase == declarative.PHASE_ENGINE_STEP
        if m.phase not in declarative.MEASURE_PHASES or (
            engine_step and (m.kind != declarative.TIMER or target.kind not in timing[:2])
        ):
            out.append(f"{target.symbol}: {m.metric}: phase {m.phase!r} not allowed for a {m.kind} on {target.kind}")
        if engine_step and len(target.measures) > 1:
            out.append(f"{target.symbol}: {m.metric}: an engine_step timer is the row's only measure")
        if m.kind == declarative.TIMER and target.kind not in timing:
            out.append(f"{target.symbol}: {m.metric}: a timer needs wrapper kind {timing}")
        wanted = catalogue.STEP_LABELS + tuple(name for name, _ in m.labels)
        if spec.labels != wanted:
            out.append(
                f"{target.symbol}: {m.metric} has labels {spec.labels}: a declarative hook fills dp, role, phase"
                + (f" and {', '.join(wanted[3:])}" if m.labels else "")
            )
        try:
            declarative.value_reader(m, declarative.argument_names(target))
        except ValueError as exc:
            out.append(f"{target.symbol}: {exc}")
    return out
