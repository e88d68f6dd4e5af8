"""API server side: vLLM's per-engine stats updates, request-level latencies, the output loop's work
and its time budget. The frontend's plain timers (adding, generating, aborting, chat completions,
input processing) are declarative rows (targets.py).

Labels (see catalogue.py):
- ``dp`` / ``engine``: values that come with an engine index (``StatLoggerManager.record``) carry
  that engine's index in both; hooks that do not know the engine use ``context.PROCESS.dp``.
- ``phase``: per-iteration sizes and ``record``'s duration carry the phase of the iteration the
  stats describe (:func:`iteration_phase`); request-level latencies and their counters, and frontend
  work not tied to one iteration, carry ``all``.

Nothing here imports vLLM: every handler reads plain attributes (with defaults) of the objects vLLM
passes, so all are testable on plain objects.
"""

from __future__ import annotations

from time import perf_counter

from .. import catalogue, context, recording, semconv
from ..catalogue import ALL, TTFT_THRESHOLDS
from ..hooks.handler import Handler, report
from ..state import STATE, UNKNOWN
from .budget import API_OTHER, API_TO, PROCESS, WAIT_ENGINE
from .traces import INBOUND, TRACKER, genai_operation

M = catalogue.BY_SEED
BATCH_SIZE = M["batch_size"]
WAITING_BATCH_SIZE = M["waiting_batch_size"]
NUM_SPEC_TOKENS = M["num_spec_tokens"]
TOTAL_TOKENS = M["total_tokens"]
INPUT = M["input"]
OUTPUT = M["output"]
TTFT = M["fine_grained_ttft"]
TPOT = M["fine_grained_tpot"]
SECOND_TOKEN = M["second_token_latency"]
DECODE_OVER_1S = M["decode_over_1s_count"]
PREFILL_OVER_THRESHOLD = M["prefill_over_threshold_count"]
RECORD_STATS = M["async_llm:record_stats:duration"]
OUTPUT_PROCESSOR = M["output_processor_duration"]
OUTPUTS_LEN = M["engine_core_outputs_len"]
HEALTH_CHECK_FAILED = M["health_check_failed"]
ASYNC_ADD_REQUEST = M["engine:async_add_request:duration"]

#: An inter-token latency above this many seconds counts in decode_over_1s_count.
SLOW_ITL_SECONDS = 1.0


def _phase(first_tokens: int, prompt_tokens: int, generated: int) -> str:
    """prefill / decode / mixed / idle from an iteration's (or a part of it) token counts.

    A request that completes its prefill in an iteration also samples its first token there, which
    vLLM counts among the generated tokens; so "decode" work is the generated tokens beyond one
    first token per request that completed its prefill (``first_tokens``)."""
    prefill = first_tokens > 0 or prompt_tokens > 0
    decode = generated > first_tokens
    if prefill:
        return "mixed" if decode else "prefill"
    return "decode" if decode else "idle"


def _prompt_tokens(iteration_stats) -> int:
    # IterationStats.num_prompt_tokens: an int attribute in old vLLM, a property over
    # prompt_token_stats.total (all prompt tokens of requests that completed prefill) since.
    value = getattr(iteration_stats, "num_prompt_tokens", None)
    if value is None:
        value = getattr(getattr(iteration_stats, "prompt_token_stats", None), "total", 0)
    return value or 0


def iteration_phase(iteration_stats) -> str:
    """The phase of the iteration an ``IterationStats`` describes (``idle`` for None): ``prefill``
    when requests completed their prefill in it (first tokens), ``decode`` when requests generated
    further tokens, ``mixed`` both, ``idle`` neither."""
    if iteration_stats is None:
        return "idle"
    return _phase(*_token_counts(iteration_stats))


def _token_counts(iteration_stats) -> tuple:
    """(first tokens, prompt tokens, generated tokens) an ``IterationStats`` has counted so far."""
    return (
        len(getattr(iteration_stats, "time_to_first_tokens_iter", None) or ()),
        _prompt_tokens(iteration_stats),
        getattr(iteration_stats, "num_generation_tokens", 0) or 0,
    )


#: Index of the engine whose outputs the API server's output loop is processing: set when the loop
#: receives an EngineCoreOutputs (``get_output_async``); it processes them (``process_outputs``, the
#: per-request stats updates) before it asks for the next, in one task.
# (STATE.current_engine)


def _api_labels(phase: str) -> tuple:
    """(dp, role, phase, engine) of a value from the output loop: the engine whose outputs are being
    processed, or, before any arrived, this process's dp twice."""
    engine = STATE.current_engine
    if engine is None:
        return context.step_labels(phase) + (context.PROCESS.dp,)
    return (engine, context.PROCESS.role, phase, engine)


class GetOutput(Handler):
    """``AsyncMPClient.get_output_async`` (COROUTINE): the engine index of the outputs just received."""

    reads_args = 0

    def before(self, args, kwargs):
        API_TO(WAIT_ENGINE, perf_counter())  # the output loop's time budget

    def after(self, state, args, kwargs, result):
        API_TO(API_OTHER, perf_counter())
        index = getattr(result, "engine_index", None)
        STATE.current_engine = str(index) if isinstance(index, int) else None

    def error(self, state, args, kwargs, exc):
        API_TO(API_OTHER, perf_counter())


# -- StatLoggerManager.record ---------------------------------------------------------------------


class RecordStats(Handler):
    """``StatLoggerManager.record(self, scheduler_stats, iteration_stats, mm_cache_stats=None,
    engine_idx=None)`` (vLLM calls it with keywords), as a SYNC_TIMER: after each call, one engine
    update's values, labelled ``dp = engine = str(engine_idx)`` (None is engine 0, as in vLLM):

    - with ``scheduler_stats``: ``batch_size`` (running requests), ``waiting_batch_size`` (waiting
      requests, deferred ones included — vLLM's ``vllm:num_requests_waiting``) and, when the step
      verified drafts (``spec_decoding_stats`` present), ``num_spec_tokens`` (its draft tokens);
    - with ``iteration_stats``: ``input`` / ``output`` / ``total_tokens`` (prompt tokens of the
      requests that completed prefill, generated tokens, their sum), each TTFT into
      ``fine_grained_ttft`` and ``prefill_over_threshold_count`` (once under every threshold it
      exceeds), ``decode_over_1s_count`` (ITLs over 1 s, each once), and, per finished request with
      at least two generated tokens, ``fine_grained_tpot`` = decode_time / (tokens - 1) (vLLM's
      ``vllm:request_time_per_output_token_seconds`` value, without its 0 for shorter requests);
    - the call's duration into ``async_llm:record_stats:duration``.

    Sizes and the duration carry the iteration's phase; per-request latencies and counters ``all``.
    A call that raised records nothing (its caller, vLLM's output handler, fails with it).
    """

    params = ("scheduler_stats", "iteration_stats", "mm_cache_stats", "engine_idx")

    def timed(self, seconds, args, kwargs, result, _record=recording.record, _add=recording.add):
        scheduler_stats = args[1]
        iteration_stats = args[2]
        engine_idx = args[4]
        engine = "0" if engine_idx is None else str(engine_idx)
        role = context.PROCESS.role
        # Each independent read is guarded on its own (free while nothing raises): a field vLLM renamed or retyped
        # costs only the values read from it, reported once and counted (hook_errors), never the whole update.
        try:
            phase = iteration_phase(iteration_stats)
        except Exception:
            report(self, "iteration phase")
            phase = UNKNOWN
        labels = (engine, role, phase, engine)

        if scheduler_stats is not None:
            try:  # SchedulerStats' fields (every supported vLLM has them): a missing one is reported, never a 0
                running = scheduler_stats.num_running_reqs
                waiting = scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
            except Exception:
                report(self, "scheduler_stats queues")
            else:
                _record(BATCH_SIZE, running, labels)
                _record(WAITING_BATCH_SIZE, waiting, labels)
            spec = getattr(scheduler_stats, "spec_decoding_stats", None)
            if spec is not None:
                try:
                    drafts = spec.num_draft_tokens
                except Exception:
                    report(self, "spec_decoding_stats")
                else:
                    _record(NUM_SPEC_TOKENS, drafts, labels)

        if iteration_stats is not None:
            request_labels = (engine, role, ALL, engine)
            try:
                prompt = _prompt_tokens(iteration_stats)
                generated = getattr(iteration_stats, "num_generation_tokens", 0) or 0
                total = prompt + generated
            except Exception:
                report(self, "token counts")
            else:
                _record(INPUT, prompt, labels)
                _record(OUTPUT, generated, labels)
                _record(TOTAL_TOKENS, total, labels)
            try:
                ttfts = getattr(iteration_stats, "time_to_first_tokens_iter", None) or ()
                if ttfts:
                    over = [0] * len(TTFT_THRESHOLDS)
                    for ttft in ttfts:
                        for i, (_, limit) in enumerate(TTFT_THRESHOLDS):
                            if ttft > limit:
                                over[i] += 1
                    for ttft in ttfts:
                        _record(TTFT, ttft, request_labels)
                    for (threshold, _), count in zip(TTFT_THRESHOLDS, over):
                        _add(PREFILL_OVER_THRESHOLD, count, request_labels + (threshold,))
            except Exception:
                report(self, "time_to_first_tokens_iter")
            try:
                itls = getattr(iteration_stats, "inter_token_latencies_iter", None) or ()
                if itls:
                    _add(DECODE_OVER_1S, sum(1 for itl in itls if itl > SLOW_ITL_SECONDS), request_labels)
            except Exception:
                report(self, "inter_token_latencies_iter")
            try:
                tpots = [
                    finished.decode_time / (tokens - 1)
                    for finished in getattr(iteration_stats, "finished_requests", None) or ()
                    if (tokens := getattr(finished, "num_generation_tokens", 0) or 0) >= 2
                ]
            except Exception:
                report(self, "finished_requests")
            else:
                for tpot in tpots:
                    _record(TPOT, tpot, request_labels)

        _record(RECORD_STATS, seconds, labels)


# -- IterationStats.update_from_output ------------------------------------------------------------


class SecondTokenLatency(Handler):
    """``IterationStats.update_from_output(self, output, engine_core_timestamp, is_prefilling,
    req_stats, …)``, once per request output per iteration (kept cheap: no ``before``, an early
    return for prefilling outputs). After the call, an output of a request past its prefill whose new
    tokens include the request's second generated token (``req_stats.num_generation_tokens`` was 1
    before this output) records ``engine_core_timestamp - req_stats.first_token_ts``: both are engine
    core timestamps (the same monotonic clock), and ``first_token_ts`` is only set by the prefilling
    output. Labels: this process's dp (the hook does not know the engine), phase ``all``."""

    params = ("output", "engine_core_timestamp", "is_prefilling", "req_stats")
    #: In the wrapper: only an output that brought the request's second generated token reaches after().
    after_if = "not is_prefilling and req_stats.num_generation_tokens - len(output.new_token_ids) == 1"

    def after(self, state, args, kwargs, result, _record=recording.record):
        if args[3]:  # is_prefilling: the first token (or none yet)
            return
        new = len(getattr(args[1], "new_token_ids", None) or ())
        if not new:
            return
        req_stats = args[4]
        if getattr(req_stats, "num_generation_tokens", 0) - new != 1:
            return
        first = getattr(req_stats, "first_token_ts", 0.0)
        timestamp = args[2]
        if not first or timestamp is None:
            return
        _record(SECOND_TOKEN, timestamp - first, _api_labels(ALL))


# -- AsyncLLM ---------------------------------------------------------------------------------------


class CheckHealth(Handler):
    """``AsyncLLM.check_health`` (COROUTINE): +1 ``health_check_failed`` when it raises (an
    Exception: a cancelled health check is not a failure). Labels: this process's dp, phase ``all``."""

    reads_args = 0

    def error(self, state, args, kwargs, exc):
        if isinstance(exc, Exception):
            recording.add(HEALTH_CHECK_FAILED, 1, context.step_labels(ALL))


# -- OutputProcessor.process_outputs ---------------------------------------------------------------


class ProcessOutputs(Handler):
    """``OutputProcessor.process_outputs(self, engine_core_outputs, engine_core_timestamp=None,
    iteration_stats=None, …)`` (SYNC): one chunk of an engine update (AsyncLLM splits an update into
    chunks sharing one IterationStats). Records the call's duration (``output_processor_duration``)
    and ``len(engine_core_outputs)`` (``engine_core_outputs_len``), labelled with the phase of the
    work in this chunk — the change of ``iteration_stats`` over the call, by the rule of
    :func:`iteration_phase` — or ``all`` without iteration_stats; dp/engine: the engine whose
    outputs the output loop is processing (see :class:`GetOutput`).
    A call that raised records nothing."""

    params = ("engine_core_outputs", "engine_core_timestamp", "iteration_stats")

    def before(self, args, kwargs):
        stats = args[3]
        if TRACKER.on:  # request traces (handlers/traces.py): the chunk's engine events and timestamps
            try:
                TRACKER.outputs(args[1], args[2], stats)
            except Exception:
                report(self, "traces")
        start = perf_counter()
        API_TO(PROCESS, start)
        try:  # the chunk's phase only: its duration and length do not depend on it
            counts = None if stats is None else _token_counts(stats)
        except Exception:
            report(self, "iteration_stats")
            counts = UNKNOWN
        return start, counts

    def after(self, state, args, kwargs, result):
        start, counts = state
        end = perf_counter()
        API_TO(API_OTHER, end)
        seconds = end - start
        if counts is None:
            phase = ALL
        elif counts is UNKNOWN:
            phase = UNKNOWN
        else:
            try:
                first, prompt, generated = _token_counts(args[3])
                phase = _phase(first - counts[0], prompt - counts[1], generated - counts[2])
            except Exception:
                report(self, "iteration_stats")
                phase = UNKNOWN
        labels = _api_labels(phase)
        recording.record(OUTPUT_PROCESSOR, seconds, labels)
        outputs = args[1]
        try:
            length = len(outputs) if outputs is not None else 0
        except Exception:
            report(self, "engine_core_outputs")
            return
        recording.record(OUTPUTS_LEN, length, labels)


# -- IterationStats.update_from_finished_request: the GenAI semantic conventions' server metrics ---------

GENAI_DURATION = M[semconv.GEN_AI_SERVER_REQUEST_DURATION]
GENAI_TPOT = M[semconv.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN]
GENAI_TTFT = M[semconv.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN]
_GENAI_ERRORS = frozenset(catalogue.GENAI_ERROR_TYPES)


def set_served_model(vllm_config) -> None:
    """``gen_ai.request.model``: this API server's served model name (vLLM's ``model_name`` label), kept in
    ``STATE.served_model`` when its AsyncLLM is built; None (no attribute) before."""
    name = getattr(getattr(vllm_config, "model_config", None), "served_model_name", None)
    if isinstance(name, (list, tuple)):  # ModelConfig normalises it to the first name; a list is tolerated
        name = name[0] if name else None
    STATE.served_model = name if isinstance(name, str) else None
    STATE.genai_labels.clear()


def _labels_of(operation: str, error, _cache=STATE.genai_labels) -> tuple:
    """(request.duration's label values, the other two's) of a request."""
    labels = _cache.get((operation, error))
    if labels is None:
        short = (operation, catalogue.GENAI_PROVIDER, STATE.served_model)
        labels = _cache[(operation, error)] = (short + (error,), short)
    return labels


class FinishedRequest(Handler):
    """``IterationStats.update_from_finished_request(self, finish_reason, request_id, num_prompt_tokens,
    max_tokens_param, req_stats, …)`` (vLLM's output processor calls it, with keywords, once per request
    it finishes; ``request_id`` is the external id, e.g. ``chatcmpl-…``). After the call, from the
    ``FinishedRequestStats`` it appended and from ``req_stats``:

    - ``gen_ai.server.request.duration``: its ``e2e_latency`` (vLLM's e2e latency value), ``error.type`` the
      finish reason when it is ``abort`` or ``error``;
    - for a request that did not fail: ``gen_ai.server.time_to_first_token`` = ``req_stats.first_token_latency``
      (the value vLLM put into its TTFT histogram for it; none if it produced no token) and, with at least two
      generated tokens, ``gen_ai.server.time_per_output_token`` = decode_time / (tokens - 1).

    When the request's trace is exported (OTEL_VLLM_ASCEND_TRACES, docs/traces.md), each of these values carries
    it as an exemplar: vLLM finishes the request (``OutputProcessor._finish_request``, where the trace is decided)
    just before it records these stats, and the trace's request span lasts exactly ``e2e_latency``."""

    params = ("finish_reason", "request_id", "num_prompt_tokens", "max_tokens_param", "req_stats")

    def after(self, state, args, kwargs, result, _record=recording.record):
        finished = getattr(args[0], "finished_requests", None)
        if not finished:
            return
        finished = finished[-1]
        reason = str(args[1])  # FinishReason.__str__: stop, length, abort, error, repetition
        error = reason if reason in _GENAI_ERRORS else None
        labels, short = _labels_of(genai_operation(args[2]), error)
        # The request's trace, when it is exported (handlers/traces.py): each value carries it as an exemplar.
        ids = TRACKER.exported_ids(args[5]) if TRACKER.on else None
        if ids is not None:
            trace_id, span_id = ids

            def _record(spec, value, labels, _exemplar=recording.record_exemplar):
                _exemplar(spec, value, labels, trace_id, span_id)

        try:  # three independent reads: one that moved costs only its metric (reported, hook_errors)
            e2e = finished.e2e_latency
        except Exception:
            report(self, "e2e_latency")
        else:
            _record(GENAI_DURATION, e2e, labels)
        if error is not None:
            return
        ttft = getattr(args[5], "first_token_latency", 0.0)
        if ttft:
            _record(GENAI_TTFT, ttft, short)
        try:
            tokens = finished.num_generation_tokens
            tpot = finished.decode_time / (tokens - 1) if tokens >= 2 else None
        except Exception:
            report(self, "decode_time")
        else:
            if tpot is not None:
                _record(GENAI_TPOT, tpot, short)


class AsyncAddRequest(Handler):
    """``AsyncLLM.add_request(self, request_id, prompt, params, arrival_time, lora_request, tokenization_kwargs,
    trace_headers, …)`` (COROUTINE): the awaited call's duration (``engine:async_add_request:duration``, phase
    ``all``; a call that raised is not timed, as for the plain timers) and, with request traces on, the request's
    inbound trace headers for ``OutputProcessor.add_request`` (``handlers/traces.py``), which vLLM calls inside this
    one after dropping them when its own tracing is off. This runs in the task that registers the request: a
    streaming request's body runs in Starlette's response task, which does not see what the OpenAI handler's task
    kept (``traces.TraceHeaders``)."""

    params = ("request_id", "prompt", "params", "arrival_time", "lora_request", "tokenization_kwargs", "trace_headers")

    def before(self, args, kwargs):
        headers = args[7]
        if headers and TRACKER.on:
            INBOUND.set(headers)
        return perf_counter()

    def after(self, state, args, kwargs, result):
        recording.record(ASYNC_ADD_REQUEST, perf_counter() - state, context.step_labels(ALL))
