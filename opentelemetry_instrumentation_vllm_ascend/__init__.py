"""OpenTelemetry instrumentation for vLLM and vLLM-Ascend.

Records where a vLLM server loses its time and what goes wrong inside it — in every vLLM process
(API server, each EngineCore, each worker, the forked EPLB child) — as OpenTelemetry metrics with
``dp``, ``role`` and ``phase`` attributes, named ``vllm_profiling_…`` for existing dashboards.

Usage
-----

Auto-instrumentation (the usual way)::

    opentelemetry-instrument vllm serve /models/my-model

Metrics appear on vLLM's own ``/metrics``; with ``OTEL_METRICS_EXPORTER=otlp`` (and the usual
``OTEL_EXPORTER_OTLP_*`` settings) every process also pushes its own data to a collector.

Without ``opentelemetry-instrument``, set ``OTEL_VLLM_ASCEND_ENABLED=true``: the package's
``vllm.general_plugins`` entry point then instruments every vLLM process.

Manual::

    from opentelemetry_instrumentation_vllm_ascend import VllmAscendInstrumentor

    VllmAscendInstrumentor().instrument()   # before vLLM builds its engine
    ...
    VllmAscendInstrumentor().uninstrument() # restores every wrapped method

Processes vLLM spawns are instrumented through the plugin (``instrument()`` sets
``OTEL_VLLM_ASCEND_ENABLED=true`` for them). ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=vllm_ascend``
or ``OTEL_VLLM_ASCEND_ENABLED=false`` turns everything off.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from opentelemetry.instrumentation.dependencies import get_dependency_conflicts
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

from . import environment
from .package import _instruments, _instruments_any
from .version import __version__

if TYPE_CHECKING:
    from .recording.metrics_endpoint import Exposition
    from .wiring.installer import Installer

logger = logging.getLogger(__name__)

__all__ = ["VllmAscendInstrumentor", "__version__"]


def register_collection_steps() -> None:
    """The handlers' part of the pipeline's pre-collection step (``recording.pipeline.add_pre_collect``; the
    recording layer knows no handler): after the deferred records, the stage clocks' seconds so far
    (``handlers.budget``); last, once per process, a second look for other vLLM instrumentations that patched
    since the hooks went in (``neighbours.recheck``). Registered once, by ``instrument()``."""
    from . import neighbours
    from .handlers import budget
    from .recording import pipeline

    pipeline.add_pre_collect(budget.flush, pipeline.HANDLERS)
    pipeline.add_pre_collect(neighbours.recheck, pipeline.LAST)


class VllmAscendInstrumentor(BaseInstrumentor):
    """Instruments vLLM / vLLM-Ascend internals in this process (and, via the plugin, its children).

    Keyword arguments of ``instrument()``:
    ``meter_provider``: a MeterProvider that gets this process's metrics too (under their instrument names;
    ``views()`` gives the catalogue's), instead of the OTEL_METRICS_EXPORTER push exporters; vLLM's /metrics
    keeps its own. ``tracer_provider``: a TracerProvider whose span processors get the request traces, instead of
    the OTEL_TRACES_EXPORTER exporters. Both are this process's (spawned and forked processes use the
    environment's settings). ``metric_readers``: extra OTel MetricReaders for this process's pipeline (e.g. an
    InMemoryMetricReader in tests).
    """

    _installer: Installer | None = None
    _exposition: Exposition | None = None
    _set_enabled = False
    _replaced_enabled: str | None = None

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _check_dependency_conflicts(self):
        return get_dependency_conflicts(_instruments, _instruments_any)

    def _instrument(self, **kwargs: Any):
        try:
            self._install(**kwargs)
        except Exception:  # never break the host (and never stop other instrumentors loading)
            logger.exception("opentelemetry-instrumentation-vllm-ascend could not instrument; vLLM runs uninstrumented")

    def _install(self, **kwargs: Any) -> None:
        from .recording import pipeline
        from .recording.metrics_endpoint import Exposition
        from .wiring.installer import Installer

        enabled = environment.flag(environment.ENABLED)
        if enabled is False:
            logger.info("%s=false: not instrumenting vLLM", environment.ENABLED)
            return
        if enabled is None:  # unset (or a value flag() warned about, treated as unset)
            # Processes vLLM spawns load our plugin; this tells it to instrument them too.
            VllmAscendInstrumentor._replaced_enabled = os.environ.get(environment.ENABLED)
            os.environ[environment.ENABLED] = "true"
            VllmAscendInstrumentor._set_enabled = True
        register_collection_steps()
        from .recording import step_records

        step_records.configure()  # the per-step records' sinks (docs/steps.md): none unless the environment says
        readers, meter_provider = kwargs.get("metric_readers"), kwargs.get("meter_provider")
        if readers or meter_provider is not None:
            pipeline.reset(extra_readers=readers or (), meter_provider=meter_provider)
        if kwargs.get("tracer_provider") is not None:
            from .recording import traces

            traces.use_provider(kwargs["tracer_provider"])
        exposition = Exposition()
        exposition.setup()
        VllmAscendInstrumentor._exposition = exposition
        from .recording import services

        services.prepare()  # what the server's processes share: the flush tree's name, the control directory
        # The flush listener and the runtime control start with the first hooked module this process loads: a
        # Python process of the server that runs no vLLM (multiprocessing's resource tracker) gets neither.
        from .state import STATE
        from .wiring.userfile import paths_from_environment

        hook_files = paths_from_environment()
        installer = Installer(on_first_load=services.start, hook_files=hook_files)
        if hook_files:
            STATE.control.reloaders.append(installer.reload)
            STATE.control.summaries.append(installer.summary)
        installer.install()
        VllmAscendInstrumentor._installer = installer

    def _uninstrument(self, **kwargs: Any):
        from .recording import pipeline

        installer, VllmAscendInstrumentor._installer = VllmAscendInstrumentor._installer, None
        if installer is not None:
            installer.remove_hook_files()
        from .recording import services, step_records

        step_records.close()  # the records queued so far reach their sinks
        services.stop()  # the control's callbacks (the hook files' reloader and summary) and the flush listener
        if installer is not None:
            installer.uninstall()
        from .hooks.patches import restore_stand_ins

        restore_stand_ins()  # objects of vLLM's that hooks replaced on their instances
        exposition, VllmAscendInstrumentor._exposition = VllmAscendInstrumentor._exposition, None
        if exposition is not None:
            exposition.teardown()
        if VllmAscendInstrumentor._set_enabled:  # the variable as it was before instrument()
            if VllmAscendInstrumentor._replaced_enabled is None:
                os.environ.pop(environment.ENABLED, None)
            else:
                os.environ[environment.ENABLED] = VllmAscendInstrumentor._replaced_enabled
            VllmAscendInstrumentor._set_enabled = False
        pipeline.reset()
        from .recording import traces

        traces.use_provider(None)

    @staticmethod
    def views() -> list:
        """SDK Views that give a ``meter_provider``'s copy of our metrics their catalogue names and labels (pass them
        to its ``MeterProvider(views=…)``); each histogram's buckets stay the reader's choice, the catalogue's where
        that is explicit."""
        from .recording import pipeline

        return pipeline.views(buckets=False)

    @property
    def installer(self):
        """Status of each target (resolved / gated off by version / missing / waiting for import)."""
        return VllmAscendInstrumentor._installer
