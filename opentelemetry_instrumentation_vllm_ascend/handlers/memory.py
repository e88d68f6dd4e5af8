"""Worker memory after warm-up, and device utilization.

Memory: read once per worker from what the worker stored while profiling and warming up (vLLM's
CUDA ``Worker``, its ``CPUWorker`` subclass, vllm-ascend's ``NPUWorker``): right after
``compile_or_warm_up_model`` returns, or — when instrumentation was enabled after start-up — at the
worker's first ``execute_model`` call. A value the worker did not store is not exported (absent,
not 0). Values are in GiB, as the incumbent's ``…_gb`` names say. Each value is read on its own: one that
fails to read is logged once (``hooks.handler.report``) and only it is missing.

vLLM 0.34: ``gpu_memory_utilization`` defaults to None, resolved where vLLM uses it
(``CacheConfig.resolved_gpu_memory_utilization``: 1.0 with the extensible KV cache, else 0.92): the ratio is
that resolved value. The extensible KV cache (the default on CUDA and ROCm) is sized only after warm-up, by
``Worker.extend_kv_cache``: its ``kvcache_gb`` is the memory the committed cache holds
(``model_runner.extensible_kv_cache.physical_bytes``), read when ``extend_kv_cache`` returns; the profiling
estimate the worker stored (``available_kv_cache_memory_bytes``) is not that size and is not exported.

Utilization: an observable gauge per worker device, read at each collection from torch_npu
(``torch.npu.utilization``) or, on CUDA, ``torch.cuda.utilization`` (NVML); nothing is exported
where no device exists or the API is unavailable.
"""

from __future__ import annotations

from types import MappingProxyType

from .. import context, recording
from ..catalogue import ALL, M
from ..hooks.handler import Handler, report
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


_KVCACHE = "engine:memory:kvcache_gb"
#: What the worker gave the KV cache before allocating it (profiled; CPU workers, explicit sizes: the size set).
_kv_budget = _first(_getter("available_kv_cache_memory_bytes"), _getter("cache_config", "kv_cache_memory_bytes"))
_extensible_bytes = _getter("model_runner", "extensible_kv_cache", "physical_bytes")


def _extensible(worker) -> bool:
    """vLLM 0.34+: the worker's KV cache is extensible (sized after warm-up, by ``extend_kv_cache``)."""
    return getattr(getattr(worker, "model_runner", None), "extensible_kv_cache", None) is not None


MEMORY = MappingProxyType(
    {
        "engine:memory:total_gb": _getter("init_snapshot", "total_memory"),
        "engine:memory:utilization_ratio": _first(
            _getter("cache_config", "resolved_gpu_memory_utilization", scale=None),  # vLLM 0.34+: None resolved
            _getter("cache_config", "gpu_memory_utilization", scale=None),
        ),
        "engine:memory:reserved_gb": _getter("requested_memory"),
        "engine:memory:weights_gb": _getter("model_runner", "model_memory_usage"),
        _KVCACHE: lambda worker: (
            _extensible_bytes(worker) if _extensible(worker) else _kv_budget(worker)
        ),  # vLLM 0.34's extensible cache: its committed size (final once extend_kv_cache returned)
        "engine:memory:non_torch_gb": _getter("non_torch_memory"),
        "engine:memory:activation_gb": _getter("peak_activation_memory"),
        "engine:memory:graph_gb": _getter("npugraph_memory_bytes"),
    }
)

_captured = STATE.memory_captured  # ids of workers whose memory was recorded (or whose warm-up began)

#: What a failed read's log line names (``memory:capture``, the value's seed).
_READS = Handler()
_READS.name = "memory:capture"


def capture(worker, seeds=None) -> int:
    """Record the worker's memory gauges (``seeds``: only those); returns how many values it had. Their
    ``rank`` is the process's (WorkerInit); a worker built before instrumentation started sets it here. A
    read that raises loses its value only (logged once per value)."""
    _captured.add(id(worker))
    if "rank" not in context.PROCESS.labels:
        context.set_rank(getattr(worker, "rank", None))
    labels = context.step_labels(ALL)
    found = 0
    for seed, read in MEMORY.items():
        if seeds is not None and seed not in seeds:
            continue
        try:
            value = read(worker)
        except Exception:
            report(_READS, seed)
            continue
        if value is not None:
            recording.set_gauge(M[seed], value, labels)
            found += 1
    return found


_BUT_KVCACHE = frozenset(MEMORY) - {_KVCACHE}


class WarmUp(Handler):
    """``compile_or_warm_up_model``: the worker's memory numbers are final when it returns — but for vLLM
    0.34's extensible KV cache, whose size ``extend_kv_cache`` sets afterwards (``ExtendKvCache``). The worker
    counts as captured from the call (vLLM 0.34's warm-up runs ``execute_model``: no ``LateCapture`` then)."""

    reads_args = 1  # self

    def before(self, args, kwargs):
        _captured.add(id(args[0]))

    def after(self, state, args, kwargs, result):
        worker = args[0]
        try:
            extensible = _extensible(worker)
        except Exception:
            report(self, "extensible_kv_cache")
            extensible = True  # its kvcache_gb is not known to be final
        capture(worker, _BUT_KVCACHE if extensible else None)


class ExtendKvCache(Handler):
    """vLLM 0.34+ ``Worker.extend_kv_cache(num_blocks)``: the extensible KV cache's final size is committed:
    ``kvcache_gb`` is read now."""

    reads_args = 1  # self

    def after(self, state, args, kwargs, result):
        capture(args[0], (_KVCACHE,))


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
