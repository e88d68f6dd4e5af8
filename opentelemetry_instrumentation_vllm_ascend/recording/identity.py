"""Which process wrote which ``/metrics`` file, and whether it still runs.

Every instrumented process writes its multiprocess files as ``<type>_otel-<pid>.db`` (``files_writer``) and,
next to its first one, ``process_otel-<pid>.id``: its identity (boot id and start time, so a reused pid is
told apart) and the root of its process tree. The files reader (``files_reader``) and the clean-ups below (of
the files of processes that are gone) ask whether a file's process is alive; ``shutdown``, ``metrics_endpoint``
and ``cli/control.py`` ask about processes too.
"""

from __future__ import annotations

import glob
import os
import re

from .. import environment
from ..context import BOOT_ID

#: The token in our file names that keeps them apart from prometheus_client's own per-pid files.
FILE_TOKEN = "otel-"
#: The type of a process's exemplars file, ``exemplars_otel-<pid>.json`` (``files_writer``): not a ``*.db`` file,
#: so prometheus_client's MultiProcessCollector never reads it.
EXEMPLARS_FILE = "exemplars"
_PID_RE = re.compile(r"_otel-(\d+)\.(?:db|id|json)$")


def proc_stat(pid: int) -> list[bytes]:
    """The fields of ``/proc/<pid>/stat`` after the command name (state, ppid, …, start time at index
    19); raises OSError (FileNotFoundError: no such process)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return stat[stat.rfind(b")") + 2 :].split()


def process_identity(pid: int) -> str | None:
    """``"<boot id> <start time>"`` of the running process ``pid`` (from /proc): a pid reused by
    another process, or after a reboot, has another one. None when no such process runs (a zombie
    counts as gone); ``""`` when /proc cannot tell."""
    try:
        fields = proc_stat(pid)
    except FileNotFoundError:
        return None
    except OSError:
        return ""
    if not fields or fields[0] in (b"Z", b"X"):
        return None
    return f"{BOOT_ID} {int(fields[19])}" if len(fields) > 19 else ""


def _identity_path(directory: str, pid: int) -> str:
    return os.path.join(directory, f"process_{FILE_TOKEN}{pid}.id")


def forget_identity(directory: str, pid: int) -> None:
    """Remove ``pid``'s identity file once no metric file of it is left."""
    if not files(directory, f"*_{FILE_TOKEN}{pid}.db"):
        try:
            os.remove(_identity_path(directory, pid))
        except OSError:
            pass


def write_identity(directory: str, pid: int) -> None:
    """Next to a process's first metric file: which process (boot and start time) wrote it, and the
    root of its process tree (pid, boot and start time)."""
    identity = process_identity(pid)
    if not identity:
        return
    root = ""
    try:
        root_pid = int(os.environ.get(environment.ROOT_PID, ""))
        root = f"{root_pid} {process_identity(root_pid) or ''}"
    except ValueError:
        pass
    try:
        with open(_identity_path(directory, pid), "w") as f:
            f.write(f"{identity}\n{root}\n")
    except OSError:
        pass


def file_process_alive(directory: str, pid: int) -> bool:
    """Whether the process that wrote ``pid``'s files still runs, in a tree that still runs: the pid
    runs and, where recorded, it is the same process (not a reused pid) and the root of its tree
    still runs (an EngineCore left running by a SIGKILLed API server serves no /metrics any more:
    its series would be counted twice next to the next server's)."""
    identity = process_identity(pid)
    if identity is None:
        return False
    if identity == "":
        return _pid_alive(pid)
    try:
        with open(_identity_path(directory, pid)) as f:
            recorded = f.read().split("\n")
    except OSError:
        return True
    if recorded[0].strip() and recorded[0].strip() != identity:
        return False
    root = recorded[1].split(" ", 1) if len(recorded) > 1 and recorded[1].strip() else None
    if root and len(root) == 2 and root[1].strip():
        try:
            root_pid = int(root[0])
        except ValueError:
            return True
        if root_pid != pid and process_identity(root_pid) not in ("", root[1].strip()):
            return False
    return True


def files(directory: str, pattern: str) -> list[str]:
    """Files of ``directory`` matching ``pattern``; the directory's own name is taken literally (a
    ``[1]`` or ``*`` in TMPDIR or PROMETHEUS_MULTIPROC_DIR is not a glob pattern)."""
    return glob.glob(os.path.join(glob.escape(directory), pattern))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def file_pid(path: str) -> int | None:
    match = _PID_RE.search(path)
    return int(match.group(1)) if match else None


def _remove_files_of_dead(directory: str, pattern: str) -> None:
    alive: dict[int, bool] = {}
    for path in files(directory, pattern):
        pid = file_pid(path)
        if pid is None:
            continue
        if pid not in alive:
            alive[pid] = file_process_alive(directory, pid)
        if not alive[pid]:
            try:
                os.remove(path)
            except OSError:
                pass
    for pid, running in alive.items():
        if not running and pattern.endswith("*.db"):
            forget_identity(directory, pid)


def remove_dead_files(directory: str) -> None:
    """Drop our files left by processes of an earlier run (PROMETHEUS_MULTIPROC_DIR reused): those
    of pids that no longer run, or run as another process (a pid reused after a container restart)."""
    _remove_files_of_dead(directory, f"{EXEMPLARS_FILE}_{FILE_TOKEN}*.json")
    _remove_files_of_dead(directory, f"*_{FILE_TOKEN}*.db")


def remove_dead_live_gauges(directory: str) -> None:
    """Drop the ``live*`` gauge files of processes that are gone (killed before their exit-time
    cleanup): vLLM's MultiProcessCollector would keep serving them. Counters and histograms stay."""
    _remove_files_of_dead(directory, f"gauge_live*_{FILE_TOKEN}*.db")
