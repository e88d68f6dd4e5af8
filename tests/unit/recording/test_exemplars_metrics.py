"""Exemplars on ``/metrics``: what ``recording.record_exemplar`` offers reaches the OpenMetrics format (parsed back
with prometheus_client's OpenMetrics parser: the trace id, span id and value as recorded, on the bucket the value
falls in, the newest per bucket over processes), through our FilesCollector (cached rendering and prometheus_client's
own, byte for byte the same) and through prometheus_client's MultiProcessCollector where PROMETHEUS_MULTIPROC_DIR is
set — vLLM's own ``/metrics`` routes included; a text-format scrape is byte for byte what it is without exemplars."""

from __future__ import annotations

import json
import os
import re
import time
from bisect import bisect_left

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client import exposition as text_format
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from opentelemetry_instrumentation_vllm_ascend import catalogue, environment, recording
from opentelemetry_instrumentation_vllm_ascend.recording import exposition, multiprocess_guard, pipeline
from opentelemetry_instrumentation_vllm_ascend.recording.files_reader import FilesCollector
from opentelemetry_instrumentation_vllm_ascend.recording.identity import remove_dead_files
from tests.support.process import set_process

TTFT = catalogue.BY_SEED["fine_grained_ttft"]
TPOT = catalogue.BY_SEED["fine_grained_tpot"]
A = ("0", "mixed", "decode", "0")  # dp, role, phase, engine (TTFT.labels' order)
B = ("1", "mixed", "decode", "1")
#: Prometheus 2.42's Accept header, and one asking for names as written (Prometheus 3's escaping=allow-utf-8).
OPENMETRICS_ACCEPTS = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8",
)
TEXT_ACCEPTS = ("", "text/plain;version=0.0.4", "text/plain;version=1.0.0;escaping=underscores")


def family_blocks(exposition_bytes: bytes) -> list:
    """An exposition's families (each from its ``# HELP`` line to the next, bytes as written), sorted; OpenMetrics'
    closing ``# EOF`` line stays last."""
    body, eof = (
        (exposition_bytes[:-6], [b"# EOF\n"]) if exposition_bytes.endswith(b"# EOF\n") else (exposition_bytes, [])
    )
    return sorted(block for block in re.split(rb"(?m)^(?=# HELP )", body) if block) + eof


def offers():
    """(spec, value, labels, trace id, span id): two in one bucket (the later one wins), the +Inf bucket, two
    series, two histograms."""
    return [
        (TTFT, 0.012, A, 0x8BADF00D_DEADBEEF_01234567_89ABCDEF, 0xF00DFACE_CAFEBABE),
        (TTFT, 0.013, A, 0x0000000A_00000000_00000000_0000000B, 0x1),
        (TTFT, 0.3, A, 0xFFFFFFFF_FFFFFFFF_FFFFFFFF_FFFFFFFF, 0xFFFFFFFF_FFFFFFFF),
        (TTFT, 1e6, B, 0x1234, 0x5678),
        (TPOT, 0.02, A, 0xABCDEF, 0x42),
    ]


def expected(offered) -> dict:
    """{(family, label items without le, le): (value, trace id hex, span id hex)}: the latest offer per bucket."""
    out = {}
    for spec, value, labels, trace_id, span_id in offered:
        bounds = tuple(float(b) for b in spec.buckets)
        index = bisect_left(bounds, value)
        le = floatToGoString(bounds[index]) if index < len(bounds) else "+Inf"
        items = tuple(sorted(zip(spec.labels, labels)))
        out[(spec.prometheus_name, items, le)] = (value, format(trace_id, "032x"), format(span_id, "016x"))
    return out


def parsed_exemplars(text: str, prefix: str = "vllm_profiling_fine_grained_t") -> tuple[dict, int]:
    """({(family, label items without le, le): (value, trace id, span id)}, exemplar timestamps outside now) of an
    OpenMetrics text, parsed by prometheus_client's OpenMetrics parser."""
    found, now = {}, time.time()
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(prefix):
            continue
        for sample in family.samples:
            if sample.exemplar is None:
                continue
            assert sample.name == family.name + "_bucket"
            labels = dict(sample.labels)
            le = labels.pop("le")
            ex = sample.exemplar
            assert set(ex.labels) == {"trace_id", "span_id"}
            assert now - 120 < float(ex.timestamp) <= now + 1
            found[(family.name, tuple(sorted(labels.items())), le)] = (
                ex.value,
                ex.labels["trace_id"],
                ex.labels["span_id"],
            )
    return found


def record_offers(offered) -> None:
    for spec, value, labels, trace_id, span_id in offered:
        recording.record_exemplar(spec, value, labels, trace_id, span_id)


def encoders(accepts):
    return [text_format.choose_encoder(accept)[0] for accept in accepts]


@pytest.fixture(params=["fast", "sdk"])
def recorder(request, monkeypatch):
    monkeypatch.setenv(environment.RECORDER, request.param)
    monkeypatch.delenv(environment.METRICS_EXEMPLAR_FILTER, raising=False)
    return request.param


def test_files_collector_renders_exemplars_in_openmetrics_only(recorder, files_dir):
    offered = offers()
    record_offers(offered)
    recording.flush()
    registry = CollectorRegistry()
    collector = FilesCollector(files_dir)
    registry.register(collector)
    plain_om = [encoder(registry) for encoder in encoders(OPENMETRICS_ACCEPTS)]
    plain_text = [encoder(registry) for encoder in encoders(TEXT_ACCEPTS)] + [text_format.generate_latest(registry)]
    fast = exposition.FastExposition(collector, registry)
    fast.install()
    try:
        for _ in range(2):  # the second render from the caches
            cached_om = [encoder(registry) for encoder in encoders(OPENMETRICS_ACCEPTS)]
            cached_text = [encoder(registry) for encoder in encoders(TEXT_ACCEPTS)]
            cached_text.append(text_format.generate_latest(registry))
            assert cached_om == plain_om and cached_text == plain_text
    finally:
        fast.remove()
    want = expected(offered)
    for om in plain_om:
        assert parsed_exemplars(om.decode()) == want
    assert b"# {" not in b"".join(plain_text)
    # Without the exemplars file: the same text, byte for byte (and OpenMetrics without the exemplars).
    (path,) = [p for p in os.listdir(files_dir) if p.startswith("exemplars_")]
    assert path == f"exemplars_otel-{os.getpid()}.json"
    os.remove(os.path.join(files_dir, path))
    bare = [encoder(registry) for encoder in encoders(TEXT_ACCEPTS)] + [text_format.generate_latest(registry)]
    assert bare == plain_text
    assert [encoder(registry) for encoder in encoders(OPENMETRICS_ACCEPTS)] == [_strip_exemplars(om) for om in plain_om]


def _strip_exemplars(om: bytes) -> bytes:
    return b"\n".join(line.split(b" # {")[0] for line in om.split(b"\n"))


def test_a_text_scrape_equals_one_of_plain_records(recorder, files_dir, tmp_path_factory, monkeypatch):
    """The same observations recorded with ``record`` into another directory: the same text scrape."""
    record_offers(offers())
    recording.flush()
    with_exemplars = _text(files_dir)
    other = str(tmp_path_factory.mktemp("plain"))
    monkeypatch.setenv(environment.FILES_DIR, other)
    pipeline.reset()
    set_process("engine_core", "0", "decode")
    for spec, value, labels, _trace_id, _span_id in offers():
        recording.record(spec, value, labels)
    recording.flush()
    assert _text(other) == with_exemplars and b"fine_grained_ttft_bucket" in with_exemplars


def _text(directory):
    registry = CollectorRegistry()
    registry.register(FilesCollector(directory))
    return text_format.generate_latest(registry)


def test_the_newest_exemplar_of_a_bucket_wins_over_processes(files_dir):
    """Two processes' files (this one's, and another written as a forked child would write it): per bucket the
    newest exemplar, whichever process has it; buckets only one has keep its own."""
    record_offers(offers()[:3])
    recording.flush()
    mine = os.path.join(files_dir, f"exemplars_otel-{os.getpid()}.json")
    rows = json.load(open(mine))
    theirs = os.path.join(files_dir, "exemplars_otel-1.json")  # pid 1: a process of this tree in a container
    (high,) = [row for row in rows if row[3] == 0.3]
    (low,) = [row for row in rows if row[3] == 0.013]
    newer = [*high[:4], high[4] + 1.0, "f" * 32, "e" * 16]  # the same bucket, later: wins
    older = [*low[:4], low[4] - 1.0, "d" * 32, "c" * 16]  # the same bucket, earlier: loses
    alone = [*low[:2], "+Inf", 1e6, low[4] - 1.0, "b" * 32, "a" * 16]  # a bucket only it has
    with open(theirs, "w") as f:
        json.dump([newer, older, alone], f)
    registry = CollectorRegistry()
    registry.register(FilesCollector(files_dir))
    found = parsed_exemplars(openmetrics.generate_latest(registry).decode())
    items = tuple(sorted(zip(TTFT.labels, A)))
    want = expected(offers()[:3])
    want[(TTFT.prometheus_name, items, high[2])] = (0.3, "f" * 32, "e" * 16)
    want[(TTFT.prometheus_name, items, "+Inf")] = (1e6, "b" * 32, "a" * 16)
    assert found == want


def test_an_unreadable_exemplars_file_is_left_out_with_one_warning(files_dir, caplog):
    record_offers(offers())
    recording.flush()
    with open(os.path.join(files_dir, "exemplars_otel-1.json"), "w") as f:
        f.write('[["half')
    registry = CollectorRegistry()
    registry.register(FilesCollector(files_dir))
    with caplog.at_level("WARNING"):
        for _ in range(2):
            assert parsed_exemplars(openmetrics.generate_latest(registry).decode()) == expected(offers())
    assert sum("exemplars_otel-1.json" in r.getMessage() for r in caplog.records) == 1


def test_always_off_writes_no_exemplars_file(files_dir, monkeypatch):
    monkeypatch.setenv(environment.METRICS_EXEMPLAR_FILTER, "always_off")
    pipeline.reset()
    record_offers(offers())
    recording.flush()
    assert not [p for p in os.listdir(files_dir) if p.startswith("exemplars_")]
    assert b"_bucket" in _text(files_dir)


@pytest.fixture
def multiproc_dir(tmp_path, monkeypatch):
    """PROMETHEUS_MULTIPROC_DIR set (as vLLM sets it with several API servers): our files go there, and the guard
    the API server installs is in place."""
    monkeypatch.setenv(environment.PROMETHEUS_MULTIPROC_DIR, str(tmp_path))
    monkeypatch.delenv(environment.FILES_DIR, raising=False)
    monkeypatch.delenv(environment.METRICS_EXPORTER, raising=False)
    monkeypatch.setenv(environment.PROMETHEUS_INTERVAL_MS, "3600000")
    pipeline.reset()
    set_process("api_server", "0", "mixed")
    guard = multiprocess_guard.guard_multiprocess_collector()
    assert guard is not None
    yield str(tmp_path), guard
    guard.remove()
    pipeline.reset()


def test_multiprocess_collector_gets_our_exemplars(recorder, multiproc_dir):
    directory, guard = multiproc_dir
    # A histogram of vLLM's in prometheus_client's own multiprocess file (as vLLM's process writes it).
    theirs = MmapedDict(os.path.join(directory, "histogram_4242.db"))
    name = "vllm:e2e_request_latency_seconds"
    for le, count in (("1.0", 0.0), ("2.0", 1.0), ("+Inf", 0.0)):
        theirs.write_value(mmap_key(name, name + "_bucket", ["engine", "le"], ["0", le], "vLLM's"), count, 0)
    theirs.write_value(mmap_key(name, name + "_sum", ["engine"], ["0"], "vLLM's"), 1.5, 0)
    theirs.close()
    offered = offers()
    record_offers(offered)
    recording.flush()
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    om = [encoder(registry) for encoder in encoders(OPENMETRICS_ACCEPTS)]
    text = [encoder(registry) for encoder in encoders(TEXT_ACCEPTS)]
    for out in om:
        assert parsed_exemplars(out.decode()) == expected(offered)
    assert b"# {" not in b"".join(text)
    # prometheus_client's own collector, as without the guard: each family the same, byte for byte (the order of
    # families follows glob's order of the files, which the file system decides, with the guard or without).
    guard.remove()
    assert [family_blocks(encoder(registry)) for encoder in encoders(TEXT_ACCEPTS)] == [family_blocks(t) for t in text]
    assert [family_blocks(encoder(registry)) for encoder in encoders(OPENMETRICS_ACCEPTS)] == [
        family_blocks(_strip_exemplars(o)) for o in om
    ]
    assert b"e2e_request_latency_seconds_bucket" in text[0]


def test_dead_processes_exemplars_files_of_an_earlier_run_are_removed(multiproc_dir):
    directory, _guard = multiproc_dir
    stale = os.path.join(directory, "exemplars_otel-999999999.json")
    with open(stale, "w") as f:
        f.write("[]")
    remove_dead_files(directory)
    assert not os.path.exists(stale)


def test_vllms_metrics_routes_with_prometheus_multiproc_dir(multiproc_dir):
    """vLLM's own /metrics (its attach_router, vLLM 0.32–0.34: prometheus_fastapi_instrumentator's route at
    ``/metrics``, prometheus_client's ``make_asgi_app`` mounted under it): the exemplars are on ``/metrics/`` when
    the scraper asks for OpenMetrics; ``/metrics`` answers in the text format whatever the Accept header. With the
    names kept (recording/openmetrics_names.py, which every instrumented process installs) ``/metrics/`` writes
    every name as ``/metrics`` does, ``:`` included, for Prometheus 2's Accept header as for Prometheus 3's, and
    prometheus_client's OpenMetrics parser reads the whole page."""
    pytest.importorskip("vllm")
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from vllm.entrypoints.serve.instrumentator.metrics import attach_router

    from opentelemetry_instrumentation_vllm_ascend.recording.openmetrics_names import KeptNames

    offered = offers()
    record_offers(offered)
    recording.record(catalogue.BY_SEED["scheduler:duration"], 0.004, ("0", "mixed", "decode"))
    recording.flush()
    app = FastAPI()
    attach_router(app)
    client = TestClient(app)
    names = KeptNames()
    names.install()
    try:
        for accept in OPENMETRICS_ACCEPTS:
            response = client.get("/metrics/", headers={"Accept": accept})
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("application/openmetrics-text")
            assert parsed_exemplars(response.text) == expected(offered)
            plain = client.get("/metrics", headers={"Accept": accept})
            assert plain.headers["content-type"].startswith("text/plain") and " # {" not in plain.text
            assert "vllm_profiling_fine_grained_ttft_bucket{" in plain.text
            assert "\nvllm_profiling_scheduler:duration_bucket{" in plain.text
            assert "\nvllm_profiling_scheduler:duration_bucket{" in response.text
            assert "\nvllm_profiling_scheduler_duration_bucket{" not in response.text
            families = {f.name: f.type for f in text_string_to_metric_families(response.text)}
            assert families["vllm_profiling_scheduler:duration"] == "histogram"
    finally:
        names.remove()


def test_a_real_prometheus_stores_the_exemplars(files_dir, tmp_path_factory):
    """Prometheus (Debian's 2.42, ``--enable-feature=exemplar-storage``) scraping our collector through
    prometheus_client's own HTTP exposition (the Accept header picks OpenMetrics): ``query_exemplars`` returns each
    exemplar on its bucket series, with its trace id, span id and value."""
    from prometheus_client import start_http_server

    from opentelemetry_instrumentation_vllm_ascend.cli.demo.server import free_port
    from tests.support.prometheus_tools import Prometheus, tool
    from tests.support.waiting import wait_for

    tool("prometheus")
    offered = offers()
    record_offers(offered)
    recording.flush()
    registry = CollectorRegistry()
    registry.register(FilesCollector(files_dir))
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    root = tmp_path_factory.mktemp("prometheus-exemplars")
    prom = Prometheus(root, [f"127.0.0.1:{port}"], flags=("--enable-feature=exemplar-storage",))
    start = time.time() - 60
    want = expected(offered)

    def stored():
        found = {}
        for family in ("vllm_profiling_fine_grained_ttft", "vllm_profiling_fine_grained_tpot"):
            data = prom.get("/api/v1/query_exemplars", query=family + "_bucket", start=start, end=time.time() + 60)
            for series in data:
                labels = dict(series["seriesLabels"])
                le = labels.pop("le")
                items = tuple(sorted((k, v) for k, v in labels.items() if k not in ("job", "instance", "__name__")))
                for ex in series["exemplars"]:
                    found[(family, items, le)] = (float(ex["value"]), ex["labels"]["trace_id"], ex["labels"]["span_id"])
        return found if found == want else None

    try:
        assert wait_for(stored, 30), (stored.__name__, want)
        # The dashboard's panels that show exemplars: their exemplar query (variables at "All") gets its histogram's.
        from opentelemetry_instrumentation_vllm_ascend.cli import dashboards

        board = dashboards.dashboard()
        shown = [(p["title"], t) for p in board["panels"] for t in p.get("targets", []) if t.get("exemplar")]
        assert [title for title, _ in shown] == ["Time to first token (TTFT)", "Time per output token (TPOT)"]
        for (_title, target), family in zip(
            shown, ("vllm_profiling_fine_grained_ttft", "vllm_profiling_fine_grained_tpot")
        ):
            expr = re.sub(r"\$(\w+)", ".*", target["expr"].replace("$__rate_interval", "5m"))
            data = prom.get("/api/v1/query_exemplars", query=expr, start=start, end=time.time() + 60)
            got = {(ex["labels"]["trace_id"], float(ex["value"])) for series in data for ex in series["exemplars"]}
            assert got == {(trace, value) for (name, _, _), (value, trace, _) in want.items() if name == family}
    finally:
        prom.stop()
        server.shutdown()
        server.server_close()


def test_genai_histograms_on_metrics_carry_theirs(files_dir, monkeypatch):
    """With OTEL_VLLM_ASCEND_GENAI_PROMETHEUS=true the GenAI histograms reach /metrics under their Prometheus names
    and sanitised labels (gen_ai_server_request_duration_seconds{gen_ai_operation_name=…}), exemplars included."""
    monkeypatch.setenv(environment.GENAI_PROMETHEUS, "true")
    pipeline.reset()
    duration = catalogue.BY_SEED["gen_ai.server.request.duration"]
    labels = ("chat", "vllm", "model-a", "")
    recording.record_exemplar(duration, 1.5, labels, 0xC0FFEE, 0xBEEF)
    recording.flush()
    registry = CollectorRegistry()
    registry.register(FilesCollector(files_dir))
    found = parsed_exemplars(openmetrics.generate_latest(registry).decode(), prefix="gen_ai_server_")
    bounds = tuple(float(b) for b in duration.buckets)
    le = floatToGoString(bounds[bisect_left(bounds, 1.5)])
    items = tuple(sorted(zip([k.replace(".", "_") for k in duration.labels], labels)))
    assert found == {(duration.prometheus_name, items, le): (1.5, format(0xC0FFEE, "032x"), format(0xBEEF, "016x"))}
