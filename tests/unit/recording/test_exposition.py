"""The cached rendering of our families on /metrics (recording/exposition.py): byte for byte what
prometheus_client writes, in the text and the OpenMetrics formats, scrape after scrape as values and series
change; everything else falls back to prometheus_client untouched."""

import logging
import os
import sys

import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client import exposition as text_format
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.openmetrics import exposition as openmetrics

from opentelemetry_instrumentation_vllm_ascend import catalogue, context, environment, recording
from opentelemetry_instrumentation_vllm_ascend.recording import exposition
from opentelemetry_instrumentation_vllm_ascend.recording.files_reader import FilesCollector
from opentelemetry_instrumentation_vllm_ascend.recording.metrics_endpoint import Exposition

#: Label values prometheus_client escapes, and one it does not.
AWKWARD = ('say "hi"', "back\\slash", "two\nlines", "ünïcödé")


def write_files(directory, round_no: int) -> None:
    """Hand-written files of two live processes: counters, a histogram, gauges of each merge mode, label values
    that need escaping; each round moves values and adds a series."""
    for i, pid in enumerate((os.getpid(), os.getppid())):
        c = MmapedDict(str(directory / f"counter_otel-{pid}.db"))
        for k, value in enumerate(AWKWARD[: 2 + round_no] + AWKWARD[3:]):
            c.write_value(mmap_key("a", "a_total", ["dp", "v"], [str(i), value], "help with \\ and\nnewline"), k + i, 0)
        c.close()
        h = MmapedDict(str(directory / f"histogram_otel-{pid}.db"))
        for le, v in (("0.1", 1.0 + round_no), ("1.0", 2.0 + i), ("+Inf", 1.0)):
            h.write_value(mmap_key("t:dur", "t:dur_bucket", ["dp", "le"], ["0", le], "d"), v, 0)
        h.write_value(mmap_key("t:dur", "t:dur_sum", ["dp"], ["0"], "d"), 3.5 + i + round_no * 0.125, 0)
        h.close()
        for mode in ("livesum", "livemostrecent", "all", "max"):
            g = MmapedDict(str(directory / f"gauge_{mode}_otel-{pid}.db"))
            g.write_value(mmap_key(f"g_{mode}", f"g_{mode}", ["dp"], ["0"], "g"), 1e7 * (i + 1) + round_no, 100.0 + i)
            g.close()


def encoders():
    """What vLLM's /metrics calls: prometheus_client's encoder for each Accept header Prometheus and curl send, and
    prometheus_fastapi_instrumentator's plain generate_latest."""
    accepts = (
        "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
        "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",  # Prometheus 2.42's
        "text/plain;version=1.0.0;escaping=underscores",
        "",  # curl's: none
    )
    return [text_format.choose_encoder(accept)[0] for accept in accepts] + [text_format.generate_latest]


@pytest.fixture
def served(tmp_path):
    """A registry holding a metric of vLLM's and our collector over hand-written files, with the encoders
    wrapped as the API server wraps them (and put back afterwards)."""
    registry = CollectorRegistry()
    Counter("vllm:thing", "vLLM's own", ["engine"], registry=registry).labels("0").inc(3)
    collector = FilesCollector(str(tmp_path))
    registry.register(collector)
    fast = exposition.FastExposition(collector, registry)
    yield registry, collector, fast
    fast.remove()


def rendered(registry, collector, fast):
    """(cached, prometheus_client's) output of each encoder for the same files."""
    fast.install()
    cached = [encoder(registry) for encoder in encoders()]
    fast.remove()
    plain = [encoder(registry) for encoder in encoders()]
    return cached, plain


def test_cached_lines_are_byte_identical_to_prometheus_clients_scrape_after_scrape(tmp_path, served):
    registry, collector, fast = served
    for round_no in range(3):  # values move and a series appears each round; the second uses the caches
        write_files(tmp_path, round_no)
        cached, plain = rendered(registry, collector, fast)
        assert cached == plain
        # vLLM's metric and ours in each (OpenMetrics writes sample names with underscores for colons).
        assert all(b"thing_total" in out and b"dur_bucket" in out and "ünïcödé".encode() in out for out in cached)
        assert cached[0].endswith(b"# EOF\n") and cached[0].count(b"# EOF") == 1  # OpenMetrics: EOF stays last


def test_a_real_pipelines_files_render_identically(files_dir, monkeypatch):
    """Series written by the real recording layer and FilesExporter (histograms with the catalogue's buckets,
    counters with extra labels, the process gauge)."""
    for phase in ("prefill", "decode", "mixed"):
        labels = context.step_labels(phase)
        recording.record(catalogue.BY_SEED["scheduler:duration"], 0.0042, labels)
        recording.add(catalogue.RUNNING_TO_WAITING, 2, labels)
        recording.add(catalogue.RPC_ERRORS, 1, labels + ("TimeoutError",))
    recording.process_started()
    recording.flush()
    registry = CollectorRegistry()
    collector = FilesCollector(files_dir)
    registry.register(collector)
    fast = exposition.FastExposition(collector, registry)
    try:
        cached, plain = rendered(registry, collector, fast)
    finally:
        fast.remove()
    assert cached == plain
    assert b'vllm_profiling_scheduler:duration_bucket{dp="0",le="0.005",phase="mixed",role="decode"} 1.0' in cached[2]


def test_other_registries_and_an_unregistered_collector_are_left_to_prometheus_client(tmp_path, served):
    registry, collector, fast = served
    write_files(tmp_path, 0)
    fast.install()
    other = CollectorRegistry()
    Counter("other", "another registry", registry=other).inc()
    assert text_format.generate_latest(other) == text_format.generate_latest.__wrapped__(other)
    registry.unregister(collector)
    out = text_format.generate_latest(registry)
    assert b"vllm:thing" in out and b"t:dur" not in out  # nothing of ours without the collector


def test_a_failing_render_falls_back_for_good_with_one_warning(tmp_path, served, monkeypatch, caplog):
    registry, collector, fast = served
    write_files(tmp_path, 0)
    fast.install()
    plain = text_format.generate_latest.__wrapped__(registry)

    def broken(encoder):
        raise RuntimeError("boom")

    monkeypatch.setattr(fast.renderer, "render", broken)
    with caplog.at_level(logging.WARNING, logger=exposition.__name__):
        outs = [text_format.generate_latest(registry) for _ in range(3)]
    assert outs == [plain] * 3  # our families still there, through prometheus_client
    assert len([r for r in caplog.records if "cannot render" in r.getMessage()]) == 1


def test_a_module_imported_later_is_wrapped_then_and_remove_restores_every_encoder(tmp_path, served, monkeypatch):
    """vLLM imports prometheus_fastapi_instrumentator (whose copy of generate_latest serves its /metrics route)
    after instrument(): its copy is wrapped on import."""
    registry, collector, fast = served
    module = tmp_path / "late_encoder_module.py"
    module.write_text(
        "from prometheus_client import generate_latest as copied\n"
        "def generate_latest(registry):\n"
        "    return copied.__wrapped__(registry)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(exposition, "ENCODERS", exposition.ENCODERS + (("late_encoder_module", "generate_latest"),))
    originals = {m: getattr(sys.modules[m], a) for m, a in exposition.ENCODERS if m in sys.modules}
    fast.install()
    import late_encoder_module  # noqa: F401

    late = sys.modules["late_encoder_module"]
    assert late.generate_latest._otel_vllm_ascend_exposition is fast
    assert text_format.generate_latest._otel_vllm_ascend_exposition is fast
    assert openmetrics.generate_latest._otel_vllm_ascend_exposition is fast
    assert late.copied._otel_vllm_ascend_exposition is fast  # a copy of the package-level wrapper
    write_files(tmp_path, 0)
    assert late.generate_latest(registry) == text_format.generate_latest(registry) == late.copied(registry)
    fast.remove()
    assert not hasattr(late.generate_latest, "_otel_vllm_ascend_exposition")
    assert late.copied(registry) == text_format.generate_latest(registry)  # the copy calls straight through
    assert {m: getattr(sys.modules[m], a) for m, a in exposition.ENCODERS if m in originals} == originals
    sys.modules.pop("late_encoder_module", None)


def test_the_api_servers_exposition_wraps_on_setup_and_unwraps_on_teardown(monkeypatch):
    for name in (environment.PROMETHEUS_MULTIPROC_DIR, environment.FILES_DIR, environment.ROOT_PID):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(environment.PROMETHEUS, "true")
    original = text_format.generate_latest
    endpoint = Exposition()
    endpoint.setup()
    try:
        assert text_format.generate_latest._otel_vllm_ascend_exposition is endpoint._fast
    finally:
        endpoint.teardown()
    assert text_format.generate_latest is original
