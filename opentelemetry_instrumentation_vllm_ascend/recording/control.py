"""Runtime control of one instrumented server: recording on / off (all metrics or patterns) and
reloading the hook files, without restart, signals or re-patching; each process's status (``control status``)
also lists its degraded hooks (handler failures, ``recording.failures``).

Channel: the server's own private directory (made by its first instrumented process with mode 0700,
owned by the user running vLLM: the /metrics files directory, or one of its own when
PROMETHEUS_MULTIPROC_DIR is set or /metrics is off). The ``control`` command writes ``control.json``
there (atomically, mode 0600); a daemon thread in every instrumented process of the server that runs vLLM
(API server, EngineCores, workers, a forked EPLB child; started with its first hooked module,
``recording.services``) polls it once per /metrics export interval
(``os.stat``), applies a change from that normal thread, and writes ``status-<pid>.json`` beside it
(what ``control status`` shows). Files of another owner, or a directory others can enter, are
ignored. The directory — state included — is removed when the server's first process exits (or, if
it was killed, by the next server's start-up), so no state outlives the server.

"off" sets the handler of every installed hook to None (the wrapper's existing check: the call goes
straight to the original; the functions stay patched) and switches the recording facade's
instruments to no-ops (what a hook already holds, e.g. deferred records, is dropped). A time budget whose
metric goes off pauses and, when it comes back, leaves the seconds it was off out (``handlers/budget.py``)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
from typing import Any

from .. import environment
from ..state import STATE
from . import failures
from .control_files import (
    CONTROL_FILE,
    STATUS_PREFIX,
    directory,
    private,
    read_control,
    replace_json,
    title,
    write_control,
)
from .deferred import run_deferred
from .instruments import switched_off

logger = logging.getLogger(__name__)

#: This process's control state: ``STATE.control`` (state.ControlState), applied under ``STATE.control.lock``.


# -- the switch -------------------------------------------------------------------------------------
def register(hook, feeds=(), provides_context: bool = False) -> None:
    """An installed hook (a ``Hook`` whose handler is set): from now on it follows the state."""
    with STATE.control.lock:
        handler = hook.handler
        if handler is None:
            return
        STATE.control.hooks[hook] = (handler, tuple(feeds), provides_context)
        _apply_to(hook)


def unregister(hook) -> None:
    with STATE.control.lock:
        STATE.control.hooks.pop(hook, None)


def clear() -> None:
    with STATE.control.lock:
        STATE.control.hooks.clear()


def _apply_to(hook) -> None:
    c = STATE.control
    handler, feeds, provides_context = c.hooks[hook]
    if not c.on:
        hook.handler = None
        return
    patterns = c.patterns
    if patterns and feeds and not provides_context and all(environment.metric_disabled(s, patterns) for s in feeds):
        hook.handler = None
    else:
        hook.handler = handler


def is_on() -> bool:
    return STATE.control.on


def control_changed() -> None:
    """Runtime control switched metrics on or off: every instrument is looked up again at its next
    record (the pipeline's own instruments, kept in ``STATE.real_instruments``, keep their values)."""
    STATE.instruments.clear()
    if not is_on():
        STATE.deferred.clear()  # records a hook left for later are not made while off
        STATE.deferred_values.clear()


def set_state(on: bool, patterns=()) -> None:
    with STATE.control.lock:
        # What hooks left for later was measured under the state in force: it is recorded now, before a metric
        # it feeds can go off (``control_changed`` then drops what still waits while off).
        run_deferred()
        c = STATE.control
        c.on = bool(on)
        c.patterns = tuple(patterns)
        clocks = [clock for clock in (STATE.engine_stages, STATE.api_stages, STATE.worker_stages) if clock is not None]
        for clock in clocks:  # a time budget switched off pauses before its instruments go
            if switched_off(clock.spec.seed):
                _budget(clock.pause)
        for hook in list(c.hooks):
            _apply_to(hook)
        control_changed()
        for clock in clocks:  # and resumes once they are back (handlers/budget.py: StageClock)
            if not switched_off(clock.spec.seed):
                _budget(clock.resume)


def _budget(step) -> None:
    try:
        step()
    except Exception:
        logger.debug("time budget pause/resume failed", exc_info=True)


# -- the directory ----------------------------------------------------------------------------------
def setup() -> None:
    """``prepare()`` then ``follow()`` at once: what a process of the server does in two steps (``recording.services``:
    the directory at ``instrument()``, the state and the poller with its first hooked module)."""
    prepare()
    follow()


def prepare() -> None:
    """In each instrumented process (at ``instrument()``): find (the first process: make) the server's control
    directory; where the server starts off, the first process writes that into its control file. Idempotent."""
    from .metrics_endpoint import DIRECTORY_PREFIX, remove_leaked_directories, write_owner

    path = directory()
    made = path is None
    if path is None:
        # No /metrics files directory (PROMETHEUS_MULTIPROC_DIR set, or /metrics off): the control's own,
        # and, as for that directory, those a killed server left behind are removed first.
        remove_leaked_directories()
        path = tempfile.mkdtemp(prefix=DIRECTORY_PREFIX)  # 0700
        write_owner(path)
        os.environ[environment.CONTROL_DIR] = path
        STATE.control.set_env.append(environment.CONTROL_DIR)
        _remove_at_exit(path)
    initial = initial_state()
    first = made or os.environ.get(environment.ROOT_PID) == str(os.getpid())
    if initial is False and first and not os.path.exists(os.path.join(path, CONTROL_FILE)):
        # The server's first process: its children (started later) find the server off too.
        write_control(path, {"state": "off", "off_metrics": [], "reload": 0, "serial": 1})


def follow() -> None:
    """Take the server's state (its control file, else OTEL_VLLM_ASCEND_INITIAL_STATE) and poll it from now on,
    writing this process's status file: in a process of the server that runs vLLM, before its first hooks are
    installed (``recording.services``)."""
    if initial_state() is False:
        set_state(False, ())
    poll_once()  # the server's current state before any hook runs
    start()


def _remove_at_exit(path: str) -> None:
    import atexit

    owner = os.getpid()

    def remove() -> None:
        if os.getpid() == owner:
            shutil.rmtree(path, ignore_errors=True)

    atexit.register(remove)


def initial_state() -> bool | None:
    raw = os.environ.get(environment.INITIAL_STATE)
    if raw is None:
        return None
    value = raw.strip().lower()
    if value in ("on", "off"):
        return value == "on"
    environment.warn_once(
        (environment.INITIAL_STATE, raw),
        "opentelemetry-instrumentation-vllm-ascend: %s=%r is neither on nor off; recording starts on",
        environment.INITIAL_STATE,
        raw,
    )
    return None


def teardown() -> None:
    """Stop polling, forget the hooks and callbacks, back to on (``STATE.control`` cleared)."""
    with STATE.control.lock:
        c = STATE.control
        if c.poller is not None:
            c.poller[2].set()
        for name in c.set_env:
            made = os.environ.pop(name, None)
            if made and name == environment.CONTROL_DIR:
                shutil.rmtree(made, ignore_errors=True)
        c.clear()


def poll_once() -> None:
    """Apply a changed control file, then write this process's status."""
    path = directory()
    if path is None:
        return
    c = STATE.control
    if not private(path):
        if not os.path.lexists(path):
            return  # removed: the server is stopping
        if path not in c.warned_dirs:
            c.warned_dirs.add(path)
            logger.warning(
                "opentelemetry-instrumentation-vllm-ascend: %s is not a private directory of this user; "
                "runtime control is ignored",
                path,
            )
        return
    try:
        st = os.stat(os.path.join(path, CONTROL_FILE))
        signature = (st.st_ino, st.st_mtime_ns, st.st_size)
    except OSError:
        signature = None
        if c.reload is None:
            c.reload = 0  # no request yet: the first file's reload counter is one
    if signature is not None and signature != c.seen:
        content = read_control(path)
        if content is not None:
            c.seen = signature
            apply(content)
    write_status(path)


def apply(content: dict) -> None:
    on = content["state"] == "on"
    patterns = tuple(content.get("off_metrics", ()))
    serial, reload = content.get("serial", 0), content.get("reload", 0)
    c = STATE.control
    if (on, patterns) != (c.on, c.patterns):
        set_state(on, patterns)
        logger.info(
            "opentelemetry-instrumentation-vllm-ascend: recording %s%s (control)",
            "on" if on else "off",
            f", off for {', '.join(patterns)}" if patterns and on else "",
        )
    c.serial = serial
    previous = c.reload
    c.reload = reload
    if previous is not None and reload > previous:  # the first file this process reads is no request
        _run_reloaders()


def _run_reloaders() -> None:
    for reload in list(STATE.control.reloaders):
        try:
            reload()
        except Exception:
            logger.warning("opentelemetry-instrumentation-vllm-ascend: reloading the hook files failed", exc_info=True)


#: The status file is rewritten when what it says changes, else once in this many polls: the time stamps alone
#: (``updated``, ``last_export``) do not warrant a write each poll. A rewrite (temporary file, rename) costs the
#: polling thread ~0.2 ms of CPU hot on ext4, ~1.7 ms a poll measured in a busy EngineCore (the thread cost as
#: much CPU as the exporter's); on these 2-core machines the EngineCore shares a core with the forward pass.
STATUS_REFRESH_POLLS = 5


def write_status(path: str) -> None:
    """Write this process's status for ``control status``, when it changed since the last write or
    ``STATUS_REFRESH_POLLS`` intervals after it (its ``last_export`` then lags by at most that)."""
    from .. import context

    c = STATE.control
    summary: dict = {}
    for callback in c.summaries:
        try:
            summary.update(callback())
        except Exception:
            pass
    status: dict[str, Any] = {
        "pid": os.getpid(),
        "root": os.environ.get(environment.ROOT_PID),
        "process": context.PROCESS.process,
        "title": title(),
        "dp": context.PROCESS.dp,
        "role": context.PROCESS.role,
        "state": "on" if c.on else "off",
        "off_metrics": list(c.patterns),
        "serial": c.serial,
        "reload": c.reload,
        "hook_files": summary,
    }
    degraded = failures.degraded()
    # Whether it exported yet counts as a change: a status that says "never" is written again at the first export.
    # So does a hook failing for the first time (in a new place); its counts alone do not (a hook failing on every
    # step would rewrite the file each poll): they lag by up to STATUS_REFRESH_POLLS intervals.
    status["degraded_hooks"] = [[d["hook"], d["where"]] for d in degraded]
    content = (json.dumps(status, sort_keys=True), bool(c.last_export))
    status["degraded_hooks"] = degraded
    now = time.monotonic()
    written = c.status_written
    if written is not None and written[0] == content and now - written[1] < (STATUS_REFRESH_POLLS - 0.5) * interval_s():
        return
    status["last_export"] = c.last_export or None
    status["updated"] = time.time()
    try:
        replace_json(path, f"{STATUS_PREFIX}{os.getpid()}.json", status)
    except OSError:
        return
    c.status_written = (content, now)


def exported() -> None:
    """A collection ran (before_collect hook of the pipeline)."""
    STATE.control.last_export = time.time()


def interval_s() -> float:
    return (
        environment.interval_ms(environment.PROMETHEUS_INTERVAL_MS, environment.DEFAULT_PROMETHEUS_INTERVAL_MS) / 1000
    )


def start() -> None:
    pid = os.getpid()
    c = STATE.control
    if c.poller is not None and c.poller[0] == pid:
        return
    event = threading.Event()
    thread = threading.Thread(target=_run, args=(event, pid), daemon=True, name="otel-vllm-ascend-control")
    c.poller = (pid, thread, event)
    thread.start()


def _run(event, pid: int) -> None:
    """Poll at a fixed rate, once per /metrics export interval: a change written at any moment is
    read within one interval (a poll that overran, e.g. a reload, is followed by the next at once),
    and the export after it shows it: within two export intervals of the command."""
    interval = interval_s()
    deadline = time.monotonic() + interval
    while not event.wait(max(0.0, deadline - time.monotonic())):
        if os.getpid() != pid:
            return
        deadline += interval
        try:
            poll_once()
        except Exception:
            logger.debug("control poll failed", exc_info=True)
        deadline = max(deadline, time.monotonic())


def after_fork_in_child() -> None:
    """In a forked child (``recording.pipeline``'s fork handler): a polling parent's child polls too, on a
    thread of its own (the parent's is not running here)."""
    c = STATE.control
    c.lock = threading.RLock()  # the parent's poller may have held it at the fork
    if c.poller is not None:
        c.poller = None
        try:
            start()
        except Exception:
            pass
