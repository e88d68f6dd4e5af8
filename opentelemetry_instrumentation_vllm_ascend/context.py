"""Who is recording: process kind, engine dp rank and PD role (per process), the label tuples derived
from them (cached), and which monotonic clock the process reads (``HOST_CLOCK``). The step being
scheduled and its classification are ``handlers.steps``.

Label rules (docs/labels.md):
- ``dp``: the engine's data-parallel index, ``parallel_config.data_parallel_index`` (vLLM keeps it
  even for dense models, where ``data_parallel_rank`` is reset to 0). Where that attribute does not
  exist, ``data_parallel_rank`` is used only when it cannot have been reset (DP size 1, or a MoE model);
  otherwise ``unknown`` — never a fake 0.
- ``role``: ``kv_transfer_config.kv_role``: kv_producer → prefill, kv_consumer → decode,
  kv_both or no KV transfer → mixed.
- ``rank`` (a process label, catalogue.WORKER_LABELS): the global rank of the worker this process
  hosts, from ``WorkerBase.__init__``; unset (no ``rank`` label) in a process hosting no worker.
"""

from __future__ import annotations

from types import MappingProxyType

from .catalogue import ROLES
from .state import STATE, UNKNOWN, clear_label_caches

# Higher wins when several hooks claim the same process (an in-process worker inside an EngineCore).
_PRIORITY = MappingProxyType({UNKNOWN: 0, "api_server": 1, "worker": 2, "engine_core": 3, "eplb": 4})


class ProcessContext:
    __slots__ = ("process", "dp", "role", "labels")

    def __init__(self) -> None:
        self.process = UNKNOWN
        self.dp = UNKNOWN
        self.role = "mixed"
        #: Values of the process labels (catalogue.WORKER_LABELS) this process has: {"rank": "1"} in a
        #: worker, {} elsewhere. Replaced, never mutated, when it changes.
        self.labels: dict = {}


PROCESS = ProcessContext()


def process_attributes(names: tuple) -> dict:
    """The process's values of the process labels ``names`` (a spec's ``process_labels``) that it has."""
    values = PROCESS.labels
    if not names or not values:
        return {}
    return {name: values[name] for name in names if name in values}


def series_attributes(names: tuple, values: tuple, extra: dict | None = None) -> dict:
    """A series' attributes: the recorded label values by name, then the recording process's labels
    ``extra`` (``process_attributes``). A value of None is no attribute (an ``error.type`` of a request
    that did not fail, a model name not known)."""
    attributes = dict(zip(names, values))
    if None in values:
        attributes = {name: value for name, value in attributes.items() if value is not None}
    if extra:
        attributes.update(extra)
    return attributes


def set_rank(rank) -> None:
    """This process hosts the worker of global rank ``rank`` (``unknown`` if it is not an int)."""
    PROCESS.labels = {**PROCESS.labels, "rank": str(rank) if isinstance(rank, int) else UNKNOWN}


def dp_of(vllm_config) -> str:
    parallel = getattr(vllm_config, "parallel_config", None)
    if parallel is None:
        return UNKNOWN
    index = getattr(parallel, "data_parallel_index", None)
    if isinstance(index, int):
        return str(index)
    size = getattr(parallel, "data_parallel_size", None)
    rank = getattr(parallel, "data_parallel_rank", None)
    if size == 1:
        return "0"
    is_moe = getattr(getattr(vllm_config, "model_config", None), "is_moe", None)
    if isinstance(rank, int) and is_moe is True:
        return str(rank)
    return UNKNOWN


def api_dp_of(vllm_config) -> str:
    parallel = getattr(vllm_config, "parallel_config", None)
    return "0" if getattr(parallel, "data_parallel_size", None) == 1 else UNKNOWN


def role_of(vllm_config) -> str:
    kv = getattr(vllm_config, "kv_transfer_config", None)
    kv_role = getattr(kv, "kv_role", None) if kv is not None else None
    return ROLES.get(kv_role, "mixed")


#: phase -> (dp, role, phase): the cache step_labels fills (STATE.step_labels, emptied in place when the
#: process identity changes): a hot path may look a phase up in it before calling step_labels.
STEP_LABELS = STATE.step_labels
_extra_labels = STATE.extra_labels


def step_labels(phase: str) -> tuple:
    """``(dp, role, phase)``: label values of a step-scoped series, in catalogue order (cached)."""
    labels = STEP_LABELS.get(phase)
    if labels is None:
        labels = STEP_LABELS[phase] = (PROCESS.dp, PROCESS.role, phase)
    return labels


def step_labels_with(phase: str, extra: str) -> tuple:
    """``(dp, role, phase, extra)`` (cached): step labels plus one more catalogue label's value."""
    key = (phase, extra)
    labels = _extra_labels.get(key)
    if labels is None:
        labels = _extra_labels[key] = (PROCESS.dp, PROCESS.role, phase, extra)
    return labels


def claim(process: str, vllm_config=None, *, api: bool = False) -> bool:
    """Record what this process is. Returns True when the claim changed the process kind."""
    clear_label_caches()
    ctx = PROCESS
    if _PRIORITY.get(process, 0) < _PRIORITY.get(ctx.process, 0):
        return False
    changed = ctx.process != process
    ctx.process = process
    if vllm_config is not None:
        ctx.role = role_of(vllm_config)
        # An API server serves every engine: with one DP rank that is engine 0; with several it has no
        # dp of its own (its per-engine values carry the engine's index).
        ctx.dp = api_dp_of(vllm_config) if api else dp_of(vllm_config)
    return changed


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


#: This boot of the machine (Linux's boot id; "" where /proc does not tell): read once per process.
BOOT_ID = _boot_id()


def _host_clock() -> str:
    """Which monotonic clock this process's ``perf_counter`` reads: on Linux CPython's perf_counter is
    ``clock_gettime(CLOCK_MONOTONIC)``, one clock for every process of a machine (boot id) and time
    namespace (an offset may differ between namespaces). Two processes with the same value can
    subtract each other's perf_counter readings."""
    if BOOT_ID:
        parts = [BOOT_ID]
    else:
        import socket

        parts = [socket.gethostname()]
    try:
        import os

        parts.append(os.readlink("/proc/self/ns/time"))
    except OSError:
        pass
    return "/".join(parts)


HOST_CLOCK = _host_clock()
