"""Nothing recorded is lost when vLLM stops its processes.

vLLM (0.23 … 0.33) stops its EngineCores with ``vllm.v1.utils.shutdown(procs, timeout)``: SIGTERM, a
join of at most ``timeout`` seconds — ``VllmConfig.shutdown_timeout``, 0 by default — then SIGKILL of
the whole process tree (``kill_process_tree``: the EngineCore and its workers). With the default the
kill follows the SIGTERM at once, so a child's own exit-time export never runs, and whatever it
recorded since its last periodic export would be lost.

The process that stops them knows first. So every instrumented process that runs vLLM listens (from its
first hooked module on: ``recording.services``), on a thread of its own, for a flush request on a Linux
abstract Unix datagram socket named after its process tree and pid (no port, no file); the hook on the
stopping call (``CoreEngineProcManager.shutdown`` in the API server or ``vllm serve``'s parent,
``MultiprocExecutor.shutdown`` in an EngineCore, see targets.py) asks the processes it is about to
stop, and their descendants, to export now, and waits for their answers — at most
``OTEL_VLLM_ASCEND_SHUTDOWN_TIMEOUT_MS`` in all — before vLLM's own code runs unchanged. Only requests
from the same user are served (the kernel's credentials of the sender).
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading
import time
import uuid

from .. import environment
from ..state import STATE

logger = logging.getLogger(__name__)

_REQUEST, _DONE = b"flush", b"done"
_CREDENTIALS = struct.calcsize("3i")  # struct ucred: pid, uid, gid


def tree() -> str:
    """This process tree's name: made by its first instrumented process, inherited by the others."""
    value = os.environ.get(environment.TREE, "")
    if not (value and len(value) <= 64 and value.isalnum()):
        value = uuid.uuid4().hex
        os.environ[environment.TREE] = value
        STATE.flush_env.append(environment.TREE)
    return value


def _address(pid: int, tree_name: str | None = None) -> bytes:
    return b"\0otel_vllm_ascend." + (tree_name or tree()).encode() + b"." + str(pid).encode()


def setup() -> None:
    """``tree()`` then ``listen()`` at once: what a process of the server does in two steps (``recording.services``:
    the tree's name at ``instrument()``, the listener with its first hooked module)."""
    tree()
    listen()


def teardown() -> None:
    listener, STATE.flush_listener = STATE.flush_listener, None
    if listener is not None:
        _stop(listener[1])
        thread = listener[2]
        if listener[0] == os.getpid() and thread is not threading.current_thread():
            thread.join(1.0)  # gone when teardown returns, so a setup() after it starts the only one
    for name in STATE.flush_env:
        os.environ.pop(name, None)
    STATE.flush_env.clear()


def _stop(sock) -> None:
    """Wakes the listener blocked on ``sock`` (close() alone would not, and its fd number could be
    reused under it), then closes it."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


def listen() -> None:
    pid = os.getpid()
    inherited = STATE.flush_listener
    if inherited is not None and inherited[0] == pid:
        return
    if inherited is not None:  # a forked child: the parent's socket is not ours to read
        try:
            inherited[1].close()
        except OSError:
            pass
    STATE.flush_listener = None
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    except (OSError, AttributeError):  # no Unix sockets here: no flush on request
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        sock.bind(_address(pid))
    except OSError as exc:
        sock.close()
        logger.debug("no shutdown flush listener in this process: %s", exc)
        return
    thread = threading.Thread(target=_serve, args=(sock, pid), daemon=True, name="otel-vllm-ascend-flush")
    STATE.flush_listener = (pid, sock, thread)
    thread.start()


def _serve(sock, pid: int) -> None:
    uid = os.getuid()
    space = socket.CMSG_SPACE(_CREDENTIALS)
    while True:
        try:
            data, ancillary, _flags, sender = sock.recvmsg(64, space)
        except OSError:  # closed (teardown, fork)
            return
        listener = STATE.flush_listener
        if os.getpid() != pid or listener is None or listener[1] is not sock:
            return  # stopped (teardown), or a forked child's copy
        credentials = [
            d for level, kind, d in ancillary if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS
        ]
        if data != _REQUEST or not sender or not credentials:
            continue
        if struct.unpack("3i", credentials[0][:_CREDENTIALS])[1] != uid:
            continue  # another user: not served
        try:
            flush_here()
        except Exception:
            logger.debug("flush on request failed", exc_info=True)
        try:
            sock.sendto(_DONE, sender)
        except OSError:
            pass


def flush_here() -> None:
    """Export what this process recorded, now (or wait for the final export already under way)."""
    from . import pipeline, step_records
    from .deferred import flush

    step_records.flush(environment.shutdown_timeout_ms() / 1000)  # the per-step records queued so far
    current = pipeline.current()
    if current is None or current.pid != os.getpid():
        return
    if current.closing:  # exiting already: its final export is what the requester waits for
        current.closed.wait(environment.shutdown_timeout_ms() / 1000)
        return
    flush(timeout_millis=environment.shutdown_timeout_ms())


def descendants(pids) -> list[int]:
    """``pids`` and every process below them (those still running)."""
    out: list[int] = []
    try:
        import psutil
    except ImportError:  # vLLM depends on psutil; without it, the processes themselves only
        return [p for p in pids if p]
    for pid in pids:
        if not pid:
            continue
        out.append(pid)
        try:
            out.extend(child.pid for child in psutil.Process(pid).children(recursive=True))
        except psutil.Error:
            pass
    return out


def flush_processes(pids, timeout_s: float | None = None, with_descendants: bool = True) -> set[int]:
    """Ask the instrumented processes among ``pids`` and (``with_descendants``, unless the caller has
    listed them already) their descendants to export now; wait for their answers, at most
    ``timeout_s`` (default: OTEL_VLLM_ASCEND_SHUTDOWN_TIMEOUT_MS) in all. Returns the pids that
    answered. Processes that are not ours (no listener) are skipped at once."""
    if timeout_s is None:
        timeout_s = environment.shutdown_timeout_ms() / 1000
    own = os.getpid()
    targets = {p for p in (descendants(pids) if with_descendants else pids) if p and p != own}
    if not targets or environment.TREE not in os.environ:
        return set()
    name = tree()
    answered: set[int] = set()
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    except (OSError, AttributeError):
        return answered
    with sock:
        try:
            sock.bind(b"")  # an autobound abstract address, for the answers
        except OSError:
            return answered
        waiting: dict[bytes, int] = {}
        for pid in targets:
            address = _address(pid, name)
            try:
                sock.sendto(_REQUEST, address)
            except OSError:  # not an instrumented process of this tree
                continue
            waiting[address] = pid
        deadline = time.monotonic() + timeout_s
        while waiting:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            sock.settimeout(remaining)
            try:
                data, sender = sock.recvfrom(64)
            except (TimeoutError, OSError):
                break
            if isinstance(sender, str):
                sender = sender.encode()
            pid = waiting.pop(sender, None)
            if pid is not None and data == _DONE:
                answered.add(pid)
        if waiting:
            logger.info(
                "opentelemetry-instrumentation-vllm-ascend: %d process(es) did not finish exporting "
                "their metrics within %.0f ms before vLLM stops them (OTEL_VLLM_ASCEND_SHUTDOWN_TIMEOUT_MS)",
                len(waiting),
                timeout_s * 1000,
            )
    return answered


def before_stop(pids) -> list[int]:
    """Before vLLM stops the processes ``pids``: they and their descendants export what they recorded (waited
    for at most OTEL_VLLM_ASCEND_SHUTDOWN_TIMEOUT_MS in all). Returns them all (what ``after_stop`` waits for)."""
    pids = descendants(pids)
    flush_processes(pids, with_descendants=False)
    return pids


def after_stop(pids) -> None:
    """After vLLM stopped the processes ``pids`` (those ``before_stop`` returned): the live gauges of the
    processes now gone are dropped from the files directory (their exit-time cleanup never ran)."""
    directory = environment.metrics_files_dir()
    if directory:
        from .identity import remove_dead_live_gauges

        wait_gone(pids)
        remove_dead_live_gauges(directory)


def wait_gone(pids, timeout_s: float = 0.5) -> None:
    """A SIGKILL takes effect asynchronously: wait (briefly, by polling — never reaping another's
    child) until the processes are gone or zombies."""
    from .identity import process_identity

    deadline = time.monotonic() + timeout_s
    pending = list(pids)
    while pending and time.monotonic() < deadline:
        pending = [pid for pid in pending if process_identity(pid) is not None]
        if pending:
            time.sleep(0.01)


def after_fork_in_child() -> None:
    """In a forked child (``recording.pipeline``'s fork handler): a listening parent's child listens too,
    on its own socket."""
    if STATE.flush_listener is not None:
        listen()
