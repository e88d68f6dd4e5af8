"""The per-process metric files under faults: an unreadable file is left out of /metrics (one warning),
never the whole exposition; directory names are taken literally, not as glob patterns."""

import logging
import os
import struct

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.mmap_dict import MmapedDict

from opentelemetry_instrumentation_vllm_ascend import catalogue, context, environment, recording
from opentelemetry_instrumentation_vllm_ascend.recording import pipeline
from opentelemetry_instrumentation_vllm_ascend.recording.files_reader import FilesCollector
from opentelemetry_instrumentation_vllm_ascend.recording.identity import remove_dead_files
from tests.support.process import set_process

DEAD_PID = 2**22 + 12345  # above the default pid_max: never a live process


def write_counter(directory, pid, key=None, value=1.0):
    from prometheus_client.mmap_dict import mmap_key

    f = MmapedDict(os.path.join(directory, f"counter_otel-{pid}.db"))
    f.write_value(key or mmap_key("vllm_profiling_x", "vllm_profiling_x_total", ["dp"], ["9"], "x"), value, 0.0)
    f.close()
    return os.path.join(directory, f"counter_otel-{pid}.db")


def corrupt_random(path):
    import random

    with open(path, "wb") as f:
        f.write(random.Random(0).randbytes(4096))


def corrupt_used_header(path):
    with open(path, "r+b") as f:
        f.write(struct.pack("i", 2**31 - 1))


def corrupt_truncated(path):
    with open(path, "rb") as f:
        data = f.read()
    used = struct.unpack("i", data[:4])[0]
    with open(path, "wb") as f:
        f.write(data[: used - 5])  # the header still says `used`: the last entry is cut


def corrupt_key(path):
    os.remove(path)
    f = MmapedDict(path)
    f.write_value("this is not a JSON key", 1.0, 0.0)
    f.close()


def corrupt_empty(path):
    open(path, "wb").close()  # what a process killed between create and truncate leaves


def corrupt_negative_header(path):
    with open(path, "r+b") as f:
        f.write(struct.pack("i", -5))  # read naively, this file would just look empty


CORRUPTIONS = [
    corrupt_random,
    corrupt_used_header,
    corrupt_truncated,
    corrupt_key,
    corrupt_empty,
    corrupt_negative_header,
]
#: The damage that makes prometheus_client's own multiprocess reader raise (the others it reads as empty).
BREAK_PROMETHEUS_CLIENT = {corrupt_used_header, corrupt_truncated, corrupt_key, corrupt_empty}


@pytest.fixture
def files_dir(tmp_path, monkeypatch):
    directory = tmp_path / "run[1]*?"  # glob metacharacters in the path (TMPDIR, PROMETHEUS_MULTIPROC_DIR)
    directory.mkdir()
    monkeypatch.delenv(environment.PROMETHEUS_MULTIPROC_DIR, raising=False)
    monkeypatch.delenv(environment.METRICS_EXPORTER, raising=False)
    monkeypatch.setenv(environment.FILES_DIR, str(directory))
    monkeypatch.setenv(environment.PROMETHEUS_INTERVAL_MS, "3600000")
    pipeline.reset()
    set_process("engine_core", "0", "mixed")
    yield str(directory)
    pipeline.reset()


def scrape(registry):
    return sorted(line for line in generate_latest(registry).decode().splitlines() if not line.startswith("#"))


def test_our_series_are_found_and_cleaned_up_under_a_directory_with_glob_characters(files_dir):
    recording.add(catalogue.RUNNING_TO_WAITING, 3, context.step_labels("decode"))
    recording.flush()
    registry = CollectorRegistry()
    registry.register(FilesCollector(files_dir))
    assert scrape(registry) == ['vllm_profiling_running_to_waiting_count_total{dp="0",phase="decode",role="mixed"} 3.0']
    stale = write_counter(files_dir, DEAD_PID)
    remove_dead_files(files_dir)
    assert not os.path.exists(stale)
    assert any(name.startswith("counter_otel-") for name in os.listdir(files_dir))  # ours (alive) stays


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda f: f.__name__)
def test_an_unreadable_file_is_left_out_with_one_warning(files_dir, corrupt, caplog):
    recording.add(catalogue.RUNNING_TO_WAITING, 3, context.step_labels("decode"))
    recording.flush()
    registry = CollectorRegistry()
    Counter("vllm_stand_in_requests", "vLLM's own metrics, on the same registry", registry=registry).inc(7)
    registry.register(FilesCollector(files_dir))
    healthy = scrape(registry)
    assert healthy == [
        'vllm_profiling_running_to_waiting_count_total{dp="0",phase="decode",role="mixed"} 3.0',
        "vllm_stand_in_requests_created " + healthy[1].split()[-1],
        "vllm_stand_in_requests_total 7.0",
    ]
    bad = write_counter(files_dir, DEAD_PID)
    corrupt(bad)
    with caplog.at_level(logging.WARNING):
        assert scrape(registry) == healthy
        assert scrape(registry) == healthy
    warnings = [r.getMessage() for r in caplog.records if "unreadable metrics file" in r.getMessage()]
    assert len(warnings) == 1 and bad in warnings[0]


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda f: f.__name__)
def test_with_prometheus_multiproc_dir_vllms_own_metrics_survive_a_file_of_ours(tmp_path, monkeypatch, corrupt, caplog):
    """vLLM serves /metrics from PROMETHEUS_MULTIPROC_DIR with prometheus_client's MultiProcessCollector,
    which raised on the first unreadable file: one file of ours took vLLM's own metrics down with it.
    Exposition.setup() guards it there: our unreadable files are left out (one warning each), vLLM's and our
    other files are served as before."""
    from prometheus_client.mmap_dict import mmap_key
    from prometheus_client.multiprocess import MultiProcessCollector

    from opentelemetry_instrumentation_vllm_ascend.recording.metrics_endpoint import Exposition

    directory = tmp_path / "multiproc"
    directory.mkdir()
    monkeypatch.setenv(environment.PROMETHEUS_MULTIPROC_DIR, str(directory))
    for name in (environment.ROOT_PID, environment.FILES_DIR, environment.TREE):
        monkeypatch.delenv(name, raising=False)
    vllms = MmapedDict(str(directory / "counter_4242.db"))  # a file prometheus_client itself wrote for vLLM
    vllms.write_value(mmap_key("vllm:num_requests", "vllm:num_requests_total", [], [], "vLLM's"), 5.0, 0.0)
    vllms.close()
    ours = write_counter(str(directory), os.getpid())  # a healthy file of ours
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    healthy = scrape(registry)
    assert healthy == ["vllm:num_requests_total 5.0", 'vllm_profiling_x_total{dp="9"} 1.0']
    corrupt(write_counter(str(directory), DEAD_PID))
    if corrupt in BREAK_PROMETHEUS_CLIENT:
        with pytest.raises(Exception):
            scrape(registry)  # prometheus_client alone
    exposition = Exposition()
    exposition.setup()  # the first process of a tree: it also removes the files of dead processes…
    corrupt(write_counter(str(directory), DEAD_PID))  # …so the damaged file comes (again) after it
    try:
        with caplog.at_level(logging.WARNING):
            assert scrape(registry) == healthy
            assert scrape(registry) == healthy
        warnings = [r.getMessage() for r in caplog.records if "unreadable metrics file" in r.getMessage()]
        assert len(warnings) == 1 and f"counter_otel-{DEAD_PID}.db" in warnings[0]
    finally:
        exposition.teardown()
    if corrupt in BREAK_PROMETHEUS_CLIENT:
        with pytest.raises(Exception):
            scrape(registry)  # uninstrumented: prometheus_client's own reader again
    assert os.path.exists(ours)
