"""The per-process pipeline: OTLP push from every process with its own resource, temporality,
fork safety, and the /metrics switch."""

import multiprocessing
import os

import pytest

from opentelemetry_instrumentation_vllm_ascend import catalogue, context, environment, recording
from opentelemetry_instrumentation_vllm_ascend.recording import pipeline
from tests.support.otlp_receiver import Receiver
from tests.support.process import set_process

R2W = "vllm_profiling_running_to_waiting_count"


@pytest.fixture
def otlp(monkeypatch, tmp_path):
    monkeypatch.delenv(environment.PROMETHEUS_MULTIPROC_DIR, raising=False)
    monkeypatch.setenv(environment.FILES_DIR, str(tmp_path))
    monkeypatch.setenv(environment.METRICS_EXPORTER, "otlp_proto_http")
    monkeypatch.setenv(environment.METRIC_EXPORT_INTERVAL, "3600000")  # only explicit flushes
    monkeypatch.setenv(environment.PROMETHEUS_INTERVAL_MS, "3600000")
    with Receiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", receiver.endpoint)
        pipeline.reset()
        set_process("engine_core", "0", "mixed")
        yield receiver
        pipeline.reset()


def _forked_eplb_child():
    context.claim("eplb")
    recording.add(catalogue.RUNNING_TO_WAITING, 7, context.step_labels("decode"))
    # leaves through os._exit (multiprocessing fork): the exit finalizer must push the data


@pytest.mark.parametrize("temporality", ["cumulative", "delta"])
def test_every_process_pushes_its_own_data_once(otlp, monkeypatch, temporality):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", temporality)
    pipeline.reset()
    attrs = context.step_labels("decode")
    recording.add(catalogue.RUNNING_TO_WAITING, 2, attrs)
    recording.flush()
    recording.add(catalogue.RUNNING_TO_WAITING, 3, attrs)
    recording.flush()
    child = multiprocessing.get_context("fork").Process(target=_forked_eplb_child)
    child.start()
    child.join(60)
    assert child.exitcode == 0
    recording.flush()

    totals = otlp.counter_totals(R2W, by="process.pid")
    assert totals == {os.getpid(): 5, child.pid: 7}
    resources = {r["process.pid"]: r for r in otlp.resources()}
    assert resources[os.getpid()]["vllm.process.role"] == "engine_core"
    assert resources[child.pid]["vllm.process.role"] == "eplb"
    assert resources[os.getpid()]["service.instance.id"] != resources[child.pid]["service.instance.id"]
    assert resources[child.pid]["service.name"] == "vllm"
    expected = 1 if temporality == "delta" else 2
    assert {p[3] for p in otlp.points(R2W)} == {expected}
    # Labels travel as attributes, names as the catalogue says.
    assert {tuple(sorted(p[1].items())) for p in otlp.points(R2W)} == {
        (("dp", "0"), ("phase", "decode"), ("role", "mixed"))
    }


def test_metrics_exposure_ignores_otel_metrics_exporter_none(monkeypatch, tmp_path):
    monkeypatch.delenv(environment.PROMETHEUS_MULTIPROC_DIR, raising=False)
    monkeypatch.setenv(environment.FILES_DIR, str(tmp_path))
    monkeypatch.setenv(environment.METRICS_EXPORTER, "none")
    pipeline.reset()
    recording.add(catalogue.RUNNING_TO_WAITING, 1, context.step_labels("decode"))
    recording.flush()
    # its counter file, and which process wrote it (boot and start time: pid reuse, see prometheus_files)
    assert sorted(os.listdir(tmp_path)) == [f"counter_otel-{os.getpid()}.db", f"process_otel-{os.getpid()}.id"]
    assert len(pipeline.current().readers) == 1  # the files reader only: no push exporter
    pipeline.reset()


def test_prometheus_exporter_name_starts_no_server(monkeypatch, tmp_path):
    monkeypatch.setenv(environment.FILES_DIR, str(tmp_path))
    monkeypatch.setenv(environment.METRICS_EXPORTER, "prometheus")
    pipeline.reset()
    recording.add(catalogue.RUNNING_TO_WAITING, 1, context.step_labels("decode"))
    assert len(pipeline.current().readers) == 1
    pipeline.reset()


def test_switch_turns_metrics_exposure_off(monkeypatch, tmp_path):
    monkeypatch.setenv(environment.FILES_DIR, str(tmp_path))
    monkeypatch.setenv(environment.PROMETHEUS, "false")
    monkeypatch.delenv(environment.METRICS_EXPORTER, raising=False)
    pipeline.reset()
    recording.add(catalogue.RUNNING_TO_WAITING, 1, context.step_labels("decode"))
    recording.flush()
    assert os.listdir(tmp_path) == []
    pipeline.reset()


def test_unknown_exporter_name_is_a_log_line_not_a_failure(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv(environment.FILES_DIR, str(tmp_path))
    monkeypatch.setenv(environment.METRICS_EXPORTER, "no_such_exporter")
    pipeline.reset()
    recording.add(catalogue.RUNNING_TO_WAITING, 1, context.step_labels("decode"))
    assert "no_such_exporter" in caplog.text
    pipeline.reset()


def test_several_unknown_exporter_names_are_one_log_line_naming_each(monkeypatch, tmp_path, caplog):
    """One line per setting, however many of its names fail (found by the configuration fuzzer: 'bogus,otlp'
    where the gRPC exporter is not installed gave two)."""
    monkeypatch.setenv(environment.FILES_DIR, str(tmp_path))
    monkeypatch.setenv(environment.METRICS_EXPORTER, "no_such_exporter,console,nor_this_one")
    pipeline.reset()
    recording.add(catalogue.RUNNING_TO_WAITING, 1, context.step_labels("decode"))
    said = [r.getMessage() for r in caplog.records if environment.METRICS_EXPORTER in r.getMessage()]
    assert said == [
        f"{environment.METRICS_EXPORTER}: 'no_such_exporter' (exporter 'no_such_exporter') is not installed; "
        "'nor_this_one' (exporter 'nor_this_one') is not installed; not exporting there"
    ]
    pipeline.reset()


def test_bad_interval_is_a_log_line_and_the_default(monkeypatch, caplog):
    monkeypatch.setenv(environment.PROMETHEUS_INTERVAL_MS, "soon")
    assert environment.interval_ms(environment.PROMETHEUS_INTERVAL_MS, 2000) == 2000
    assert "is not a positive integer" in caplog.text


@pytest.mark.parametrize(
    "raw, expected, lines",
    [(None, 7, 0), ("4096", 4096, 0), ("1024", 1024, 0), ("1023", 7, 1), ("-5", 7, 1), ("1e3", 7, 1), ("", 7, 1)],
)
def test_an_integer_setting_below_its_floor_or_not_an_integer_is_one_line_and_the_default(
    monkeypatch, caplog, raw, expected, lines
):
    from opentelemetry_instrumentation_vllm_ascend import state

    state.reset()  # warnings not yet given
    name = environment.STEPS_FILE_MAX_BYTES
    if raw is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, raw)
    assert [environment.integer(name, 7, 1024) for _ in range(3)] == [expected] * 3
    said = [r.getMessage() for r in caplog.records if name in r.getMessage()]
    assert len(said) == lines
    if lines:
        assert said == [
            f"opentelemetry-instrumentation-vllm-ascend: {name}={raw!r} is not an integer of at least 1024; using 7"
        ]


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("0", 2000),
        ("-5", 2000),
        ("1.5", 2000),
        ("", 2000),
        ("50", 100),
        ("100", 100),
        ("2500", 2500),
        ("86400000", 86_400_000),
        ("86400001", 86_400_000),
        (str(10**12), 86_400_000),
    ],
)
def test_intervals_are_clamped_to_a_documented_range(monkeypatch, caplog, raw, expected):
    """Above threading.TIMEOUT_MAX (~9.2e12 ms here) the SDK's reader thread died with an OverflowError and
    nothing was ever exported; 0 or a negative value made its constructor raise."""
    monkeypatch.setenv(environment.PROMETHEUS_INTERVAL_MS, raw)
    with caplog.at_level("WARNING"):
        assert environment.interval_ms(environment.PROMETHEUS_INTERVAL_MS, 2000) == expected
        assert environment.interval_ms(environment.PROMETHEUS_INTERVAL_MS, 2000) == expected
    warned = [r for r in caplog.records if environment.PROMETHEUS_INTERVAL_MS in r.getMessage()]
    assert len(warned) == (0 if raw in ("100", "2500", "86400000") else 1)


@pytest.mark.parametrize("raw, expected", [("0", 60_000), ("50", 100), (str(10**13), 86_400_000)])
def test_push_interval_is_read_once_and_clamped(monkeypatch, tmp_path, raw, expected):
    monkeypatch.setenv(environment.FILES_DIR, str(tmp_path))
    monkeypatch.setenv(environment.METRICS_EXPORTER, "console")
    monkeypatch.setenv(environment.METRIC_EXPORT_INTERVAL, raw)
    pipeline.reset()
    try:
        recording.add(catalogue.RUNNING_TO_WAITING, 1, context.step_labels("decode"))
        readers = pipeline.current().readers
        assert [r._export_interval_millis for r in readers] == [2000, expected]
    finally:
        pipeline.reset()


def test_a_pipeline_that_cannot_be_built_is_one_log_line_and_no_leak(monkeypatch, tmp_path, caplog):
    """The files reader starts its thread, then the push reader fails: the started reader is shut down,
    the process records into a pipeline without readers, and later records never try again (each try
    started a reader thread: thousands of leaked threads after a few hundred requests)."""
    import threading

    from opentelemetry_instrumentation_vllm_ascend.recording import otlp as exporters

    monkeypatch.setenv(environment.FILES_DIR, str(tmp_path))
    monkeypatch.setattr(exporters, "push_exporters", lambda: [object()])  # not an exporter: the reader raises
    pipeline.reset()
    before = set(threading.enumerate())
    with caplog.at_level("ERROR"):
        for i in range(1000):
            recording.add(catalogue.RUNNING_TO_WAITING, 1, context.step_labels("decode"))
            recording.record(catalogue.M["scheduler:duration"], 0.001 * i, context.step_labels("decode"))
    errors = [r for r in caplog.records if "cannot build the metrics pipeline" in r.getMessage()]
    assert len(errors) == 1
    assert pipeline.current().disabled and pipeline.current().readers == []
    assert set(threading.enumerate()) <= before  # the files reader's thread was stopped again
    pipeline.reset()


def _report_poller(conn):
    from opentelemetry_instrumentation_vllm_ascend.state import STATE

    poller = STATE.control.poller
    conn.send((os.getpid(), poller and poller[0], poller is not None and poller[1].is_alive()))


def test_the_fork_handler_gives_a_polling_process_s_child_its_own_control_poller(monkeypatch):
    """recording.pipeline's fork handler (the package's only one) restarts the runtime control's poller in
    the child: the parent's thread does not run there."""
    from opentelemetry_instrumentation_vllm_ascend.recording import control
    from opentelemetry_instrumentation_vllm_ascend.state import STATE

    monkeypatch.delenv(environment.CONTROL_DIR, raising=False)
    control.start()
    try:
        parent, child_end = multiprocessing.Pipe()
        child = multiprocessing.get_context("fork").Process(target=_report_poller, args=(child_end,))
        child.start()
        assert parent.recv() == (child.pid, child.pid, True)
        child.join(10)
        assert child.exitcode == 0
        assert STATE.control.poller[0] == os.getpid()
    finally:
        control.teardown()


@pytest.mark.parametrize("recorder", ["fast", "sdk"])
def test_a_metric_declared_after_the_start_is_exported_by_its_name_or_not_at_all(
    recorder, metrics, monkeypatch, caplog
):
    """A hook file's metric first declared on `control reload`: the fast recorder exports it by its name like any
    other; the SDK recorder's Views are fixed when its provider is built, so there it is absent (one log line)
    until the next start, never exported under its instrument name."""
    monkeypatch.setenv(environment.RECORDER, recorder)
    pipeline.reset(extra_readers=[metrics.reader])
    recording.add(catalogue.RUNNING_TO_WAITING, 1, context.step_labels("decode"))  # the pipeline is built
    late = catalogue.MetricSpec("custom:declared_late", catalogue.HISTOGRAM, "s", "A user metric.", buckets=(0.5, 1.0))
    monkeypatch.setitem(catalogue.EXTRA, late.seed, late)
    recording.control_changed()  # what a reload does: instruments are looked up again
    for _ in range(2):
        recording.record(late, 0.25, context.step_labels("decode"))
    points = metrics.points()
    assert points[R2W] == {(("dp", "0"), ("phase", "decode"), ("role", "mixed")): 1}
    if recorder == "fast":
        [(count, total, buckets)] = points["vllm_profiling_custom:declared_late"].values()
        assert (count, total, list(buckets)) == (2, 0.5, [2, 0, 0])
    else:
        assert not [name for name in points if "declared_late" in name]
        assert [r.getMessage() for r in caplog.records if "declared_late" in r.getMessage()] == [
            "opentelemetry-instrumentation-vllm-ascend: metric vllm_profiling_custom:declared_late was declared "
            "after this process started and is not recorded with OTEL_VLLM_ASCEND_RECORDER=sdk (its Views are "
            "fixed at start); restart the server, or use the default recorder"
        ]
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        restarted = type(metrics)(InMemoryMetricReader())  # a reader belongs to one provider
        pipeline.reset(extra_readers=[restarted.reader])  # the next start
        recording.record(late, 0.25, context.step_labels("decode"))
        [(key, (count, total, buckets))] = restarted.points()["vllm_profiling_custom:declared_late"].items()
        assert (key, count, total, list(buckets)) == (
            (("dp", "0"), ("phase", "decode"), ("role", "mixed")),
            1,
            0.25,
            [1, 0, 0],
        )
