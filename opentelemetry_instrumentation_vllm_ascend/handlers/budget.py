"""Exclusive time budgets: one clock per loop that is always in exactly one ``stage``, so the seconds
of its stages never overlap and sum to the loop's wall time since the clock started.

A boundary is one ``StageClock.to(stage, now)`` call with a ``perf_counter()`` reading the hook took
anyway (the same reading as its own timer where it has one: the ``schedule`` stage and
``scheduler:duration`` share both readings); no hook reads the clock more than once for it. The
seconds reach the ``engine_core:stage_seconds`` counter at each collection (``flush``): the stage in
progress counts up to that moment, so a collection never misses the time of a long stage.

EngineCore busy loop (vLLM 0.23-0.34 ``EngineCoreProc.run_busy_loop``: ``_process_input_queue`` then
``_process_engine_step``, whose ``step()`` schedules, sends the step to the workers, asks for the
grammar bitmask, waits for the output and updates the scheduler; ``tests/contract/test_budget.py`` checks
that order in each version's source):

- ``idle``: ``_process_input_queue`` blocked on the input queue while the engine had no work;
- ``input``: the rest of ``_process_input_queue`` (handling client requests: adds, aborts, utility calls); from
  vLLM 0.34 also each request ``_wait_for_output`` handles while the step waits (adds, aborts, wake-ups, executor
  failures: ``_handle_client_request`` outside a pass), after which the interrupted ``wait_workers`` resumes;
- ``schedule``: ``Scheduler.schedule``;
- ``dispatch``: from ``schedule()``'s return to the wait for the workers (sending the execute_model RPC,
  building the grammar bitmask; with the batch queue also the non-blocking sample_tokens RPC, up to the
  call's return when it does not wait);
- ``telemetry``: this package's deferred scheduler records, run inside ``get_grammar_bitmask`` every
  ``FLUSH_STEPS`` steps (the instrumentation's own cost, made visible); the stage it interrupted resumes;
- ``wait_workers``: from the call of ``capture_iteration_details`` (vLLM 0.23: ``log_iteration_details``),
  the context manager ``step`` and ``step_with_batch_queue`` open right before ``future.result()`` (vLLM 0.34:
  ``self._wait_for_output(future)``, which spins on ``poll`` / ``wait_briefly`` before it), to
  ``update_from_output`` (waiting for the workers' output, step()'s blocking sample_tokens RPC, vLLM's
  abort queue); also the DP engine's dummy batch, which runs inside the same context manager;
- ``update``: ``Scheduler.update_from_output``;
- ``output``: from ``update_from_output``'s return to ``post_step``'s call (queueing the outputs to the
  clients; the batch queue's deferred structured-output sampling, which follows the update);
- ``other``: everything else in the loop (``post_step`` and the short sleep of a step that ran no model,
  publishing DP request counts, the shutdown check; an idle ``step()`` that found no requests; a
  ``_process_input_queue`` pass whose ``has_work()`` cannot be read, logged once: idle cannot be told from input).

With the batch queue (async scheduling, pipeline parallelism) ``step_with_batch_queue`` calls the same
hooked methods in another order, and a call may schedule without waiting or wait without scheduling; the
wait begins at the same context manager, so each stage keeps its meaning there
(``tests/unit/test_batch_queue.py`` replays vLLM's own function, stage by stage).

Worker step (``worker:stage_seconds``; the thread that runs the model runner's ``execute_model`` and
``sample_tokens``: a worker process's RPC loop, or the EngineCore's thread with an in-process worker).
Host time: on a device that computes asynchronously a stage holds the host's work in it (launching
kernels) and the device's only where the host waits for it. The boundaries are the readings the model
runner hooks take anyway (``model_runner.ExecuteModel``, ``SampleTokens``, the forward and sample
profiling scopes); the clock starts at the first step:

- ``idle``: between steps: from the end of a step (``sample_tokens``' return, or an ``execute_model``
  that returned the output itself) to the next ``execute_model`` call: waiting for the next RPC, and
  the worker's own RPC handling (reading the request, sending the reply);
- ``prepare_inputs``: from ``execute_model``'s start to its forward scope (``gpu_model_runner: forward``;
  NPU: ``forward``): updating the persistent batch, preparing inputs and attention metadata; all of an
  ``execute_model`` that runs no forward (a step with no tokens, a KV-connector-only step);
- ``forward``: the forward scope (MRV1: with the KV connector's loads and save wait, which its
  ``maybe_get_kv_connector_output`` context runs inside it);
- ``wait_sample``: from ``execute_model``'s return of None to ``sample_tokens``' call (waiting for the
  EngineCore's sample_tokens RPC and its grammar bitmask);
- ``sample``: the sample scope (``gpu_model_runner: sample``; NPU: ``sample_token``);
- ``other``: the rest of the step: in ``execute_model`` after the forward (post-processing: logits),
  in ``sample_tokens`` before and after sampling (grammar, drafting, bookkeeping, building the output).

What the hooks record after a call returned (the step's timers) lands in the stage that return
opened (``idle`` or ``wait_sample``): the instrumentation's own cost in the worker is not a stage.

Model runner V2 enters no profiling scopes: from vLLM 0.30 its own methods are the boundaries
(``model_runner.ForwardStartV2``: ``StepTimingCollector.forward_start()`` opens ``forward``, execute_model's
return ends it; ``model_runner.SampleV2``: its ``sample`` method, logits included, is ``sample``). Without
that mark (vLLM 0.23's V2, the 0.34 standalone CPU runner) its forward cannot be told from its input
preparation: its steps move no boundary and the worker budget is absent there (``paths.py``).

Each clock also sets its start gauge (``catalogue.STAGE_STARTS``: ``engine_core:stage_start_time`` &
co.): the system clock (``time.time()``) read once, at the clock's first boundary. It is the independent
oracle of the wall time the stages cover: an export's stage sum equals its collection's timestamp minus
this start (tests/e2e/test_kv_transfer.py).

Runtime control (``recording.control.set_state``): when a clock's metric is switched off (recording off,
or a pattern matching it), the clock pauses: its totals are noted and nothing is flushed; some of its
boundaries may stop moving meanwhile (rows that feed only the budget are uninstalled). When it is switched
on again it resumes: the seconds each stage gained while off are excluded from that stage, and the start
gauge moves forward by the time it was off, so the stages still sum to ``time() - start`` and a stage's
seconds are only ones counted while on. Until the loop's next boundary after ``on``, its seconds count
in the stage in progress when it went off. The totals are read from the control's thread, like a
collection reads them: a reading that races a boundary can misplace that one boundary's seconds.
"""

from __future__ import annotations

from time import perf_counter, time

from .. import context, environment, recording
from ..catalogue import API_STAGES, ENGINE_STAGES, STAGE_STARTS, WORKER_STAGES, M
from ..hooks.handler import report
from ..state import STATE

IDLE, INPUT, SCHEDULE, DISPATCH, TELEMETRY, WAIT_WORKERS, UPDATE, OUTPUT, OTHER = range(len(ENGINE_STAGES))
WAIT_ENGINE, PROCESS, API_OTHER = range(len(API_STAGES))
W_IDLE, W_PREPARE, W_FORWARD, W_WAIT_SAMPLE, W_SAMPLE, W_OTHER = range(len(WORKER_STAGES))


class StageClock:
    """Seconds per stage index; ``since`` is None until the first boundary starts the clock (and reads
    the system clock once: ``started_unix``, which ``flush`` sets as the start gauge ``start_spec``)."""

    __slots__ = (
        "names",
        "spent",
        "stage",
        "since",
        "started",
        "started_unix",
        "reported",
        "spec",
        "labels",
        "start_spec",
        "excluded",
        "shift",
        "paused",
        "marks",
    )

    def __init__(self, names: tuple[str, ...], spec) -> None:
        self.names = names
        self.spec = spec
        self.start_spec = M[STAGE_STARTS[spec.seed]]
        self.started_unix: float | None = None
        self.spent = [0.0] * len(names)
        self.reported = [0.0] * len(names)
        self.stage = len(names) - 1
        self.since: float | None = None
        self.started: float | None = None
        self.labels: dict = {}
        #: Seconds per stage gained while runtime control had the metric off (not counted), and the time the
        #: start gauge moved forward for them; ``paused``: (totals, time()) when it went off, None while on.
        self.excluded = [0.0] * len(names)
        self.shift = 0.0
        self.paused: tuple | None = None
        #: The worker step's boundaries while step records are on (``to_marked``): ``[stage, now, stage, now, …]``.
        self.marks: list = []

    def to(self, stage: int, now: float) -> None:
        """Close the stage in progress at ``now`` and open ``stage``."""
        since = self.since
        if since is None:
            self.started = now
            self.started_unix = time()
        else:
            self.spent[self.stage] += now - since
        self.stage = stage
        self.since = now

    def to_marked(self, stage: int, now: float) -> None:
        """``to``, also noting the boundary in ``marks`` (the worker step's, for its step record: one list
        extend more per boundary, no call more)."""
        self.marks += (stage, now)
        since = self.since
        if since is None:
            self.started = now
            self.started_unix = time()
        else:
            self.spent[self.stage] += now - since
        self.stage = stage
        self.since = now

    def totals(self, now: float) -> list[float]:
        """Seconds per stage up to ``now``, the stage in progress included."""
        totals = list(self.spent)
        since = self.since
        if since is not None:
            totals[self.stage] += now - since
        return totals

    def flush(self, now: float | None = None) -> None:
        """Add what each stage gained since the last flush to the counter (the stage in progress
        up to ``now``). A reading that raced a boundary in the loop's thread is caught up later.
        Nothing while paused (the metric is switched off)."""
        if self.since is None or self.paused is not None:
            return
        totals = self.totals(perf_counter() if now is None else now)
        excluded = self.excluded
        for index, value in enumerate(totals):
            value -= excluded[index]
            gained = value - self.reported[index]
            if gained > 0:
                self.reported[index] = value
                recording.add(self.spec, gained, self._labels(index))
        started = self.started_unix
        if started is not None:
            recording.set_gauge(self.start_spec, started + self.shift, (context.PROCESS.dp, context.PROCESS.role))

    def pause(self) -> None:
        """Runtime control switched the metric off: note the totals (None: not started yet) and the time."""
        if self.paused is None:
            if self.since is None:
                self.paused = (None, 0.0)
            else:
                self.paused = (self.totals(perf_counter()), time())

    def resume(self) -> None:
        """Switched on again: exclude what each stage gained while off, move the start by the time off."""
        paused = self.paused
        if paused is None:
            return
        self.paused = None
        if self.since is None:
            return  # not started (or reset meanwhile): it starts at its next boundary
        at_pause, unix = paused
        totals = self.totals(perf_counter())
        if at_pause is None:  # it started while off: none of its seconds so far were on
            at_pause, unix = [0.0] * len(totals), self.started_unix
        for index, value in enumerate(totals):
            self.excluded[index] += value - at_pause[index]
        self.shift += time() - unix

    def _labels(self, index: int) -> tuple:
        key = (context.PROCESS.dp, context.PROCESS.role, index)
        labels = self.labels.get(key)
        if labels is None:
            labels = self.labels[key] = (key[0], key[1], self.names[index])
        return labels

    def reset(self) -> None:
        self.spent = [0.0] * len(self.names)
        self.reported = [0.0] * len(self.names)
        self.stage = len(self.names) - 1
        self.since = None
        self.started = None
        self.started_unix = None
        self.labels = {}
        self.excluded = [0.0] * len(self.names)
        self.shift = 0.0
        self.paused = None


#: The EngineCore busy loop's clock (one loop per EngineCore process); ``state.reset()`` and a closed
#: pipeline reset it in place (the seconds so far were the old pipeline's: it starts again at the next
#: boundary).
ENGINE = STATE.engine_stages = StageClock(ENGINE_STAGES, M["engine_core:stage_seconds"])


def off(stage: int, now: float) -> None:
    pass


#: ``to`` of the engine clock, bound once: hooks call ``ENGINE_TO(stage, now)`` (a no-op when the metric
#: is disabled by OTEL_VLLM_ASCEND_DISABLED_METRICS).
def boundary(clock: StageClock):
    """The boundary function hooks call for ``clock``: a no-op when its metric is disabled (read once,
    at import: the hooks bind it then)."""
    return off if environment.metric_disabled(clock.spec.seed) else clock.to


ENGINE_TO = boundary(ENGINE)
#: The API server's output loop (``catalogue.API_STAGES``): ``AsyncMPClient.get_output_async`` is
#: ``wait_engine``, ``OutputProcessor.process_outputs`` is ``process``, the rest ``other``.
API = STATE.api_stages = StageClock(API_STAGES, M["api_server:output_loop_stage_seconds"])
API_TO = boundary(API)
#: The worker step's (``catalogue.WORKER_STAGES``): the model runner hooks call ``WORKER_TO`` through
#: their step (``model_runner.WorkerStep.to``: a no-op for model runner V2 without its forward mark).
WORKER = STATE.worker_stages = StageClock(WORKER_STAGES, M["worker:stage_seconds"])
WORKER_TO = boundary(WORKER)
#: ``WORKER_TO`` that also notes each boundary of the step (``StageClock.to_marked``): the model runner hooks use it
#: while step records are on in this process (``model_runner.begin_step``).
WORKER_MARKED = off if WORKER_TO is off else WORKER.to_marked
CLOCKS = (ENGINE, API, WORKER)


def flush() -> None:
    """Each clock's seconds so far into its counter (a pre-collection step of ``recording.pipeline``, which
    ``instrument()`` registers: it runs at the start of every collection). A clock that fails to flush is
    reported once and loses only its own budget."""
    for clock in CLOCKS:
        try:
            clock.flush()
        except Exception:
            report(_Budget, f"flush {clock.spec.seed}")


class _Budget:
    name = "stage budget"
