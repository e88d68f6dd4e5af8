"""What each process is, and what its children do before vLLM stops them.

The ``…Init`` handlers claim this process's kind (api_server / engine_core / worker) and its dp/role
(``context.claim``) and count it in ``instrumented_processes``; the ``Stop…`` handlers have the processes
vLLM is about to stop export first, then drop their live gauges (``recording.before_stop``/``after_stop``).
Which process a file or a pid belongs to is ``recording.identity``'s."""

from __future__ import annotations

from .. import context, recording
from ..hooks.handler import Handler, report


def _vllm_config(args, kwargs):
    return args[1] if len(args) > 1 else kwargs.get("vllm_config")


class _Claim(Handler):
    process = "unknown"
    api = False

    def before(self, args, kwargs):
        try:  # the config's dp / role: a field that moved leaves them as they were, the process is still counted
            context.claim(self.process, _vllm_config(args, kwargs), api=self.api)
        except Exception:
            report(self, "vllm_config")
        recording.process_started()


class ApiServerInit(_Claim):
    """``AsyncLLM.__init__`` runs in each API server process."""

    params = ("vllm_config",)
    reads_args = None  # every argument: it reads them by position or by name

    process = "api_server"
    api = True

    def before(self, args, kwargs):
        super().before(args, kwargs)
        from .api import set_served_model

        try:
            set_served_model(_vllm_config(args, kwargs))
        except Exception:
            report(self, "served_model_name")


class EngineCoreInit(_Claim):
    """``Executor.__init__`` runs in each EngineCore process (before its workers start)."""

    params = ("vllm_config",)
    reads_args = None  # every argument: it reads them by position or by name

    process = "engine_core"


class WorkerInit(_Claim):
    """``WorkerBase.__init__`` runs in each worker process (inside the EngineCore with UniProcExecutor);
    its ``rank`` (the worker's global rank) becomes the process's ``rank`` label; the worker's device
    utilization gauge is registered here (read at each collection)."""

    params = ("vllm_config", "local_rank", "rank")
    reads_args = None  # every argument: it reads them by position or by name

    process = "worker"

    def before(self, args, kwargs):
        context.set_rank(args[3] if len(args) > 3 else kwargs.get("rank"))
        super().before(args, kwargs)
        from .memory import observe_utilization

        try:  # the device utilization gauge: independent of the worker's identity
            observe_utilization()
        except Exception:
            report(self, "device utilization")


class _BeforeStop(Handler):
    """Before vLLM stops its child processes (SIGTERM, then SIGKILL of each tree once its timeout —
    0 by default — has passed): they and their descendants export what they recorded, waited for
    at most OTEL_VLLM_ASCEND_SHUTDOWN_TIMEOUT_MS in all (shutdown.py); then vLLM's code runs
    unchanged. Afterwards, the live gauges of the processes now gone are dropped from the files
    directory (their exit-time cleanup never ran)."""

    def processes(self, owner) -> list:
        return []

    def before(self, args, kwargs):
        pids = [p.pid for p in self.processes(args[0]) if p.pid and p.is_alive()]
        return recording.before_stop(pids) if pids else pids

    def after(self, state, args, kwargs, result):
        if state:
            recording.after_stop(state)


class StopEngines(_BeforeStop):
    """``CoreEngineProcManager.shutdown`` (API server, or ``vllm serve``'s parent with several API
    servers): the EngineCores and their workers."""

    def processes(self, owner) -> list:
        finalizer = getattr(owner, "_finalizer", None)
        if finalizer is not None and not finalizer.alive:  # stopped already
            return []
        return list(getattr(owner, "processes", ()))


class StopWorkers(_BeforeStop):
    """``MultiprocExecutor.shutdown`` (EngineCore): its worker processes."""

    def processes(self, owner) -> list:
        if getattr(owner, "shutting_down", False):
            return []
        return [w.proc for w in (getattr(owner, "workers", None) or ()) if getattr(w, "proc", None) is not None]
