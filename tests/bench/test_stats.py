"""The end-to-end benchmark's statistics (benchmarks/e2e_overhead.py): rounds of one server set share its server
processes, so the interval resamples server sets, then their rounds; CPU time per round is counted in
nanoseconds per thread, in clock ticks only where a thread ended."""

from __future__ import annotations

import os
import random
import time

import pytest

from benchmarks.e2e_overhead import bootstrap_median, bootstrap_median_by_set, cpu_between, cpu_snapshot  # noqa: E402


def test_one_set_is_the_rounds_bootstrap():
    rounds = [0.97, 1.01, 0.99, 1.03, 0.95, 1.0, 0.98, 1.02]
    assert bootstrap_median_by_set([rounds]) == bootstrap_median(rounds)


def test_identical_rounds_give_a_point():
    assert bootstrap_median_by_set([[0.98] * 8, [0.98] * 8, [0.98] * 8]) == (0.98, 0.98)


def test_set_offsets_widen_the_interval_that_rounds_alone_would_give():
    # Three server sets whose processes run 2-4.5 % fast for their whole life (their own offsets, not the code's),
    # 1 % noise from round to round: resampling the 24 rounds as if independent gives an interval 1.2 % wide;
    # resampling the sets first, one almost twice as wide (three sets, all fast, still leave out 1.0).
    rng = random.Random(7)
    sets = [[offset + rng.gauss(0.0, 0.01) for _ in range(8)] for offset in (1.02, 1.03, 1.045)]
    flat_low, flat_high = bootstrap_median([r for s in sets for r in s])
    low, high = bootstrap_median_by_set(sets)
    assert (round(flat_low, 3), round(flat_high, 3)) == (1.025, 1.037)
    assert (round(low, 3), round(high, 3)) == (1.018, 1.040)
    assert low < flat_low and high > flat_high


@pytest.mark.parametrize("seed", [1, 2])
def test_reproducible_for_a_seed(seed):
    sets = [[0.95, 0.99, 1.0], [1.02, 0.97], [0.96, 1.01, 0.98, 0.99]]
    assert bootstrap_median_by_set(sets, seed=seed) == bootstrap_median_by_set(sets, seed=seed)


def test_cpu_between_counts_threads_in_nanoseconds():
    before = {10: ("engine_core", 0.42, {"10": 400_000_000, "11": 20_000_000})}
    after = {10: ("engine_core", 0.44, {"10": 412_345_678, "11": 21_000_000, "12": 5_000})}  # 12: a new thread
    assert cpu_between(before, after)["engine_core"] == pytest.approx(0.013350678)  # not the ticks' 0.02


def test_cpu_between_falls_back_to_ticks_where_a_thread_ended():
    before = {10: ("worker", 3.0, {"10": 3_000_000_000, "11": 1_000_000})}
    after = {10: ("worker", 3.5, {"10": 3_490_000_000}), 20: ("api_server", 0.25, {"20": 250_000_000})}
    cpu = cpu_between(before, after)
    assert cpu["worker"] == pytest.approx(0.5)  # thread 11's last CPU time is gone from schedstat
    assert cpu["api_server"] == pytest.approx(0.25)  # a process new since the first snapshot: all its time


def test_cpu_snapshot_of_this_process_agrees_with_its_cpu_clock():
    """Against the kernel's per-process CPU clock (CLOCK_PROCESS_CPUTIME_ID, nanoseconds) over the same work."""
    me = os.getpid()
    before, clock = cpu_snapshot(me), time.process_time()
    while time.process_time() - clock < 0.05:
        pass
    after, spent = cpu_snapshot(me), time.process_time() - clock
    assert sum(cpu_between(before, after).values()) == pytest.approx(spent, abs=0.002)


def _printout(path, header: str, rounds) -> str:
    lines = [header] + [
        f"server set {s} round {r:2d}: off {off:8.2f}, on {on:8.2f}, control {control:8.2f} tokens_per_s; x"
        for s, r, off, on, control in rounds
    ]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_pool_reads_each_set_of_each_printout(tmp_path, capsys):
    from benchmarks import pool

    a = _printout(tmp_path / "a.txt", "run a", [(1, 1, 100, 99, 100), (1, 2, 100, 98, 101)])
    b = _printout(tmp_path / "b.txt", "run b", [(1, 1, 100, 97, 99)])
    [[first, second]] = pool.sets_of(a).values()
    assert first == pytest.approx({"on": 0.99, "on_both": 0.99, "control": 1.0})
    assert second == pytest.approx({"on": 0.98, "on_both": 98 / 100.5, "control": 1.01})
    assert pool.main([a, b]) == 0
    out = capsys.readouterr().out
    assert "uninstrumented, 2 runs, 2 server sets, 3 rounds: median 0.980" in out  # ratios 0.99, 0.98, 0.97
    # against the mean of both uninstrumented servers: 0.99, 98 / 100.5, 97 / 99.5
    assert "mean of both uninstrumented, 2 runs, 2 server sets, 3 rounds: median 0.975" in out


def test_pool_refuses_to_mix_switched_runs_with_three_server_runs(tmp_path, capsys):
    from benchmarks import pool

    three = _printout(tmp_path / "three.txt", "### preset step; 1 server sets", [(1, 1, 100, 99, 100)])
    one = _printout(tmp_path / "one.txt", "### preset step; SWITCHED: one instrumented server", [(1, 1, 100, 99, 100)])
    assert pool.main([three, one]) == 2
    assert "differ in their design (switched, three servers)" in capsys.readouterr().err
    assert pool.main([one, one]) == 0


HEADER = "### End-to-end overhead, preset step: model hidden 512 x {} layers (intermediate 1536), batch load; {}"
SHARED = "EngineCores bound to their workers' core(s), API servers and the client to [1]"
APART = "workers alone on their core(s), EngineCores, API servers and the client on [1]"


@pytest.mark.parametrize(
    "other, differs",
    [
        (HEADER.format(4, SHARED), "preset and model (('step', '512', '2'), ('step', '512', '4'))"),
        (HEADER.format(2, APART), "placement (apart, shared)"),
        (
            HEADER.format(2, "the instrumented server's recording switched off at runtime once started; " + SHARED),
            "ablation (none, the instrumented server's recording switched off)",
        ),
        (
            HEADER.format(2, "disabled metrics: scheduler:*, worker:*; " + SHARED),
            "ablation (disabled metrics: scheduler:*, worker:*, none)",
        ),
    ],
)
def test_pool_refuses_runs_of_another_model_size_placement_or_ablation(tmp_path, capsys, other, differs):
    from benchmarks import pool

    rounds = [(1, 1, 100, 99, 100)]
    base = _printout(tmp_path / "base.txt", HEADER.format(2, SHARED), rounds)
    assert pool.main([base, _printout(tmp_path / "other.txt", other, rounds)]) == 2
    assert f"differ in their {differs}" in capsys.readouterr().err
    assert pool.main([base, base]) == 0


@pytest.mark.parametrize("placement, engine_core", [("shared", {0}), ("apart", {1})])
def test_bind_places_the_engine_core_with_its_worker_or_apart(monkeypatch, placement, engine_core):
    """On two cores with the worker on core 0: the API server always gets core 1; the EngineCore gets the
    worker's core (shared) or core 1 (apart); the worker keeps vLLM's own binding."""
    from benchmarks import e2e_overhead

    kinds = {10: "api_server", 11: "engine_core", 12: "worker"}
    pinned: dict = {}
    monkeypatch.setattr(e2e_overhead.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(e2e_overhead, "worker_cores", lambda pid: {0})
    monkeypatch.setattr(e2e_overhead, "descendants", lambda pid: [11, 12])
    monkeypatch.setattr(e2e_overhead, "process_kind", kinds.get)
    monkeypatch.setattr(e2e_overhead, "pin", pinned.__setitem__)
    server = type("Server", (), {"proc": type("Proc", (), {"pid": 10})})()
    assert e2e_overhead.bind(server, placement) == {1}
    assert pinned == {10: {1}, 11: engine_core}


@pytest.mark.parametrize("layers, step_ms, resized", [(2, 14.2, 4), (2, 13.0, 5), (2, 60.0, 1), (4, 21.0, 6)])
def test_resized_layers_aim_at_the_middle_of_the_step_range(layers, step_ms, resized):
    """The step preset's model on a faster or slower machine: layers scaled toward 30 ms (of 20-40 ms)."""
    from benchmarks.e2e_overhead import STEP_RANGE_MS, resized_layers

    assert STEP_RANGE_MS == (20, 40)
    assert resized_layers(layers, step_ms) == resized
