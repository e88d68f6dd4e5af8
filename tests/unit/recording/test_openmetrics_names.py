"""Names kept in the OpenMetrics format (recording/openmetrics_names.py): a real prometheus_client registry with vLLM's
kind of ``vllm:`` families (a counter, a histogram with an exemplar, a gauge) and our collector's (exemplars
included), rendered by the encoder each Accept header picks and read back by prometheus_client's own OpenMetrics
parser: every family has its samples under its declared name and type, the names as the text format writes them
(the oracle: the same samples, names, labels and values), for Prometheus 2's Accept header and every escaping
scheme a scraper can ask for; the text format is untouched; whatever fails leaves prometheus_client's own output."""

from __future__ import annotations

import inspect
import logging
import types

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import exposition as text_format
from prometheus_client.metrics_core import CounterMetricFamily
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.parser import text_string_to_metric_families as text_families

from opentelemetry_instrumentation_vllm_ascend import catalogue, environment, recording
from opentelemetry_instrumentation_vllm_ascend.recording import exposition, openmetrics_names
from opentelemetry_instrumentation_vllm_ascend.recording.files_reader import FilesCollector
from opentelemetry_instrumentation_vllm_ascend.recording.metrics_endpoint import Exposition

#: The Accept header Prometheus 2.42 sends with every scrape.
PROMETHEUS_2 = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
#: Every OpenMetrics Accept header a scraper may send: Prometheus 2's, no version, each escaping scheme (Prometheus 3
#: asks for allow-utf-8).
OPENMETRICS_ACCEPTS = (
    PROMETHEUS_2,
    "application/openmetrics-text",
    "application/openmetrics-text;version=1.0.0;escaping=underscores",
    "application/openmetrics-text;version=1.0.0;escaping=values",
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8",
)
TEXT_ACCEPTS = ("", "text/plain;version=0.0.4", "text/plain;version=1.0.0;escaping=underscores")
#: The sample-name suffixes each OpenMetrics family type allows.
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gauge": ("",),
}
TTFT = catalogue.BY_SEED["fine_grained_ttft"]
SCHEDULER = catalogue.BY_SEED["scheduler:duration"]
#: prometheus_client 0.23 and later take an escaping scheme (and rename sample names by themselves).
ESCAPES_NAMES = "escaping" in inspect.signature(openmetrics.generate_latest).parameters

needs_escaping = pytest.mark.skipif(
    not ESCAPES_NAMES, reason="prometheus_client < 0.23 takes no escaping scheme and writes names as given"
)


@pytest.fixture
def registry(files_dir):
    """vLLM's kind of families (``vllm:`` names, an exemplar on a bucket) beside our collector's over files the real
    recording layer wrote (histograms with exemplars, a ``:`` in a name)."""
    reg = CollectorRegistry()
    Counter("vllm:request_success", "vLLM's counter", ["engine", "finished_reason"], registry=reg).labels(
        "0", "stop"
    ).inc(3)
    latency = Histogram("vllm:e2e_request_latency_seconds", "vLLM's", ["engine"], buckets=(0.5, 1.0), registry=reg)
    latency.labels("0").observe(0.7, {"trace_id": "ab" * 16, "span_id": "cd" * 8})
    Gauge("vllm:num_requests_running", "vLLM's gauge", ["engine"], registry=reg).labels("0").set(2)
    recording.record_exemplar(TTFT, 0.012, ("0", "mixed", "decode", "0"), 0x8BADF00D, 0xF00D)
    recording.record(SCHEDULER, 0.004, ("0", "mixed", "decode"))
    recording.flush()
    collector = FilesCollector(files_dir)
    reg.register(collector)
    reg.ours = collector  # type: ignore[attr-defined]
    return reg


@pytest.fixture
def kept():
    names = openmetrics_names.KeptNames()
    names.install()
    yield names
    names.remove()


def render(registry, accepts):
    return [text_format.choose_encoder(accept)[0](registry).decode() for accept in accepts]


def samples_of(families) -> set:
    return {(s.name, tuple(sorted(s.labels.items())), s.value) for f in families for s in f.samples}


def strict(text: str) -> list:
    """The families of an OpenMetrics text, each checked: a declared type, every sample under its family's name."""
    families = list(text_string_to_metric_families(text))
    for family in families:
        assert family.type in SUFFIXES, (family.name, family.type)
        for sample in family.samples:
            assert sample.name in {family.name + suffix for suffix in SUFFIXES[family.type]}, (family.name, sample)
    names = [f.name for f in families]
    assert len(names) == len(set(names)), "a family twice"
    return families


def test_prometheus_2s_accept_header_gets_every_family_under_its_own_name(registry, kept):
    """The reproduction of issue 49 ("vllm:… counters with no samples beside untyped vllm_… families"), fixed."""
    text = text_format.generate_latest(registry).decode()
    oracle = samples_of(text_families(text))
    assert {"vllm:request_success_total", "vllm_profiling_scheduler:duration_bucket"} <= {s[0] for s in oracle}
    for accept, om in zip(OPENMETRICS_ACCEPTS, render(registry, OPENMETRICS_ACCEPTS)):
        families = strict(om)
        by_name = {f.name: f for f in families}
        assert by_name["vllm:request_success"].type == "counter" and by_name["vllm:request_success"].samples
        assert by_name["vllm:e2e_request_latency_seconds"].type == "histogram"
        assert by_name[SCHEDULER.prometheus_name].type == "histogram" and ":" in SCHEDULER.prometheus_name
        assert samples_of(families) == oracle, accept  # the same samples as the text format, names as written
        exemplars = {
            f.name: s.exemplar.labels["trace_id"] for f in families for s in f.samples if s.exemplar is not None
        }
        assert exemplars == {
            "vllm:e2e_request_latency_seconds": "ab" * 16,
            TTFT.prometheus_name: format(0x8BADF00D, "032x"),
        }
    if ESCAPES_NAMES:  # every name legal: each scheme's answer is prometheus_client's own allow-utf-8 answer
        reference = openmetrics.generate_latest.__wrapped__(registry, escaping=openmetrics.ALLOWUTF8).decode()
        assert render(registry, OPENMETRICS_ACCEPTS) == [reference] * len(OPENMETRICS_ACCEPTS)


@needs_escaping
def test_without_the_wrapper_prometheus_client_renames_sample_names_only(registry):
    """What prometheus_client 0.23+ writes by itself for Prometheus 2 (client_python issue 1177): sample names with
    ``_`` for ``:``, under families declared with the colon, so a strict parser cannot read the page. Were it fixed
    upstream, this test says so (and the wrapper changes nothing for it)."""
    om = text_format.choose_encoder(PROMETHEUS_2)[0](registry).decode()
    assert "# TYPE vllm:request_success counter\n" in om
    assert "\nvllm_request_success_total{" in om and "\nvllm:request_success_total{" not in om
    with pytest.raises(ValueError):
        list(text_string_to_metric_families(om))  # an exemplar on a sample of an untyped family


def test_the_text_format_is_untouched(registry, kept):
    with_names = render(registry, TEXT_ACCEPTS) + [text_format.generate_latest(registry).decode()]
    kept.remove()
    assert render(registry, TEXT_ACCEPTS) + [text_format.generate_latest(registry).decode()] == with_names


def test_the_cached_rendering_renders_through_it_byte_for_byte(registry, kept):
    """As the API server installs both (names first): our families' cached lines keep their colons too, and the
    page is what the wrapper alone writes, scrape after scrape."""
    alone = render(registry, OPENMETRICS_ACCEPTS + TEXT_ACCEPTS)
    fast = exposition.FastExposition(registry.ours, registry)
    fast.install()
    try:
        for _ in range(2):
            assert render(registry, OPENMETRICS_ACCEPTS + TEXT_ACCEPTS) == alone
    finally:
        fast.remove()
    assert not ESCAPES_NAMES or openmetrics.generate_latest._otel_vllm_ascend_names is kept


class Odd:
    """A collector with names outside the legacy character set (a ``.``), and a ``vllm:`` counter."""

    def collect(self):
        dotted = CounterMetricFamily("a.b", "dotted", labels=["c.d"])
        dotted.add_metric(["x"], 1.0)
        colon = CounterMetricFamily("vllm:x_y", "colon", labels=["engine"])
        colon.add_metric(["0"], 2.0)
        return [dotted, colon]


@needs_escaping
@pytest.mark.parametrize(
    ("scheme", "names"),
    [
        ("underscores", {"a_b": ("a_b_total", "c_d"), "vllm:x_y": ("vllm:x_y_total", "engine")}),
        ("values", {"U__a_2e_b": ("U__a_2e_b_total", "U__c_2e_d"), "vllm:x_y": ("vllm:x_y_total", "engine")}),
        ("dots", {"a_dot_b": ("a_dot_b_total", "c_dot_d"), "vllm:x__y": ("vllm:x__y_total", "engine")}),
    ],
)
def test_a_name_that_must_change_changes_alike_in_the_headers_and_the_samples(kept, scheme, names):
    """Each scheme as the Prometheus escaping schemes define it (prometheus_client's escape_metric_name: ``:`` is
    legal in a metric name), and a sample's name the escaped family name and its suffix: the family and its samples
    under one name, strictly parseable."""
    reg = CollectorRegistry()
    reg.register(Odd())
    om = text_format.choose_encoder(f"application/openmetrics-text;version=1.0.0;escaping={scheme}")[0](reg).decode()
    families = strict(om)
    found = {f.name: ({s.name for s in f.samples}, {k for s in f.samples for k in s.labels}) for f in families}
    assert found == {family: ({total}, {label}) for family, (total, label) in names.items()}
    again = text_format.choose_encoder(f"application/openmetrics-text;version=1.0.0;escaping={scheme}")[0](reg)
    assert again.decode() == om  # from the caches


@needs_escaping
def test_a_failure_escaping_falls_back_to_prometheus_clients_own_output_with_one_warning(
    registry, kept, monkeypatch, caplog
):
    encoder = text_format.choose_encoder(PROMETHEUS_2)[0]
    own = encoder.func.__wrapped__(registry, *encoder.args, **encoder.keywords)
    reg = CollectorRegistry()
    reg.register(Odd())  # names not yet known: escaping them runs

    def broken(name, escaping):
        raise RuntimeError("boom")

    monkeypatch.setattr(kept.names, "escape_metric_name", broken)
    with caplog.at_level(logging.WARNING, logger=openmetrics_names.__name__):
        first = encoder(reg)
        outs = [encoder(registry) for _ in range(2)]
    assert first == encoder.func.__wrapped__(reg, *encoder.args, **encoder.keywords)
    assert outs == [own, own]  # prometheus_client's own from then on (names renamed as without the wrapper)
    assert len([r for r in caplog.records if "cannot keep metric names" in r.getMessage()]) == 1


@needs_escaping
def test_a_collectors_own_error_propagates_and_leaves_the_wrapper_on(registry, kept):
    class Broken:
        def collect(self):
            raise RuntimeError("collector's own")

    reg = CollectorRegistry()
    reg.register(Broken())
    encoder = text_format.choose_encoder(PROMETHEUS_2)[0]
    with pytest.raises(RuntimeError, match="collector's own"):
        encoder(reg)
    assert "\nvllm:request_success_total{" in encoder(registry).decode()


def test_an_encoder_without_escaping_or_escape_functions_is_left_alone(caplog):
    """prometheus_client < 0.23 (no ``escaping`` parameter: names written as given) is not wrapped; one that takes
    ``escaping`` but lacks the public escape functions is not either, with one warning."""
    names = openmetrics_names.KeptNames()

    def old(registry):
        return b""

    assert names.wrap(old, types.SimpleNamespace()) is old

    def new(registry, escaping="underscores", version="1.0.0"):
        return b""

    with caplog.at_level(logging.WARNING, logger=openmetrics_names.__name__):
        assert names.wrap(new, types.SimpleNamespace(escape_label_name=len, ALLOWUTF8="allow-utf-8")) is new
    assert len([r for r in caplog.records if "escape_metric_name" in r.getMessage()]) == 1


def test_the_api_server_installs_it_before_the_cached_rendering_and_teardown_restores_the_original(monkeypatch):
    for name in (environment.PROMETHEUS_MULTIPROC_DIR, environment.FILES_DIR, environment.ROOT_PID):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(environment.PROMETHEUS, "true")
    original = openmetrics.generate_latest
    endpoint = Exposition()
    endpoint.setup()
    try:
        wrapper = openmetrics.generate_latest
        assert wrapper._otel_vllm_ascend_exposition is endpoint._fast
        if ESCAPES_NAMES:
            assert wrapper.__wrapped__._otel_vllm_ascend_names is endpoint._names
            assert wrapper.__wrapped__.__wrapped__ is original
    finally:
        endpoint.teardown()
    assert openmetrics.generate_latest is original


def test_with_prometheus_multiproc_dir_every_process_installs_it(monkeypatch, tmp_path):
    monkeypatch.setenv(environment.PROMETHEUS_MULTIPROC_DIR, str(tmp_path))
    monkeypatch.setenv(environment.ROOT_PID, "1")  # a child (an API server of several)
    monkeypatch.setenv(environment.PROMETHEUS, "true")
    original = openmetrics.generate_latest
    endpoint = Exposition()
    endpoint.setup()
    try:
        assert (openmetrics.generate_latest is not original) is bool(ESCAPES_NAMES)
    finally:
        endpoint.teardown()
    assert openmetrics.generate_latest is original
