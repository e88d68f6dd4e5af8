"""``python -m opentelemetry_instrumentation_vllm_ascend steps`` (cli/steps.py, steps_stats.py, steps_plot.py):
the arithmetic on hand-computed examples; the table's numbers from JSON-lines files the real ``Stream`` wrote for
two DP ranks, and from its real ZMQ socket; the SVG has one dot per record in each panel."""

from __future__ import annotations

import math
import threading
import time
import xml.etree.ElementTree as ET

import pytest

from opentelemetry_instrumentation_vllm_ascend import environment
from opentelemetry_instrumentation_vllm_ascend.cli import steps_stats as st
from opentelemetry_instrumentation_vllm_ascend.cli.main import main
from opentelemetry_instrumentation_vllm_ascend.recording import step_records
from tests.support.process import set_process
from tests.support.step_feed import feed

MS = 1 / 1024  # a dyadic step time: wall_time is exact


# -- the arithmetic ----------------------------------------------------------------------------------------------
def test_percentile_is_the_nearest_rank():
    assert st.percentile([3.0, 1.0, 2.0], 50) == 2.0  # ceil(1.5) = 2nd smallest
    assert st.percentile([3.0, 1.0, 2.0], 99) == 3.0
    values = [float(v) for v in range(1, 11)]
    assert st.percentile(values, 50) == 5.0 and st.percentile(values, 99) == 10.0 and st.percentile(values, 10) == 1.0
    assert st.percentile([float(v) for v in range(1, 201)], 99) == 198.0
    assert math.isnan(st.percentile([], 50))


def test_token_buckets_are_powers_of_two():
    assert [st.bucket(n) for n in (0, 1, 2, 3, 4, 5, 8, 9, 19, 94, 128, 129)] == [
        (0, 0), (1, 1), (2, 2), (3, 4), (3, 4), (5, 8), (5, 8), (9, 16), (17, 32), (65, 128), (65, 128), (129, 256),
    ]  # fmt: skip
    assert st.bucket_label(3, 4) == "3-4" and st.bucket_label(2, 2) == "2"


def test_rate_shape_and_point():
    assert st.rate([0.0, 1.0, 2.0, 3.0]) == 1.0 and st.rate([10.0, 10.5]) == 2.0
    assert math.isnan(st.rate([5.0])) and math.isnan(st.rate([5.0, 5.0]))
    assert (st.shape(2, 0), st.shape(0, 3), st.shape(1, 1), st.shape(0, 0)) == ("prefill", "decode", "mixed", "decode")
    dynamo_only = {
        "dp_rank": 1,
        "wall_time": 0.02,
        "scheduled_requests": {"num_prefill_requests": 1, "sum_prefill_tokens": 30, "num_decode_requests": 3},
        "queued_requests": {"num_prefill_requests": 2, "num_decode_requests": 1},
    }
    assert st.point(dynamo_only, 7.0) == st.Point(dp=1, t=7.0, wall=0.02, tokens=33, shape="mixed", queued=3)


def test_rows_on_hand_points():
    points = [
        st.Point(0, 0.0, 0.010, 4, "decode", 0),
        st.Point(0, 0.5, 0.030, 4, "decode", 2),
        st.Point(0, 1.0, 0.020, 100, "prefill", 1),
        st.Point(1, 0.0, 0.005, 2, "decode", 0),
    ]
    table = st.rows(points)
    assert [(r.dp, r.shape, r.tokens, r.steps) for r in table] == [
        (0, "all", "", 3), (0, "prefill", "65-128", 1), (0, "decode", "3-4", 2), (1, "all", "", 1), (1, "decode", "2", 1),
    ]  # fmt: skip
    everything = table[0]
    assert (everything.rate, everything.p50, everything.p99, everything.queued_mean, everything.queued_max) == (
        2.0, 0.020, 0.030, 1.0, 2,
    )  # fmt: skip
    assert (table[2].p50, table[2].p99, table[2].rate) == (0.010, 0.030, 2.0)  # shapes in SHAPES order
    assert math.isnan(table[3].rate)


def test_the_window_keeps_the_last_seconds_per_rank():
    window = st.Window(seconds=1.0)
    for t in (0.0, 0.5, 1.0, 1.5, 2.0):
        window.add(st.Point(0, t, 0.01, 1, "decode", 0))
    window.add(st.Point(1, 0.0, 0.01, 1, "decode", 0))
    assert [(p.dp, p.t) for p in window.points()] == [(0, 1.0), (0, 1.5), (0, 2.0), (1, 0.0)]


# -- the real stream's records ------------------------------------------------------------------------------------
#: Per rank: (decode requests, new requests (prompt, chunk), queued, wall in units of MS).
RANK0 = (
    (4, (), 0, 2), (4, (), 0, 4), (4, (), 0, 8), (0, ((100, 64), (30, 30)), 2, 32), (0, ((90, 64), (30, 30)), 2, 16),
    (3, ((40, 16),), 1, 8),
)  # fmt: skip
RANK1 = ((8, (), 0, 4), (8, (), 0, 4), (8, (), 0, 4))


@pytest.fixture
def stream_env(monkeypatch):
    for name in (environment.STEPS_ZMQ, environment.STEPS_FILE, environment.STEPS_OTLP_LOGS):
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch
    step_records.close()
    set_process("engine_core", "0", "mixed")


def _write(stream, steps) -> None:
    for counter, (decode, prefill, queued, wall) in enumerate(steps):
        feed(stream, counter, 1024.0 + counter * 0.5, wall * MS, decode, prefill, queued)
    stream.drain()


def _table(text: str) -> dict:
    """{(dp, shape, tokens): (steps, steps/s, p50, p99, queued, queued max)} of the last table in ``text``."""
    last = text.strip().split("\n\n")[-1].splitlines()
    assert last[1].split()[:3] == ["dp", "shape", "tokens"]
    out, dp = {}, None
    for line in last[2:]:
        f = line.split()
        if f[1] == "all":
            dp, key, f = f[0], (f[0], "all", ""), f[2:]
        else:
            key, f = (dp, f[0], f[1]), f[2:]
        out[key] = tuple(f)
    return out


EXPECTED = {
    # dp 0: walls 2 4 8 32 16 8 (MS): p50 = 3rd = 8 MS = 7.8125 ms, p99 = 32 MS; 6 steps in 2.5 s; queued 0 0 0 2 2 1.
    ("0", "all", ""): ("6", "2.0", "7.81", "31.25", "0.8", "2"),
    ("0", "prefill", "65-128"): ("2", "2.0", "15.62", "31.25", "2.0", "2"),  # 94 tokens each; p50 = 1st = 16 MS
    ("0", "decode", "3-4"): ("3", "2.0", "3.91", "7.81", "0.0", "0"),
    ("0", "mixed", "17-32"): ("1", "-", "7.81", "7.81", "1.0", "1"),  # 3 decode + 16 prefill tokens
    ("1", "all", ""): ("3", "2.0", "3.91", "3.91", "0.0", "0"),
    ("1", "decode", "5-8"): ("3", "2.0", "3.91", "3.91", "0.0", "0"),
}


def _svg_points(path) -> list[list[str]]:
    """Per panel, the dp of each dot (each inside its panel's plot area)."""
    from opentelemetry_instrumentation_vllm_ascend.cli import steps_plot as sp

    ns = {"s": "http://www.w3.org/2000/svg"}
    root = ET.parse(path).getroot()
    panels = root.findall("s:g[@class='panel']", ns)
    out = []
    for index, panel in enumerate(panels):
        dots = panel.findall("s:circle[@class='step']", ns)
        left = index * sp.WIDTH + sp.MARGIN_LEFT
        for c in dots:
            assert left <= float(c.get("cx")) <= (index + 1) * sp.WIDTH - sp.MARGIN_RIGHT
            assert sp.MARGIN_TOP <= float(c.get("cy")) <= sp.HEIGHT - sp.MARGIN_BOTTOM
        out.append([c.get("data-dp") for c in dots])
    return out


def test_the_table_and_the_plot_from_the_files_the_stream_wrote(stream_env, tmp_path, capsys):
    stream_env.setenv(environment.STEPS_FILE, str(tmp_path / "steps-{dp}.jsonl"))
    for dp, steps in (("0", RANK0), ("1", RANK1)):
        set_process("engine_core", dp, "mixed")
        stream = step_records.configure()
        stream.open_sinks()
        _write(stream, steps)
        step_records.close()
    plot = tmp_path / "steps.svg"
    files = [str(tmp_path / "steps-0.jsonl"), str(tmp_path / "steps-1.jsonl")]
    assert main(["steps", "--file", files[0], "--file", files[1], "--once", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("9 steps\n")
    assert _table(out) == EXPECTED
    panels = _svg_points(plot)
    assert len(panels) == 2 and all(len(dots) == 9 for dots in panels)
    assert all(dots.count("0") == 6 and dots.count("1") == 3 for dots in panels)


def test_follow_reads_what_the_stream_appends_and_redraws(stream_env, tmp_path, capsys):
    path = tmp_path / "steps-0.jsonl"
    stream_env.setenv(environment.STEPS_FILE, str(tmp_path / "steps-{dp}.jsonl"))
    set_process("engine_core", "0", "mixed")
    stream = step_records.configure()
    stream.open_sinks()
    _write(stream, RANK0[:3])
    stream.sinks[0].batch_done()
    result: list = []
    args = ["steps", "--file", str(path), "--follow", "--seconds", "1.5", "--interval", "0.2"]
    reader = threading.Thread(target=lambda: result.append(main(args)))
    reader.start()
    time.sleep(0.5)
    for counter, (decode, prefill, queued, wall) in enumerate(RANK0[3:], start=3):
        feed(stream, counter, 1024.0 + counter * 0.5, wall * MS, decode, prefill, queued)
    stream.drain()  # written and flushed
    reader.join(10)
    out = capsys.readouterr().out
    assert result == [0] and out.count("dp  shape") >= 3  # redrawn while it ran, and the last table
    assert out.split("\n\n")[0].startswith("3 steps")
    assert _table(out) == {key: value for key, value in EXPECTED.items() if key[0] == "0"}


def test_the_table_from_the_streams_zmq_socket(stream_env, tmp_path, capsys):
    pytest.importorskip("zmq", reason="the ZMQ sink and --zmq need pyzmq (vLLM ships it)")
    pytest.importorskip("msgspec", reason="the ZMQ sink and --zmq need msgspec (vLLM ships it)")
    endpoint = f"ipc://{tmp_path}/steps.sock"
    stream_env.setenv(environment.STEPS_ZMQ, endpoint)
    set_process("engine_core", "0", "mixed")
    stream = step_records.configure()
    stream.open_sinks()
    result: list = []
    reader = threading.Thread(target=lambda: result.append(main(["steps", "--zmq", endpoint, "--seconds", "2"])))
    reader.start()
    deadline = time.monotonic() + 5
    while stream.subscribers < 1 and time.monotonic() < deadline:
        stream.drain()  # polls the XPUB socket's subscriptions
        time.sleep(0.01)
    assert stream.subscribers == 1
    _write(stream, RANK0)
    reader.join(10)
    assert result == [0] and stream.sent == len(RANK0)
    table = _table(capsys.readouterr().out)
    assert table == {key: value for key, value in EXPECTED.items() if key[0] == "0"}
