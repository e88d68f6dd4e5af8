"""The process identity set directly, as tests and benchmarks need it (the package's hooks ``claim`` it)."""

import contextlib
import logging
import sys

from opentelemetry_instrumentation_vllm_ascend import context, state


def set_process(process: str, dp: str, role: str, rank: str | None = None) -> None:
    """Set the process context directly; ``context.claim()`` is what hooks use. ``rank``: the hosted worker's
    rank (None: no worker)."""
    ctx = context.PROCESS
    ctx.process, ctx.dp, ctx.role = process, dp, role
    ctx.labels = {} if rank is None else {"rank": rank}
    state.clear_label_caches()


def package_warnings() -> list:
    """The messages of this package's log records of WARNING and above from now on, in this process (a driver
    subprocess reports them to its test): the list they are appended to."""
    messages: list = []

    class Collect(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                messages.append(record.getMessage())

    logging.getLogger("opentelemetry_instrumentation_vllm_ascend").addHandler(Collect())
    return messages


def instrument_every_metric(process: str, dp: str = "0", role: str = "mixed"):
    """A driver subprocess's set-up: the package instrumented with every metric (``ENABLED_METRICS=*``), no files,
    no exporter, an in-memory reader, in the process context given. Returns (the instrumentor, the reader, the
    list ``package_warnings`` fills)."""
    import os

    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from opentelemetry_instrumentation_vllm_ascend import VllmAscendInstrumentor, environment

    for name in (
        environment.ENABLED,
        environment.PROMETHEUS_MULTIPROC_DIR,
        environment.FILES_DIR,
        environment.METRICS_EXPORTER,
    ):
        os.environ.pop(name, None)
    os.environ[environment.ENABLED_METRICS] = "*"
    failures = package_warnings()
    reader = InMemoryMetricReader()
    instrumentor = VllmAscendInstrumentor()
    instrumentor.instrument(metric_readers=[reader])
    set_process(process, dp, role)
    return instrumentor, reader, failures


@contextlib.contextmanager
def modules_while(stand_ins: dict):
    """``stand_ins`` ({module name: module}) in ``sys.modules`` only inside the block: what was there before is put
    back, and a name that was absent is removed again."""
    saved = {name: sys.modules.get(name) for name in stand_ins}
    sys.modules.update(stand_ins)
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
