"""The files of runtime control (``recording/control.py``), in the server's private directory: where that
directory is and whether it is ours (``private``), the control file the ``control`` command writes and every
process reads (``control.json``: written atomically, mode 0600; read only when ours and well-formed), the
status files' prefix and name scheme, and the process title a status carries."""

from __future__ import annotations

import json
import os
import stat
import tempfile

from .. import environment

CONTROL_FILE = "control.json"
STATUS_PREFIX = "status-"
MAX_CONTROL_BYTES = 64 * 1024


def directory() -> str | None:
    return os.environ.get(environment.FILES_DIR) or os.environ.get(environment.CONTROL_DIR) or None


def private(path: str) -> bool:
    """Ours and closed to others: owned by this user, not a link, no group/other permissions."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def replace_json(path: str, name: str, content: dict) -> None:
    """Atomically replace ``name`` in ``path`` with ``content`` as JSON (mode 0600): a temporary file in one
    write, renamed over it; the temporary is removed when that fails (the error propagates)."""
    fd, temporary = tempfile.mkstemp(prefix=f".{name}-", dir=path)
    try:
        try:
            os.write(fd, json.dumps(content).encode())
        finally:
            os.close(fd)
        os.replace(temporary, os.path.join(path, name))
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


def write_control(path: str, content: dict) -> None:
    """Atomically replace ``control.json`` in ``path`` (mode 0600)."""
    replace_json(path, CONTROL_FILE, content)


def read_control(path: str) -> dict | None:
    """The control file's content when it is ours and well-formed, else None."""
    target = os.path.join(path, CONTROL_FILE)
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.getuid() or not stat.S_ISREG(st.st_mode):
            return None
        data = f.read(MAX_CONTROL_BYTES + 1)
    if len(data) > MAX_CONTROL_BYTES:
        return None
    try:
        content = json.loads(data)
    except ValueError:
        return None
    if not isinstance(content, dict) or content.get("state") not in ("on", "off"):
        return None
    off = content.get("off_metrics", [])
    if not isinstance(off, list) or not all(isinstance(p, str) for p in off):
        return None
    if not isinstance(content.get("serial", 0), int) or not isinstance(content.get("reload", 0), int):
        return None
    return content


def title(limit: int = 60) -> str:
    """This process's title as ``ps`` shows it: vLLM names its processes (``VLLM::EngineCore_DP0``,
    ``VLLM::DPCoordinator``, ``VLLM::APIServer_1``); the ``vllm serve`` parent of several API servers keeps its
    command line. What tells an operator which process a status of kind ``unknown`` is."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            raw = f.read(4096)
        words = raw.replace(b"\0", b" ").decode(errors="replace").split(" ")
    except OSError:  # no procfs
        import sys

        words = list(sys.argv)
    return title_of(words, limit)


def title_of(words: list[str], limit: int = 60) -> str:
    """``title()`` from a command line's words: a vLLM title as it is, else the program's and (``python …/vllm``)
    the script's base names, then the arguments; at most ``limit`` characters."""
    words = [w for w in words if w]  # setproctitle pads the title
    if words and not words[0].startswith("VLLM::"):
        words[0] = os.path.basename(words[0])
        if len(words) > 1 and words[1].endswith(("/vllm", "/opentelemetry-instrument")):
            words[1] = os.path.basename(words[1])  # python …/bin/vllm serve MODEL
    text = " ".join(words)
    return text if len(text) <= limit else text[: limit - 1] + "…"
