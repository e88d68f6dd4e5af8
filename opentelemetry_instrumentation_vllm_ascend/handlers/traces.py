"""Request traces, the API server's side (docs/traces.md): each request's journey, kept compactly while it runs from
what vLLM already sends the API server, handed to the recording layer's trace pipeline (``recording/traces.py``)
when it ends. No span object exists while a request runs, and nothing here runs on the EngineCore but the notes of
async KV loads (below).

- ``BaseServing._get_trace_headers``: the request's inbound ``traceparent`` / ``tracestate`` (vLLM drops them in
  ``AsyncLLM.add_request`` unless its own tracing is on), kept in a context variable of the request's task;
- ``OutputProcessor.add_request``: a :class:`Journey` starts (arrival time, parameters, prompt length, parent: the
  inbound headers, else the OpenTelemetry context current there);
- ``OutputProcessor.process_outputs`` (``handlers/api.py:ProcessOutputs``, one flag check when tracing is off):
  per output of a followed request, its engine events (QUEUED / SCHEDULED / PREEMPTED, the EngineCore's monotonic
  clock), the batch timestamp of its first and last output, its token count and finish reason;
- ``OutputProcessor._finish_request``: the request finished (by the engine, or by a stop string the API server
  found); ``OutputProcessor.abort_requests``: it was aborted (a client that went away, a failed add);
- ``GenerateBaseServing._with_kv_transfer_rejection_cleanup``, the coroutine each OpenAI handler
  (``create_chat_completion``, ``create_completion``, ``create_responses``) awaits its work through: a request it
  answers with an error (or that ends by raising) before ``OutputProcessor.add_request`` registered anything in the
  request's task was rejected: a journey of its own (entry to return, ``error.type``, the HTTP status) goes to the
  pipeline;
- ``validation_exception_handler`` as ``exception_handling/register.py`` registers it (FastAPI's
  ``RequestValidationError``: a body that did not parse into vLLM's request model, invalid JSON, a wrong content
  type, raised before any vLLM handler ran): on an OpenAI generation path, one rejected journey;
- ``AsyncLLM.check_admission`` raising where vLLM registers a request (``AsyncLLM.add_request``, a request id
  given) outside any OpenAI handler call under way (a streaming request's body, which Starlette runs after the
  handler returned: vLLM sends the refusal as a chunk of the started 200 response): one rejected journey.

The EngineCore's one part (``Scheduler.__init__``, ``handlers/kv_transfer.py:SchedulerInit``): on a scheduler with a KV
connector, and only there, the scheduler's ``_set_kv_fetch_stage`` gets a wrapper of its own (an instance attribute,
:func:`watch_kv_loads`) that appends the EngineCore's ``time.monotonic()`` of each async KV load's start and of its
end (the worker reported it received) to ``request.trace_headers`` under :data:`KV_WAIT_KEY`, a few characters per
load. vLLM sends ``trace_headers`` back with each output of the request; the API server reads the key on the outputs
that carry engine events (the first, and the first after each preemption) and keeps the string; the export thread
parses it (``recording/traces.py``: the ``kv_load_wait`` spans). A scheduler without a connector runs no code of
ours there.

No metric label comes from here: traces carry ``vllm.dp_rank`` (the engine whose outputs brought the request's first
token) and ``vllm.pd_role``. Nothing here imports vLLM (plain attribute reads with defaults)."""

from __future__ import annotations

import logging
from asyncio import CancelledError
from contextvars import ContextVar
from time import monotonic, time
from types import MappingProxyType

from .. import catalogue, environment, semconv, targets
from ..hooks.handler import Handler, report
from ..recording import step_traces
from ..recording import traces as pipeline
from ..recording.journeys import KV_LOADED, KV_START, KV_WAIT_KEY, MAX_KV_MARKS, PREEMPTED, QUEUED, SCHEDULED, Journey
from ..state import STATE

logger = logging.getLogger(__name__)

#: The inbound trace headers of the request the current task serves (set by ``TraceHeaders``).
INBOUND: ContextVar = ContextVar("otel_vllm_ascend_trace_headers", default=None)
#: The OpenAI handler call the current task is in (a :class:`Handling`, set by ``Rejections``).
HANDLING: ContextVar = ContextVar("otel_vllm_ascend_handling", default=None)
_KINDS = MappingProxyType({"QUEUED": QUEUED, "SCHEDULED": SCHEDULED, "PREEMPTED": PREEMPTED})
#: Finish reasons that are an ``error.type``.
_ERRORS = frozenset(catalogue.GENAI_ERROR_TYPES)
#: The stop reason of a request vllm-ascend's RecomputeScheduler handed back to the P/D proxy (finished here as a
#: stop, no preemption; the proxy resubmits it).
RECOMPUTED = "recomputed"


def _note_steps(journey: Journey, value) -> None:
    """The kept steps an output says carried the request (``STEP_KEY``), added to those noted before."""
    links = journey.step_links
    if links is None:
        links = journey.step_links = []
    for ids in step_traces.decode_all(value):
        if ids not in links and len(links) < step_traces.MAX_STEP_LINKS:
            links.append(ids)


def genai_operation(request_id) -> str:
    """``gen_ai.operation.name`` of a request, from the prefix vLLM's OpenAI server gives its id."""
    if isinstance(request_id, str):
        for prefix, operation in catalogue.GENAI_OPERATIONS:
            if request_id.startswith(prefix):
                return operation
    return catalogue.GENAI_OTHER


def _event_names(sample) -> dict:
    """EngineCoreEventType member -> journey kind (by member name), for the enum ``sample`` belongs to."""
    members = getattr(type(sample), "__members__", None)
    if not members:  # plain ints: vLLM's values
        return {1: QUEUED, 2: SCHEDULED, 3: PREEMPTED}
    return {member: _KINDS[name] for name, member in members.items() if name in _KINDS}


class Handling:
    """One OpenAI handler call: when it was entered (wall-clock seconds), whether a request was registered
    (``OutputProcessor.add_request``) in its task since, and whether the call has ended (what runs after it in a
    task that inherited it, a stream's body, is no longer answered by it)."""

    __slots__ = ("entered", "registered", "ended")

    def __init__(self, entered: float) -> None:
        self.entered = entered
        self.registered = False
        self.ended = False


#: vLLM's request class -> ``gen_ai.operation.name`` of a rejected request (others: ``_OTHER``, as their ids give).
_OPERATIONS = MappingProxyType({"ChatCompletionRequest": "chat", "CompletionRequest": "text_completion"})
#: SamplingParams attribute -> span attribute.
_PARAMS = (
    ("max_tokens", semconv.GEN_AI_REQUEST_MAX_TOKENS),
    ("temperature", semconv.GEN_AI_REQUEST_TEMPERATURE),
    ("top_p", semconv.GEN_AI_REQUEST_TOP_P),
    ("top_k", semconv.GEN_AI_REQUEST_TOP_K),
    ("seed", semconv.GEN_AI_REQUEST_SEED),
    ("presence_penalty", semconv.GEN_AI_REQUEST_PRESENCE_PENALTY),
    ("frequency_penalty", semconv.GEN_AI_REQUEST_FREQUENCY_PENALTY),
)
#: Client-given request fields -> span attributes of a rejected request (chat's max_completion_tokens first).
_REQUEST_FIELDS = (("max_completion_tokens", semconv.GEN_AI_REQUEST_MAX_TOKENS), *_PARAMS)
#: A client-given model name longer than this is cut (it names the span).
_MAX_MODEL_CHARS = 256
#: The OpenAI generation paths (their ends: a ``--root-path`` may precede them) -> ``gen_ai.operation.name`` of a
#: request whose body never parsed; a validation error on any other path (``/tokenize``, …) is no request here.
_PATHS = (
    ("/v1/chat/completions", "chat"),
    ("/v1/completions", "text_completion"),
    ("/v1/responses", catalogue.GENAI_OTHER),
)


class Tracker:
    """The requests this API server follows, by vLLM's internal request id (at most ``limit``)."""

    def __init__(self, on: bool | None = None, limit: int | None = None, tracing=None) -> None:
        self.on = environment.traces_enabled() if on is None else on
        self.limit = limit or environment.positive_int(
            environment.TRACES_MAX_INFLIGHT, environment.DEFAULT_TRACES_MAX_INFLIGHT
        )
        self.inflight: dict[str, Journey] = {}
        self.names: dict | None = None
        #: The IterationStats of the process_outputs call under way (its timestamp ends the requests it finishes).
        self.iteration = None
        #: (RequestStateStats, Journey) of the request finished last: vLLM records its stats right after.
        self.last_finished: tuple = (None, None)
        self._tracing = tracing
        self._propagator = None
        self._warned_vllm = False
        #: Slow-step traces on (docs/steps.md): request span ids go to the EngineCore, kept steps come back.
        self.step_traces = step_traces.enabled()

    def tracing(self):
        return self._tracing if self._tracing is not None else pipeline.tracing()

    # -- start ------------------------------------------------------------------------------------------------
    def start(self, processor, request, parent_req=None, index=0) -> None:
        """``parent_req``: vLLM's ParentRequest when ``request`` is one of the ``n`` > 1 choices it fans out into
        (``index``: which), each an engine request of its own with its own journey."""
        request_id = request.request_id
        inflight = self.inflight
        if request_id in inflight:  # a streaming-input update of a request already followed
            return
        if len(inflight) >= self.limit and not self._forget_gone(processor):
            self.tracing().drop("inflight_full")
            return
        if getattr(processor, "tracing_enabled", False):
            # vLLM's own tracing (--otlp-traces-endpoint) would build a second request span: ours replaces it.
            processor.tracing_enabled = False
            if not self._warned_vllm:
                self._warned_vllm = True
                logger.info(
                    "opentelemetry-instrumentation-vllm-ascend: OTEL_VLLM_ASCEND_TRACES is on: vLLM's own llm_request "
                    "spans are replaced by this package's request traces (one request span per request)"
                )
        headers = getattr(request, "trace_headers", None) or INBOUND.get()
        parent = self._parent(headers)
        external = getattr(request, "external_req_id", None) or request_id
        attributes = {}
        params = getattr(request, "sampling_params", None)
        if params is not None:
            for name, attribute in _PARAMS:
                value = getattr(params, name, None)
                if value is not None:
                    attributes[attribute] = value
            n = getattr(params, "n", 1)
            if parent_req is not None:  # a choice of n > 1: its own params say n = 1
                n = getattr(getattr(parent_req, "sampling_params", None), "n", n)
                if isinstance(index, int):
                    attributes["vllm.request.choice_index"] = index
            if isinstance(n, int) and n != 1:
                attributes[semconv.GEN_AI_REQUEST_CHOICE_COUNT] = n
        prompt = getattr(request, "prompt_token_ids", None)
        if prompt is not None:
            attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS] = len(prompt)
        arrival = getattr(request, "arrival_time", None) or time()
        journey = Journey(
            request_id, external, genai_operation(external), STATE.served_model, arrival, parent, attributes
        )
        states = getattr(processor, "request_states", None)
        state = states.get(request_id) if states is not None else None
        journey.stats = getattr(state, "stats", None)
        if self.step_traces:
            # The request span's ids now, for the EngineCore's step traces to link to (recording/step_traces.py).
            self.tracing().assign(journey)
            noted = dict(request.trace_headers or {})
            noted[step_traces.REQUEST_KEY] = step_traces.encode(journey.trace_id, journey.span_id)
            request.trace_headers = noted
        inflight[request_id] = journey

    def _forget_gone(self, processor) -> bool:
        """At the limit: forget the journeys of requests vLLM no longer has (their end was not seen: hooks switched
        off by runtime control meanwhile); True when that made room."""
        states = getattr(processor, "request_states", None)
        if states is None:
            return False
        gone = [request_id for request_id in self.inflight if request_id not in states]
        for request_id in gone:
            del self.inflight[request_id]
        return len(self.inflight) < self.limit

    def _parent(self, headers):
        from opentelemetry import trace as trace_api

        if headers:
            if self._propagator is None:
                from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

                self._propagator = TraceContextTextMapPropagator()
            found = trace_api.get_current_span(self._propagator.extract(headers)).get_span_context()
            if found.is_valid:
                return found
        current = trace_api.get_current_span().get_span_context()
        return current if current.is_valid else None

    # -- outputs ----------------------------------------------------------------------------------------------
    def outputs(self, outputs, timestamp, iteration_stats) -> None:
        """One process_outputs chunk, before vLLM processes it."""
        self.iteration = iteration_stats
        inflight = self.inflight
        if not inflight or not outputs:
            return
        engine = STATE.current_engine
        steps = self.step_traces
        for output in outputs:
            journey = inflight.get(output.request_id)
            if journey is None:
                continue
            if steps:
                headers = output.trace_headers
                if headers and step_traces.STEP_KEY in headers:
                    _note_steps(journey, headers[step_traces.STEP_KEY])
            if journey.first_ts is None:
                journey.first_ts = timestamp
                journey.dp = engine
                if iteration_stats is None:
                    journey.first_latency = time() - journey.arrival
                prefill = getattr(output, "prefill_stats", None)
                cached = getattr(prefill, "num_cached_tokens", None) if prefill is not None else None
                if cached is None:
                    cached = getattr(output, "num_cached_tokens", None)
                if isinstance(cached, int):
                    journey.cached_tokens = cached
                if prefill is not None:
                    journey.kv_tokens = getattr(prefill, "num_external_cached_tokens", None)
            journey.last_ts = timestamp
            journey.tokens += len(output.new_token_ids or ())
            events = output.events
            if events:
                names = self.names
                if names is None:
                    names = self.names = _event_names(events[0].type)
                journey.add_events(events, names)
                # The EngineCore's notes of async KV loads (``KvFetchStage``): a load ends before the SCHEDULED
                # that such an output carries, so the last one seen holds them all.
                headers = output.trace_headers
                if headers:
                    notes = headers.get(KV_WAIT_KEY)
                    if notes is not None:
                        journey.kv_waits = notes
            reason = output.finish_reason
            if reason is not None:
                journey.reason = str(reason)
                if getattr(output, "stop_reason", None) == RECOMPUTED:
                    journey.attributes["vllm.request.recomputed"] = True

    # -- end ----------------------------------------------------------------------------------------------------
    def finished(self, req_state) -> None:
        """``OutputProcessor._finish_request``: the request finished, with the reason the engine gave (or stop: a
        stop string the API server found)."""
        journey = self.inflight.pop(getattr(req_state, "request_id", ""), None)
        if journey is None:
            return
        stats = journey.stats
        self._end(journey, journey.reason or "stop", self.iteration)
        self.last_finished = (stats, journey)

    def aborted(self, request_ids) -> None:
        """``OutputProcessor.abort_requests`` returned the internal ids it aborted."""
        inflight = self.inflight
        for request_id in request_ids or ():
            journey = inflight.pop(request_id, None)
            if journey is not None:
                self._end(journey, "abort", None)

    def _end(self, journey: Journey, reason: str, iteration) -> None:
        now = getattr(iteration, "iteration_timestamp", None) if iteration is not None else None
        journey.e2e = (now if now is not None else time()) - journey.arrival
        journey.reason = reason
        if reason in _ERRORS:
            journey.error = reason
        stats = journey.stats
        journey.stats = None
        if stats is not None:
            latency = getattr(stats, "first_token_latency", 0.0)
            if latency:
                journey.first_latency = latency
        tracing = self.tracing()
        if tracing.decide(journey) and not tracing.submit(journey):
            journey.decided = False  # not sent: no exemplar may name it

    def rejected(
        self, handling: Handling, request, raw_request, error: str, status: int | None, operation: str | None = None
    ) -> None:
        """A request vLLM answered with an error (``status``: the status of its error, None when no response was
        sent) before any request was registered for it. ``request``: vLLM's request model (None: the body never
        parsed); ``operation``: ``gen_ai.operation.name`` when the request model does not tell it."""
        headers = getattr(raw_request, "headers", None) if raw_request is not None else None
        parent = self._parent(headers or INBOUND.get())
        model = getattr(request, "model", None)
        model = model[:_MAX_MODEL_CHARS] if isinstance(model, str) and model else STATE.served_model
        attributes: dict = {}
        fields = getattr(request, "__dict__", None) or {}  # a pydantic model's values (no deprecated-field warning)
        for name, attribute in _REQUEST_FIELDS:
            value = fields.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and attribute not in attributes:
                attributes[attribute] = value
        n = fields.get("n", 1)
        if isinstance(n, int) and not isinstance(n, bool) and n != 1:
            attributes[semconv.GEN_AI_REQUEST_CHOICE_COUNT] = n
        if operation is None:
            operation = _OPERATIONS.get(type(request).__name__, catalogue.GENAI_OTHER)
        journey = Journey(None, None, operation, model, handling.entered, parent, attributes)
        journey.e2e = max(0.0, time() - handling.entered)
        journey.error = error
        journey.status = status
        tracing = self.tracing()
        if tracing.decide(journey):
            tracing.submit(journey)

    def exported_ids(self, req_stats) -> tuple[int, int] | None:
        """(trace id, root span id) of the request whose stats vLLM records now, when its trace is exported."""
        stats, journey = self.last_finished
        if stats is None or stats is not req_stats or not journey.decided:
            return None
        return journey.trace_id, journey.span_id


TRACKER = Tracker()


class TraceHeaders(Handler):
    """``BaseServing._get_trace_headers(self, headers)`` (COROUTINE; vLLM 0.23: ``OpenAIServing``'s and the
    generative scoring server's): the request's inbound trace headers (or None), kept for the rest of the
    request's task. vLLM 0.23 returns None unless its own tracing is on: then they are read from ``headers`` as
    vLLM's ``extract_trace_headers`` reads them."""

    params = ("headers",)

    def after(self, state, args, kwargs, result):
        if result is None:
            headers = args[1]
            if headers is not None:
                result = {name: headers[name] for name in _TRACE_HEADERS if name in headers} or None
        INBOUND.set(result)


#: The W3C trace context headers (vLLM's ``vllm.tracing.TRACE_HEADERS``).
_TRACE_HEADERS = ("traceparent", "tracestate")


class AddRequest(Handler):
    """``OutputProcessor.add_request(self, request, …)``: a journey starts."""

    params = ("request", "prompt", "parent_req", "request_index")

    def after(self, state, args, kwargs, result):
        if TRACKER.on:
            handling = HANDLING.get()
            if handling is not None:
                handling.registered = True
            TRACKER.start(args[0], args[1], args[3], args[4])


class FinishRequest(Handler):
    """``OutputProcessor._finish_request(self, req_state)``: a request finished (not an abort)."""

    params = ("req_state",)

    def after(self, state, args, kwargs, result):
        if TRACKER.inflight:
            TRACKER.finished(args[1])


class AbortRequests(Handler):
    """``OutputProcessor.abort_requests(self, request_ids, internal)``: the requests it aborted (its result)."""

    params = ("request_ids",)

    def after(self, state, args, kwargs, result):
        if TRACKER.inflight and result:
            try:
                TRACKER.aborted(list(result))
            except Exception:
                report(self, "aborted")


class Rejections(Handler):
    """``GenerateBaseServing._with_kv_transfer_rejection_cleanup(self, awaitable, request, raw_request)``
    (COROUTINE), which ``create_chat_completion``, ``create_completion`` and ``create_responses`` return the awaited
    result of: an ``ErrorResponse`` returned, or an exception raised (which vLLM's exception handlers turn into
    the response), while no request was registered in this task is a rejected request. A request registered
    before its error has its journey already (finished as error or abort)."""

    params = ("awaitable", "request", "raw_request")

    def before(self, args, kwargs):
        handling = Handling(time())
        HANDLING.set(handling)
        return handling

    def after(self, state, args, kwargs, result):
        state.ended = True
        if state.registered or not TRACKER.on:
            return
        if type(result).__name__ != "ErrorResponse":  # a response, or a stream (whose errors are chunks of it)
            return
        info = result.error  # ErrorInfo(message, type, param, code)
        if _cancelling():  # vLLM answered "Client disconnected" to the cancellation of a client that went away
            TRACKER.rejected(state, args[2], args[3], "abort", None)
            return
        code = getattr(info, "code", None)
        TRACKER.rejected(state, args[2], args[3], str(getattr(info, "type", None) or code), _status(code))

    def error(self, state, args, kwargs, exc):
        state.ended = True
        if state.registered or not TRACKER.on:
            return
        if not isinstance(exc, Exception):  # the task was cancelled: the client went away before registration
            if isinstance(exc, CancelledError):
                TRACKER.rejected(state, args[2], args[3], "abort", None)
            return
        error, status = _response_of(args[0], exc)
        TRACKER.rejected(state, args[2], args[3], error, status)


class Unparsed(Handler):
    """``validation_exception_handler(req, exc)`` (COROUTINE), the module-level function vLLM's
    ``exception_handling/register.py`` imports by name and registers for FastAPI's ``RequestValidationError``
    (``init_exception_handler``: ``app.exception_handler(RequestValidationError)(validation_exception_handler)``,
    which reads the name from register.py's globals when the app is built; the hook replaces that global). The
    error was raised before vLLM's handler ran: the body did not parse into vLLM's request model, was not JSON, or
    had another content type than JSON (``validate_json_request``). On an OpenAI generation path: one rejected
    journey, from the exception handler's entry to its return, with the status and error type of its response
    (400, ``Bad Request``) and the served model (the body named none that parsed)."""

    # A module-level function (no self): the generic wrapper, whose ``args`` are the call's (Starlette's
    # ``handler(request, exc)``); the contract test checks the parameters (``req``, ``exc``).

    def before(self, args, kwargs):
        return time()

    def after(self, state, args, kwargs, result):
        if not TRACKER.on:
            return
        operation = _operation_of_path(args[0])
        if operation is None:
            return
        status = getattr(result, "status_code", None)
        status = status if isinstance(status, int) else None
        TRACKER.rejected(Handling(state), None, args[0], _error_type(result, status), status, operation)

    def error(self, state, args, kwargs, exc):
        if not TRACKER.on or not isinstance(exc, Exception):
            return
        operation = _operation_of_path(args[0])
        if operation is not None:  # Starlette's ServerErrorMiddleware answers it: 500
            TRACKER.rejected(Handling(state), None, args[0], type(exc).__name__, 500, operation)


class Admission(Handler):
    """``AsyncLLM.check_admission(self, n, request_id)`` (SYNC) raising: vLLM's admission limits
    (``--max-num-queued-reqs``, ``--max-num-queued-tokens``) refused a request. Recorded only where
    ``AsyncLLM.add_request`` calls it (a request id given; it raises before ``OutputProcessor.add_request``, so the
    request was never registered) and no OpenAI handler call is under way in this task (one under way answers the
    refusal itself: ``Rejections``). That is a streaming request's body, which Starlette runs after the handler
    returned the stream: vLLM sends the refusal as the error chunk of a 200 response. ``error.type`` and the status
    are what vLLM's ``create_error_response`` makes of the exception (a ``GracefulHTTPError``: its
    ``http_status``'s phrase and number, ``Service Unavailable`` / 503)."""

    params = ("n", "request_id")
    after_if = "False"  # nothing to do when it returns (every request, twice)

    def error(self, state, args, kwargs, exc):
        if not TRACKER.on or not isinstance(exc, Exception):
            return
        request_id = args[2]
        if request_id is None:  # a handler's preflight (GenerateBaseServing._preflight): its handler answers it
            return
        handling = HANDLING.get()
        if handling is not None and not handling.ended:
            return
        error, status = _graceful(exc)
        TRACKER.rejected(Handling(time()), None, None, error, status, genai_operation(request_id))


def _operation_of_path(request) -> str | None:
    """``gen_ai.operation.name`` of an HTTP request on an OpenAI generation path, else None."""
    path = request.url.path.rstrip("/")
    for suffix, operation in _PATHS:
        if path.endswith(suffix):
            return operation
    return None


def _error_type(response, status: int | None) -> str:
    """The ``error.type`` of vLLM's JSON error response (``{"error": {"type": …}}``), else the status's phrase."""
    try:
        import json

        found = json.loads(response.body)["error"]["type"]
        if isinstance(found, str) and found:
            return found
    except Exception:
        pass
    return _phrase(status)


def _phrase(status: int | None) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "error" if status is None else str(status)


def _graceful(exc: Exception) -> tuple[str, int | None]:
    """(error type, status) vLLM's ``create_error_response`` gives ``exc`` when it is a ``GracefulHTTPError`` (its
    ``http_status``), else the exception's class name and 503 (the status of both admission limits)."""
    status = _status(getattr(exc, "http_status", None))
    if status is None:
        return type(exc).__name__, 503
    return _phrase(status), status


def _cancelling() -> bool:
    """The current task is being cancelled (vLLM's ``with_cancellation``: the client went away), even when the code
    it cancelled caught the CancelledError and returned."""
    try:
        from asyncio import current_task

        cancelling = getattr(current_task(), "cancelling", None)  # Python 3.11+
        return cancelling is not None and cancelling() > 0
    except Exception:  # no running loop
        return False


def _status(code) -> int | None:
    try:
        return int(code)
    except (TypeError, ValueError):
        return None


def _response_of(serving, exc: Exception) -> tuple[str, int | None]:
    """(error type, HTTP status) of the response vLLM's exception handlers make of ``exc``: an HTTPException's
    status and its phrase; else what ``BaseServing.create_error_response(exc)`` says (the handlers call the same
    function); else the exception's class name and 500."""
    code = getattr(exc, "status_code", None)
    if isinstance(code, int) and hasattr(exc, "detail"):  # starlette / FastAPI HTTPException
        return _phrase(code), code
    try:
        info = serving.create_error_response(exc).error
        return str(info.type), _status(info.code)
    except Exception:
        return type(exc).__name__, 500


# -- the EngineCore's part: async KV loads ------------------------------------------------------------------------

#: vLLM's KV fetch stages (``vllm/v1/metrics/stats.py``, 0.32-0.34) that mark a load's moments: the load began (the
#: request is WAITING_FOR_REMOTE_KVS), the worker reported it received.
_KV_MARKS = MappingProxyType({"in_progress": KV_START, "completed_waiting": KV_LOADED})


class KvFetchStage(Handler):
    """``Scheduler._set_kv_fetch_stage(self, request, stage)`` of one scheduler with a KV connector (installed on
    that instance by :func:`watch_kv_loads`): the EngineCore's ``time.monotonic()`` of a load's start and end,
    appended to ``request.trace_headers[KV_WAIT_KEY]`` (a new dict: the headers may be the API server's own object
    when the engine runs in its process), which vLLM sends back with the request's outputs. vLLM calls it with
    ``None`` for every request it schedules: the wrapper's guard returns before the handler then."""

    params = ("request", "stage")
    after_if = "stage is not None"

    def after(self, state, args, kwargs, result):
        mark = _KV_MARKS.get(args[2])
        if mark is None:
            return
        request = args[1]
        headers = request.trace_headers
        notes = headers.get(KV_WAIT_KEY, "") if headers else ""
        if notes.count(";") >= MAX_KV_MARKS:
            return
        request.trace_headers = {**(headers or {}), KV_WAIT_KEY: f"{notes}{mark}{monotonic()!r};"}


def watch_kv_loads(scheduler) -> bool:
    """Give ``scheduler`` (a vLLM ``Scheduler`` just built) the :class:`KvFetchStage` wrapper of its
    ``_set_kv_fetch_stage``, as an attribute of that instance only, when it has a KV connector (vLLM 0.32+ define
    the method); runtime control switches it off with the other hooks. True when installed."""
    attribute = targets.KV_FETCH_STAGE.qualname.rsplit(".", 1)[-1]
    if getattr(scheduler, "connector", None) is None or attribute in vars(scheduler):
        return False
    function = getattr(type(scheduler), attribute, None)
    if function is None:  # vLLM before 0.32
        return False
    from types import MethodType

    from ..hooks.patches import stand_in
    from ..hooks.wrappers import wrap
    from ..kinds import SYNC
    from ..recording import control

    handler = KvFetchStage()
    handler.name = "Scheduler._set_kv_fetch_stage"
    wrapper, hook = wrap(function, handler, SYNC)
    stand_in(scheduler, attribute, MethodType(wrapper, scheduler))
    control.register(hook, (), provides_context=True)
    return True
