"""Where each kind of process is ready to serve (``READY_POINTS``), when the installer reports the targets that
never resolved (``Installer.report_unresolved``), and ``module_exists``, which tells a target whose module is absent
from one still to be imported, without importing anything."""

from __future__ import annotations

#: Where each kind of process is ready to serve: (module, "Class.method", process kind). When the method
#: returns, the targets this process's kinds expect on the detected execution path and that never resolved
#: are reported, once (``Installer.report_unresolved``). Each runs once per process, at start-up: no cost
#: on any step. The contract test checks them in every supported vLLM.
READY_POINTS: tuple[tuple[str, str, str], ...] = (
    # The API server: its client has the engines' start-up handshake (their READY); the app is served next.
    # (Not AsyncLLM.__init__: a target's own, and each target's wrapper wraps vLLM's function directly.)
    ("vllm.v1.engine.core_client", "AsyncMPClient.__init__", "api_server"),
    # The EngineCore (and the worker it hosts in process): model loaded, KV cache allocated, READY sent.
    ("vllm.v1.engine.core", "EngineCoreProc.__init__", "engine_core"),
    # A worker process: device initialised and model loaded (its runner's modules imported).
    ("vllm.v1.executor.multiproc_executor", "WorkerProc.__init__", "worker"),
)


def module_exists(name: str) -> bool | None:
    """Whether module ``name`` exists, found on the path of its nearest imported parent package without
    importing anything (a parent's ``__init__`` may be heavy); None when no parent is imported."""
    import importlib.machinery
    import os
    import sys

    parts = name.split(".")
    for depth in range(len(parts) - 1, 0, -1):
        parent = sys.modules.get(".".join(parts[:depth]))
        if parent is not None:
            break
    else:
        return None
    directories = list(getattr(parent, "__path__", None) or ())
    suffixes = importlib.machinery.all_suffixes()
    for index, part in enumerate(parts[depth:], start=depth):
        last = index == len(parts) - 1
        packages = [os.path.join(d, part) for d in directories if os.path.isdir(os.path.join(d, part))]
        if last and (packages or any(os.path.isfile(os.path.join(d, part + x)) for d in directories for x in suffixes)):
            return True
        if not packages:
            return False
        directories = packages
    return False
