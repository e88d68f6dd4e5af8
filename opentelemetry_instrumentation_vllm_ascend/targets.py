"""The target table: every vLLM / vllm-ascend symbol this package wraps, with the versions it is
known to exist in (vLLM and vllm-ascend gated separately), the wrapper kind, the handler and the
metrics it feeds. ``docs/metrics.md`` and the installer are driven from it."""

from __future__ import annotations

from dataclasses import dataclass

from . import catalogue as c
from .contract import Read
from .wrappers import COROUTINE, FUTURE, FUTURE_CLASS, SYNC  # noqa: F401  (kinds used in rows)


@dataclass(frozen=True)
class Target:
    module: str
    qualname: str  # "Class.method"
    kind: str
    handler: str  # "module:Class" under opentelemetry_instrumentation_vllm_ascend.handlers
    vllm: str = ">=0.23.0"  # PEP 440 specifier on the installed vLLM version
    vllm_ascend: str | None = None  # a specifier when this symbol comes from vllm-ascend
    feeds: tuple[str, ...] = ()  # catalogue seed names; () for context-only hooks
    #: Names of the positional parameters (after self) the handler reads by position, in order:
    #: the contract test checks them against the source of every supported version.
    params: tuple[str, ...] = ()

    @property
    def symbol(self) -> str:
        return f"{self.module}:{self.qualname}"

    @property
    def owner_qualname(self) -> str:
        return self.qualname if self.kind == FUTURE_CLASS else self.qualname.rsplit(".", 1)[0]

    @property
    def attribute(self) -> str | None:
        return None if self.kind == FUTURE_CLASS else self.qualname.rsplit(".", 1)[1]


_SCHED = "vllm.v1.core.sched.scheduler"

TARGETS: tuple[Target, ...] = (
    Target(_SCHED, "Scheduler.schedule", SYNC, "scheduler:Schedule",
           feeds=(c.RUNNING_TO_WAITING.seed, c.RECOMPUTE_EVENTS.seed, c.BLOCK_ALLOCATE_FAILURES.seed)),
    Target(_SCHED, "Scheduler._preempt_request", SYNC, "scheduler:PreemptRequest",
           feeds=(c.RUNNING_TO_WAITING.seed, c.RECOMPUTE_EVENTS.seed), params=("request",)),
    Target(_SCHED, "Scheduler.reset_prefix_cache", SYNC, "scheduler:ResetPrefixCache"),
    Target("vllm.v1.core.kv_cache_manager", "KVCacheManager.allocate_slots", SYNC, "kv_cache:AllocateSlots",
           feeds=(c.BLOCK_ALLOCATE_FAILURES.seed,)),
    Target("vllm.v1.executor.multiproc_executor", "MultiprocExecutor.collective_rpc", FUTURE,
           "executor:CollectiveRpc", feeds=(c.RPC_ERRORS.seed,), params=("method",)),
    # The futures non-blocking RPCs return report their own completion (cheaper than a callback each).
    Target("vllm.v1.executor.multiproc_executor", "FutureWrapper", FUTURE_CLASS, ""),
    # Single-device GPU/NPU engines run their worker in-process (no message queues), same contract.
    Target("vllm.v1.executor.uniproc_executor", "UniProcExecutor.collective_rpc", FUTURE,
           "executor:CollectiveRpc", feeds=(c.RPC_ERRORS.seed,), params=("method",)),
    Target("vllm.v1.engine.async_llm", "AsyncLLM.__init__", SYNC, "process:ApiServerInit",
           feeds=(c.INSTRUMENTED_PROCESSES.seed,), params=("vllm_config",)),
    Target("vllm.v1.executor.abstract", "Executor.__init__", SYNC, "process:EngineCoreInit",
           feeds=(c.INSTRUMENTED_PROCESSES.seed,), params=("vllm_config",)),
    Target("vllm.v1.worker.worker_base", "WorkerBase.__init__", SYNC, "process:WorkerInit",
           feeds=(c.INSTRUMENTED_PROCESSES.seed,), params=("vllm_config",)),
)


#: Attributes handlers read from vLLM objects (checked against source like the targets).
READS = tuple(
    Read(module, cls, attribute)
    for module, cls, attributes in (
        ("vllm.v1.core.sched.scheduler", "Scheduler", ("requests",)),
        ("vllm.v1.request", "Request", ("request_id", "num_computed_tokens", "num_prompt_tokens", "num_tokens")),
        ("vllm.v1.core.sched.output", "SchedulerOutput",
         ("num_scheduled_tokens", "scheduled_new_reqs", "scheduled_cached_reqs")),
        ("vllm.v1.core.sched.output", "CachedRequestData",
         ("req_ids", "resumed_req_ids", "num_computed_tokens", "num_output_tokens")),
        ("vllm.config", "VllmConfig", ("parallel_config", "kv_transfer_config", "model_config")),
        ("vllm.config", "ParallelConfig", ("data_parallel_index", "data_parallel_size", "data_parallel_rank")),
        ("vllm.config", "KVTransferConfig", ("kv_role",)),
    )
    for attribute in attributes
)


def load_handler(target: Target):
    import importlib

    if not target.handler:
        return None
    module_name, class_name = target.handler.split(":")
    module = importlib.import_module(f"{__package__}.handlers.{module_name}")
    return getattr(module, class_name)()
