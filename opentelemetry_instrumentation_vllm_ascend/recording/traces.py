"""Request traces (docs/traces.md): the sampling decision for a finished request's journey, and the export of its
spans from a thread of this module's own.

The API server's handlers (``handlers/traces.py``) follow each request in a ``Journey`` (``recording/journeys.py``):
plain numbers and short lists, appended in vLLM's output loop; no OpenTelemetry object exists for a request while it
runs. When it finishes, :meth:`Tracing.decide` makes the head sampling decision (``OTEL_TRACES_SAMPLER``, the SDK's
own sampler, given the parent the request arrived with) and, where that says drop, the tail rules (error, abort,
preempted, TTFT or end-to-end over a threshold); a kept journey goes into a bounded queue
(``OTEL_BSP_MAX_QUEUE_SIZE``, full: the journey is dropped and counted in ``traces_dropped``). The export thread
turns queued journeys into SDK ``ReadableSpan`` objects (``recording/spans.py``) and hands them to the exporters
OTEL_TRACES_EXPORTER names (chosen as the SDK's configurator chooses them), every ``OTEL_BSP_SCHEDULE_DELAY`` ms or
as soon as ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` wait.

Clock: engine events carry the EngineCore's ``time.monotonic()``; the API server (same host, the same
CLOCK_MONOTONIC) maps them to wall time with ``time.time_ns() - time.monotonic_ns()`` read when the batch is built.
Intervals between engine events are exact (to the nanosecond); their placement against the request's arrival (the
API server's wall clock) is off by how much the wall clock was adjusted between the event and the batch (NTP slew:
at most 0.5 ms per second).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections import deque
from typing import TYPE_CHECKING

from .. import catalogue, context, environment
from ..state import STATE
from . import otlp, private_otel, providers
from .journeys import Journey
from .spans import journey_spans

if TYPE_CHECKING:
    from .step_spans import StepTrace

logger = logging.getLogger(__name__)

#: Why a journey that head sampling dropped was kept (``vllm.trace.kept_by``); ``step``: a kept step carried it.
ERROR, ABORT, PREEMPT, TTFT, E2E, STEP = "error", "abort", "preempted", "ttft", "e2e", "step"


class Tracing:
    """This process's trace pipeline: sampler, tail rules, bounded queue, export thread, exporters."""

    def __init__(self, exporters=None, resource=None, sampler=None) -> None:
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

        self.pid = os.getpid()
        self.exporters = list(self._exporters() if exporters is None else exporters)
        self.resource = resource
        self.sampler = sampler if sampler is not None else self._sampler()
        self.ids = RandomIdGenerator()
        self.ttft_threshold = environment.threshold_seconds(environment.TRACES_TTFT_THRESHOLD_MS)
        self.e2e_threshold = environment.threshold_seconds(environment.TRACES_E2E_THRESHOLD_MS)
        self.keep = environment.traces_keep()
        self.max_queue = environment.positive_int(environment.BSP_MAX_QUEUE_SIZE, 2048)
        self.batch_size = min(environment.positive_int(environment.BSP_MAX_EXPORT_BATCH_SIZE, 512), self.max_queue)
        self.delay = environment.positive_int(environment.BSP_SCHEDULE_DELAY, 5000) / 1000.0
        self.queue: deque = deque()
        self.dropped: dict[str, int] = {}
        self._dropped_lock = threading.Lock()
        self._lock = threading.Lock()  # one export at a time (the thread's, a flush's)
        self._wake = threading.Event()
        self._stopping = False
        self._build_failed = False
        self._thread = None
        if self.exporters:
            self._thread = threading.Thread(target=self._run, name="otel-vllm-ascend-traces", daemon=True)
            self._thread.start()
        atexit.register(self.shutdown)

    # -- configuration ------------------------------------------------------------------------------------------
    @staticmethod
    def _sampler():
        from opentelemetry.sdk.trace import TracerProvider

        # The SDK's own reading of OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG: the sampler a TracerProvider
        # built without one takes (public API; once per pipeline).
        return TracerProvider(shutdown_on_exit=False).sampler

    @staticmethod
    def _exporters() -> list:
        return otlp.load_exporters(environment.trace_exporter_names(), "traces")

    # -- the output loop's side ------------------------------------------------------------------------------
    def drop(self, reason: str, count: int = 1) -> None:
        """Count ``count`` lost traces (``traces_dropped``, exported at the next collection)."""
        with self._dropped_lock:
            self.dropped[reason] = self.dropped.get(reason, 0) + count

    def decide(self, journey: Journey) -> bool:
        """Head sampling, then the tail rules, for a finished journey (once: later calls return the first answer).
        A kept journey gets its trace id, root span id and parent (None for a tail-kept one under a dropped parent,
        which is linked instead)."""
        if journey.decided is not None:
            return journey.decided
        if journey.head is None:
            self.assign(journey)
        if journey.head:
            journey.parent_span = journey.parent
        else:
            reason = self._tail(journey)
            if reason is None:
                journey.decided = False
                return False
            journey.kept_by = reason
        journey.decided = True
        return True

    def assign(self, journey: Journey) -> None:
        """Head sampling, and the ids the journey's request span will have if it is kept: the parent's trace (or a
        new one) when head sampling keeps it, a new trace (a root linked to the parent) when only a tail rule may.
        ``decide`` calls it at the end; with slow-step traces on, ``handlers/traces.py`` at the start, so that the
        EngineCore can link a step to the request span before the request ends."""
        parent = journey.parent
        trace_id = parent.trace_id if parent is not None else self.ids.generate_trace_id()
        journey.head = self._head(parent, trace_id, journey)
        if not journey.head and parent is not None:
            trace_id = self.ids.generate_trace_id()
        journey.trace_id, journey.span_id = trace_id, self.ids.generate_span_id()

    def _head(self, parent, trace_id, journey) -> bool:
        from opentelemetry import trace as trace_api
        from opentelemetry.context import Context

        if parent is not None:
            parent_context = trace_api.set_span_in_context(trace_api.NonRecordingSpan(parent), Context())
        else:
            parent_context = Context()
        result = self.sampler.should_sample(parent_context, trace_id, journey.operation, trace_api.SpanKind.SERVER)
        return result.decision.is_sampled()

    def _tail(self, journey: Journey) -> str | None:
        keep = self.keep
        if journey.error is not None:
            if journey.error == ABORT and ABORT in keep:
                return ABORT
            if journey.error != ABORT and ERROR in keep:
                return ERROR
        if journey.preemptions and PREEMPT in keep:
            return PREEMPT
        if self.ttft_threshold is not None and journey.first_latency is not None:
            if journey.first_latency > self.ttft_threshold:
                return TTFT
        if self.e2e_threshold is not None and journey.e2e is not None and journey.e2e > self.e2e_threshold:
            return E2E
        if journey.step_links:
            return STEP
        return None

    def submit(self, journey: Journey | StepTrace) -> bool:
        """Queue a kept journey for export; False where it is not queued (no exporter; the queue full: dropped and
        counted), so that no exemplar names a trace that will not be sent."""
        if not self.exporters:
            return False
        queue = self.queue
        if len(queue) >= self.max_queue:
            self.drop("queue_full")
            return False
        queue.append(journey)
        if len(queue) >= self.batch_size:
            self._wake.set()
        return True

    # -- the export thread ---------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self.delay)
            self._wake.clear()
            if os.getpid() != self.pid:  # an inherited copy (fork): the child builds its own
                return
            try:
                self.export_queued()
            except Exception:
                logger.exception("trace export failed")

    def export_queued(self) -> None:
        """Build and export everything queued now, in batches."""
        with self._lock:
            queue = self.queue
            while queue:
                batch: list = []
                while queue and len(batch) < self.batch_size:
                    batch.append(queue.popleft())
                offset = time.time_ns() - time.monotonic_ns()
                spans = []
                for journey in batch:
                    try:
                        build = getattr(journey, "spans", None)  # a kept step (recording/step_spans.py)
                        if build is not None:
                            spans.extend(build(offset, self.resource, self.ids))
                        else:
                            spans.extend(journey_spans(journey, offset, self.resource, self.ids))
                    except Exception:
                        if not self._build_failed:  # once: the count says how often
                            self._build_failed = True
                            logger.exception("could not build the spans of request %s", journey.request_id)
                        self.drop("export_failed")
                if not spans:
                    continue
                for exporter in self.exporters:
                    try:
                        result = exporter.export(spans)
                    except Exception:
                        logger.debug("span export raised", exc_info=True)
                        result = None
                    if getattr(result, "name", None) != "SUCCESS":
                        self.drop("export_failed", len(batch))

    def flush(self) -> None:
        if os.getpid() == self.pid:
            self.export_queued()

    def shutdown(self) -> None:
        """The final export (at exit), waiting at most OTEL_VLLM_ASCEND_SHUTDOWN_TIMEOUT_MS for it: an unreachable
        collector never holds the process up longer (what was not exported by then is lost)."""
        if os.getpid() != self.pid or self._stopping:
            return
        self._stopping = True
        self._wake.set()

        def final():
            try:
                self.export_queued()
            except Exception:
                logger.debug("final trace export failed", exc_info=True)
            for exporter in self.exporters:
                try:
                    exporter.shutdown()
                except Exception:
                    logger.debug("span exporter shutdown failed", exc_info=True)

        worker = threading.Thread(target=final, name="otel-vllm-ascend-traces-final", daemon=True)
        worker.start()
        worker.join(environment.shutdown_timeout_ms() / 1000.0)


_LOCK = threading.Lock()


def tracing() -> Tracing:
    """This process's trace pipeline (built at the first call; a forked child builds its own)."""
    current = STATE.tracing
    if current is not None and current.pid == os.getpid():
        return current
    with _LOCK:
        current = STATE.tracing
        if current is None or current.pid != os.getpid():
            from . import pipeline

            provider = STATE.tracer_provider
            if provider is not None:
                current = STATE.tracing = _for_provider(provider)
            else:
                current = STATE.tracing = Tracing(resource=pipeline.get().resource)
        return current


def _for_provider(provider) -> Tracing:
    """The trace pipeline of a user's TracerProvider: its resource and sampler; spans to its span processors. A
    provider without the SDK's processor (not an SDK TracerProvider) is one log line, and the environment's
    exporters."""
    from opentelemetry.sdk.trace import TracerProvider

    from . import pipeline

    processor = private_otel.span_processor(provider)
    if processor is None:
        if isinstance(provider, TracerProvider):  # an SDK without the private shape: private_otel said so
            return Tracing(resource=pipeline.get().resource)
        logger.warning(
            "opentelemetry-instrumentation-vllm-ascend: the tracer_provider given to instrument() (%s) is not an "
            "OpenTelemetry SDK TracerProvider; request traces go to OTEL_TRACES_EXPORTER instead",
            type(provider).__name__,
        )
        return Tracing(resource=pipeline.get().resource)
    return Tracing(
        exporters=[providers.ProviderSpans(processor)],
        resource=getattr(provider, "resource", None) or pipeline.get().resource,
        sampler=getattr(provider, "sampler", None),
    )


def use_provider(provider) -> None:
    """Request traces go to ``provider`` (a user's TracerProvider), or (None) back to OTEL_TRACES_EXPORTER's
    exporters: the trace pipeline built before is shut down (its queue exported)."""
    if provider is None and STATE.tracer_provider is None:
        return
    STATE.tracer_provider = provider
    install(None)


def install(instance: Tracing | None) -> None:
    """Use ``instance`` as this process's trace pipeline (tests), or forget it (None)."""
    with _LOCK:
        old, STATE.tracing = STATE.tracing, instance
    if old is not None and old is not instance:
        old.shutdown()


def export_drops() -> None:
    """Add the traces lost since the last collection to ``traces_dropped`` (a pre-collection step)."""
    current = STATE.tracing
    if current is None or current.pid != os.getpid() or not current.dropped:
        return
    from .instruments import add

    with current._dropped_lock:
        dropped, current.dropped = current.dropped, {}
    ctx = context.PROCESS
    for reason, count in dropped.items():
        add(catalogue.TRACES_DROPPED, count, (ctx.dp, ctx.role, reason))
