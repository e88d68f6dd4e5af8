"""Per-process files → one /metrics exposition: exact prometheus_client text, across real processes."""

import multiprocessing
import os
import time

from prometheus_client import CollectorRegistry, generate_latest

from opentelemetry_instrumentation_vllm_ascend import catalogue, context, environment, recording
from opentelemetry_instrumentation_vllm_ascend.recording import pipeline
from opentelemetry_instrumentation_vllm_ascend.recording.files_reader import FilesCollector
from opentelemetry_instrumentation_vllm_ascend.recording.identity import remove_dead_files
from tests.support.process import set_process


def exposition(directory):
    registry = CollectorRegistry()
    registry.register(FilesCollector(directory))
    return generate_latest(registry).decode()


def sample_lines(text, prefix="vllm_profiling_"):
    return sorted(line for line in text.splitlines() if line.startswith(prefix))


def record_some(n_preempt, phase="decode"):
    attrs = context.step_labels(phase)
    recording.add(catalogue.RUNNING_TO_WAITING, n_preempt, attrs)


def test_exact_exposition_names_and_help(files_dir):
    record_some(3)
    recording.add(catalogue.RPC_ERRORS, 1, context.step_labels("prefill") + ("timeout",))
    recording.process_started()
    recording.flush()
    text = exposition(files_dir)
    assert sample_lines(text) == sorted(
        [
            'vllm_profiling_running_to_waiting_count_total{dp="0",phase="decode",role="decode"} 3.0',
            'vllm_profiling_rpc_errors_total{dp="0",exception_type="timeout",phase="prefill",role="decode"} 1.0',
            'vllm_profiling_instrumented_processes{dp="0",process="engine_core",role="decode"} 1.0',
        ]
    )
    assert "# TYPE vllm_profiling_running_to_waiting_count_total counter" in text
    assert "# TYPE vllm_profiling_instrumented_processes gauge" in text
    assert "Unit: {preemption}." in text


def test_histogram_buckets_are_cumulative_with_count_and_sum(files_dir, monkeypatch):
    """A histogram through a View with explicit buckets (test-only spec) lands as prometheus expects."""
    spec = catalogue.MetricSpec(
        seed="test:duration", kind=catalogue.HISTOGRAM, unit="s", description="test histogram", buckets=(0.01, 0.1, 1.0)
    )
    monkeypatch.setattr(catalogue, "CATALOGUE", catalogue.CATALOGUE + (spec,))
    pipeline.reset()
    for v in (0.005, 0.05, 0.05, 0.5, 5.0):
        recording.record(spec, v, context.step_labels("prefill"))
    recording.flush()
    lines = sample_lines(exposition(files_dir), "vllm_profiling_test")
    labels = 'dp="0",phase="prefill",role="decode"'
    assert lines == sorted(
        [
            'vllm_profiling_test:duration_bucket{dp="0",le="0.01",phase="prefill",role="decode"} 1.0',
            'vllm_profiling_test:duration_bucket{dp="0",le="0.1",phase="prefill",role="decode"} 3.0',
            'vllm_profiling_test:duration_bucket{dp="0",le="1.0",phase="prefill",role="decode"} 4.0',
            'vllm_profiling_test:duration_bucket{dp="0",le="+Inf",phase="prefill",role="decode"} 5.0',
            f"vllm_profiling_test:duration_count{{{labels}}} 5.0",
            f"vllm_profiling_test:duration_sum{{{labels}}} 5.605",
        ]
    )


def _child(kind, dp, n, directory, delay):
    os.environ[environment.FILES_DIR] = directory
    set_process(kind, dp, "mixed")
    recording.process_started()
    recording.add(catalogue.RUNNING_TO_WAITING, n, context.step_labels("decode"))
    time.sleep(delay)  # exits normally: the exit handler flushes the final values


def test_spawned_processes_sum_and_dead_ones_keep_their_counters(files_dir):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_child, args=("engine_core", dp, n, files_dir, 0)) for dp, n in (("0", 2), ("1", 5))]
    procs.append(ctx.Process(target=_child, args=("worker", "0", 4, files_dir, 0)))
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    text = exposition(files_dir)
    # Same labels from two processes (EngineCore dp0 and its worker) sum; dp1 stays apart.
    assert 'vllm_profiling_running_to_waiting_count_total{dp="0",phase="decode",role="mixed"} 6.0' in text
    assert 'vllm_profiling_running_to_waiting_count_total{dp="1",phase="decode",role="mixed"} 5.0' in text
    # The processes exited: their live gauges are gone, their counters stay.
    assert "vllm_profiling_instrumented_processes{" not in text


def test_live_gauge_of_a_killed_process_is_dropped(files_dir):
    ctx = multiprocessing.get_context("spawn")
    p = ctx.Process(target=_child, args=("worker", "0", 1, files_dir, 60))
    p.start()
    deadline = time.monotonic() + 60
    # The child exports only at exit (interval 1 h), so force its data out by killing it hard
    # after it wrote nothing: instead, write a gauge file as that pid would.
    while not p.pid:
        time.sleep(0.01)
    from prometheus_client.mmap_dict import MmapedDict, mmap_key

    path = os.path.join(files_dir, f"gauge_livesum_otel-{p.pid}.db")
    d = MmapedDict(path)
    d.write_value(
        mmap_key(
            "vllm_profiling_instrumented_processes",
            "vllm_profiling_instrumented_processes",
            ["dp", "process", "role"],
            ["0", "worker", "mixed"],
            "h",
        ),
        1.0,
        time.time(),
    )
    d.close()
    assert 'vllm_profiling_instrumented_processes{dp="0",process="worker",role="mixed"} 1.0' in exposition(files_dir)
    p.kill()
    p.join(30)
    assert time.monotonic() < deadline
    assert "vllm_profiling_instrumented_processes{" not in exposition(files_dir)


def test_fork_child_does_not_double_count_and_flushes_at_os_exit(files_dir):
    record_some(5)
    recording.flush()  # parent's pipeline exists and has exported 5 before the fork
    ctx = multiprocessing.get_context("fork")
    p = ctx.Process(target=_fork_child)
    p.start()
    p.join(60)
    assert p.exitcode == 0
    record_some(1)
    recording.flush()
    lines = sample_lines(exposition(files_dir), "vllm_profiling_running_to_waiting")
    # parent 5+1, child 100 — the parent's pre-fork 5 is not exported again by the child.
    assert lines == ['vllm_profiling_running_to_waiting_count_total{dp="0",phase="decode",role="decode"} 106.0']
    pids = {f.rsplit("otel-", 1)[1][:-3] for f in os.listdir(files_dir)}
    assert pids == {str(os.getpid()), str(p.pid)}


def _fork_child():
    # A forked multiprocessing child ends with os._exit: no atexit; our Finalize must flush.
    record_some(100)


def test_remove_dead_files_keeps_live_processes(tmp_path):
    live = tmp_path / f"counter_otel-{os.getpid()}.db"
    dead = tmp_path / "counter_otel-999999999.db"
    foreign = tmp_path / "counter_999999999.db"  # prometheus_client's own file: not ours to touch
    for f in (live, dead, foreign):
        f.write_bytes(b"")
    remove_dead_files(str(tmp_path))
    assert live.exists() and foreign.exists() and not dead.exists()


def test_files_collector_merges_exactly_like_prometheus_client(tmp_path):
    """Our cached-key merge gives the same exposition as prometheus_client's MultiProcessCollector."""
    from prometheus_client.mmap_dict import MmapedDict, mmap_key
    from prometheus_client.multiprocess import MultiProcessCollector

    pids = [os.getpid(), os.getppid()]  # live processes: live gauges are kept by both collectors
    for i, pid in enumerate(pids):
        c = MmapedDict(str(tmp_path / f"counter_otel-{pid}.db"))
        c.write_value(mmap_key("a", "a_total", ["dp"], [str(i % 2)], "h"), 2.0 + i, 0)
        c.write_value(mmap_key("a", "a_total", ["dp"], ["0"], "h"), 1.0, 0)
        c.close()
        h = MmapedDict(str(tmp_path / f"histogram_otel-{pid}.db"))
        for le, v in (("0.1", 1.0), ("1.0", 2.0 + i), ("+Inf", 1.0)):
            h.write_value(mmap_key("t", "t_bucket", ["dp", "le"], ["0", le], "d"), v, 0)
        h.write_value(mmap_key("t", "t_sum", ["dp"], ["0"], "d"), 3.5 + i, 0)
        h.close()
        for mode in ("livesum", "livemostrecent", "all", "max"):
            g = MmapedDict(str(tmp_path / f"gauge_{mode}_otel-{pid}.db"))
            g.write_value(mmap_key(f"g_{mode}", f"g_{mode}", ["dp"], ["0"], "g"), 10.0 * (i + 1), 100.0 + i)
            g.close()
    ours = CollectorRegistry()
    ours.register(FilesCollector(str(tmp_path)))
    theirs = CollectorRegistry()
    MultiProcessCollector(theirs, path=str(tmp_path))
    for _ in range(2):  # the second scrape uses the cached keys
        assert sorted(generate_latest(ours).decode().splitlines()) == sorted(
            generate_latest(theirs).decode().splitlines()
        )


def test_incremental_exports_write_what_one_full_export_writes(tmp_path, monkeypatch):
    """The exporter rewrites only series and buckets that changed since its last export: after
    several exports with partial changes (a new series, a bucket moving, a counter unchanged, a
    gauge set again) the files read the same as one export of the final data into a fresh directory,
    and every value is the hand-computed one."""
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from opentelemetry_instrumentation_vllm_ascend.recording.files_writer import FilesExporter

    spec = catalogue.MetricSpec(
        seed="test:duration", kind=catalogue.HISTOGRAM, unit="s", description="test histogram", buckets=(0.01, 0.1, 1.0)
    )
    monkeypatch.setattr(catalogue, "CATALOGUE", catalogue.CATALOGUE + (spec,))
    monkeypatch.delenv(environment.FILES_DIR, raising=False)
    monkeypatch.delenv(environment.PROMETHEUS_MULTIPROC_DIR, raising=False)
    reader = InMemoryMetricReader()
    pipeline.reset(extra_readers=[reader])
    set_process("engine_core", "0", "decode")
    try:
        incremental = FilesExporter(str(tmp_path / "incremental"))
        os.makedirs(tmp_path / "incremental")
        decode, prefill = context.step_labels("decode"), context.step_labels("prefill")
        rounds = [
            [(spec, 0.005, decode), (spec, 0.05, decode), (catalogue.RUNNING_TO_WAITING, 2, decode)],
            [(spec, 0.5, decode), (spec, 0.05, prefill)],  # a bucket of a known series; a new series
            [],  # nothing changed
            [(catalogue.RUNNING_TO_WAITING, 1, decode), (spec, 5.0, prefill)],
        ]
        for records in rounds:
            for metric, value, labels in records:
                if metric.kind == catalogue.COUNTER:
                    recording.add(metric, value, labels)
                else:
                    recording.record(metric, value, labels)
            recording.process_started()  # the instrumented_processes gauge, set again each round
            incremental.export(reader.get_metrics_data())
        full = FilesExporter(str(tmp_path / "full"))
        os.makedirs(tmp_path / "full")
        full.export(reader.get_metrics_data())
        incremental.shutdown()
        full.shutdown()
        text = exposition(str(tmp_path / "incremental"))
        assert sample_lines(text) == sample_lines(exposition(str(tmp_path / "full")))
        assert sample_lines(text, "vllm_profiling_test") == sorted(
            [
                'vllm_profiling_test:duration_bucket{dp="0",le="0.01",phase="decode",role="decode"} 1.0',
                'vllm_profiling_test:duration_bucket{dp="0",le="0.1",phase="decode",role="decode"} 2.0',
                'vllm_profiling_test:duration_bucket{dp="0",le="1.0",phase="decode",role="decode"} 3.0',
                'vllm_profiling_test:duration_bucket{dp="0",le="+Inf",phase="decode",role="decode"} 3.0',
                'vllm_profiling_test:duration_count{dp="0",phase="decode",role="decode"} 3.0',
                'vllm_profiling_test:duration_sum{dp="0",phase="decode",role="decode"} 0.555',
                'vllm_profiling_test:duration_bucket{dp="0",le="0.01",phase="prefill",role="decode"} 0.0',
                'vllm_profiling_test:duration_bucket{dp="0",le="0.1",phase="prefill",role="decode"} 1.0',
                'vllm_profiling_test:duration_bucket{dp="0",le="1.0",phase="prefill",role="decode"} 1.0',
                'vllm_profiling_test:duration_bucket{dp="0",le="+Inf",phase="prefill",role="decode"} 2.0',
                'vllm_profiling_test:duration_count{dp="0",phase="prefill",role="decode"} 2.0',
                'vllm_profiling_test:duration_sum{dp="0",phase="prefill",role="decode"} 5.05',
            ]
        )
        assert 'vllm_profiling_running_to_waiting_count_total{dp="0",phase="decode",role="decode"} 3.0' in sample_lines(
            text
        )
    finally:
        pipeline.reset()
