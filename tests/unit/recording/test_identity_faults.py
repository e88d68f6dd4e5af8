"""Process identity under faults: pids reused across restarts, identity variables inherited from a
process that is not an ancestor, directories leaked by a killed API server, a full metrics disk."""

import os
import subprocess
import sys
import tempfile
import textwrap

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from opentelemetry_instrumentation_vllm_ascend import catalogue, environment, recording
from opentelemetry_instrumentation_vllm_ascend.recording import metrics_endpoint as exposition
from opentelemetry_instrumentation_vllm_ascend.recording import pipeline
from opentelemetry_instrumentation_vllm_ascend.recording.files_reader import FilesCollector
from opentelemetry_instrumentation_vllm_ascend.recording.identity import (
    file_process_alive,
    process_identity,
    remove_dead_files,
    write_identity,
)
from tests.support.waiting import wait_for
from tests.unit.recording.test_files_faults import DEAD_PID, write_counter

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def scrape(directory):
    registry = CollectorRegistry()
    registry.register(FilesCollector(directory))
    return sorted(line for line in generate_latest(registry).decode().splitlines() if not line.startswith("#"))


# -- pid reuse -------------------------------------------------------------------------------------------
def test_files_of_a_reused_pid_are_those_of_a_dead_process(tmp_path):
    """A persistent PROMETHEUS_MULTIPROC_DIR across a container restart: a file of the earlier run whose
    pid runs again — as another process (here: this very process, with another start time recorded)."""
    directory = str(tmp_path)
    pid = os.getpid()
    write_counter(directory, pid, value=500.0)
    with open(os.path.join(directory, f"gauge_livesum_otel-{pid}.db"), "wb"):
        pass
    mine = process_identity(pid)
    assert mine and mine.split()[0]  # boot id and start time
    boot, start = mine.split()
    with open(os.path.join(directory, f"process_otel-{pid}.id"), "w") as f:
        f.write(f"{boot} {int(start) - 1}")  # the earlier process with this pid started before
    assert not file_process_alive(directory, pid)
    remove_dead_files(directory)
    assert os.listdir(directory) == []  # its counters (+500 preemptions) are not merged into this run


def test_files_of_the_running_process_itself_stay(tmp_path):
    directory = str(tmp_path)
    kept = write_counter(directory, os.getpid())
    write_identity(directory, os.getpid())
    dead = write_counter(directory, DEAD_PID)
    remove_dead_files(directory)
    assert os.path.exists(kept) and not os.path.exists(dead)
    assert file_process_alive(directory, os.getpid())


def test_a_zombie_is_dead():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    assert wait_for(lambda: process_identity(proc.pid) is None, 10, 0.05)  # exited, not yet reaped: a zombie
    assert os.path.exists(f"/proc/{proc.pid}")
    proc.wait()


# -- identity variables ----------------------------------------------------------------------------------
SETUP_CHILD = textwrap.dedent("""
    import json, os
    from opentelemetry_instrumentation_vllm_ascend import environment
    from opentelemetry_instrumentation_vllm_ascend.recording.metrics_endpoint import Exposition
    e = Exposition()
    e.setup()
    print(json.dumps({k: os.environ.get(k) for k in (environment.ROOT_PID, environment.FILES_DIR)}))
""")


def run_setup(env):
    full = dict(os.environ, PYTHONPATH=ROOT, **env)
    full.pop(environment.PROMETHEUS_MULTIPROC_DIR, None)
    out = subprocess.run([sys.executable, "-c", SETUP_CHILD], env=full, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    import json

    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_identity_inherited_from_a_process_that_is_not_an_ancestor_is_not_trusted(tmp_path):
    """The environment of another server's worker (its root is not our ancestor): a tree of our own,
    with our own directory, instead of writing into the other server's."""
    other_root = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # alive, not ours
    try:
        foreign = tmp_path / "other-server"
        foreign.mkdir(mode=0o700)
        got, _ = run_setup({environment.ROOT_PID: str(other_root.pid), environment.FILES_DIR: str(foreign)})
        assert got[environment.FILES_DIR] != str(foreign)
        assert got[environment.ROOT_PID] != str(other_root.pid)
        assert os.path.basename(got[environment.FILES_DIR]).startswith(exposition.DIRECTORY_PREFIX)
    finally:
        other_root.kill()
        other_root.wait()


def test_identity_inherited_from_an_ancestor_is_kept(tmp_path):
    mine = tmp_path / "ours"
    mine.mkdir(mode=0o700)
    got, _ = run_setup({environment.ROOT_PID: str(os.getpid()), environment.FILES_DIR: str(mine)})
    assert got == {environment.ROOT_PID: str(os.getpid()), environment.FILES_DIR: str(mine)}


def test_ancestry():
    assert exposition.is_ancestor(os.getpid()) is True
    assert exposition.is_ancestor(os.getppid()) is True
    assert exposition.is_ancestor(DEAD_PID) is False


# -- directories leaked by a killed API server -----------------------------------------------------------
def test_directories_of_killed_roots_are_removed_at_the_next_start(tmp_path):
    parent = str(tmp_path)
    root = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:

        def leaked(pid, name):
            path = tmp_path / (exposition.DIRECTORY_PREFIX + name)
            path.mkdir()
            write_counter(str(path), pid)
            with open(path / "root.pid", "w") as f:
                f.write(f"{pid}\n{process_identity(pid)}\n")
            return str(path)

        killed_dir = leaked(root.pid, "killed")
        alive_dir = leaked(alive.pid, "alive")
        unknown = tmp_path / (exposition.DIRECTORY_PREFIX + "norecord")
        unknown.mkdir()
        other = tmp_path / "not_ours"
        other.mkdir()
        root.kill()
        root.wait()  # SIGKILL: its atexit cleanup never ran
        assert exposition.remove_leaked_directories(parent) == [killed_dir]
        assert sorted(os.listdir(parent)) == sorted([os.path.basename(alive_dir), unknown.name, other.name])
    finally:
        for p in (root, alive):
            p.kill()
            p.wait()


def test_the_root_records_itself_in_its_directory(monkeypatch):
    for name in (environment.ROOT_PID, environment.FILES_DIR, environment.PROMETHEUS_MULTIPROC_DIR):
        monkeypatch.delenv(name, raising=False)
    e = exposition.Exposition()
    e.setup()
    try:
        directory = e.directory
        assert directory.startswith(os.path.join(tempfile.gettempdir(), exposition.DIRECTORY_PREFIX))
        with open(os.path.join(directory, "root.pid")) as f:
            assert f.read().split("\n")[:2] == [str(os.getpid()), process_identity(os.getpid())]
    finally:
        e.teardown()
        import shutil

        shutil.rmtree(directory, ignore_errors=True)


# -- a full metrics filesystem ---------------------------------------------------------------------------
FULL_DISK_CHILD = textwrap.dedent("""
    import os, sys
    from opentelemetry_instrumentation_vllm_ascend import catalogue, recording
    from opentelemetry_instrumentation_vllm_ascend.recording import pipeline
    from tests.support.process import set_process
    set_process("engine_core", "0", "mixed")
    # Fill the filesystem up to the last few KiB.
    with open(os.path.join(sys.argv[1], "filler"), "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"x" * 4096)
                f.flush()
        except OSError:
            pass
    os.truncate(os.path.join(sys.argv[1], "filler"), os.path.getsize(os.path.join(sys.argv[1], "filler")) - 98304)  # 96 KiB left: the first 64 KiB file fits, its growth does not
    # Many new series: the files must grow past what the disk has left.
    for i in range(3000):
        recording.add(catalogue.RUNNING_TO_WAITING, 1, ("0", "mixed", "p%d-%s" % (i, "x" * 40)))
        if i % 100 == 0:
            recording.flush()
    recording.flush()
    print("survived", flush=True)
""")


def test_a_full_metrics_filesystem_is_one_log_line_not_a_sigbus(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"mount not permitted here: {done.stderr.decode().strip()}")
    try:
        env = dict(
            os.environ,
            PYTHONPATH=ROOT,
            **{
                environment.FILES_DIR: str(mount),
                environment.PROMETHEUS_INTERVAL_MS: "3600000",
                environment.METRICS_EXPORTER: "none",
            },
        )
        env.pop(environment.PROMETHEUS_MULTIPROC_DIR, None)
        out = subprocess.run(
            [sys.executable, "-c", FULL_DISK_CHILD, str(mount)], env=env, capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, (out.returncode, out.stderr[-3000:])  # a sparse file's page: -7 (SIGBUS)
        assert "survived" in out.stdout
        lines = [line for line in out.stderr.splitlines() if "opentelemetry-instrumentation-vllm-ascend" in line]
        assert len(lines) == 1 and "No space left on device" in lines[0], out.stderr[-3000:]
        assert "stops writing" in lines[0]
    finally:
        subprocess.run(["umount", "-l", str(mount)])


def test_pipeline_files_are_allocated_not_sparse(tmp_path, monkeypatch):
    monkeypatch.delenv(environment.PROMETHEUS_MULTIPROC_DIR, raising=False)
    monkeypatch.setenv(environment.FILES_DIR, str(tmp_path))
    monkeypatch.setenv(environment.METRICS_EXPORTER, "none")
    pipeline.reset()
    try:
        for i in range(2000):  # grows the counter file past its first 64 KiB
            recording.add(catalogue.RUNNING_TO_WAITING, 1, ("0", "mixed", f"p{i}-{'y' * 40}"))
        recording.flush()
        st = os.stat(tmp_path / f"counter_otel-{os.getpid()}.db")
        assert st.st_size > 65536
        assert st.st_blocks * 512 >= st.st_size  # every byte backed by a block: no page to SIGBUS on
        assert len(scrape(str(tmp_path))) == 2000
    finally:
        pipeline.reset()


# -- two instrumented trees on one host ------------------------------------------------------------------
TREE_ROOT = textwrap.dedent("""
    import json, os, subprocess, sys
    from prometheus_client import CollectorRegistry, generate_latest
    from opentelemetry_instrumentation_vllm_ascend import VllmAscendInstrumentor
    VllmAscendInstrumentor().instrument(skip_dep_check=True)
    tag, env_file, go_file = sys.argv[1:4]
    child = subprocess.run([sys.executable, "-c", sys.argv[4], tag, env_file, go_file])
    registry = CollectorRegistry()
    registry.register(VllmAscendInstrumentor._exposition.collector)
    print(json.dumps({"dir": VllmAscendInstrumentor._exposition.directory, "rc": child.returncode,
                      "text": generate_latest(registry).decode()}))
""")
TREE_CHILD = textwrap.dedent("""
    import json, os, sys, time
    from opentelemetry_instrumentation_vllm_ascend import VllmAscendInstrumentor, catalogue, recording
    VllmAscendInstrumentor().instrument(skip_dep_check=True)
    tag, env_file, go_file = sys.argv[1:4]
    recording.add(catalogue.RUNNING_TO_WAITING, 1, ("0", "mixed", tag))
    recording.flush()
    with open(env_file, "w") as f:
        json.dump(dict(os.environ), f)
    deadline = time.monotonic() + 120
    while go_file != "-" and not os.path.exists(go_file) and time.monotonic() < deadline:
        time.sleep(0.05)
""")


def test_two_instrumented_trees_on_one_host_never_see_each_other(tmp_path):
    """Tree B is started with the environment of tree A's child (the issue's case: 2 series crossed
    over into A's directory): each tree's /metrics shows its own series only."""
    import json

    env = dict(
        os.environ,
        PYTHONPATH=ROOT,
        **{
            environment.ENABLED: "true",
            environment.METRICS_EXPORTER: "none",
            environment.PROMETHEUS_INTERVAL_MS: "3600000",
        },
    )
    for name in (environment.PROMETHEUS_MULTIPROC_DIR, environment.ROOT_PID, environment.FILES_DIR, environment.TREE):
        env.pop(name, None)
    a_env, go = tmp_path / "a.env", tmp_path / "go"
    a = subprocess.Popen(
        [sys.executable, "-c", TREE_ROOT, "a", str(a_env), str(go), TREE_CHILD],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:

        def written():  # the whole file: it may exist before its JSON is complete
            try:
                return json.loads(a_env.read_text())
            except (OSError, ValueError):
                return None

        inherited = wait_for(written, 120, 0.05)  # A's child's environment, A still running
        assert inherited[environment.FILES_DIR]
        b = subprocess.run(
            [sys.executable, "-c", TREE_ROOT, "b", str(tmp_path / "b.env"), "-", TREE_CHILD],
            env=inherited,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert b.returncode == 0, b.stderr
    finally:
        go.touch()
        out_a = a.communicate(timeout=120)[0]
    got_a, got_b = json.loads(out_a.strip().splitlines()[-1]), json.loads(b.stdout.strip().splitlines()[-1])
    assert got_a["rc"] == got_b["rc"] == 0
    assert got_a["dir"] != got_b["dir"] and got_b["dir"] != inherited[environment.FILES_DIR]

    def phases(text):
        return sorted(
            line.split('phase="')[1].split('"')[0]
            for line in text.splitlines()
            if line.startswith("vllm_profiling_running_to_waiting_count_total{")
        )

    assert phases(got_a["text"]) == ["a"]
    assert phases(got_b["text"]) == ["b"]


def test_files_of_a_process_whose_tree_root_is_gone_are_those_of_a_dead_tree(tmp_path, monkeypatch):
    """vLLM 0.32 leaves the EngineCore and its worker running when the API server is SIGKILLed: on a
    persistent PROMETHEUS_MULTIPROC_DIR the next server would count their series next to its own."""
    directory = str(tmp_path)
    root = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        monkeypatch.setenv(environment.ROOT_PID, str(root.pid))
        orphan = write_counter(directory, os.getpid())  # this process plays the orphaned EngineCore
        write_identity(directory, os.getpid())
        assert file_process_alive(directory, os.getpid())  # its root runs
        root.kill()
        root.wait()
        assert not file_process_alive(directory, os.getpid())
        remove_dead_files(directory)
        assert not os.path.exists(orphan)
    finally:
        root.kill()
        root.wait()
