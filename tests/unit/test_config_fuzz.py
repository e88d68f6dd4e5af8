"""Configuration fuzzer: every switch the package reads (environment.py), valid, invalid and random
values together, in process. Properties: nothing raises; at most one log line of ours per setting,
none per record; the threads a pipeline starts are gone after it closes; and 10k records under the
worst settings the issue found (a 0 push interval) leave threads and memory flat."""

import gc
import logging
import os
import shutil
import socket
import threading
import time
import tracemalloc

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opentelemetry_instrumentation_vllm_ascend import catalogue, context, environment, recording, state
from opentelemetry_instrumentation_vllm_ascend.recording import metrics_endpoint as exposition
from opentelemetry_instrumentation_vllm_ascend.recording import pipeline
from opentelemetry_instrumentation_vllm_ascend.recording import shutdown as shutdown_module
from tests.support.process import set_process

_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
_BOOL = st.sampled_from(["true", "false", "1", "0", "yes", "off", "2", "enabled", "", " TRUE ", "nope"]) | _TEXT
_INTERVAL = st.sampled_from(
    ["0", "-1", "1", "99", "100", "2000", "86400001", "1e3", "", "abc", str(2**63), "9" * 30]
) | st.integers(-(10**12), 10**12).map(str)
_PATTERNS = st.lists(
    st.sampled_from(
        [
            "npu:*",
            "*",
            "[",
            "scheduler:duration",
            "vllm_profiling_*",
            "",
            "  ",
            "schedule: allocate_slots",
            "forward",
            "?",
        ]
    )
    | _TEXT,
    max_size=4,
).map(",".join)

BASE = "/tmp/otel-vllm-ascend-fuzz"


def _dirs():
    os.makedirs(os.path.join(BASE, "ok"), exist_ok=True)
    os.makedirs(os.path.join(BASE, "glob[1]*"), exist_ok=True)
    with open(os.path.join(BASE, "a-file"), "w"):
        pass
    return st.sampled_from(
        [
            os.path.join(BASE, "ok"),
            os.path.join(BASE, "glob[1]*"),
            os.path.join(BASE, "missing"),
            os.path.join(BASE, "a-file"),
            "",
            "relative/dir",
        ]
    )


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SWITCHES = {
    environment.ENABLED: _BOOL,
    environment.PROMETHEUS: _BOOL,
    environment.PROMETHEUS_INTERVAL_MS: _INTERVAL,
    environment.RECORDER: st.sampled_from(["fast", "sdk", "SDK", "", "slow"]) | _TEXT,
    environment.DISABLED_METRICS: _PATTERNS,
    environment.DISABLED_SCOPES: _PATTERNS,
    environment.SHUTDOWN_TIMEOUT_MS: _INTERVAL,
    environment.DISABLED_INSTRUMENTATIONS: st.sampled_from(["", "*", "vllm_ascend", "other,vllm_ascend", "x"]),
    environment.METRICS_EXPORTER: st.lists(
        st.sampled_from(["none", "prometheus", "console", "bogus", "", "otlp_proto_http", "otlp"]), max_size=3
    ).map(",".join),
    environment.METRIC_EXPORT_INTERVAL: _INTERVAL,
    environment.FILES_DIR: _dirs(),
    environment.PROMETHEUS_MULTIPROC_DIR: _dirs(),
    environment.ROOT_PID: st.sampled_from(["1", str(os.getpid()), "-4", "x", "", str(2**22 + 7)]),
    environment.TREE: st.sampled_from(["", "abc", "a" * 100, "../x", "t0"]) | _TEXT,
}

CASES = st.fixed_dictionaries({}, optional={name: strategy for name, strategy in SWITCHES.items()})


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        if record.levelno >= logging.INFO:
            self.records.append(record)


def _record_some(n: int) -> None:
    labels = context.step_labels("decode")
    for i in range(n):
        recording.add(catalogue.RUNNING_TO_WAITING, 1, labels)
        recording.add(catalogue.RECOMPUTE_EVENTS, i % 3, labels)
        recording.set_gauge(catalogue.INSTRUMENTED_PROCESSES, 1, ("engine_core", "0", "mixed"))


def _apply(case: dict) -> dict:
    saved = {
        name: os.environ.get(name)
        for name in list(SWITCHES)
        + ["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "OTEL_EXPORTER_OTLP_ENDPOINT"]
    }
    for name in SWITCHES:
        os.environ.pop(name, None)
    os.environ.update(case)
    # a collector that refuses connections, answering fast
    os.environ["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"] = f"http://127.0.0.1:{_closed_port()}/v1/metrics"
    os.environ["OTEL_EXPORTER_OTLP_METRICS_TIMEOUT"] = "0.2"
    return saved


def _restore(saved: dict) -> None:
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(CASES)
def test_every_configuration_is_safe(case):
    ours = logging.getLogger("opentelemetry_instrumentation_vllm_ascend")
    lines = _Lines()
    ours.addHandler(lines)
    state.reset()  # each example: warnings not yet given
    threads_before = threading.active_count()
    saved = _apply(case)
    made = None
    try:
        exp = exposition.Exposition()
        exp.setup()
        made = exp.directory
        shutdown_module.setup()
        pipeline.reset()
        set_process("engine_core", "0", "mixed")
        _record_some(50)
        recording.flush(timeout_millis=500)
        after_first = len(lines.records)
        _record_some(500)
        recording.flush(timeout_millis=500)
        assert len(lines.records) == after_first, [r.getMessage() for r in lines.records[after_first:]]
        pipeline.reset()  # the final export, the readers' threads stop
        shutdown_module.teardown()
        exp.teardown()
        # One line at most per setting (a bad value, or a fault it causes, such as a missing directory).
        assert len(lines.records) <= max(1, len(case)), [r.getMessage() for r in lines.records]
        # Closing is bounded (OTEL_VLLM_ASCEND_SHUTDOWN_TIMEOUT_MS), so a reader still inside an export to an
        # unreachable collector, or the flush listener just woken, may end a moment after close returned:
        # the threads must be gone within a few seconds, never accumulate.
        deadline = time.monotonic() + 5.0
        while threading.active_count() > threads_before + 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert threading.active_count() <= threads_before + 1, [t.name for t in threading.enumerate()]
    finally:
        ours.removeHandler(lines)
        _restore(saved)
        pipeline.reset()
        if made:
            shutil.rmtree(made, ignore_errors=True)


def test_ten_thousand_records_under_a_zero_push_interval_leave_threads_and_memory_flat(monkeypatch, tmp_path):
    """The issue's worst case: OTEL_METRIC_EXPORT_INTERVAL=0 with a push exporter built a pipeline per
    record (thousands of threads, hundreds of MB)."""
    monkeypatch.setenv(environment.METRIC_EXPORT_INTERVAL, "0")
    monkeypatch.setenv(environment.METRICS_EXPORTER, "console")
    monkeypatch.setenv(environment.FILES_DIR, str(tmp_path))
    monkeypatch.delenv(environment.PROMETHEUS_MULTIPROC_DIR, raising=False)
    pipeline.reset()
    set_process("engine_core", "0", "mixed")
    _record_some(1000)
    threads = set(threading.enumerate())
    tracemalloc.start()
    try:
        _record_some(1000)
        gc.collect()
        start = tracemalloc.get_traced_memory()[0]
        _record_some(10_000)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
        pipeline.reset()
    assert set(threading.enumerate()) <= threads
    assert grown < 256 * 1024, grown
