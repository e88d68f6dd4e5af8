"""Worker memory after warm-up, and device utilization.

Memory: read once per worker from what the worker stored while profiling and warming up (vLLM's
CUDA ``Worker``, its ``CPUWorker`` subclass, vllm-ascend's ``NPUWorker``): right after
``compile_or_warm_up_model`` returns, or — when instrumentation was enabled after start-up — at the
worker's first ``execute_model`` call. A value the worker did not store is not exported (absent,
not 0). Values are in GiB, as the incumbent's ``…_gb`` names say.

Utilization: an observable gauge per worker device, read at each collection from torch_npu
(``torch.npu.utilization``) or, on CUDA, ``torch.cuda.utilization`` (NVML); nothing is exported
where no device exists or the API is unavailable.
"""

from __future__ import annotations

from types import MappingProxyType

from .. import context, recording
from ..catalogue import ALL, M
from ..hooks.handler import Handler
from ..state import STATE
from .common import device_module

GIB = float(1 << 30)


#: gauge seed → how to read it from a worker (None: not stored).
def _getter(*path, scale=GIB):
    def read(worker):
        value = worker
        for name in path:
            value = getattr(value, name, None)
            if value is None:
                return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        return value / scale if scale else float(value)

    return read


def _first(*readers):
    def read(worker):
        for reader in readers:
            value = reader(worker)
            if value is not None:
                return value
        return None

    return read


MEMORY = MappingProxyType(
    {
        "engine:memory:total_gb": _getter("init_snapshot", "total_memory"),
        "engine:memory:utilization_ratio": _getter("cache_config", "gpu_memory_utilization", scale=None),
        "engine:memory:reserved_gb": _getter("requested_memory"),
        "engine:memory:weights_gb": _getter("model_runner", "model_memory_usage"),
        "engine:memory:kvcache_gb": _first(
            _getter("available_kv_cache_memory_bytes"), _getter("cache_config", "kv_cache_memory_bytes")
        ),  # CPU workers, explicit sizes
        "engine:memory:non_torch_gb": _getter("non_torch_memory"),
        "engine:memory:activation_gb": _getter("peak_activation_memory"),
        "engine:memory:graph_gb": _getter("npugraph_memory_bytes"),
    }
)

_captured = STATE.memory_captured  # ids of workers whose memory was recorded


def capture(worker) -> int:
    """Record the worker's memory gauges; returns how many values it had. Their ``rank`` is the
    process's (WorkerInit); a worker built before instrumentation started sets it here."""
    _captured.add(id(worker))
    if "rank" not in context.PROCESS.labels:
        context.set_rank(getattr(worker, "rank", None))
    labels = context.step_labels(ALL)
    found = 0
    for seed, read in MEMORY.items():
        value = read(worker)
        if value is not None:
            recording.set_gauge(M[seed], value, labels)
            found += 1
    return found


class WarmUp(Handler):
    """``compile_or_warm_up_model``: the worker's memory numbers are final when it returns."""

    reads_args = 1  # self

    def after(self, state, args, kwargs, result):
        capture(args[0])


class LateCapture(Handler):
    """The worker's ``execute_model``: captures memory once if warm-up happened before we were
    installed (one set lookup per step otherwise)."""

    reads_args = 1  # self

    def before(self, args, kwargs, _captured=_captured):
        if id(args[0]) not in _captured:
            capture(args[0])


# -- device utilization ---------------------------------------------------------------------------------


def utilization():
    """[(labels, percent)] for this process's device; [] where there is none or no API answers."""
    module = device_module()
    if module is None:
        return []
    try:
        index = module.current_device()
    except Exception:
        return []
    read = getattr(module, "utilization", None)
    if read is None:
        return []
    value = read(index)
    if not isinstance(value, (int, float)) or value < 0:
        return []
    return [(context.step_labels_with(ALL, str(index)), float(value))]


def observe_utilization() -> None:
    """Register the utilization gauge for this (worker) process, once."""
    if not STATE.utilization_observed:
        STATE.utilization_observed = True
        recording.observe(M["npu:utilization"], utilization)
