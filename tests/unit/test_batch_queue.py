"""Async scheduling replayed in-process with vLLM's real code: ``EngineCore.step_with_batch_queue``
(and ``EngineCore.step``), ``MultiprocExecutor.collective_rpc`` with its ``FutureWrapper``,
``WorkerProc``'s RPC execution and its output thread (``handle_output`` / ``async_output_busy_loop``
/ ``enqueue_output``), and ``UniProcExecutor.collective_rpc`` with its ``AsyncOutputFuture``, all
instrumented. Only the scheduler, the message queues (replies pickled, as through shared memory) and
the model runner are stand-ins; the runner and its async output are hooked with the rows of the
target table. The engine does 25 ms of its own work in ``schedule`` and in ``update_from_output``;
the runner takes 20 ms in ``execute_model`` and the sampled tokens reach the host 15 ms after
``sample_tokens``. The oracle is the stand-ins' own clock readings: when each RPC was put on the
broadcast queue, when the runner's execute_model returned, when the tokens were on the host."""

import pickle
import queue
import threading
import time
from collections import deque
from types import SimpleNamespace as NS

import pytest

from tests.support import fakes

pytest.importorskip("vllm")

from opentelemetry_instrumentation_vllm_ascend import targets
from opentelemetry_instrumentation_vllm_ascend.handlers import (
    steps,
)
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import wrap  # noqa: E402
from opentelemetry_instrumentation_vllm_ascend.state import STATE
from opentelemetry_instrumentation_vllm_ascend.wiring import declarative

ENGINE_WORK, EXECUTE, TOKENS = 0.025, 0.020, 0.015
EXEC, SAMPLE = "vllm_profiling_executor:execute_model:duration", "vllm_profiling_executor:sample_tokens:duration"
GET_OUTPUT = "vllm_profiling_worker:model_runner_get_output:duration"
STEPS = 6
PHASES = ("prefill", "decode")


@pytest.fixture
def instrumented(instrumentation):
    STATE.device = None  # host timeline (CPU)


def row(qualname):
    (target,) = [t for t in targets.TARGETS if t.qualname == qualname and t.module == "vllm.v1.worker.gpu_model_runner"]
    return target


class Oracle:
    def __init__(self):
        self.dispatched = []  # (method, perf_counter) per RPC of a step with tokens, as it is sent
        self.returned = []  # perf_counter when each execute_model returned
        self.tokens = []  # perf_counter when each step's sampled tokens were on the host

    def dispatch(self, method, args):
        if method != "execute_model" or args[0].total_num_scheduled_tokens:  # not the empty steps
            self.dispatched.append((method, time.perf_counter()))


def make_runner(oracle, async_outputs=True):
    """The model runner's shape: execute_model returns None (sampling follows), sample_tokens returns
    an async output (async scheduling) or the ModelRunnerOutput itself. Hooked like the real ones."""
    from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, AsyncModelRunnerOutput, ModelRunnerOutput

    class Output(AsyncModelRunnerOutput):
        def __init__(self, launched):
            self.launched = launched

        def get_output(self):  # waits until the device-to-host copy is done
            time.sleep(max(0.0, self.launched + TOKENS - time.perf_counter()))
            oracle.tokens.append(time.perf_counter())
            return ModelRunnerOutput(req_ids=["r"], req_id_to_index={"r": 0})

    class Runner:
        requests = {}

        def execute_model(self, scheduler_output, intermediate_tensors=None):
            if not scheduler_output.total_num_scheduled_tokens:  # as vLLM's runner: nothing to run
                return EMPTY_MODEL_RUNNER_OUTPUT
            time.sleep(EXECUTE)
            oracle.returned.append(time.perf_counter())
            return None

        def sample_tokens(self, grammar_output):
            if async_outputs:
                return Output(time.perf_counter())
            time.sleep(TOKENS)  # synchronous: waits for the device
            oracle.tokens.append(time.perf_counter())
            return ModelRunnerOutput(req_ids=["r"], req_id_to_index={"r": 0})

    for qualname, owner in (
        ("GPUModelRunner.execute_model", Runner),
        ("GPUModelRunner.sample_tokens", Runner),
        ("AsyncGPUModelRunnerOutput.get_output", Output),
    ):
        target = row(qualname)
        name = target.attribute
        setattr(owner, name, wrap(owner.__dict__[name], declarative.load_handler(target), target.kind)[0])
    return Runner()


class Scheduler:
    """Schedules ``STEPS`` steps of one token each (phases alternating), then, while they are in
    flight, empty steps (as vLLM's scheduler does); 25 ms of engine work in schedule and in
    update_from_output."""

    def __init__(self):
        self.left = STEPS
        self.in_flight = 0

    def has_requests(self):
        return self.left > 0 or self.in_flight > 0

    def schedule(self, throttle_prefills=False):
        time.sleep(ENGINE_WORK)
        out = NS(total_num_scheduled_tokens=1 if self.left else 0, pending_structured_output_tokens=False)
        if self.left:
            setattr(out, steps.PHASE_ATTRIBUTE, PHASES[(STEPS - self.left) % 2])
            self.left -= 1
            self.in_flight += 1
        return out

    def get_grammar_bitmask(self, scheduler_output):
        return None

    def update_from_output(self, scheduler_output, model_output):
        time.sleep(ENGINE_WORK)
        self.in_flight -= scheduler_output.total_num_scheduled_tokens
        return {}


def engine_core(executor, batch_queue_size):
    from vllm.v1.engine.core import EngineCore

    core = EngineCore.__new__(EngineCore)  # no model, no processes
    core.scheduler = Scheduler()
    core.model_executor = executor
    core.batch_queue_size = batch_queue_size
    core.batch_queue = deque(maxlen=batch_queue_size) if batch_queue_size > 1 else None
    core.is_pooling_model = core.is_mm_encoder_only = core.check_for_draft_tokens = False
    core.log_stats = False
    core.vllm_config = NS(observability_config=NS(enable_logging_iteration_details=False))
    core.aborts_queue = queue.Queue()
    core._weight_version = None
    return core


class Broadcast:
    """rpc_broadcast_mq: the worker's main loop takes the RPCs in order."""

    def __init__(self, oracle):
        self.oracle = oracle
        self.queue = queue.Queue()

    def enqueue(self, item):
        self.oracle.dispatch(item[0], item[1])
        self.queue.put(pickle.dumps(item))


class Responses:
    """worker_response_mq on the worker's side, response_mqs[0] on the engine's: pickled, as through
    vLLM's shared-memory MessageQueue."""

    def __init__(self):
        self.queue = queue.Queue()

    def enqueue(self, item):
        self.queue.put(pickle.dumps(item))

    def dequeue(self, timeout=None):
        return pickle.loads(self.queue.get(timeout=timeout or 30))


def start_worker(runner, broadcast, responses):
    """vLLM's WorkerProc (real RPC execution and, with async scheduling, its output thread)."""
    from vllm.v1.executor.multiproc_executor import WorkerProc

    proc = WorkerProc.__new__(WorkerProc)
    proc.worker = runner
    proc.rank = 0
    proc.worker_response_mq = responses
    proc.use_async_scheduling = True
    proc.async_output_queue = queue.Queue()
    threading.Thread(target=proc.async_output_busy_loop, daemon=True, name="WorkerAsyncOutputCopy").start()

    def main_loop():
        while (request := broadcast.queue.get()) is not None:
            proc._execute_worker_rpc(pickle.loads(request))

    thread = threading.Thread(target=main_loop, daemon=True)
    thread.start()
    return thread


def run_engine(core, step):
    calls = 0
    while core.scheduler.has_requests() or core.batch_queue:
        step()
        calls += 1
        assert calls < 100
    return calls


def expected(oracle):
    """Per phase: sums of (execute_model returned - its dispatch) and (tokens on host - sample dispatch)."""
    execs = [t for m, t in oracle.dispatched if m == "execute_model"]
    samples = [t for m, t in oracle.dispatched if m == "sample_tokens"]
    assert len(execs) == len(samples) == len(oracle.returned) == len(oracle.tokens) == STEPS
    out = {}
    for i in range(STEPS):
        e, s = out.setdefault(PHASES[i % 2], [0.0, 0.0])[0:2]
        out[PHASES[i % 2]] = [e + oracle.returned[i] - execs[i], s + oracle.tokens[i] - samples[i]]
    return out


def histogram(metrics, name, phase):
    return metrics.value(name, dp="0", role="mixed", phase=phase)


TOLERANCE = 0.001  # per phase (3 steps): the hooks read the clock microseconds from the oracle


def test_batch_queue_with_worker_processes_records_the_workers_times(instrumented, metrics):
    """MultiprocExecutor + step_with_batch_queue (async scheduling, queue of 2): vLLM reads step N's
    replies only after scheduling and dispatching step N+1, i.e. 25 ms or more after they were ready.
    execute_model must be its dispatch to the worker's return from execute_model; sample_tokens its
    dispatch to the sampled tokens on the host (the output thread's get_output), not the engine's read."""
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    oracle = Oracle()
    broadcast, responses = Broadcast(oracle), Responses()
    worker = start_worker(make_runner(oracle), broadcast, responses)
    executor = MultiprocExecutor.__new__(MultiprocExecutor)
    executor.rpc_broadcast_mq = broadcast
    executor.response_mqs = [responses]
    executor.futures_queue = deque()
    executor.is_failed = False
    executor.output_rank = 0
    executor.kv_output_aggregator = executor.ec_output_aggregator = None
    core = engine_core(executor, batch_queue_size=2)
    try:
        run_engine(core, core.step_with_batch_queue)
    finally:
        broadcast.queue.put(None)
        worker.join(10)
    assert not executor.futures_queue
    truth = expected(oracle)
    for phase in PHASES:
        count, total, _ = histogram(metrics, EXEC, phase)
        assert count == STEPS // 2
        assert total == pytest.approx(truth[phase][0], abs=TOLERANCE), (phase, total, truth[phase][0])
        count, total, _ = histogram(metrics, SAMPLE, phase)
        assert count == STEPS // 2
        assert total == pytest.approx(truth[phase][1], abs=TOLERANCE), (phase, total, truth[phase][1])
        # get_output ran in the output thread: labelled with its own step's phase.
        assert histogram(metrics, GET_OUTPUT, phase)[0] == STEPS // 2


def uniproc(runner, oracle):
    """UniProcExecutor with the runner as its in-process worker; each RPC's dispatch time goes to the
    oracle before our hook sees the call."""
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    executor = UniProcExecutor.__new__(UniProcExecutor)
    executor.driver_worker = runner
    hooked = UniProcExecutor.collective_rpc

    def collective_rpc(method, *args, **kwargs):
        oracle.dispatch(method, kwargs.get("args", ()))
        return hooked(executor, method, *args, **kwargs)

    executor.collective_rpc = collective_rpc
    return executor


def test_uniproc_batch_queue_records_execute_model_and_no_sample_time(instrumented, metrics):
    """UniProcExecutor (one device) with async scheduling: execute_model runs in the engine's thread
    (its RPC duration is the runner's execute_model); the sampled tokens are fetched only when the
    engine reads the AsyncOutputFuture, so no truthful sample_tokens time exists: none is recorded."""
    oracle = Oracle()
    core = engine_core(uniproc(make_runner(oracle), oracle), batch_queue_size=2)
    run_engine(core, core.step_with_batch_queue)
    truth = expected(oracle)
    for phase in PHASES:
        count, total, _ = histogram(metrics, EXEC, phase)
        assert count == STEPS // 2
        assert total == pytest.approx(truth[phase][0], abs=TOLERANCE), (phase, total, truth[phase][0])
        # the runner's time: its sleeps, not the tokens' wait after them (sleeps never return early)
        assert STEPS // 2 * EXECUTE <= truth[phase][0] < STEPS // 2 * (EXECUTE + TOKENS)
    assert SAMPLE not in metrics.points()


def test_uniproc_synchronous_steps_record_both(instrumented, metrics):
    """UniProcExecutor without async scheduling (EngineCore.step): sample_tokens waits for the device
    and returns the output; its RPC time is its dispatch to that return."""
    oracle = Oracle()
    core = engine_core(uniproc(make_runner(oracle, async_outputs=False), oracle), batch_queue_size=1)
    run_engine(core, core.step)
    truth = expected(oracle)
    for phase in PHASES:
        for name, i in ((EXEC, 0), (SAMPLE, 1)):
            count, total, _ = histogram(metrics, name, phase)
            assert count == STEPS // 2
            assert total == pytest.approx(truth[phase][i], abs=TOLERANCE), (name, phase, total, truth[phase][i])


# -- the EngineCore's time budget on the batch queue, on an injected clock ---------------------------------


def _hooked(owner, qualname, func=None):
    """``owner.<method>`` wrapped by the handler of its row in the target table (the installed vLLM's),
    the real vLLM function unless ``func`` is given."""
    from opentelemetry_instrumentation_vllm_ascend.wiring.installer import in_range, vllm_version

    (target,) = [
        t
        for t in targets.TARGETS
        if t.qualname == qualname
        and t.module in ("vllm.v1.engine.core", "vllm.v1.core.sched.scheduler")
        and in_range(vllm_version(), t.vllm)
    ]
    setattr(
        owner,
        target.attribute,
        wrap(func or owner.__dict__[target.attribute], declarative.load_handler(target), target.kind)[0],
    )


def _batch_queue_engine(clock, plan):
    """vLLM's EngineCoreProc busy-loop functions and ``EngineCore.step_with_batch_queue`` (queue of 2), every
    hooked call wrapped by its row's handler, on stand-ins whose calls advance ``clock``: schedule 1/8 s,
    execute_model's dispatch 1/16 s, the grammar bitmask 1/32 s, sample_tokens' dispatch 1/64 s, update 1/4 s,
    queueing one output 1/128 s, waiting for a step's output 1 s (1/4 s for a step that ran no model), blocking
    on the input queue 1/2 s. ``plan``: the tokens each schedule() call schedules."""
    from vllm.v1.engine import core

    def advance(seconds):
        clock.t += seconds

    class Future:
        def __init__(self, wait):
            self.wait = wait

        def result(self):
            advance(self.wait)  # the workers compute; their reply arrives
            return NS(req_ids=[])

    class Scheduler:
        running, waiting, max_num_running_reqs, requests = [], [], 4, {}
        kv_cache_manager = NS(block_pool=NS(num_gpu_blocks=16, get_num_free_blocks=lambda: 8))

        def __init__(self):
            self.plan = []  # the client's request brings the work

        def has_requests(self):
            return bool(self.plan)

        def schedule(self, throttle_prefills=False):
            advance(0.125)
            tokens = self.plan.pop(0)
            out = fakes.output({}, new=[("a", tokens)] if tokens else ())
            out.pending_structured_output_tokens = False
            return out

        def get_grammar_bitmask(self, scheduler_output):
            advance(0.03125)

        def update_from_output(self, scheduler_output, model_output):
            advance(0.25)
            return {0: NS(weight_version=None)}

    for name in ("schedule", "get_grammar_bitmask", "update_from_output"):
        _hooked(Scheduler, f"Scheduler.{name}")

    class Executor:
        def execute_model(self, scheduler_output, non_block=False):
            advance(0.0625)
            return Future(1.0 if scheduler_output.total_num_scheduled_tokens else 0.25)

        def sample_tokens(self, grammar_output, non_block=False):
            advance(0.015625)
            return Future(1.0)

    def request(engine):
        engine.scheduler.plan = list(plan)

    Engine = fakes.busy_loop_engine(
        core, advance, Scheduler(), Executor(), batch_queue=True, output_put=0.0078125, on_request=request
    )
    real = core.EngineCoreProc
    for name in ("capture_iteration_details", "post_step", "step_with_batch_queue"):
        qualname = "EngineCore." + name
        _hooked(Engine, qualname, func=getattr(core.EngineCore, name))
    for name in ("_process_input_queue", "_process_engine_step", "_handle_client_request"):
        _hooked(Engine, "EngineCoreProc." + name, func=Engine.__dict__.get(name) or getattr(real, name))
    return Engine()


def test_the_engine_budget_on_the_batch_queue_sums_to_the_wall_time_stage_by_stage(metrics, clock):
    """Four passes of the busy loop through vLLM's real step_with_batch_queue (queue of 2): step A schedules
    and returns at once (the queue has room); B schedules and waits for A's output; C schedules nothing and
    waits for B's; D has nothing to schedule and waits for C's. Each wait is ``wait_workers`` — also C's and
    D's, which reach ``future.result()`` without a grammar bitmask — the sample_tokens dispatch is
    ``dispatch``, and the stages sum to the injected clock's wall time exactly; ``schedule`` is the
    scheduler's own duration."""
    from opentelemetry_instrumentation_vllm_ascend import catalogue, recording

    loop = _batch_queue_engine(clock, plan=[1, 1, 0])
    start = clock.t
    for _ in range(4):  # run_busy_loop's body; 1/2 s between the two calls ("other")
        loop._process_input_queue()
        clock.t += 0.5
        loop._process_engine_step()
    assert not loop.batch_queue and not loop.scheduler.has_requests()
    clock.t += 0.25  # the loop is in "other" when the collection comes
    wall = clock.t - start
    recording.flush()
    got = {dict(k)["stage"]: v for k, v in metrics.points()[catalogue.PREFIX + "engine_core:stage_seconds"].items()}
    dispatch = 0.0625 + 0.03125 + 0.015625  # execute_model RPC, grammar bitmask, sample_tokens RPC
    assert got == {
        "idle": 0.5,  # the first pass blocks on the input queue; then the queue keeps the engine busy
        "input": 0.0078125,
        "schedule": 3 * 0.125,
        "dispatch": 2 * dispatch + 0.0625,  # C: execute_model only
        "wait_workers": 1.0 + 1.0 + 0.25,  # B waits for A, C for B, D for C (a step that ran no model)
        "update": 3 * 0.25,
        "output": 3 * 0.0078125,
        "other": 4 * 0.5 + 0.25,
    }
    assert sum(got.values()) == wall
    durations = metrics.points()[catalogue.PREFIX + "scheduler:duration"].values()  # prefill and idle steps
    assert (sum(d[0] for d in durations), sum(d[1] for d in durations)) == (3, got["schedule"])
