"""Slow-step traces (docs/steps.md#slow-step-traces): a trace for an engine step a tail rule keeps, exported from
the EngineCore, linked both ways to the request spans of the requests it carried.

The rules (``OTEL_VLLM_ASCEND_STEP_TRACES_*``): the step's wall time above a threshold, or above a multiple of the
recent p99 of this engine's steps; a preemption in the step; a failed executor call. At most ``PER_S`` steps a
second are kept (like steps no rule kept, the rest are not counted).

Who does what:

- **EngineCore thread**, per step (``handlers.scheduler.UpdateFromOutput``): one comparison of the step's wall
  time with :attr:`StepTracer.slow_s` and a read of its preemption count. Only a kept step costs more
  (:meth:`StepTracer.keep`): its ids, and a note of them (``STEP_KEY``) in the ``trace_headers`` of the outputs
  it produced and of the requests it carried that produced none (their next output carries it), which is how
  the API server learns the links back.
- **The step records' background thread** (``step_records.Stream``; the record is the step trace's data): the
  request spans' ids each new request brought from the API server (``REQUEST_KEY`` of its ``trace_headers``,
  taken out there so that no later output carries it), the p99 of the recent steps (``slow_s``), and the
  kept step's spans, handed to this process's trace pipeline (``recording/traces.py``), which exports them.
- **API server** (``handlers/traces.py``): a request's span ids are chosen when vLLM registers it (head sampling
  runs then) and sent in ``REQUEST_KEY``; a request whose outputs carried a ``STEP_KEY`` is kept (``kept_by``
  ``step``) and its request span links to those steps.
"""

from __future__ import annotations

from collections import deque

from .. import environment

#: ``trace_headers`` key, API server -> EngineCore: ``{trace id:032x}-{span id:016x}`` of the request span.
REQUEST_KEY = "otel-vllm-ascend-request-span"
#: ``trace_headers`` key, EngineCore -> API server: the kept steps that carried the request, comma-separated.
STEP_KEY = "otel-vllm-ascend-steps"
#: A request links to at most this many kept steps.
MAX_STEP_LINKS = 8
#: Why a step was kept (``vllm.trace.kept_by`` of its step span).
THRESHOLD, P99, PREEMPTED, ERROR = "threshold", "p99", "preempted", "error"
DEFAULT_P99_FACTOR = 3.0
DEFAULT_PER_S = 10
#: The recent steps whose p99 the p99 rule reads, how many before it applies, how often it is recomputed.
WINDOW, MIN_STEPS, EVERY = 1000, 100, 100


def encode(trace_id: int, span_id: int) -> str:
    return f"{trace_id:032x}-{span_id:016x}"


def decode(value) -> tuple[int, int] | None:
    """``(trace id, span id)`` of one ``encode``d value; None for anything else."""
    try:
        trace, span = value.split("-")
        ids = int(trace, 16), int(span, 16)
    except (AttributeError, ValueError):
        return None
    return ids if len(trace) == 32 and len(span) == 16 and ids[0] and ids[1] else None


def decode_all(value) -> list[tuple[int, int]]:
    """The steps of a ``STEP_KEY`` value."""
    if not isinstance(value, str):
        return []
    found = (decode(part) for part in value.split(","))
    return [ids for ids in found if ids is not None]


def with_step(headers, value: str) -> dict:
    """A copy of ``headers`` (a request's ``trace_headers``: vLLM's inbound ones, other notes) noting one more
    kept step (the oldest kept when ``MAX_STEP_LINKS`` are noted)."""
    headers = dict(headers) if headers else {}
    noted = headers.get(STEP_KEY)
    headers[STEP_KEY] = value if not noted else ",".join((noted.split(",") + [value])[-MAX_STEP_LINKS:])
    return headers


def enabled() -> bool:
    return environment.flag(environment.STEP_TRACES) is True


class StepTracer:
    """One EngineCore's step-trace rules and its links to request spans."""

    def __init__(self) -> None:
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

        self.threshold = environment.threshold_seconds(environment.STEP_TRACES_THRESHOLD_MS)
        factor = environment.number(environment.STEP_TRACES_P99_FACTOR, DEFAULT_P99_FACTOR)
        self.factor = factor or None  # 0: no p99 rule
        keep = environment.traces_keep(environment.STEP_TRACES_KEEP, environment.STEP_TRACES_KEEP_CHOICES)
        self.preempted = PREEMPTED in keep
        self.errors = ERROR in keep
        self.per_s = environment.integer(environment.STEP_TRACES_PER_S, DEFAULT_PER_S, 1)
        #: The EngineCore thread's comparison: a step longer than this (seconds) is kept.
        self.slow_s = self.threshold if self.threshold is not None else float("inf")
        self.ids = RandomIdGenerator()
        self.second = 0.0  # the start of the current rate-limit second, and the steps kept in it
        self.kept_in_second = 0
        self.rate_limited = 0
        #: request id -> (trace id, span id) of its request span (the background thread's).
        self.links: dict = {}
        self.walls: deque = deque(maxlen=WINDOW)
        self.observed = 0

    # -- the EngineCore thread --------------------------------------------------------------------------------
    def keep(self, head, update_start: float, end: float, result, stamp=None, error: str | None = None) -> tuple:
        """The queue item of a step that ``slow_s`` or its preemptions flagged (``stamp``: the worker's on its
        output; ``error``: its executor call failed, the exception's type): ``(head, update start, end, stamp,
        (trace id, span id, kept_by, error))`` when a rule keeps it, else ``(head, update start, end, stamp)``.
        Notes the step's ids on its outputs (``result``, what update_from_output returned) and on the requests it
        carried that produced none."""
        wall = end - head[3]
        if error is not None:
            reason = ERROR if self.errors else None
        elif head[5].preemptions and self.preempted:
            reason = PREEMPTED
        elif self.threshold is not None and wall > self.threshold:
            reason = THRESHOLD
        elif wall > self.slow_s:
            reason = P99
        else:
            reason = None
        if reason is None:
            return head, update_start, end, stamp
        if end - self.second >= 1.0:
            self.second, self.kept_in_second = end, 0
        if self.kept_in_second >= self.per_s:
            self.rate_limited += 1
            return head, update_start, end, stamp
        self.kept_in_second += 1
        trace_id, span_id = self.ids.generate_trace_id(), self.ids.generate_span_id()
        try:
            self._note(head, result, encode(trace_id, span_id))
        except Exception:
            environment.warn_once(
                ("step trace notes",),
                "opentelemetry-instrumentation-vllm-ascend: step traces: a kept step's outputs could not be noted; "
                "its requests do not link back to it",
            )
        return head, update_start, end, stamp, (trace_id, span_id, reason, error)

    @staticmethod
    def _note(head, result, value: str) -> None:
        tokens = head[11][0]  # the step's num_scheduled_tokens: every request it carried
        seen = set()
        for outputs in (result or {}).values():
            for output in outputs.outputs:
                request_id = output.request_id
                if request_id in tokens:
                    output.trace_headers = with_step(output.trace_headers, value)
                    seen.add(request_id)
        requests = head[1].requests
        for request_id in tokens:
            if request_id not in seen:
                request = requests.get(request_id)
                if request is not None:
                    request.trace_headers = with_step(request.trace_headers, value)

    # -- the background thread --------------------------------------------------------------------------------
    def note_new(self, new, requests) -> None:
        """The request spans' ids the step's new requests brought (``REQUEST_KEY``), taken out of their headers."""
        links = self.links
        for data in new:
            request = requests.get(data.req_id)
            headers = getattr(request, "trace_headers", None)
            if headers and REQUEST_KEY in headers:
                ids = decode(headers.pop(REQUEST_KEY, None))
                if ids is not None:
                    links[data.req_id] = ids
                if not headers:
                    request.trace_headers = None

    def forget(self, finished) -> None:
        for request_id in finished or ():
            self.links.pop(request_id, None)

    def observe(self, wall: float) -> None:
        """One more step's wall time; every ``EVERY`` steps ``slow_s`` becomes ``factor`` times the p99 of the last
        ``WINDOW`` (nearest rank), or the threshold where that is lower."""
        self.walls.append(wall)
        self.observed += 1
        if self.factor is None or self.observed % EVERY or len(self.walls) < MIN_STEPS:
            return
        ordered = sorted(self.walls)
        slow = self.factor * ordered[-(-99 * len(ordered) // 100) - 1]
        self.slow_s = min(slow, self.threshold) if self.threshold is not None else slow

    def carried(self, tokens) -> list:
        """``[(request id, (trace id, span id))]`` of the requests of a step (``tokens``: its num_scheduled_tokens)
        whose request spans are known."""
        links = self.links
        return [(request_id, links[request_id]) for request_id in tokens if request_id in links]
