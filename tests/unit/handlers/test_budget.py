"""The EngineCore's exclusive time budget, replayed through vLLM's own busy-loop functions
(``EngineCoreProc._process_input_queue``, ``_process_engine_step``, ``EngineCore.step``, the real
wrappers and handlers of every hooked call) on a stand-in engine whose calls advance an injected clock
by exact binary fractions: each stage's seconds are hand-computed, and their sum is the wall time the
loop ran, exactly."""

import contextlib
from collections import deque
from types import SimpleNamespace as NS

import pytest
from packaging.version import Version

from opentelemetry_instrumentation_vllm_ascend import catalogue, recording, supported
from opentelemetry_instrumentation_vllm_ascend.handlers import budget, engine, model_runner, scheduler, scopes
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import SYNC, SYNC_TIMER, wrap
from opentelemetry_instrumentation_vllm_ascend.state import STATE
from tests.support.fakes import ALL_LABELS as _ALL
from tests.support.fakes import Boundaries, busy_loop_engine, handler_of, output, patch_clock
from tests.support.vllm_source import assignments, functions

core = pytest.importorskip("vllm.v1.engine.core")

STAGE = catalogue.PREFIX + "engine_core:stage_seconds"
_CORE = "vllm.v1.engine.core"


@pytest.fixture
def clock(monkeypatch):
    """The clock of the wrappers and of the handlers that read it (the autouse fixture's state.reset()
    resets the stage clocks and the pass in progress)."""
    c = patch_clock(monkeypatch, scheduler, engine, budget)
    c.t = 1000.0
    return c


def _engine(clock):
    """vLLM's loop functions on a stand-in engine; every call it makes advances ``clock``."""

    def advance(seconds):
        clock.t += seconds

    class Scheduler:
        running, waiting, max_num_running_reqs = [], [], 4
        kv_cache_manager = NS(block_pool=NS(num_gpu_blocks=16, get_num_free_blocks=lambda: 8))
        requests = {}

        def __init__(self):
            self.pending = 0

        def has_requests(self):
            return self.pending > 0

        def schedule(self, throttle=False):
            advance(0.125)
            return output({}, new=[("a", 5)])  # one new request of 5 tokens: a prefill step

        def get_grammar_bitmask(self, scheduler_output):
            advance(0.03125)

        def update_from_output(self, scheduler_output, model_output):
            advance(0.25)
            self.pending -= 1
            return {0: NS(weight_version=None)}

    Scheduler.schedule = wrap(Scheduler.schedule, scheduler.Schedule(), SYNC)[0]
    Scheduler.get_grammar_bitmask = wrap(Scheduler.get_grammar_bitmask, scheduler.GrammarBitmask(), SYNC)[0]
    Scheduler.update_from_output = wrap(Scheduler.update_from_output, scheduler.UpdateFromOutput(), SYNC)[0]

    class Future:
        def result(self):
            advance(1.0)  # the workers compute
            return object()

    class Executor:
        def execute_model(self, scheduler_output, non_block=False):
            advance(0.0625)
            return Future()

    def request(engine):
        engine.scheduler.pending += 1

    Engine = busy_loop_engine(
        core, advance, Scheduler(), Executor(), batch_queue=False, output_put=0.015625, on_request=request
    )
    real = core.EngineCoreProc
    Engine.capture_iteration_details = wrap(real.capture_iteration_details, engine.WaitForWorkers(), SYNC)[0]
    Engine.post_step = wrap(real.post_step, engine.PostStep(), SYNC)[0]
    Engine._process_input_queue = wrap(real._process_input_queue, engine.ProcessInputQueue(), SYNC)[0]
    step_row = handler_of("vllm.v1.engine.core:EngineCoreProc._process_engine_step")
    Engine._process_engine_step = wrap(real._process_engine_step, step_row, SYNC_TIMER)[0]
    Engine._handle_client_request = wrap(Engine._handle_client_request, engine.HandleClientRequest(), SYNC)[0]
    return Engine()


def test_the_stages_of_vllms_busy_loop_sum_to_its_wall_time(metrics, clock, monkeypatch):
    loop = _engine(clock)
    boundaries = Boundaries(clock, budget.ENGINE_TO)
    for module in (engine, scheduler):
        monkeypatch.setattr(module, "ENGINE_TO", boundaries)
    start = clock.t
    for _ in range(3):  # run_busy_loop's body, three times; 0.5 s between the calls ("other")
        loop._process_input_queue()
        clock.t += 0.5
        loop._process_engine_step()
    clock.t += 0.25  # the loop is in "other" when the collection comes
    wall = clock.t - start
    recording.flush()  # runs the budget's collection hook
    got = {
        dict(k)["stage"]: v for k, v in metrics.points()[STAGE].items() if dict(k)["dp"] == "0"
    }  # one EngineCore process
    assert got == {
        "idle": 3 * 0.5,
        "input": 3 * 0.0078125,
        "schedule": 3 * 0.125,
        "dispatch": 3 * (0.0625 + 0.03125),
        "wait_workers": 3 * 1.0,
        "update": 3 * 0.25,
        "output": 3 * 0.015625,
        "other": 3 * 0.5 + 0.25,  # between the two calls, then the tail up to the collection
    }
    assert sum(got.values()) == wall
    # The schedule stage and scheduler:duration read the same two clock readings.
    count, seconds, _ = metrics.value(catalogue.PREFIX + "scheduler:duration", dp="0", role="mixed", phase="prefill")
    assert (count, seconds) == (3, got["schedule"])
    # The cost: per pass 9 boundaries, none reading the clock itself (each takes its hook's reading), and at
    # most 2 readings since the boundary before: other's 2 are _handle_client_request's and
    # _process_input_queue's ends, schedule's 2 the _process_engine_step timer's start and schedule()'s;
    # from the second pass, idle's 2 are the engine-step timer's end and _process_input_queue's start.
    assert boundaries.inside == 0
    stages = [budget.IDLE, budget.INPUT, budget.OTHER, budget.SCHEDULE, budget.DISPATCH, budget.WAIT_WORKERS]
    stages += [budget.UPDATE, budget.OUTPUT, budget.OTHER]
    assert boundaries.stages == 3 * stages
    per_pass = [1, 2, 2, 1, 1, 1, 1, 1]  # input, other, schedule, dispatch, wait_workers, update, output, other
    assert boundaries.reads_per_boundary() == [1] + per_pass + 2 * ([2] + per_pass)


def test_a_disabled_budget_costs_no_boundary(monkeypatch):
    monkeypatch.setenv("OTEL_VLLM_ASCEND_DISABLED_METRICS", "engine_core:stage_*")
    assert budget.boundary(budget.ENGINE) is budget.off
    monkeypatch.setenv("OTEL_VLLM_ASCEND_DISABLED_METRICS", "kv_transfer:*")
    assert budget.boundary(budget.ENGINE) == budget.ENGINE.to


def test_the_output_loops_stages_sum_to_its_wall_time(metrics, monkeypatch):
    """vLLM's output handler, in short: await the engine's outputs, process them, the rest (stat
    logging, yields) — through the real hooks of get_output_async and process_outputs."""
    import asyncio

    from opentelemetry_instrumentation_vllm_ascend.handlers import api
    from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import COROUTINE

    clock = patch_clock(monkeypatch, api, budget)

    async def get_output_async(self):
        clock.t += 0.5
        return NS(engine_index=0, outputs=[])

    def process_outputs(self, engine_core_outputs, engine_core_timestamp=None, iteration_stats=None):
        clock.t += 0.25

    get = wrap(get_output_async, api.GetOutput(), COROUTINE)[0]
    process = wrap(process_outputs, api.ProcessOutputs(), SYNC)[0]
    boundaries = Boundaries(clock, budget.API_TO)
    monkeypatch.setattr(api, "API_TO", boundaries)

    async def loop():
        for _ in range(2):
            outputs = await get(None)
            process(None, outputs.outputs, None, None)
            clock.t += 0.125  # stat logging, yielding

    start = clock.t
    asyncio.run(loop())
    wall = clock.t - start
    recording.flush()
    name = catalogue.PREFIX + "api_server:output_loop_stage_seconds"
    got = {dict(k)["stage"]: v for k, v in metrics.points()[name].items()}
    assert got == {"wait_engine": 1.0, "process": 0.5, "other": 0.25}
    assert sum(got.values()) == wall
    # wait_engine, other, process, other per pass: one reading each, taken by the hook, none by the boundary.
    assert boundaries.stages == 2 * [budget.WAIT_ENGINE, budget.API_OTHER, budget.PROCESS, budget.API_OTHER]
    assert (boundaries.reads_per_boundary(), boundaries.inside) == ([1] * 8, 0)


def test_the_clocks_and_kv_state_live_in_state_and_reset_in_place(metrics):
    """The stage clocks are ``STATE``'s (bound once by the hooks: reset in place, never replaced); a closed
    pipeline and ``state.reset()`` (fork, tests) restart them at the next boundary and drop the KV state."""
    from opentelemetry_instrumentation_vllm_ascend import state
    from opentelemetry_instrumentation_vllm_ascend.recording import pipeline

    assert state.STATE.engine_stages is budget.ENGINE and state.STATE.api_stages is budget.API
    budget.ENGINE.to(budget.SCHEDULE, 10.0)
    budget.ENGINE.to(budget.DISPATCH, 10.5)
    assert budget.ENGINE.totals(11.0)[budget.SCHEDULE] == 0.5
    pipeline.reset()  # the final export took the seconds so far: the clock starts again
    assert budget.ENGINE.since is None and budget.ENGINE.totals(12.0) == [0.0] * len(catalogue.ENGINE_STAGES)
    budget.API.to(budget.PROCESS, 1.0)
    state.STATE.kv_bytes_per_token = 4096
    state.STATE.kv_job_phases[7] = "prefill"
    state.reset()
    assert budget.API.since is None and state.STATE.api_stages is budget.API
    assert state.STATE.kv_bytes_per_token == 0 and not state.STATE.kv_job_phases


# -- the worker step ----------------------------------------------------------------------------------

WORKER_STAGE = catalogue.PREFIX + "worker:stage_seconds"
START = catalogue.PREFIX + "worker:stage_start_time"


class _Done(Exception):
    """The stand-in RPC queue is empty: ends vLLM's worker_busy_loop."""


def _runner_class(clock, utils):
    """GPUModelRunner's shape (vLLM 0.32 ``v1/worker/gpu_model_runner.py``): execute_model's preprocess,
    forward and postprocess scopes (an early return inside preprocess when no token is scheduled),
    then sample_tokens' grammar work, sample scope and bookkeeping; every part advances ``clock``."""

    scope = utils.record_function_or_nullcontext

    class Runner:
        def execute_model(self, scheduler_output, intermediate_tensors=None):
            with scope("gpu_model_runner: preprocess"):
                if not scheduler_output.total_num_scheduled_tokens:
                    clock.t += 0.03125
                    return "empty"  # EMPTY_MODEL_RUNNER_OUTPUT
                clock.t += 0.0625
            with scope("gpu_model_runner: forward"):
                clock.t += 0.5
            with scope("gpu_model_runner: postprocess"):
                clock.t += 0.125
            return None

        def sample_tokens(self, grammar_output):
            clock.t += 0.03125  # the grammar bitmask, before sampling
            with scope("gpu_model_runner: sample"):
                clock.t += 0.25
            with scope("gpu_model_runner: bookkeep"):
                clock.t += 0.015625
            return NS(req_ids=["a"])

    Runner.execute_model = wrap(Runner.execute_model, model_runner.ExecuteModel(), SYNC)[0]
    Runner.sample_tokens = wrap(Runner.sample_tokens, model_runner.SampleTokens(), SYNC)[0]
    return Runner


def _worker_proc(clock, runner, rpcs):
    """vLLM's own ``WorkerProc.worker_busy_loop`` / ``_execute_worker_rpc`` and ``Worker.sample_tokens``
    on stand-ins: ``rpcs`` are (seconds the dequeue waits, rpc); each reply takes 1/128 s."""
    from vllm.v1.executor.multiproc_executor import WorkerProc
    from vllm.v1.worker.gpu_worker import Worker

    class Queue:
        def dequeue(self, timeout=None, cancel=None, indefinite=False):
            wait, rpc = rpcs.pop(0)
            clock.t += wait
            if rpc is None:
                raise _Done
            return rpc

    class StandInWorker:
        sample_tokens = Worker.sample_tokens

        def __init__(self):
            self.model_runner = runner

        def execute_model(self, scheduler_output):  # vLLM's adds PP tensor passing around this
            return self.model_runner.execute_model(scheduler_output, None)

    class Proc:
        worker_busy_loop = WorkerProc.worker_busy_loop
        _execute_worker_rpc = WorkerProc._execute_worker_rpc

        def __init__(self):
            self.rank = 0
            self.worker = StandInWorker()
            self.rpc_broadcast_mq = Queue()
            self.replies = []

        def handle_output(self, output):
            clock.t += 0.0078125
            self.replies.append(output)

    return Proc()


def test_the_worker_steps_stages_sum_to_its_wall_time(metrics, monkeypatch, utils):
    """Two model steps (execute_model, then the sample_tokens RPC) and one that schedules nothing,
    through vLLM's worker RPC loop: each stage's seconds hand-computed, their sum the wall time since
    the first step began, the forward stage the forward scope's own readings."""
    from opentelemetry_instrumentation_vllm_ascend.handlers.steps import PHASE_ATTRIBUTE
    from opentelemetry_instrumentation_vllm_ascend.state import STATE

    clock = patch_clock(monkeypatch, model_runner, scopes, budget)
    monkeypatch.setattr(budget, "time", lambda: 1_700_000_000.5)  # the system clock at the first boundary
    STATE.device = None  # the host timeline (CPU)
    runner = _runner_class(clock, utils)()

    def so(tokens):
        return NS(total_num_scheduled_tokens=tokens, **{PHASE_ATTRIBUTE: "decode" if tokens else "idle"})

    rpcs = [
        (1.0, ("execute_model", (so(4),), {}, 0)),  # before the first step: not on the clock
        (0.0625, ("sample_tokens", (None,), {}, 0)),
        (1.0, ("execute_model", (so(4),), {}, 0)),
        (0.0625, ("sample_tokens", (None,), {}, 0)),
        (0.25, ("execute_model", (so(0),), {}, 0)),
        (0.5, None),
    ]
    proc = _worker_proc(clock, runner, rpcs)
    boundaries = Boundaries(clock, budget.WORKER_TO)
    monkeypatch.setattr(model_runner.begin_step, "__defaults__", (boundaries,))
    with pytest.raises(_Done):
        proc.worker_busy_loop()
    assert [r if r is None or r == "empty" else "sampled" for r in proc.replies] == [
        None,
        "sampled",
        None,
        "sampled",
        "empty",
    ]
    start = 100.0 + 1.0  # the first execute_model's start
    wall = clock.t - start
    recording.flush()
    got = {dict(k)["stage"]: v for k, v in metrics.points()[WORKER_STAGE].items()}
    reply = 0.0078125
    assert got == {
        "idle": (reply + 1.0) + (reply + 0.25) + (reply + 0.5),  # after each step's end, up to the collection
        "prepare_inputs": 2 * 0.0625 + 0.03125,  # the step with no token: all of its execute_model
        "forward": 2 * 0.5,
        "wait_sample": 2 * (reply + 0.0625),  # execute_model's reply, waiting for the sample_tokens RPC
        "sample": 2 * 0.25,
        "other": 2 * (0.125 + 0.03125 + 0.015625),  # postprocess; grammar and bookkeeping
    }
    assert sum(got.values()) == wall
    # The forward stage and npu:forward_duration read the same two clock readings.
    count, seconds, _ = metrics.value(catalogue.PREFIX + "npu:forward_duration", dp="0", role="mixed", phase="decode")
    assert (count, seconds) == (2, got["forward"])
    assert list(metrics.points()[START].values()) == [1_700_000_000.5]
    # Each boundary takes a reading its hook takes anyway (none of its own) and costs one: the 3s below are
    # the preprocess, postprocess and bookkeep scopes' own timers (2 readings each, for
    # record_function_or_nullcontext and npu:non_forward_duration) before the boundary's reading.
    assert boundaries.inside == 0
    step = [budget.W_PREPARE, budget.W_FORWARD, budget.W_OTHER, budget.W_WAIT_SAMPLE, budget.W_OTHER]
    step += [budget.W_SAMPLE, budget.W_OTHER, budget.W_IDLE]
    assert boundaries.stages == 2 * step + [budget.W_PREPARE, budget.W_IDLE]
    assert boundaries.reads_per_boundary() == 2 * [1, 3, 1, 3, 1, 1, 1, 3] + [1, 3]


def test_model_runner_v2_without_its_forward_mark_moves_no_boundary_of_the_worker_budget(metrics, monkeypatch, utils):
    """Model runner V2 enters no profiling scopes: without its forward mark (vLLM 0.23, no StepTimingCollector;
    tests/unit/handlers/test_mrv2.py has the budget with it) its steps leave the worker budget absent."""
    from opentelemetry_instrumentation_vllm_ascend.handlers.steps import PHASE_ATTRIBUTE
    from opentelemetry_instrumentation_vllm_ascend.state import STATE

    monkeypatch.setattr(STATE, "mrv2_forward_marked", False)
    clock = patch_clock(monkeypatch, model_runner, scopes, budget)

    class RunnerV2:
        def execute_model(self, scheduler_output, intermediate_tensors=None, dummy_run=False):
            clock.t += 0.5

        def sample_tokens(self, grammar_output):
            clock.t += 0.25
            return "sampled"

    RunnerV2.execute_model = wrap(RunnerV2.execute_model, model_runner.ExecuteModelV2(), SYNC)[0]
    RunnerV2.sample_tokens = wrap(RunnerV2.sample_tokens, model_runner.SampleTokens(), SYNC)[0]
    runner = RunnerV2()
    runner.execute_model(NS(**{PHASE_ATTRIBUTE: "decode"}))
    assert runner.sample_tokens(None) == "sampled"
    recording.flush()
    assert budget.WORKER.since is None
    assert WORKER_STAGE not in metrics.points() and START not in metrics.points()
    assert catalogue.PREFIX + "executor:model_runner_execute_model:duration" in metrics.points()


def test_a_disabled_worker_budget_costs_no_boundary(monkeypatch):
    monkeypatch.setenv("OTEL_VLLM_ASCEND_DISABLED_METRICS", "worker:stage_*")
    assert budget.boundary(budget.WORKER) is budget.off
    assert budget.boundary(budget.ENGINE) == budget.ENGINE.to


def test_two_readers_collecting_at_once_count_a_stage_once(metrics, monkeypatch):
    """Each reader collects in its own thread (the files every few seconds, OTLP on its own interval): when
    their pre-collection steps overlap, the seconds a stage gained since the last flush still go in once."""
    import itertools
    import threading

    from opentelemetry_instrumentation_vllm_ascend.recording import pipeline

    readings = itertools.chain([10.0], itertools.repeat(13.0))  # the start, then every flush's reading
    monkeypatch.setattr(budget, "perf_counter", lambda: next(readings))
    clock = budget.ENGINE
    clock.to(budget.IDLE, budget.perf_counter())
    both_read = threading.Barrier(2, timeout=0.5)
    waited = set()

    class Reported(list):
        """The clock's reported seconds: each thread's first read of them waits for the other's (as a
        thread switch right after it would)."""

        def __getitem__(self, index):
            value = super().__getitem__(index)
            if threading.get_ident() not in waited:
                waited.add(threading.get_ident())
                try:
                    both_read.wait()
                except threading.BrokenBarrierError:  # the other thread could not get there: a lock held it
                    pass
            return value

    clock.reported = Reported(clock.reported)
    threads = [threading.Thread(target=pipeline.before_collect) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    got = {dict(k)["stage"]: v for k, v in metrics.points()[STAGE].items()}
    assert got == {"idle": 3.0}


# -- vLLM 0.34+: requests handled while the step waits for its output ------------------------------------------

_V034 = [v for v in supported.VLLM if Version(v) >= Version("0.34.0")]


@pytest.mark.parametrize("version", _V034)
def test_requests_handled_while_the_step_waits_are_input_not_waiting(metrics, clock, monkeypatch, version):
    """vLLM 0.34's own ``EngineCore.step``, ``EngineCoreProc._wait_for_output``, ``_process_input_queue`` and
    ``_process_engine_step`` (compiled from its source) on the stand-in engine. While each step waits, a client
    ADD arrives during the spin (``wait_briefly``) and is handled there (``_handle_client_request``), then a
    UTILITY call arrives and is deferred to the next pass. The ADD's handling is the budget's ``input`` stage,
    not ``wait_workers``, and ``process_input_queue:duration``'s next observation holds it (with the deferred
    call's): every second vLLM spent on a client request is input, every other second of the wait is waiting."""
    from tests.contract.test_vllm import tree_for

    tree = tree_for(version)
    namespace = dict(vars(core))
    assignments(tree, _CORE, ("_INPUTS_HANDLED_DURING_STEP", "_INPUT_SPIN_DURATION_S"), namespace)
    namespace["time"] = NS(monotonic=lambda: clock.t, sleep=lambda s: None)
    namespace["get_watch_dog"] = lambda: NS(feed=lambda: None, disable=contextlib.nullcontext)
    own = functions(
        tree,
        _CORE,
        (
            "EngineCore.step",
            "EngineCoreProc._wait_for_output",
            "EngineCoreProc._process_input_queue",
            "EngineCoreProc._process_engine_step",
        ),
        namespace,
    )
    loop = _engine(clock)
    Engine = type(loop)
    Request = core.EngineCoreRequestType

    class Future:
        """FutureWrapper's 0.34 shape: ``poll`` (done yet?) and ``wait_briefly`` (a spin: 0.25 s, in which a
        client request arrives: first an ADD, then a UTILITY call), then ``result`` (0.5 s more)."""

        def __init__(self):
            self.arrivals = [(Request.ADD, None), (Request.UTILITY, None)]

        def poll(self):
            return False

        def wait_briefly(self, pending, deadline):
            clock.t += 0.25
            loop.input_queue.put(self.arrivals.pop(0))

        def result(self):
            clock.t += 0.5
            return object()

    Engine.step = wrap(own["EngineCore.step"], handler_of("vllm.v1.engine.core:EngineCore.step"), SYNC_TIMER)[0]
    Engine._wait_for_output = own["EngineCoreProc._wait_for_output"]
    Engine._process_input_queue = wrap(own["EngineCoreProc._process_input_queue"], engine.ProcessInputQueue(), SYNC)[0]
    step_row = handler_of("vllm.v1.engine.core:EngineCoreProc._process_engine_step")
    Engine._process_engine_step = wrap(own["EngineCoreProc._process_engine_step"], step_row, SYNC_TIMER)[0]
    loop._deferred_inputs = deque()
    loop.model_executor.execute_model = lambda scheduler_output, non_block=False: (
        setattr(clock, "t", clock.t + 0.0625) or Future()
    )
    start = clock.t
    for _ in range(3):
        loop._process_input_queue()
        clock.t += 0.5
        loop._process_engine_step()
    wall = clock.t - start
    recording.flush()
    got = {dict(k)["stage"]: v for k, v in metrics.points()[STAGE].items() if dict(k)["dp"] == "0"}
    handle = 0.0078125  # each client request's handling (busy_loop_engine)
    assert got == {
        "idle": 0.5,  # the first pass blocks until the first request; later passes find work
        # first pass: one request; each step: the ADD handled while waiting; passes 2 and 3: the deferred UTILITY
        "input": handle + 3 * handle + 2 * handle,
        "schedule": 3 * 0.125,
        "dispatch": 3 * (0.0625 + 0.03125),
        "wait_workers": 3 * (0.25 + 0.25 + 0.5),  # two spins and the blocking result, not the ADD
        "update": 3 * 0.25,
        "output": 3 * 0.015625,
        "other": 3 * 0.5,
    }
    assert sum(got.values()) == wall
    count, seconds, _ = metrics.value(catalogue.PREFIX + "engine_core:process_input_queue:duration", **_ALL)
    # pass 1: its request; passes 2, 3: the ADD handled during the step before, then the deferred UTILITY
    assert (count, seconds) == (3, handle + 2 * (handle + handle))
    assert STATE.input_in_step == handle  # the last step's ADD waits for the next pass


def test_a_clock_that_fails_to_flush_loses_only_its_own_budget(metrics, clock, monkeypatch, caplog):
    """Narrow degradation at collection: the EngineCore's clock is broken (its totals cannot be read); the
    other clocks (here the API server's, flushed after it) still record their stages exactly; one warning names
    the failed clock."""
    import logging

    budget.ENGINE.to(budget.INPUT, 10.0)
    budget.API.to(budget.PROCESS, 10.0)
    budget.API.to(budget.API_OTHER, 10.5)
    monkeypatch.setattr(budget.ENGINE, "spent", None)  # list(None): the engine clock's totals raise
    with caplog.at_level(logging.WARNING):
        budget.flush()
        budget.flush()
    api = catalogue.PREFIX + "api_server:output_loop_stage_seconds"
    got = {dict(k)["stage"]: v for k, v in metrics.points()[api].items()}
    assert got == {"process": 0.5, "other": clock.t - 10.5}
    assert STAGE not in metrics.points()
    warnings = [r.getMessage() for r in caplog.records if "stage budget" in r.getMessage()]
    assert len(warnings) == 1 and "engine_core:stage_seconds" in warnings[0]
