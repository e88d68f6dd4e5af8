"""Runtime control (recording/control.py, cli/control.py) without a vLLM server: this test process is the
instrumented server (its control directory in a private temp directory, polled every 100 ms), a forked
child of it, and a second "server" whose first process is a sleeping child. What is checked: the
command finds the one server without --server and refuses to guess between two; a directory others can
enter, or of another owner, is ignored with one log line; a forked child applies a change; the poller
reads the file once per /metrics export interval; OTEL_VLLM_ASCEND_INITIAL_STATE; directories a killed
server left are removed at start-up."""

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import types

import pytest

from opentelemetry_instrumentation_vllm_ascend import catalogue, environment
from opentelemetry_instrumentation_vllm_ascend.cli import control as cli_control
from opentelemetry_instrumentation_vllm_ascend.cli import main as cli
from opentelemetry_instrumentation_vllm_ascend.recording import control, control_files
from opentelemetry_instrumentation_vllm_ascend.recording.identity import process_identity
from opentelemetry_instrumentation_vllm_ascend.recording.metrics_endpoint import DIRECTORY_PREFIX
from opentelemetry_instrumentation_vllm_ascend.state import STATE
from opentelemetry_instrumentation_vllm_ascend.wiring import userfile
from tests.conftest import instrumented

P = catalogue.PREFIX
INTERVAL_MS = 100
OFF = {"state": "off", "off_metrics": [], "reload": 0, "serial": 1}


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A temp directory of its own (where servers' directories are made and found), no inherited server
    identity, polling every 100 ms; the control torn down after the test."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for name in (
        environment.FILES_DIR,
        environment.CONTROL_DIR,
        environment.ROOT_PID,
        environment.INITIAL_STATE,
        environment.PROMETHEUS_MULTIPROC_DIR,
        userfile.OTEL_CONFIG_NAME,
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(environment.PROMETHEUS_INTERVAL_MS, str(INTERVAL_MS))
    yield tmp_path
    control.teardown()


def _stop_polling():
    poller = STATE.control.poller
    if poller is not None:
        poller[2].set()
        poller[1].join(5)


# -- finding the server ---------------------------------------------------------------------------------------
def test_with_one_server_the_command_needs_no_server_option(host, capsys):
    control.setup()
    assert cli.main(["control", "off", "--wait", "10"]) == 0
    assert control.is_on() is False
    out = capsys.readouterr().out
    assert out.startswith(f"server {os.getpid()} ({control.directory()}): recording off\n")
    assert f"pid {os.getpid():>7}" in out and "state=off" in out
    assert cli.main(["control", "on", "--wait", "10"]) == 0
    assert control.is_on() is True


@pytest.fixture
def second_server(host):
    """Another server of this user: a running process recorded as its first one, with its status."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        path = tempfile.mkdtemp(prefix=DIRECTORY_PREFIX)
        deadline = time.monotonic() + 10
        while process_identity(child.pid) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        with open(os.path.join(path, "root.pid"), "w") as f:
            f.write(f"{child.pid}\n{process_identity(child.pid)}\n")
        with open(os.path.join(path, f"status-{child.pid}.json"), "w") as f:
            json.dump({"pid": child.pid, "process": "api_server", "dp": "0", "role": "mixed", "state": "on"}, f)
        yield child.pid
    finally:
        child.kill()
        child.wait(10)


def test_with_two_servers_a_command_without_server_names_both_and_status_lists_both(host, second_server, capsys):
    control.setup()
    mine = os.getpid()
    assert cli.main(["control", "off", "--wait", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("2 instrumented servers run (") and err.endswith("): choose one with --server PID\n")
    assert {int(p) for p in err[err.index("(") + 1 : err.index(")")].split(", ")} == {mine, second_server}
    assert control.is_on() is True  # nothing was written
    assert cli.main(["control", "status"]) == 0
    out = capsys.readouterr().out
    servers = sorted(line.split()[1] for line in out.splitlines() if line.startswith("server "))
    assert servers == sorted([str(mine), str(second_server)])
    assert cli.main(["control", "off", "--server", str(mine), "--wait", "10"]) == 0
    assert control.is_on() is False


def test_status_names_a_process_by_its_title_and_the_command_shows_it_for_one_of_unknown_kind(capsys):
    """vLLM's DP coordinator and the ``vllm serve`` parent of several API servers are processes of the server that no
    hook gives a kind: their title says which they are."""
    assert control_files.title_of(["VLLM::DPCoordinator", "", ""]) == "VLLM::DPCoordinator"
    assert (
        control_files.title_of(["/venv/bin/python3.11", "/venv/bin/vllm", "serve", "/models/m"])
        == "python3.11 vllm serve /models/m"
    )
    assert control_files.title_of(["python", "-m", "x" * 80], limit=20) == "python -m " + "x" * 9 + "…"
    # As vLLM names its processes (vllm.utils.system_utils.set_process_title: setproctitle).
    pytest.importorskip("setproctitle")  # vLLM's dependency: the child imports it
    code = (
        "import setproctitle; setproctitle.setproctitle('VLLM::DPCoordinator');"
        "from opentelemetry_instrumentation_vllm_ascend.recording import control; print(control.title())"
    )
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert child.stdout.strip() == "VLLM::DPCoordinator"
    server = {
        "root": 1,
        "directory": "/d",
        "control": {},
        "processes": [
            {"pid": 7, "process": "unknown", "title": "VLLM::DPCoordinator", "dp": "unknown", "role": "mixed"},
            {"pid": 8, "process": "engine_core", "title": "VLLM::EngineCore_DP0", "dp": "0", "role": "mixed"},
        ],
    }
    cli_control._print_server(server, as_json=False)
    lines = capsys.readouterr().out.splitlines()
    assert "unknown (VLLM::DPCoordinator) dp=unknown" in lines[1]
    assert "engine_core dp=0" in lines[2] and "EngineCore_DP0" not in lines[2]


# -- the directory's safety ----------------------------------------------------------------------------------
def test_a_control_directory_others_can_enter_or_of_another_owner_is_ignored_with_one_log_line(
    host, caplog, monkeypatch
):
    control.setup()
    _stop_polling()
    path = control.directory()
    control.write_control(path, OFF)
    caplog.set_level(logging.WARNING, logger=control.logger.name)

    def warnings():
        return [r.getMessage() for r in caplog.records if "not a private directory" in r.getMessage()]

    os.chmod(path, 0o755)
    for _ in range(3):
        control.poll_once()
    assert control.is_on() is True
    assert warnings() == [
        f"opentelemetry-instrumentation-vllm-ascend: {path} is not a private directory of this user; "
        "runtime control is ignored"
    ]
    os.chmod(path, 0o700)
    STATE.control.warned_dirs.clear()
    caplog.clear()
    uid = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: uid + 1)  # the directory's owner is another user
    for _ in range(3):
        control.poll_once()
    monkeypatch.undo()
    assert control.is_on() is True and len(warnings()) == 1
    control.poll_once()  # ours and private again: applied
    assert control.is_on() is False


# -- every process of the server, within one interval --------------------------------------------------------
def test_a_forked_child_applies_a_change(host):
    control.setup()
    path = control.directory()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own poller (restarted after fork) applies what the parent writes
        code = 1
        try:
            os.close(read)
            deadline = time.monotonic() + 20
            while control.is_on() and time.monotonic() < deadline:
                time.sleep(0.005)
            os.write(write, f"{'on' if control.is_on() else 'off'} {time.time()!r}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    time.sleep(0.3)  # the child is polling
    written = time.time()
    control.write_control(path, OFF)
    with os.fdopen(read) as f:
        state, seen = f.read().split()
    _, status = os.waitpid(pid, 0)
    assert status == 0 and state == "off"
    # Measured, not asserted (this machine is shared): how long the change took to reach the child.
    print(f"applied in the forked child {float(seen) - written:.3f} s after the write (interval {INTERVAL_MS} ms)")


def test_a_child_forked_while_a_thread_holds_the_control_lock_can_switch(host):
    """The parent's poller may hold the control's lock at the moment of a fork (vllm-ascend forks its EPLB
    process from a worker): the child gets a lock of its own and switches without waiting for a thread that
    does not exist in it."""
    import threading

    control.setup()
    held, release = threading.Event(), threading.Event()

    def holder():
        with STATE.control.lock:
            held.set()
            release.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(5)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            done = threading.Event()
            threading.Thread(target=lambda: (control.set_state(False), done.set()), daemon=True).start()
            code = 0 if done.wait(5) and not control.is_on() else 3
        finally:
            os._exit(code)
    release.set()
    thread.join(5)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0  # 3: the child waited on the parent's lock


def test_the_poller_reads_the_file_once_per_metrics_export_interval(host, monkeypatch):
    """By construction: the poller waits at most one /metrics export interval between reads, so a change
    is applied within one interval of the command and the export after it shows it: within two."""
    waits, polls = [], []

    class Event:
        def wait(self, timeout):
            waits.append(timeout)
            time.sleep(timeout)
            return len(waits) > 5

    monkeypatch.setattr(control, "poll_once", lambda: polls.append(time.monotonic()))
    interval = control.interval_s()
    assert interval == INTERVAL_MS / 1000  # the interval of the /metrics export (pipeline.py)
    control._run(Event(), os.getpid())
    assert len(polls) == 5 and len(waits) == 6
    assert all(0 <= w <= interval for w in waits), waits


def _status_on_a_clock(monkeypatch):
    """Control set up without its polling thread, on a monotonic clock the test moves (``clock[0]``): the
    control directory, this process's status file and the clock."""
    control.setup()
    _stop_polling()
    path = control.directory()
    clock = [1000.0]
    monkeypatch.setattr(control, "time", types.SimpleNamespace(monotonic=lambda: clock[0], time=time.time))
    return path, os.path.join(path, f"{control.STATUS_PREFIX}{os.getpid()}.json"), clock


def test_the_status_file_is_rewritten_when_it_changes_or_every_few_intervals(host, monkeypatch):
    """A poll that finds nothing new leaves the status file alone (a rewrite costs the polling thread a rename
    on the server's core); a change (here: control off, and the first export) is written at that poll, and the time
    stamps (``updated``, ``last_export``) are refreshed every ``STATUS_REFRESH_POLLS`` intervals."""
    path, status_path, clock = _status_on_a_clock(monkeypatch)

    def status():
        with open(status_path) as f:
            return json.load(f), os.stat(status_path).st_ino

    control.poll_once()
    first, inode = status()
    assert first["state"] == "on" and first["serial"] == 0 and first["last_export"] is None
    STATE.control.last_export = 12000.0  # the first export: written at the next poll (the file said "never")
    clock[0] += control.interval_s()
    control.poll_once()
    first, first_inode = status()
    assert first_inode != inode and first["last_export"] == 12000.0
    inode = first_inode
    STATE.control.last_export = 12345.0  # another export: a time stamp only
    for _ in range(control.STATUS_REFRESH_POLLS - 1):
        clock[0] += control.interval_s()
        control.poll_once()
    assert status() == (first, inode)  # not rewritten (a rename makes a new inode)

    control.write_control(path, OFF)
    clock[0] += control.interval_s() / 2
    control.poll_once()
    changed, changed_inode = status()
    assert changed_inode != inode and (changed["state"], changed["serial"]) == ("off", 1)
    assert changed["last_export"] == 12345.0

    STATE.control.last_export = 23456.0
    for _ in range(control.STATUS_REFRESH_POLLS - 1):
        clock[0] += control.interval_s()
        control.poll_once()
    assert status() == (changed, changed_inode)
    clock[0] += control.interval_s()
    control.poll_once()
    refreshed, _ = status()
    assert refreshed["last_export"] == 23456.0 and refreshed["updated"] >= changed["updated"]
    assert [n for n in os.listdir(path) if n.startswith(".")] == []  # no temporary file left


# -- OTEL_VLLM_ASCEND_INITIAL_STATE ------------------------------------------------------------------------
TARGET_MODULE = "otel_control_target"


@pytest.fixture
def hooked_module(host, monkeypatch):
    module = types.ModuleType(TARGET_MODULE)

    class C:
        def add_request(self, request):
            return request

    module.C = C
    monkeypatch.setitem(sys.modules, TARGET_MODULE, module)
    hook_file = host / "hooks.yaml"
    hook_file.write_text(f"- symbol: {TARGET_MODULE}:C.add_request\n  metrics: [{{name: t:ctl, type: counter}}]\n")
    monkeypatch.setenv(userfile.OTEL_CONFIG_NAME, str(hook_file))
    monkeypatch.setenv(environment.CONFIG_MODULES, TARGET_MODULE)
    yield C
    catalogue.EXTRA.pop("t:ctl", None)


def test_initial_state_off_records_nothing_until_control_on(hooked_module, metrics, monkeypatch):
    monkeypatch.setenv(environment.PROMETHEUS_INTERVAL_MS, str(INTERVAL_MS))
    monkeypatch.setenv(environment.INITIAL_STATE, "off")
    labels = {"dp": "0", "role": "mixed", "phase": "unknown"}
    with instrumented(monkeypatch, skip_dep_check=True):
        assert control.is_on() is False
        for _ in range(3):
            hooked_module().add_request(1)
        assert metrics.value(P + "t:ctl", **labels) is None
        assert cli.main(["control", "on", "--server", str(os.getpid()), "--wait", "10"]) == 0
        for _ in range(2):
            hooked_module().add_request(1)
        assert metrics.value(P + "t:ctl", **labels) == 2


def test_an_invalid_initial_state_starts_on_with_one_warning(host, monkeypatch, caplog):
    monkeypatch.setenv(environment.INITIAL_STATE, "maybe")
    caplog.set_level(logging.WARNING)
    control.setup()
    assert control.is_on() is True and control.initial_state() is None
    lines = [r.getMessage() for r in caplog.records if environment.INITIAL_STATE in r.getMessage()]
    assert lines == [
        "opentelemetry-instrumentation-vllm-ascend: OTEL_VLLM_ASCEND_INITIAL_STATE='maybe' is neither on nor off; "
        "recording starts on"
    ]


# -- no state outlives the server ----------------------------------------------------------------------------
def test_control_directories_of_killed_servers_are_removed_at_start_up_with_prometheus_multiproc_dir(
    host, metrics, monkeypatch
):
    from opentelemetry_instrumentation_vllm_ascend.recording.metrics_endpoint import write_owner

    multiproc = host / "multiproc"
    multiproc.mkdir()
    monkeypatch.setenv(environment.PROMETHEUS_MULTIPROC_DIR, str(multiproc))
    monkeypatch.setenv(environment.PROMETHEUS_INTERVAL_MS, str(INTERVAL_MS))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(30)
    leaked = tempfile.mkdtemp(prefix=DIRECTORY_PREFIX)  # a killed server's: its first process is gone
    with open(os.path.join(leaked, "root.pid"), "w") as f:
        f.write(f"{dead.pid}\nnot-the-same-process\n")
    control.write_control(leaked, OFF)
    running = tempfile.mkdtemp(prefix=DIRECTORY_PREFIX)  # a running server's (this process)
    write_owner(running)
    with instrumented(monkeypatch, skip_dep_check=True):
        mine = control.directory()
        assert mine not in (leaked, running) and os.path.isdir(mine)
        assert not os.path.exists(leaked)
        assert os.path.isdir(running)
        assert control.is_on() is True
    assert not os.path.exists(mine)  # the server's own, removed at its end


# -- degraded hooks (hook_errors) ---------------------------------------------------------------------------------
def test_status_lists_degraded_hooks_a_new_one_at_once_and_counts_within_a_few_intervals(host, monkeypatch, capsys):
    """Handler failures in this process are listed by ``control status`` (hook, place, failures, most first). A hook
    failing in a new place rewrites the status at the next poll; more failures of a listed one alone do not (a hook
    failing on every step would rewrite it each poll): its count is refreshed with the time stamps."""
    from opentelemetry_instrumentation_vllm_ascend.hooks.handler import Handler, report

    class Scheduler(Handler):
        name = "Scheduler.schedule"

    path, status_path, clock = _status_on_a_clock(monkeypatch)

    def status():
        with open(status_path) as f:
            return json.load(f)["degraded_hooks"], os.stat(status_path).st_ino

    control.poll_once()
    assert status()[0] == []
    for _ in range(3):
        report(Scheduler, "resumed_req_ids")
    clock[0] += control.interval_s()
    control.poll_once()
    listed, inode = status()
    assert listed == [{"hook": "Scheduler.schedule", "where": "resumed_req_ids", "failures": 3}]
    for _ in range(4):
        report(Scheduler, "resumed_req_ids")
    clock[0] += control.interval_s()
    control.poll_once()
    assert status() == (listed, inode)  # counts alone: not rewritten
    report(Scheduler, "after")
    clock[0] += control.interval_s()
    control.poll_once()
    listed, _ = status()
    assert listed == [
        {"hook": "Scheduler.schedule", "where": "resumed_req_ids", "failures": 7},
        {"hook": "Scheduler.schedule", "where": "after", "failures": 1},
    ]
    assert cli.main(["control", "status"]) == 0
    out = capsys.readouterr().out
    assert (
        "degraded hooks: Scheduler.schedule in resumed_req_ids (x7), Scheduler.schedule in after (x1)  "
        "(docs/deploy.md#vllmascendhookdegraded)"
    ) in out


def test_status_of_a_healthy_process_lists_no_degraded_hook(host, capsys):
    control.setup()
    _stop_polling()
    control.poll_once()
    assert cli.main(["control", "status"]) == 0
    assert "degraded hooks" not in capsys.readouterr().out
