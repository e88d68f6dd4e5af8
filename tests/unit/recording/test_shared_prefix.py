"""Our ``vllm_profiling_*`` names beside another writer of that prefix (ms-service-metric) in one exposition:
while the other writer exports a family with our prefix, ours are served as ``otel_vllm_profiling_*``
(recording/files_reader.py), so no family merges two tools' counts and no name appears twice.

The files are real prometheus_client multiprocess files, written in a subprocess by real prometheus_client
``Histogram``s and ``Counter``s: the other writer's under its default per-pid names (``histogram_<pid>.db``, what
ms-service-metric's metrics write with ``PROMETHEUS_MULTIPROC_DIR``), ours under our ``otel-<pid>`` token (the
names ``files_writer`` gives them), with the same family name in both."""

import logging
import os
import subprocess
import sys
import textwrap

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from opentelemetry_instrumentation_vllm_ascend.catalogue import PREFIX, SHARED_PREFIX
from opentelemetry_instrumentation_vllm_ascend.recording import files_reader, multiprocess_guard

NAME = PREFIX + "scheduler:add_request:duration"
WRITER = textwrap.dedent(
    """
    import os, sys
    from prometheus_client import values  # multiprocess values: PROMETHEUS_MULTIPROC_DIR is set
    directory, who = sys.argv[1], sys.argv[2]
    if who == "ours":
        values.ValueClass = values.MultiProcessValue(lambda: f"otel-{os.getpid()}")
    from prometheus_client import Counter, Histogram
    if who in ("ours", "theirs"):
        h = Histogram(sys.argv[3], "add_request", ["dp", "role"] + (["phase"] if who == "ours" else []),
                      buckets=(0.01, 0.1))
        for _ in range(int(sys.argv[4])):
            (h.labels("0", "mixed", "all") if who == "ours" else h.labels("-1", "mixed")).observe(0.05)
    if who == "ours":
        Counter("vllm_profiling_scheduler:preemptions", "preemptions", ["dp"]).labels("0").inc(4)
    if who == "vllm":
        Counter("vllm:request_success", "finished requests", ["engine"]).labels("0").inc(int(sys.argv[4]))
    """
)


def write(directory, who, n, name=NAME):
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(directory))
    subprocess.run([sys.executable, "-c", WRITER, str(directory), who, name, str(n)], env=env, check=True, timeout=60)


def families(text) -> dict:
    out: dict = {}
    for family in text_string_to_metric_families(text):
        assert family.name not in out, f"{family.name} twice"
        out[family.name] = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples}
    return out


def count(fams, name):
    return sum(v for (sample, _labels), v in fams.get(name, {}).items() if sample == name + "_count")


def no_series_twice(text):
    seen = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series = line.rsplit(" ", 1)[0]
            assert series not in seen, series
            seen.add(series)


@pytest.fixture
def guarded():
    guard = multiprocess_guard.guard_multiprocess_collector()
    yield
    if guard is not None:
        guard.remove()


def multiprocess_scrape(directory) -> str:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    return generate_latest(registry).decode()


def test_multiprocess_ours_are_renamed_while_another_writer_exports_our_prefix(tmp_path, guarded, caplog):
    write(tmp_path, "theirs", 3)
    write(tmp_path, "ours", 2)
    write(tmp_path, "vllm", 5)
    with caplog.at_level(logging.WARNING, logger=files_reader.__name__):
        text = multiprocess_scrape(tmp_path)
        again = multiprocess_scrape(tmp_path)
    assert text == again
    fams = families(text)
    no_series_twice(text)
    assert count(fams, NAME) == 3  # the other writer's alone: not 3 + 2
    assert count(fams, SHARED_PREFIX + "scheduler:add_request:duration") == 2
    assert fams[SHARED_PREFIX + "scheduler:preemptions"] == {
        (SHARED_PREFIX + "scheduler:preemptions_total", (("dp", "0"),)): 4.0
    }
    assert fams["vllm:request_success"] == {("vllm:request_success_total", (("engine", "0"),)): 5.0}
    [warning] = [r.getMessage() for r in caplog.records if "served as" in r.getMessage()]
    assert f"also writes {PREFIX}*" in warning and f"served as {SHARED_PREFIX}*" in warning


def test_unguarded_merge_sums_the_two_writers_which_the_rename_prevents(tmp_path):
    """The oracle for the test above: prometheus_client's own merge of the same files adds both tools' counts."""
    write(tmp_path, "theirs", 3)
    write(tmp_path, "ours", 2)
    assert count(families(multiprocess_scrape(tmp_path)), NAME) == 5


def test_multiprocess_without_another_writer_of_our_prefix_is_unchanged(tmp_path, caplog):
    write(tmp_path, "ours", 2)
    write(tmp_path, "vllm", 5)
    plain = multiprocess_scrape(tmp_path)
    guard = multiprocess_guard.guard_multiprocess_collector()
    try:
        with caplog.at_level(logging.WARNING, logger=files_reader.__name__):
            guarded_text = multiprocess_scrape(tmp_path)
    finally:
        guard.remove()
    assert families(guarded_text) == families(plain)
    assert count(families(plain), NAME) == 2
    assert not [r for r in caplog.records if "served as" in r.getMessage()]


def test_multiprocess_a_name_both_write_outside_our_prefix_merges_as_before(tmp_path, guarded):
    write(tmp_path, "theirs", 3, name="gen_ai_shared")
    write(tmp_path, "ours", 2, name="gen_ai_shared")
    assert count(families(multiprocess_scrape(tmp_path)), "gen_ai_shared") == 5


def test_multiprocess_exemplars_follow_the_renamed_buckets(tmp_path):
    from prometheus_client.samples import Exemplar

    write(tmp_path, "theirs", 1)
    write(tmp_path, "ours", 2)
    registry = CollectorRegistry()
    collector = MultiProcessCollector(registry, path=str(tmp_path))
    guard = multiprocess_guard.guard_multiprocess_collector()
    try:
        metrics = list(collector.collect())
    finally:
        guard.remove()
    exemplar = Exemplar({"trace_id": "1", "span_id": "2"}, 0.05, 1.0)
    key = (NAME + "_bucket", (("dp", "0"), ("phase", "all"), ("role", "mixed")), "0.1")
    files_reader.attach_exemplars(metrics, {key: exemplar})
    found = [(m.name, s.labels.get("le")) for m in metrics for s in m.samples if s.exemplar is not None]
    assert found == [(SHARED_PREFIX + "scheduler:add_request:duration", "0.1")]


def _single_process(tmp_path, foreign: bool):
    """Our files under a FilesCollector on a registry that holds, when ``foreign``, a real prometheus_client
    Histogram of the same name (what ms-service-metric registers on vLLM's registry without
    ``PROMETHEUS_MULTIPROC_DIR``)."""
    write(tmp_path, "ours", 2)
    registry = CollectorRegistry()
    if foreign:
        Histogram(NAME, "add_request", ["dp", "role"], registry=registry).labels("-1", "mixed").observe(0.05)
    collector = files_reader.FilesCollector(str(tmp_path))
    collector.registry = registry
    registry.register(collector)
    return registry, collector


def test_single_process_ours_are_renamed_beside_a_registered_family_of_our_prefix(tmp_path, caplog):
    registry, collector = _single_process(tmp_path, foreign=True)
    with caplog.at_level(logging.WARNING, logger=files_reader.__name__):
        text = generate_latest(registry).decode()
        generate_latest(registry)
    fams = families(text)
    no_series_twice(text)
    assert count(fams, NAME) == 1
    assert count(fams, SHARED_PREFIX + "scheduler:add_request:duration") == 2
    assert (SHARED_PREFIX + "scheduler:preemptions_total", (("dp", "0"),)) in fams[
        SHARED_PREFIX + "scheduler:preemptions"
    ]
    assert len([r for r in caplog.records if "served as" in r.getMessage()]) == 1
    # The cached rendering (recording/exposition.py) renders from the same families: the same names.
    from opentelemetry_instrumentation_vllm_ascend.recording.exposition import Renderer

    rendered = Renderer(collector).render(generate_latest)
    assert f"{SHARED_PREFIX}scheduler:add_request:duration_count" in rendered
    assert f"\n{NAME}" not in "\n" + rendered


def test_single_process_without_another_writer_keeps_our_names(tmp_path):
    registry, _collector = _single_process(tmp_path, foreign=False)
    fams = families(generate_latest(registry).decode())
    assert count(fams, NAME) == 2
    assert not any(name.startswith(SHARED_PREFIX) for name in fams)


def test_single_process_without_the_registrys_private_names_finds_the_other_writer_by_its_samples(
    tmp_path, monkeypatch, caplog
):
    """recording/private_prometheus.py's fallback: prometheus_client without ``_names_to_collectors`` (the name the
    module reads, renamed): the same families, served under the same names, and one line saying so."""
    from opentelemetry_instrumentation_vllm_ascend import environment
    from opentelemetry_instrumentation_vllm_ascend.recording import private_prometheus

    registry, _ = _single_process(tmp_path, foreign=True)
    private = families(generate_latest(registry).decode())
    (tmp_path / "public").mkdir()
    registry, _ = _single_process(tmp_path / "public", foreign=True)
    monkeypatch.setattr(private_prometheus, "_NAMES", "_names_to_collectors_gone")
    monkeypatch.setattr(environment, "_WARNED", set())
    with caplog.at_level(logging.WARNING):
        public = families(generate_latest(registry).decode())
        generate_latest(registry)
    created = lambda fams: {n: v for n, v in fams.items() if not n.endswith("_created")}  # noqa: E731 (two clocks)
    assert created(public) == created(private)
    assert count(public, SHARED_PREFIX + "scheduler:add_request:duration") == 2
    assert len([r for r in caplog.records if "_names_to_collectors" in r.getMessage()]) == 1
