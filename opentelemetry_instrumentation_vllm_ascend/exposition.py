"""Makes every process's metrics appear on vLLM's own ``/metrics`` (no extra port).

Runs in each instrumented process at ``instrument()``; only the first instrumented process of a
process tree (the API server, which serves ``/metrics``) does anything:
- ``PROMETHEUS_MULTIPROC_DIR`` set: vLLM's registry merges the directory itself; we only drop
  files of ours that dead processes of an earlier run left there.
- unset: create a directory, hand it to every child through the environment (before vLLM spawns
  EngineCore and workers), and register a collector over it on ``prometheus_client.REGISTRY``,
  which vLLM's ``/metrics`` serves in that mode.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile

from . import environment

logger = logging.getLogger(__name__)


class Exposition:
    def __init__(self) -> None:
        self.collector = None
        self.directory: str | None = None
        self._set_env: list[str] = []

    def setup(self) -> None:
        if not environment.prometheus_enabled():
            return
        if environment.ROOT_PID in os.environ:
            return  # a child: the root already arranged everything, the directory is in our environment
        os.environ[environment.ROOT_PID] = str(os.getpid())
        self._set_env.append(environment.ROOT_PID)
        multiproc = os.environ.get(environment.PROMETHEUS_MULTIPROC_DIR)
        if multiproc:
            from .prometheus_files import remove_dead_files

            if os.path.isdir(multiproc):
                remove_dead_files(multiproc)
            return
        from prometheus_client import REGISTRY

        from .prometheus_files import FilesCollector

        directory = tempfile.mkdtemp(prefix="otel_vllm_ascend_")
        os.environ[environment.FILES_DIR] = directory
        self._set_env.append(environment.FILES_DIR)
        self.directory = directory
        self.collector = FilesCollector(directory)
        REGISTRY.register(self.collector)
        owner = os.getpid()
        atexit.register(lambda: os.getpid() == owner and shutil.rmtree(directory, ignore_errors=True))
        logger.debug("per-process metric files for /metrics in %s", directory)

    def teardown(self) -> None:
        if self.collector is not None:
            from prometheus_client import REGISTRY

            try:
                REGISTRY.unregister(self.collector)
            except KeyError:
                pass
            self.collector = None
        for name in self._set_env:
            os.environ.pop(name, None)
        self._set_env.clear()
