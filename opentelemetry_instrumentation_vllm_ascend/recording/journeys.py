"""A request's journey as the API server sees it (docs/traces.md): :class:`Journey`, plain numbers and short lists
the API server's handlers (``handlers/traces.py``) append in vLLM's output loop, and the notes of its async KV
loads; ``recording/traces.py`` samples a finished journey and turns it into spans. No OpenTelemetry object here."""

from __future__ import annotations

from typing import Any

#: Journey event kinds (the EngineCore's QUEUED / SCHEDULED / PREEMPTED).
QUEUED, SCHEDULED, PREEMPTED = "queued", "scheduled", "preempted"
#: At most this many engine events kept per request (a request preempted over and over): the rest is counted.
MAX_EVENTS = 120
#: The key of ``trace_headers`` under which the EngineCore notes a request's async KV loads (``handlers/traces.py``:
#: ``KvFetchStage``): ``{mark}{EngineCore monotonic seconds};`` per moment, :data:`KV_START` when the load began (the
#: request went to WAITING_FOR_REMOTE_KVS), :data:`KV_LOADED` when the worker reported it received.
KV_WAIT_KEY = "otel-vllm-ascend-kv-wait"
KV_START, KV_LOADED = "s", "l"
#: At most this many moments noted per request (a request preempted and loading again, over and over).
MAX_KV_MARKS = 32


class Journey:
    """One request as the API server saw it. Times: ``arrival`` and ``end`` wall-clock seconds (the API server's),
    ``events`` / ``first_ts`` / ``last_ts`` the EngineCore's monotonic clock. A request vLLM rejected before
    registering it has no request id (``request_id`` None): ``arrival`` is when its OpenAI handler was entered,
    ``e2e`` how long the handler ran, ``status`` the HTTP status of its error response."""

    __slots__ = (
        "request_id",
        "external_id",
        "operation",
        "model",
        "arrival",
        "parent",
        "attributes",
        "events",
        "lost_events",
        "first_ts",
        "last_ts",
        "tokens",
        "cached_tokens",
        "dp",
        "reason",
        "error",
        "first_latency",
        "e2e",
        "preemptions",
        "trace_id",
        "span_id",
        "parent_span",
        "kept_by",
        "decided",
        "stats",
        "status",
        "kv_waits",
        "kv_tokens",
        "head",
        "step_links",
    )

    def __init__(self, request_id, external_id, operation, model, arrival, parent=None, attributes=None) -> None:
        self.request_id = request_id
        self.external_id = external_id
        self.operation = operation
        self.model = model
        self.arrival = arrival
        #: The SpanContext the request arrived with (traceparent, or the context current when it was added).
        self.parent = parent
        #: Request attributes known at arrival (semantic-convention names).
        self.attributes = attributes or {}
        self.events: list = []  # [(kind, monotonic ts)]
        self.lost_events = 0
        self.first_ts: Any = None
        self.last_ts: Any = None
        self.tokens = 0
        self.cached_tokens: int | None = None
        self.dp: str | None = None
        self.reason: str | None = None  # finish reason: stop, length, abort, error, …
        self.error: str | None = None  # error.type
        self.first_latency: float | None = None  # seconds from arrival to the first token (vLLM's first_token_latency)
        self.e2e: float | None = None  # seconds from arrival to finish
        self.preemptions = 0
        self.trace_id = 0
        self.span_id = 0
        self.parent_span: Any = None
        self.kept_by: str | None = None
        self.decided: bool | None = None  # None: not yet; True: exported; False: not kept
        self.head: bool | None = None  # head sampling's decision (None: not yet taken: Tracing.assign)
        #: The kept steps that carried it, ``[(trace id, span id)]`` (docs/steps.md#slow-step-traces).
        self.step_links: list | None = None
        self.stats: Any = None  # vLLM's RequestStateStats of the request, while it runs (None without log stats)
        self.status: int | None = None  # a rejected request's HTTP status (None: none was sent)
        #: The EngineCore's notes of the request's async KV loads (``KV_WAIT_KEY``'s value, parsed on export).
        self.kv_waits: str | None = None
        self.kv_tokens: int | None = None  # tokens the KV connector loads for its first scheduling

    def add_events(self, events, names) -> None:
        """Append vLLM EngineCoreEvents (``names``: event type -> kind, unknown types skipped)."""
        for event in events:
            kind = names.get(event.type)
            if kind is None:
                continue
            if kind is PREEMPTED:
                self.preemptions += 1
            if len(self.events) < MAX_EVENTS:
                self.events.append((kind, event.timestamp))
            else:
                self.lost_events += 1


def kv_waits(notes: str | None) -> list[tuple[float, float | None]]:
    """(start, loaded or None) of each async KV load ``notes`` (``KV_WAIT_KEY``'s value) tells of, in order; a
    malformed note is skipped."""
    waits: list[tuple[float, float | None]] = []
    for note in (notes or "").split(";"):
        if len(note) < 2:
            continue
        try:
            ts = float(note[1:])
        except ValueError:
            continue
        if note[0] == KV_START:
            waits.append((ts, None))
        elif note[0] == KV_LOADED and waits and waits[-1][1] is None:
            waits[-1] = (waits[-1][0], ts)
    return waits
