"""The per-step record (docs/steps.md): one record per engine step that scheduled work, in each EngineCore,
sent to the sinks the environment turns on (``OTEL_VLLM_ASCEND_STEPS_ZMQ``: a ZMQ PUB socket, msgpack,
wire-compatible with NVIDIA Dynamo's forward-pass metrics v1; ``OTEL_VLLM_ASCEND_STEPS_FILE``: JSON lines,
rotated, size-bounded; ``OTEL_VLLM_ASCEND_STEPS_OTLP_LOGS``: OTLP log records; the sinks are step_sinks.py's). With
no sink on there is no ``Stream`` (``STATE.step_stream`` is None) and the
scheduler hooks add nothing.

Cost on the EngineCore: the scheduler hook appends one tuple of what it already read (the SchedulerOutput, the
step's events, classification, queue and block state, a C-level copy of the waiting queue) to ``pending``; the
update hook completes it with its two clock readings and moves it to ``queue`` (bounded: a full queue drops the
record and counts it). Everything else — the per-request sums and variances, encoding, sending, writing — runs
on the stream's one background thread, which wakes every ``INTERVAL_S`` and drains the queue. At a clean stop
(atexit, multiprocessing's exit finalizers, ``uninstrument()``) the thread drains what is left before the
sockets close (``close``).

Drops are counted on ``/metrics`` as ``step_record_dropped`` (``export_drops``, a pre-collection step), by
reason: ``queue_full`` (the background thread fell behind), ``zmq_full`` (a subscriber stopped reading: the
socket is an XPUB with ``XPUB_NODROP``, so a full subscriber pipe is seen, never silent), ``file_error`` (a
write failed), ``otlp_full`` (more records in the OTLP logs' batch processor than its queue holds),
``otlp_error`` (the OTLP log exporter reported a failure), ``incomplete`` (a step whose ``update_from_output``
never returned).
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import threading
import time
from collections import deque

from .. import catalogue, context, environment
from ..state import STATE
from . import step_traces
from .step_fields import EXTENSION, VERSION, record
from .step_sinks import ZmqSink, open_sinks

__all__ = ["EXTENSION", "VERSION", "Stream", "close", "configure", "export_drops", "flush"]

logger = logging.getLogger(__name__)

#: How often the background thread drains the queue (seconds) at most; it also drains as soon as ``WAKE_AT``
#: records wait (the update hook wakes it): each waiting record keeps a few of its step's containers alive, and
#: hundreds of them (fast steps) would start the garbage collector on the EngineCore's thread.
INTERVAL_S = 0.02
WAKE_AT = 32
#: Records the background thread builds and sends between two hand-backs of the GIL (~20-40 µs each).
YIELD_EVERY = 8
DEFAULT_QUEUE = 4096
DEFAULT_FILE_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_FILE_BACKUPS = 2
DEFAULT_ZMQ_HWM = 10_000
#: The reasons of ``step_record_dropped``.
REASONS = ("queue_full", "zmq_full", "file_error", "otlp_full", "otlp_error", "incomplete")


class Stream:
    """This process's step records: the two deques the EngineCore's hooks append to, the background thread,
    the sinks (made in that thread, at its start: the EngineCore's dp is known by then) and the drop counts."""

    def __init__(self, zmq_endpoint: str | None, file_path: str | None, otlp_logs: bool = False, tracer=None) -> None:
        self.zmq_endpoint = zmq_endpoint
        self.file_path = file_path
        self.otlp_logs = otlp_logs
        #: Slow-step traces (``step_traces.StepTracer``), or None: off.
        self.tracer = tracer
        self.capacity = environment.integer(environment.STEPS_QUEUE, DEFAULT_QUEUE, 1)
        self.file_max_bytes = environment.integer(environment.STEPS_FILE_MAX_BYTES, DEFAULT_FILE_MAX_BYTES, 1024)
        self.file_backups = environment.integer(environment.STEPS_FILE_BACKUPS, DEFAULT_FILE_BACKUPS, 0)
        self.zmq_hwm = environment.integer(environment.STEPS_ZMQ_HWM, DEFAULT_ZMQ_HWM, 1)
        self.worker_id = os.environ.get(environment.STEPS_WORKER_ID) or f"{socket.gethostname()}:{os.getpid()}"
        #: Steps scheduled, waiting for their update_from_output (the hooks' side; FIFO, a few at most).
        self.pending: deque = deque()
        #: Completed steps waiting for the background thread (at most ``capacity``).
        self.queue: deque = deque()
        #: Records dropped because ``queue`` was full (the EngineCore thread's count; the others' are in ``dropped``).
        self.queue_full = 0
        self.dropped = dict.fromkeys(REASONS, 0)
        self.exported = dict.fromkeys(REASONS, 0)
        self.sent = 0  # records the ZMQ sink sent
        self.written = 0  # records built and handed to the sinks
        self.subscribers = 0
        self.started = False
        self.pid = os.getpid()
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()
        #: Set by the update hook when ``WAKE_AT`` records wait, and by ``close``.
        self.wake = threading.Event()
        self.sinks: list = []
        self.prompts: dict = {}  # request id -> prompt length (the background thread's)
        self.clock_offset = time.time() - time.perf_counter()
        self.closed = False
        self.busy = False  # the thread is draining
        self.last_end: float | None = None  # the previous record's update end (the background thread's)

    def forked(self) -> Stream:
        """A forked child's own stream (same settings; nothing of the parent's queue, thread or sockets)."""
        tracer = step_traces.StepTracer() if self.tracer is not None else None
        return Stream(self.zmq_endpoint, self.file_path, self.otlp_logs, tracer)

    # -- the EngineCore thread ----------------------------------------------------------------------------
    def enqueue(self, item: tuple) -> None:
        """A completed step to the bounded queue (``UpdateFromOutput.after`` inlines this for the usual step)."""
        queue = self.queue
        if len(queue) < self.capacity:
            queue.append(item)
            if len(queue) == WAKE_AT:
                self.wake.set()
        else:
            self.queue_full += 1
        if not self.started:
            self.start()

    def start(self) -> None:
        """Start the background thread (the first completed step calls it)."""
        if self.started:
            return
        self.started = True
        self.thread = threading.Thread(target=self._run, name="otel-vllm-ascend-steps", daemon=True)
        self.thread.start()
        atexit.register(self.close)
        try:
            from multiprocessing import util

            util.Finalize(None, self.close, exitpriority=101)  # before the pipeline's final export (100)
        except Exception:
            pass

    # -- the background thread ----------------------------------------------------------------------------
    def open_sinks(self) -> None:
        open_sinks(self)

    def _run(self) -> None:
        try:
            self.open_sinks()
        except Exception:
            logger.warning("opentelemetry-instrumentation-vllm-ascend: step records: no sink", exc_info=True)
        wake = self.wake
        while True:
            wake.wait(INTERVAL_S)
            wake.clear()
            stopping = self.stop.is_set()
            try:
                self.drain()
            except Exception:
                logger.warning("opentelemetry-instrumentation-vllm-ascend: step records: a drain failed", exc_info=True)
            if stopping:
                break

    def flush(self, timeout_s: float) -> None:
        """Wake the thread and wait (``timeout_s`` at most) until the records queued so far reached the sinks
        (a flush request before the server stops: ``recording.shutdown.flush_here``); the stream goes on."""
        if not self.started or self.closed or self.pid != os.getpid() or self.thread is None:
            return
        deadline = time.monotonic() + timeout_s
        self.wake.set()
        while (self.queue or self.busy) and time.monotonic() < deadline:
            time.sleep(0.001)
        for sink in list(self.sinks):
            flush = getattr(sink, "flush", None)
            if flush is not None:
                try:
                    flush(max(deadline - time.monotonic(), 0.0))
                except Exception:
                    logger.debug("step records: a sink's flush failed", exc_info=True)

    def drain(self) -> None:
        self.busy = True
        try:
            self._drain()
        finally:
            self.busy = False

    def _drain(self) -> None:
        queue = self.queue
        for sink in self.sinks:
            if isinstance(sink, ZmqSink):
                sink.poll_subscriptions()
        if not queue:
            return
        while queue:
            item = queue.popleft()
            try:
                record = self.build(*item)
            except Exception:
                self.dropped["incomplete"] += 1
                environment.warn_once(
                    ("step record build",),
                    "opentelemetry-instrumentation-vllm-ascend: step records: a record could not be built",
                )
                continue
            self.written += 1
            for sink in self.sinks:
                sink.send(record)
            # Hand the GIL back every few records: the EngineCore thread, if it waits for it, runs now rather
            # than after the interpreter's switch interval (5 ms).
            if not self.written % YIELD_EVERY:
                _yield(0)
        for sink in self.sinks:
            done = getattr(sink, "batch_done", None)
            if done is not None:
                done()

    def build(self, scheduled, update_start: float, update_end: float, stamp=None, trace: tuple | None = None) -> dict:
        """One record from what the hooks kept (``stamp``: the worker's on its output); ``trace``: a step trace is
        exported from it (``StepTracer.keep``)."""
        built = record(self, scheduled, update_start, update_end, stamp)
        if (tracer := self.tracer) is not None:
            kept = scheduled[11]
            tracer.note_new(kept[1], getattr(scheduled[1], "requests", None) or {})
            tracer.observe(built["wall_time"])
            if trace is not None:
                from .step_fields import worker_timeline
                from .step_spans import StepTrace
                from .traces import tracing

                ours = built[EXTENSION]
                if trace[3] is not None:  # the failed executor call's exception type
                    ours["error"] = trace[3]
                timeline = worker_timeline(stamp, self.clock_offset)
                tracing().submit(StepTrace(built, ours, trace, tracer.carried(kept[0]), timeline))
            tracer.forget(kept[6])
        return built

    def close(self, timeout_s: float = 2.0) -> None:
        """Drain and close (a clean stop): the records queued so far reach the sinks; idempotent."""
        if self.closed or self.pid != os.getpid():
            return
        self.closed = True
        thread = self.thread
        if thread is not None:
            self.stop.set()
            self.wake.set()
            thread.join(timeout_s)
        for sink in self.sinks:
            sink.close(int(timeout_s * 1000))
        self.sinks = []


_yield = time.sleep


def configure() -> Stream | None:
    """This process's stream from the environment (``instrument()`` calls it): None when no sink is on."""
    endpoint = os.environ.get(environment.STEPS_ZMQ) or None
    path = os.environ.get(environment.STEPS_FILE) or None
    otlp_logs = environment.flag(environment.STEPS_OTLP_LOGS) is True
    tracer = step_traces.StepTracer() if step_traces.enabled() else None
    current = STATE.step_stream
    if current is not None:
        current.close()
    on = endpoint or path or otlp_logs or tracer is not None
    STATE.step_stream = Stream(endpoint, path, otlp_logs, tracer) if on else None
    return STATE.step_stream


def close() -> None:
    """Drain and close this process's stream (``uninstrument()``); the hooks stop adding records."""
    current, STATE.step_stream = STATE.step_stream, None
    if current is not None:
        current.close()


def flush(timeout_s: float) -> None:
    """This process's records queued so far, to their sinks now (``Stream.flush``)."""
    current = STATE.step_stream
    if current is not None:
        current.flush(timeout_s)


def export_drops() -> None:
    """Add the records dropped since the last collection to ``step_record_dropped`` (a pre-collection step)."""
    current = STATE.step_stream
    if current is None or current.pid != os.getpid():
        return
    from .instruments import add

    current.dropped["queue_full"] = current.queue_full
    ctx = context.PROCESS
    for reason in REASONS:
        count = current.dropped[reason] - current.exported[reason]
        if count > 0:
            current.exported[reason] += count
            add(catalogue.STEP_RECORD_DROPPED, count, (ctx.dp, ctx.role, reason))
