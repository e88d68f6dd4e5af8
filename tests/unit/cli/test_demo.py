"""The demo's printout (cli/demo/__main__.py) without a server: a stand-in ``Server`` whose "EngineCore" is a real
step-record ``Stream`` writing the file the demo's environment names, and whose /metrics is a real prometheus_client
exposition with hand-chosen step times. Checked: the engine step's shares add to 100 % (an ``other`` row, from
the same totals), and the ``steps`` table the demo prints counts the records in that file. The live demo's pieces
on a real server: tests/e2e/test_catalogue.py (test_demo_shares_and_steps_table_of_a_live_server)."""

from __future__ import annotations

import json
import re

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from opentelemetry_instrumentation_vllm_ascend import environment
from opentelemetry_instrumentation_vllm_ascend.cli.demo import __main__ as demo
from opentelemetry_instrumentation_vllm_ascend.recording import step_records
from tests.support.process import set_process
from tests.support.step_feed import feed

P = "vllm_profiling_"
MS = 1 / 1024


def exposition() -> str:
    """Two busy steps of 40 ms: schedule 4, execute_model 30, update_from_output 3 (ms): other 3 ms, 7.5 %."""
    r = CollectorRegistry()
    for seed, values in (
        ("engine_core:engine_core_step:duration", (0.010, 0.030)),
        ("scheduler:duration", (0.001, 0.003)),
        ("executor:execute_model:duration", (0.008, 0.022)),
        ("scheduler:update_from_output:duration", (0.001, 0.002)),
    ):
        h = Histogram(P + seed, "x", ["dp", "role", "phase"], registry=r, buckets=(0.01, 0.1))
        for v in values:
            h.labels("0", "mixed", "decode").observe(v)
    Counter("vllm:num_preemptions", "x", ["engine"], registry=r).labels("0").inc(3)
    return generate_latest(r).decode()


class FakeServer:
    """What the demo calls of ``server.Server``; ``start`` runs 5 steps through a real ``Stream`` configured from
    the environment the demo gave it (as the EngineCore's ``instrument()`` would), and ``stop`` closes it."""

    made: list = []

    def __init__(self, model_dir, log_path=None, env=None):
        self.env = dict(env or {})
        self.url = "http://127.0.0.1:1"
        FakeServer.made.append(self)

    def command(self):
        return ["vllm", "serve"]

    def start(self):
        set_process("engine_core", "0", "mixed")
        with pytest.MonkeyPatch.context() as mp:
            for name, value in self.env.items():
                mp.setenv(name, value)
            stream = step_records.configure()
        if stream is None:  # --no-steps: no sink on
            return self
        stream.open_sinks()
        for counter, (decode, prefill) in enumerate(((0, ((40, 40),)), (1, ()), (1, ()), (1, ()), (0, ()))):
            if decode or prefill:
                feed(stream, counter + 1, 1024.0 + counter, 4 * MS, decode, prefill)
        stream.drain()
        return self

    def batch(self, prompts, max_tokens):
        return {}

    def scrape(self):
        return exposition()

    def stop(self):
        step_records.close()


@pytest.fixture
def demo_run(monkeypatch, tmp_path, capsys):
    for name in (environment.STEPS_ZMQ, environment.STEPS_FILE, environment.STEPS_OTLP_LOGS):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(demo.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(demo.tiny_model, "build", lambda path: path)
    monkeypatch.setattr(demo.time, "sleep", lambda s: None)
    monkeypatch.setattr(demo, "Server", FakeServer)
    FakeServer.made.clear()

    def run(*argv):
        assert demo.main(list(argv)) == 0
        return capsys.readouterr().out

    yield run
    step_records.close()
    set_process("engine_core", "0", "mixed")


def test_demo_shares_add_to_100_and_its_steps_table_counts_the_file(demo_run, tmp_path):
    out = demo_run()
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if "of the step time:" in line)
    shares = [line for line in lines[start + 1 :] if re.match(r"\s{4}\S.*\d%", line)]
    assert [line.split()[0] for line in shares] == ["schedule", "execute_model", "update_from_output", "other"]
    percents = [float(re.search(r"([\d.]+)%", line).group(1)) for line in shares]
    assert percents == [10.0, 75.0, 7.5, 7.5]  # 4, 30, 3 and 40 - 37 = 3 ms of 40
    assert abs(sum(percents) - 100.0) <= 0.05 * len(percents)
    # The step records: the file the demo named, and its table.
    path = tmp_path / "otel-vllm-ascend-demo-steps-0.jsonl"
    [server] = FakeServer.made
    assert server.env[environment.STEPS_FILE] == str(tmp_path / "otel-vllm-ascend-demo-steps-{dp}.jsonl")
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == 4  # the idle step has none
    head = lines.index(demo.STEPS_COMMAND.format(path=path).join(("One record per engine step of that load (", "):")))
    assert lines[head + 1] == f"  {len(records)} steps"
    all_row = lines[head + 3].split()
    assert all_row[:3] == ["0", "all", str(len(records))]


def test_demo_without_steps_names_no_file(demo_run, tmp_path):
    out = demo_run("--no-steps")
    [server] = FakeServer.made
    assert environment.STEPS_FILE not in server.env
    assert "One record per engine step" not in out
    assert not list(tmp_path.glob("*steps*"))


def test_demo_starts_each_run_with_a_fresh_steps_file(demo_run, tmp_path):
    demo_run()
    demo_run()
    path = tmp_path / "otel-vllm-ascend-demo-steps-0.jsonl"
    assert len(path.read_text().splitlines()) == 4
