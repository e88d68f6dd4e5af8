"""One OTel metrics pipeline per process, owned by this package (not the global MeterProvider,
which ``opentelemetry-instrument`` builds without our Views).

- Built lazily, at the first recording (or when a vLLM hook tells us what the process is).
- Readers: a files reader feeding vLLM's ``/metrics`` (on unless OTEL_VLLM_ASCEND_PROMETHEUS=false,
  whatever OTEL_METRICS_EXPORTER says), and one OTLP (or console) reader per name in
  OTEL_METRICS_EXPORTER, with the standard OTEL_EXPORTER_OTLP_* settings, temporality preference included.
- A user's MeterProvider (``instrument(meter_provider=…)``) gets every measurement too, through SDK instruments on
  its own meter (its readers, Views and aggregations decide what it exports); it then replaces the push readers.
- OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION=base2_exponential_bucket_histogram with a push reader:
  the SDK recorder, whose histogram Views leave the aggregation to each reader (the catalogue's buckets as the
  instrument's advice), so OTLP gets exponential histograms and the files reader the catalogue's buckets.
- Resource: service.name (``vllm`` unless OTEL_SERVICE_NAME/OTEL_RESOURCE_ATTRIBUTES say otherwise),
  service.instance.id, process.pid, vllm.process.role, vllm.dp_rank, vllm.pd_role.
- Fork: the child drops the inherited pipeline (its readers are stopped, its exporters are no-ops
  outside the pid that built them) and builds its own, so pre-fork data is never exported twice.
- Exit: data is flushed at interpreter exit and at multiprocessing's exit of forked children
  (which leave through ``os._exit``, skipping atexit).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import uuid
from typing import TYPE_CHECKING

from .. import catalogue, context, environment, semconv, state
from ..state import STATE
from ..version import __version__
from . import private_otel, providers
from .collect_steps import (  # noqa: F401  (the recording facade and instrument() register through pipeline)
    HANDLERS,
    LAST,
    RECORDS,
    REPORTS,
    add_after_fork,
    add_pre_collect,
    before_collect,
)
from .views import views

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter
    from opentelemetry.sdk.metrics import MeterProvider

    from .fastpath import Store
    from .files_writer import FilesExporter

logger = logging.getLogger(__name__)


class Pipeline:
    def __init__(self, extra_readers=(), recorder: str | None = None, disabled: bool = False) -> None:
        """``disabled``: no reader of its own (what a process records goes nowhere): the fallback when
        building the configured pipeline failed."""
        from opentelemetry.sdk.resources import Resource

        self.pid = os.getpid()
        self.recorder = recorder or environment.recorder()
        self.files_exporter: FilesExporter | None = None
        self.disabled = disabled
        #: A push reader was built with OTLP's exponential histograms asked for (the SDK recorder then).
        self.exponential = False
        user_provider = STATE.meter_provider
        readers = [] if disabled else self._readers(push=user_provider is None)
        if self.exponential and recorder is None and self.recorder == "fast":
            self.recorder = "sdk"  # the fast path aggregates into the catalogue's buckets only
        readers.extend(extra_readers)
        self.readers = readers
        if self.recorder == "fast" and not private_otel.fast_path_fits(readers):
            self.recorder = "sdk"  # the SDK's private reader shapes are gone: its public recorder (one log line)

        ctx = context.PROCESS
        attributes = {
            semconv.SERVICE_INSTANCE_ID: str(uuid.uuid4()),
            "process.pid": self.pid,
            "vllm.process.role": ctx.process,
            "vllm.dp_rank": ctx.dp,
            "vllm.pd_role": ctx.role,
        }
        env_attrs = os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
        if not os.environ.get("OTEL_SERVICE_NAME") and "service.name=" not in env_attrs:
            attributes[semconv.SERVICE_NAME] = "vllm"
        resource = self.resource = Resource.create(attributes)
        self.provider: MeterProvider | None = None
        self.meter: Meter | None = None  # the SDK recorder's
        self.store: Store | None = None  # the fast recorder's
        self.viewed: set[str] = set()
        if self.recorder == "sdk":
            from opentelemetry.sdk.metrics import MeterProvider

            specs = catalogue.defined()
            # The metrics this provider has Views for: an SDK provider's Views are fixed when it is built.
            self.viewed = {spec.exposed_name for spec in specs}
            self.provider = MeterProvider(
                metric_readers=readers,
                resource=resource,
                views=views(specs, buckets=not self.exponential),
                shutdown_on_exit=False,
            )
            self.meter = self._meter(self.provider)
        else:
            from .fastpath import Store

            self.store = Store(
                resource, catalogue.SCOPE_NAME, __version__, process_attributes=context.process_attributes
            )
            self.store.before_collect.append(self._before_collect)
            for reader in readers:
                self.store.attach(reader)
        #: The user's MeterProvider's meter (its instruments get each measurement too), None: no such provider.
        self.user_provider = user_provider
        self.user_meter: Meter | None = None
        if user_provider is not None:
            try:
                self.user_meter = self._meter(user_provider)
            except Exception as exc:
                logger.error(
                    "opentelemetry-instrumentation-vllm-ascend: the meter_provider given to instrument() gives no "
                    "meter (%s: %s); its readers get none of our metrics",
                    type(exc).__name__,
                    exc,
                )
        self._closed = False
        #: flush() or close() ran the pre-collection step for the export it makes: every reader's
        #: collection in it then sees the same values (a stage budget's open stage would otherwise grow
        #: between them; the clean-stop flush and the final export write /metrics files and OTLP alike).
        self._final_values_taken = False
        #: Set once close() is done (its final export made or timed out).
        self.closed = threading.Event()

    def _before_collect(self) -> None:
        if not self._final_values_taken:
            before_collect()

    def _meter(self, provider) -> Meter:
        """``provider``'s meter of this package, with an observable gauge that observes nothing and runs the
        pre-collection step at the start of each of its readers' collections."""
        meter = provider.get_meter(catalogue.SCOPE_NAME, __version__)

        def run_hooks(_options):  # an observable instrument that observes nothing: exports nothing
            self._before_collect()
            return []

        meter.create_observable_gauge("otel_vllm_ascend_before_collect", callbacks=[run_hooks])
        return meter

    @property
    def closing(self) -> bool:
        """close() (or abandon()) has begun: no further export but its final one."""
        return self._closed

    def _readers(self, push: bool = True) -> list:
        """The readers the environment asks for (``push``: the push readers too). Each starts its export thread
        when it is built: if a later one fails, those already started are shut down before the failure propagates."""
        readers: list = []
        try:
            self._add_readers(readers, push)
        except BaseException:
            for reader in readers:
                try:
                    reader.shutdown(timeout_millis=1_000)
                except Exception:
                    pass
            raise
        return readers

    def _add_readers(self, readers: list, push: bool = True) -> None:
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        directory = environment.metrics_files_dir() if environment.prometheus_enabled() else None
        if directory:
            from .files_writer import FilesExporter

            self.files_exporter = FilesExporter(directory)
            readers.append(
                PeriodicExportingMetricReader(
                    self.files_exporter,
                    export_interval_millis=environment.interval_ms(
                        environment.PROMETHEUS_INTERVAL_MS, environment.DEFAULT_PROMETHEUS_INTERVAL_MS
                    ),
                )
            )
        from .otlp import push_exporters

        exporters = push_exporters() if push else []
        self.exponential = bool(exporters) and environment.exponential_histograms()
        if exporters:  # OTEL_METRIC_EXPORT_INTERVAL, read once and clamped (0 made the SDK's reader raise)
            push_interval = environment.interval_ms(
                environment.METRIC_EXPORT_INTERVAL, environment.DEFAULT_METRIC_EXPORT_INTERVAL_MS
            )
        for exporter in exporters:
            readers.append(PeriodicExportingMetricReader(exporter, export_interval_millis=push_interval))

    def instrument(self, spec: catalogue.MetricSpec):
        """An instrument with the recording layer's interface: add/record/set(value, label tuple); None for a
        metric this pipeline cannot export as the catalogue defines it."""
        own = self.store.instrument(spec) if self.store is not None else self._own_sdk_instrument(spec)
        if self.user_meter is None:
            return own
        theirs = providers.sdk_instrument(self.user_meter, spec)
        return theirs if own is None else providers.Both(own, theirs)

    def _own_sdk_instrument(self, spec: catalogue.MetricSpec):
        meter = self.meter
        assert meter is not None  # no store: the SDK recorder
        if spec.exposed_name not in self.viewed:
            # Declared after this provider was built (a hook file's metric new on `control reload`): without its
            # View it would go out under its instrument name, unfiltered. Absent instead, until the next start (the
            # recording layer asks once per metric and pipeline).
            logger.warning(
                "opentelemetry-instrumentation-vllm-ascend: metric %s was declared after this process started and "
                "is not recorded with OTEL_VLLM_ASCEND_RECORDER=sdk (its Views are fixed at start); restart the "
                "server, or use the default recorder",
                spec.exposed_name,
            )
            return None
        return providers.sdk_instrument(meter, spec)

    def observe(self, spec: catalogue.MetricSpec, callback) -> None:
        """An observable gauge: ``callback()`` returns ``[(label tuple, value), …]`` at each collection
        (no value: nothing is exported — absent, not zero)."""
        if self.store is not None:
            instrument = self.store.instrument(spec)

            def hook():
                for labels, value in callback():
                    instrument.set(value, labels)

            self.store.before_collect.append(hook)
        else:
            assert self.meter is not None  # no store: the SDK recorder
            providers.observe(self.meter, spec, callback)
        if self.user_meter is not None:
            providers.observe(self.user_meter, spec, callback)

    def flush(self, timeout_millis: float = 5_000) -> None:
        """Export now, every reader the same values (the pre-collection step runs once, first)."""
        if os.getpid() != self.pid or self._closed:
            return
        before_collect()
        self._final_values_taken = True
        try:
            if self.provider is not None:
                self.provider.force_flush(timeout_millis)
            else:
                for reader in self.readers:
                    reader.force_flush(timeout_millis)
            if self.user_meter is not None and hasattr(self.user_provider, "force_flush"):
                self.user_provider.force_flush(timeout_millis)
        finally:
            if not self._closed:
                self._final_values_taken = False

    def close(self, timeout_millis: float | None = None) -> None:
        """Final export, then stop; all readers together within ``timeout_millis`` (default
        OTEL_VLLM_ASCEND_SHUTDOWN_TIMEOUT_MS: an unreachable collector delays the exit by that much,
        not by the exporter's own timeout). Live gauges of this process disappear from /metrics."""
        if os.getpid() != self.pid or self._closed:
            return
        self._closed = True
        if timeout_millis is None:
            timeout_millis = environment.shutdown_timeout_ms()
        deadline = time.monotonic() + timeout_millis / 1000
        try:
            # Values a hook still holds (deferred records) go in before the final export (at exit;
            # reset() has run them already), and are there for a reader read after the close.
            before_collect()
            self._final_values_taken = True
            if self.provider is not None:
                self.provider.shutdown(timeout_millis=timeout_millis)
            else:
                for reader in self.readers:  # the files reader first: it is fast, and local
                    try:
                        reader.shutdown(timeout_millis=max(0.0, deadline - time.monotonic()) * 1000)
                    except Exception as exc:  # one reader out of time: the others still get theirs
                        _final_export_failed(timeout_millis, exc)
        except Exception as exc:  # the SDK raises when a reader missed the deadline: never at exit
            _final_export_failed(timeout_millis, exc)
        finally:
            if self.files_exporter is not None:
                self.files_exporter.remove_live_gauges()
            self.closed.set()

    def abandon(self) -> None:
        """In a forked child: stop the inherited reader threads without exporting anything."""
        self._closed = True
        for reader in self.readers:
            private_otel.stop_inherited_reader(reader)


def _final_export_failed(timeout_millis: float, exc: Exception) -> None:
    logger.warning(
        "opentelemetry-instrumentation-vllm-ascend: the final export did not complete within %s ms "
        "(OTEL_VLLM_ASCEND_SHUTDOWN_TIMEOUT_MS); what it had not written is lost: %s",
        timeout_millis,
        exc,
    )


def get() -> Pipeline:
    pipeline = STATE.pipeline
    if pipeline is not None:
        return pipeline
    return _build()


def current() -> Pipeline | None:
    return STATE.pipeline


def _build() -> Pipeline:
    with STATE.pipeline_lock:
        built = STATE.pipeline
        if built is None:
            try:
                built = Pipeline(extra_readers=STATE.extra_readers)
            except Exception as exc:
                # Never a retry per record (each would start reader threads again): this process
                # records into a pipeline without readers of its own until the next reset().
                logger.error(
                    "opentelemetry-instrumentation-vllm-ascend: cannot build the metrics pipeline "
                    "(%s: %s); this process's metrics are not exported, vLLM runs on",
                    type(exc).__name__,
                    exc,
                )
                built = Pipeline(extra_readers=STATE.extra_readers, disabled=True)
            STATE.pipeline = built
            _register_exit(built)
            state.forget_pipeline(closed=False)  # the recording layer's instruments were the old one's
            for spec, callback in STATE.observers:  # every observable gauge of this process
                built.observe(spec, callback)
        return built


def _register_exit(pipeline: Pipeline) -> None:
    def at_exit():
        try:
            pipeline.close()
        except Exception:
            logger.debug("final metrics export failed", exc_info=True)

    atexit.register(at_exit)
    try:
        # Forked multiprocessing children end in os._exit: atexit never runs there, but
        # multiprocessing's own exit finalizers do.
        from multiprocessing import util

        util.Finalize(None, at_exit, exitpriority=100)
    except Exception:
        pass


def reset(extra_readers=(), meter_provider=None) -> None:
    """Close this process's pipeline; the next recording builds a new one (tests, uninstrument), with
    ``extra_readers`` and a user's ``meter_provider`` (``instrument()``'s keywords)."""
    current = STATE.pipeline
    if current is not None and current.pid == os.getpid() and not current.closing:
        before_collect()  # held values go in while it is still the current pipeline
    with STATE.pipeline_lock:
        old, STATE.pipeline = STATE.pipeline, None
        STATE.extra_readers = tuple(extra_readers)
        STATE.meter_provider = meter_provider
    if old is not None:
        old.close()
    state.forget_pipeline(closed=True)


def _after_fork_in_child() -> None:
    """The package's fork handler."""
    STATE.pipeline_lock = threading.Lock()  # a parent's thread may have held it at the fork
    STATE.collect_lock = threading.RLock()
    STATE.failures_lock = threading.Lock()
    STATE.extra_readers = ()  # a reader belongs to one provider: the parent's
    STATE.meter_provider = STATE.tracer_provider = None  # the user's, in the parent: pre-fork data exported once
    old, STATE.pipeline = STATE.pipeline, None
    if old is not None:
        old.abandon()
    state.reset()  # a parent's pending records, caches and steps are not this process's
    for step in STATE.after_fork:  # the flush listener and the control's poller (the recording facade's)
        step()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
