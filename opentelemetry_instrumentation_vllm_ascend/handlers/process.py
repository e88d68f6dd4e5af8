"""Process identity: what this process is (api_server / engine_core / worker) and its dp/role."""

from __future__ import annotations

from .. import context, recording
from ..wrappers import Handler


def _vllm_config(args, kwargs):
    return args[1] if len(args) > 1 else kwargs.get("vllm_config")


class _Claim(Handler):
    process = "unknown"
    api = False

    def before(self, args, kwargs):
        context.claim(self.process, _vllm_config(args, kwargs), api=self.api)
        recording.process_started()


class ApiServerInit(_Claim):
    """``AsyncLLM.__init__`` runs in each API server process."""

    name = "AsyncLLM.__init__"
    process = "api_server"
    api = True


class EngineCoreInit(_Claim):
    """``Executor.__init__`` runs in each EngineCore process (before its workers start)."""

    name = "Executor.__init__"
    process = "engine_core"


class WorkerInit(_Claim):
    """``WorkerBase.__init__`` runs in each worker process (inside the EngineCore with UniProcExecutor);
    its ``rank`` (the worker's global rank) becomes the process's ``rank`` label; the worker's device
    utilization gauge is registered here (read at each collection)."""

    name = "WorkerBase.__init__"
    process = "worker"

    def before(self, args, kwargs):
        context.set_rank(args[3] if len(args) > 3 else kwargs.get("rank"))
        super().before(args, kwargs)
        from .memory import observe_utilization

        observe_utilization()
