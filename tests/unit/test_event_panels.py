"""The dashboard panels a healthy CPU server cannot fill (dashboards.EVENT_ONLY: health-check failures, degraded
hooks, slow tokens, draft tokens, device utilization, KV transfers, offloaded weights), proven on a real Prometheus: their
events are recorded through the real handlers (driven by the real wrappers, on objects shaped like vLLM's, as
tests/unit/handlers/test_api.py, test_kv_connectors.py, test_weight_offload.py and tests/unit/handlers/test_ascend.py drive
them), written by the real /metrics files writer and exposed as vLLM's /metrics exposes them (FilesCollector),
served by a small HTTP server that records one more round of events before each scrape, and scraped every
second by Prometheus (tests/support/prometheus_tools.py). Every EVENT_ONLY panel query, variables at "All", returns
series, with the values the rounds give (hand-computed below). One process identity records both the API-side
and the worker-side events (a worker of rank 0, dp 0, role decode): the series are those the two processes
would write, the API ones without ``rank``."""

from __future__ import annotations

import asyncio
import http.server
import re
import sys
import threading
import time
from types import SimpleNamespace as NS

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from opentelemetry_instrumentation_vllm_ascend import context, environment, recording
from opentelemetry_instrumentation_vllm_ascend.cli import dashboards
from opentelemetry_instrumentation_vllm_ascend.handlers import api, kv_transfer, memory, weight_offload
from opentelemetry_instrumentation_vllm_ascend.hooks.handler import Handler
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import COROUTINE, SYNC, SYNC_TIMER, wrap
from opentelemetry_instrumentation_vllm_ascend.recording import pipeline
from opentelemetry_instrumentation_vllm_ascend.recording.files_reader import FilesCollector
from opentelemetry_instrumentation_vllm_ascend.state import STATE
from tests.support.fakes import patch_clock
from tests.support.process import set_process
from tests.support.prometheus_tools import Prometheus, tool
from tests.support.waiting import wait_for

#: Per round: 2 failed health checks; one engine update with 12 draft tokens, ITLs 1.5 s and 0.2 s (one over
#: 1 s) and a 6 s TTFT (over the 5 s threshold only); two NIXL transfers of 64 KiB in 1.5 ms each and one failed;
#: one ExampleConnector store of 3 slots into a layer whose token takes 2 heads x 4 float32 (32 bytes), in 4 ms.
HEALTH_FAILURES, DRAFT_TOKENS, NIXL_BYTES, NIXL_SECONDS = 2, 12, 65536, 0.0015
STORE_BYTES, STORE_SECONDS = 3 * 2 * 4 * 4, 0.004
OFFLOADED, UTILIZATION = 5184, 37.0
#: Per round: a hook whose handler fails three times (in after).
HOOK_FAILURES = 3
RANGE = "1m"


class StatLoggerManager:
    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=None):
        pass


class AsyncLLM:
    async def check_health(self):
        raise RuntimeError("EngineCore is dead")


class NixlKVConnectorStats:
    def record_transfer(self, res):
        pass

    def record_failed_transfer(self):
        pass


class Failing:
    """A hook whose handler fails on every call (vLLM's call is untouched)."""

    def run(self):
        return 1


class FailingHandler(Handler):
    name = "Failing.run"

    def after(self, state, args, kwargs, result):
        raise AttributeError("moved")


class ExampleConnector:
    def __init__(self, requests, clock):
        self.requests = requests
        self.clock = clock

    def _get_connector_metadata(self):
        return NS(requests=self.requests)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata=None):
        self.clock.t += STORE_SECONDS  # a synchronous copy and file write


class KVLayer:
    """A [blocks, heads, block_size, head_size] float32 layer's shape as _token_bytes reads it: [0, :, 0] is a
    heads x head_size slice (2 x 4 floats)."""

    def __getitem__(self, index):
        return NS(numel=lambda: 2 * 4)

    def element_size(self):
        return 4


class UVAOffloader:
    cpu_offload_bytes = OFFLOADED

    def wrap_modules(self, modules_generator, prefix=""):
        return list(modules_generator)


@pytest.fixture
def files_dir(tmp_path, monkeypatch):
    directory = tmp_path / "metrics"
    directory.mkdir()
    monkeypatch.delenv(environment.PROMETHEUS_MULTIPROC_DIR, raising=False)
    monkeypatch.delenv(environment.METRICS_EXPORTER, raising=False)
    monkeypatch.setenv(environment.FILES_DIR, str(directory))
    monkeypatch.setenv(environment.PROMETHEUS_INTERVAL_MS, "3600000")  # written when the server flushes
    saved = (context.PROCESS.process, context.PROCESS.dp, context.PROCESS.role, context.PROCESS.labels)
    pipeline.reset()
    set_process("worker", "0", "decode")
    context.set_rank(0)
    yield str(directory)
    pipeline.reset()
    set_process(*saved[:3])
    context.PROCESS.labels = saved[3]


@pytest.fixture
def events(files_dir, monkeypatch):
    """A function recording one round of the events through the real wrappers and handlers, then writing the
    files; and one rendering /metrics from them."""
    clock = patch_clock(monkeypatch, api, kv_transfer)
    # The device: a torch whose npu answers 37 % for device 1 (the gauge reads it at each collection).
    npu = NS(
        is_available=lambda: True, is_initialized=lambda: True, current_device=lambda: 1, utilization=lambda i: 37.0
    )
    monkeypatch.setitem(sys.modules, "torch", NS(npu=npu, cuda=None))
    monkeypatch.setattr(STATE, "observers", [])
    monkeypatch.setattr(STATE, "utilization_observed", False)
    memory.observe_utilization()
    check = wrap(AsyncLLM.check_health, api.CheckHealth(), COROUTINE)[0]
    record_stats = wrap(StatLoggerManager.record, api.RecordStats(), SYNC_TIMER)[0]
    nixl_transfer = wrap(NixlKVConnectorStats.record_transfer, kv_transfer.NixlRecordTransfer(), SYNC)[0]
    nixl_failed = wrap(NixlKVConnectorStats.record_failed_transfer, kv_transfer.NixlFailedTransfer(), SYNC)[0]
    save_layer = wrap(ExampleConnector.save_kv_layer, kv_transfer.ExampleSaveKvLayer(), SYNC)[0]
    wrap_modules = wrap(UVAOffloader.wrap_modules, weight_offload.UVAWrapModules(), SYNC)[0]
    failing = wrap(Failing.run, FailingHandler(), SYNC)[0]
    stats = NixlKVConnectorStats()
    requests = [NS(is_store=True, slot_mapping=[0, 1, 2]), NS(is_store=False, slot_mapping=[3])]
    connector = ExampleConnector(requests, clock)
    lock = threading.Lock()

    def round_():
        with lock:
            for _ in range(HEALTH_FAILURES):
                with pytest.raises(RuntimeError):
                    asyncio.run(check(AsyncLLM()))
            iteration = NS(
                prompt_token_stats=NS(total=10),
                num_prompt_tokens=10,
                num_generation_tokens=3,
                time_to_first_tokens_iter=[6.0],
                inter_token_latencies_iter=[1.5, 0.2],
                finished_requests=[],
            )
            scheduler = NS(num_running_reqs=1, num_waiting_reqs=0, num_skipped_waiting_reqs=0)
            scheduler.spec_decoding_stats = NS(num_draft_tokens=DRAFT_TOKENS)
            record_stats(StatLoggerManager(), scheduler, iteration, None, 0)
            STATE.last_step_phase = "decode"
            for _ in range(2):
                nixl_transfer(stats, NS(totalBytes=NIXL_BYTES, xferDuration=NIXL_SECONDS * 1e6))
            nixl_failed(stats)
            save_layer(connector, "layer.0", KVLayer(), None)
            wrap_modules(UVAOffloader(), iter(()))
            for _ in range(HOOK_FAILURES):
                assert failing(Failing()) == 1
            recording.flush()

    def exposition() -> bytes:
        registry = CollectorRegistry()
        registry.register(FilesCollector(files_dir))
        return generate_latest(registry)

    return NS(round=round_, exposition=exposition)


@pytest.fixture
def target(events):
    """/metrics on a free local port: each request records one more round, then renders the files."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            events.round()
            body = events.exposition()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def match_all(expr: str) -> str:
    return re.sub(r"\$(\w+)", ".*", expr.replace("$__rate_interval", RANGE))


def test_event_only_panels_return_series_on_a_real_prometheus(target, tmp_path):
    tool("prometheus")  # skip (fail in CI) before anything starts where Prometheus cannot be had
    prom = Prometheus(tmp_path, [target])
    try:
        scraped = wait_for(lambda: prom.query('count_over_time(up{job="vllm"}[1m]) >= 4 and up == 1'), 60, 0.5)
        assert scraped, "Prometheus never scraped the target 4 times"
        at = time.time()  # every query at one time: their ratios compare the same scrapes
        panels = {p.title: p for _, ps in dashboards.sections() for p in ps}
        assert set(dashboards.EVENT_ONLY) <= set(panels)
        results = {}
        for title in dashboards.EVENT_ONLY:
            for legend, expr in panels[title].targets:
                result = prom.query(match_all(expr), at)
                assert result, f"{title} ({legend}): no series for {match_all(expr)}"
                results[(title, legend)] = result
        scrapes = float(prom.query('count_over_time(up{job="vllm"}[1m])', at)[0]["value"][1])
    finally:
        prom.stop()

    def values(title, legend_start=""):
        [(legend, result)] = [(k[1], v) for k, v in results.items() if k[0] == title and k[1].startswith(legend_start)]
        return {tuple(sorted((k, v) for k, v in r["metric"].items())): float(r["value"][1]) for r in result}

    assert scrapes >= 4
    one = (("dp", "0"), ("instance", target))
    # Gauges: the offloader's bytes and the device's percent, as the fakes hold them.
    assert values("Weights offloaded to host memory") == {(one[0], one[1], ("offloader", "UVAOffloader")): OFFLOADED}
    assert values("Device utilization") == {(("device", "1"), *one): UTILIZATION}
    # Means of a histogram: 12 draft tokens per engine update, exactly.
    assert values("Draft tokens verified per step") == {one: pytest.approx(DRAFT_TOKENS)}
    # Rates of counters grow by a fixed amount per scrape: their ratios are the per-round amounts.
    nixl = (("connector", "NixlConnector"), ("direction", "remote"), *one)
    store = (("connector", "ExampleConnector"), ("direction", "d2h"), *one)
    rates = values("KV transfers: bytes per second by direction")
    counts = values("KV transfers per second by direction")
    assert rates.keys() == counts.keys() == {nixl, store}
    assert rates[nixl] / counts[nixl] == pytest.approx(NIXL_BYTES)
    assert rates[store] / counts[store] == pytest.approx(STORE_BYTES)
    failures = values("KV transfer failures")
    assert set(failures) == {nixl} and failures[nixl] > 0
    health = values("Health-check failures")
    slow = values("Inter-token latency over 1 s / TTFT over threshold", "ITL")
    ttft = values("Inter-token latency over 1 s / TTFT over threshold", "TTFT")
    assert health[one] / slow[one] == pytest.approx(HEALTH_FAILURES)
    degraded = values("Degraded hooks (handler failures)")
    hook = (("dp", "0"), ("hook", "Failing.run"), ("instance", target), ("process", "worker"), ("where", "after"))
    assert degraded.keys() == {hook} and degraded[hook] / slow[one] == pytest.approx(HOOK_FAILURES)
    assert ttft == {(("dp", "0"), ("instance", target), ("threshold", "5s")): pytest.approx(slow[one])}
    # The transfer duration's quantiles: every NIXL transfer took 1.5 ms, in the (1 ms, 2.5 ms] bucket; every
    # store 4 ms, in (2.5 ms, 5 ms].
    for (title, legend), result in results.items():
        if title == "KV transfer duration":
            by_direction = {r["metric"]["direction"]: float(r["value"][1]) for r in result}
            assert 0.001 < by_direction["remote"] <= 0.0025 and 0.0025 < by_direction["d2h"] <= 0.005, legend
    # Blocked: 4 ms per round, the store's, in decode steps; as many rounds as stores.
    blocked = values("Step time blocked on KV transfers (seconds per second)")
    decode = (*one, ("phase", "decode"))
    assert blocked.keys() == {decode}
    assert blocked[decode] / counts[store] == pytest.approx(STORE_SECONDS)
