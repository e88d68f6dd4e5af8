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
from typing import TYPE_CHECKING

from .. import environment

if TYPE_CHECKING:
    from .exposition import FastExposition
    from .files_reader import FilesCollector
    from .multiprocess_guard import MultiprocessGuard
    from .openmetrics_names import KeptNames

logger = logging.getLogger(__name__)


class Exposition:
    def __init__(self) -> None:
        self.collector: FilesCollector | None = None
        self._guard: MultiprocessGuard | None = None
        self._fast: FastExposition | None = None
        self._names: KeptNames | None = None
        self.directory: str | None = None
        self._set_env: list[str] = []

    def setup(self) -> None:
        drop_foreign_identity()
        if not environment.prometheus_enabled():
            return
        self._keep_names()
        if os.environ.get(environment.PROMETHEUS_MULTIPROC_DIR):
            # vLLM serves /metrics from that directory in this process or its children (several API
            # servers): a file of ours that cannot be read must not take it down.
            from .multiprocess_guard import guard_multiprocess_collector

            try:
                self._guard = guard_multiprocess_collector()
            except Exception:
                logger.warning(
                    "opentelemetry-instrumentation-vllm-ascend: cannot guard prometheus_client's "
                    "multiprocess collector against unreadable files",
                    exc_info=True,
                )
        if environment.ROOT_PID in os.environ:
            return  # a child: the root already arranged everything, the directory is in our environment
        os.environ[environment.ROOT_PID] = str(os.getpid())
        self._set_env.append(environment.ROOT_PID)
        multiproc = os.environ.get(environment.PROMETHEUS_MULTIPROC_DIR)
        if multiproc:
            from .identity import remove_dead_files

            if os.path.isdir(multiproc):
                remove_dead_files(multiproc)
            return
        from prometheus_client import REGISTRY

        from .files_reader import FilesCollector

        remove_leaked_directories()
        directory = tempfile.mkdtemp(prefix=DIRECTORY_PREFIX)
        write_owner(directory)
        os.environ[environment.FILES_DIR] = directory
        self._set_env.append(environment.FILES_DIR)
        self.directory = directory
        self.collector = FilesCollector(directory)
        self.collector.registry = REGISTRY  # where another writer of our prefix would register (ms-service-metric)
        REGISTRY.register(self.collector)
        try:
            from .exposition import FastExposition

            self._fast = FastExposition(self.collector, REGISTRY)
            self._fast.install()
        except Exception:
            logger.warning(
                "opentelemetry-instrumentation-vllm-ascend: /metrics renders our series without cached lines",
                exc_info=True,
            )
        owner = os.getpid()

        def remove_directory() -> None:
            if os.getpid() == owner:
                shutil.rmtree(directory, ignore_errors=True)

        atexit.register(remove_directory)
        logger.debug("per-process metric files for /metrics in %s", directory)

    def _keep_names(self) -> None:
        """vLLM's names and ours as they are in the OpenMetrics format too (recording/openmetrics_names.py), in
        every process (whichever serves /metrics: the root's, or each API server's with PROMETHEUS_MULTIPROC_DIR);
        before the cached rendering wraps that encoder, which then renders through it."""
        try:
            from .openmetrics_names import KeptNames

            self._names = KeptNames()
            self._names.install()
        except Exception:
            logger.warning(
                "opentelemetry-instrumentation-vllm-ascend: cannot keep metric names in the OpenMetrics format",
                exc_info=True,
            )

    def teardown(self) -> None:
        if self._guard is not None:
            self._guard.remove()
            self._guard = None
        if self._fast is not None:
            self._fast.remove()
            self._fast = None
        if self._names is not None:
            self._names.remove()
            self._names = None
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


DIRECTORY_PREFIX = "otel_vllm_ascend_"
_OWNER_FILE = "root.pid"  # not *.db: no collector reads it


def read_owner(directory: str) -> tuple[int, str] | None:
    """(root pid, its process identity) recorded in a metric directory by the process that made it;
    None when the record is missing or unreadable."""
    try:
        with open(os.path.join(directory, _OWNER_FILE)) as f:
            lines = f.read().split("\n")
        return int(lines[0]), (lines[1] if len(lines) > 1 else "")
    except (OSError, ValueError):
        return None


def owner_running(pid: int, identity: str) -> bool:
    """Whether the directory's root process still runs (the same process: a reused pid is not)."""
    from .identity import process_identity

    running = process_identity(pid)
    return running is not None and not (identity and running and running != identity)


def _parent(pid: int) -> int | None:
    from .identity import proc_stat

    try:
        return int(proc_stat(pid)[1])
    except (OSError, ValueError, IndexError):
        return None


def is_ancestor(pid: int) -> bool | None:
    """Whether ``pid`` is this process or one of its ancestors (the ppid chain in /proc); None when
    /proc cannot tell."""
    current: int | None = os.getpid()
    for _ in range(4096):
        if current == pid:
            return True
        if current in (None, 0, 1):
            return None if current is None else False
        current = _parent(current)
    return False


def drop_foreign_identity() -> None:
    """The identity variables a root process hands its children (its pid, its files directory, its
    tree's name) are trusted only from an ancestor: a process started from the environment of an
    instrumented vLLM process elsewhere (a copied environment, a second server started from a
    worker's shell) begins a tree of its own instead of writing into the other server's directory."""
    raw = os.environ.get(environment.ROOT_PID)
    if raw is None:
        return
    try:
        root = int(raw)
    except ValueError:
        root = -1
    ancestor = is_ancestor(root) if root > 0 else False
    directory = os.environ.get(environment.FILES_DIR)
    if ancestor is not False and directory:
        try:
            ancestor = os.stat(directory).st_uid == os.getuid()
        except OSError:
            ancestor = False
    if ancestor is False:
        for name in (environment.ROOT_PID, environment.FILES_DIR, environment.TREE, environment.CONTROL_DIR):
            os.environ.pop(name, None)
        logger.info(
            "opentelemetry-instrumentation-vllm-ascend: %s=%s is not an ancestor of this process; "
            "it starts a process tree of its own",
            environment.ROOT_PID,
            raw,
        )


def write_owner(directory: str) -> None:
    """Record this process as the owner of ``directory`` (pid and start identity), for
    ``remove_leaked_directories`` once the process is gone."""
    from .identity import process_identity

    try:
        with open(os.path.join(directory, _OWNER_FILE), "w") as f:
            f.write(f"{os.getpid()}\n{process_identity(os.getpid()) or ''}\n")
    except OSError:
        pass


def remove_leaked_directories(parent: str | None = None) -> list[str]:
    """Directories of ours (our prefix, our user, not a link) left in the temp directory by a root
    process that was killed (SIGKILL skips its atexit cleanup): removed when their root no longer
    runs. A directory without the root's record is left alone."""

    parent = parent or tempfile.gettempdir()
    removed: list[str] = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    uid = os.getuid()
    for name in names:
        if not name.startswith(DIRECTORY_PREFIX):
            continue
        path = os.path.join(parent, name)
        try:
            st = os.lstat(path)
            if not os.path.isdir(path) or os.path.islink(path) or st.st_uid != uid:
                continue
        except OSError:
            continue
        owner = read_owner(path)
        if owner is None:
            continue
        if not owner_running(*owner):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    if removed:
        logger.info(
            "opentelemetry-instrumentation-vllm-ascend: removed %d metric director%s left by killed processes",
            len(removed),
            "y" if len(removed) == 1 else "ies",
        )
    return removed
