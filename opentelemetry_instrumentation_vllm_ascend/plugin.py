"""``vllm.general_plugins`` entry point: vLLM calls it in every process it runs (API server,
EngineCore, workers) before building engines, so processes it spawns — which inherit no patches —
get instrumented too. It instruments when OTEL_VLLM_ASCEND_ENABLED=true, which ``instrument()``
sets for its children, and never raises."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def register() -> None:
    try:
        from . import environment

        if environment.flag(environment.ENABLED) is not True or environment.disabled_by_otel():
            return
        from . import VllmAscendInstrumentor

        instrumentor = VllmAscendInstrumentor()
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument(skip_dep_check=True)
        installer = instrumentor.installer
        if installer is not None:
            # Another plugin vLLM loaded before this one may have put an import finder ahead of our hooks.
            installer.catch_up()
    except Exception:
        logger.exception("opentelemetry-instrumentation-vllm-ascend plugin failed; vLLM runs uninstrumented")
