"""vllm-ascend EPLB: hotness / imbalance arithmetic, the handlers on fakes that copy vllm-ascend
0.23.0.post1's code, a real forked EPLB process seen through /metrics and OTLP, and the transfer timers."""

import multiprocessing
import os

import pytest

from opentelemetry_instrumentation_vllm_ascend import catalogue, context, environment, recording
from opentelemetry_instrumentation_vllm_ascend.handlers import eplb
from opentelemetry_instrumentation_vllm_ascend.hooks import patches, wrappers
from opentelemetry_instrumentation_vllm_ascend.recording import pipeline
from opentelemetry_instrumentation_vllm_ascend.state import STATE
from opentelemetry_instrumentation_vllm_ascend.wiring import declarative
from tests.support.fakes import (
    ExpertWeightUpdateState,
    FakeAdaptor,
    FakeEplbWorker,
    FakeEplbWorkerWithoutHotness,
    FakeLoader,
    handler_of,
)
from tests.support.otlp_receiver import Receiver
from tests.support.process import set_process
from tests.unit.recording.test_prometheus import exposition, sample_lines

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

# numpy 2 on torch tensors, in the copy of vllm-ascend's _compute_imbalance (np.array(tensor)).
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")

# -- a hand-made case -----------------------------------------------------------------------------------
# 2 MoE layers, 2 EP ranks, 2 slots per rank, 3 logical experts.
# Layer 0, old placement: rank 0 holds experts [0, 1], rank 1 holds [0, 2] (expert 0 replicated).
#   Load per slot: rank 0 [4, 2], rank 1 [6, 20] -> hotness e0 = 4 + 6 = 10, e1 = 2, e2 = 20.
#   current: e0 split over 2 replicas (5 each): rank loads 5 + 2 = 7 and 5 + 20 = 25; mean 16, max 25,
#   imbalance 25 / 16 = 1.5625.
#   update (EPLB's new placement): rank 0 [0, 2], rank 1 [1, 2] (expert 2 replicated instead):
#   e0 10, e1 2, e2 20 / 2 = 10: rank loads 10 + 10 = 20 and 2 + 10 = 12; mean 16, max 20 -> 1.25.
# Layer 1: no load at all, placement unchanged: imbalance 1.0 (no division by zero), loads 0.
OLD_PLACEMENT = [[[0, 1], [0, 2]], [[0, 1], [0, 2]]]
NEW_PLACEMENT = [[[0, 2], [1, 2]], [[0, 1], [0, 2]]]
LOAD = [[[4, 2], [6, 20]], [[0, 0], [0, 0]]]
# The same load over 3 collection stages: [T, L, ep, E_local] (vllm-ascend's multi-stage layout) ...
_STAGES = (
    [[[1, 2], [6, 5]], [[0, 0], [0, 0]]],
    [[[3, 0], [0, 15]], [[0, 0], [0, 0]]],
    [[[0, 0], [0, 0]], [[0, 0], [0, 0]]],
)
STAGED_LOAD = [list(stage) for stage in _STAGES]
# ... and unpermuted, [L, ep, T, E_local].
STAGED_LOAD_L_FIRST = [[[_STAGES[t][layer][rank] for t in range(3)] for rank in range(2)] for layer in range(2)]

EXPECTED_STATS = {
    "current": [(1.5625, 16.0, 25.0), (1.0, 0.0, 0.0)],
    "update": [(1.25, 16.0, 20.0), (1.0, 0.0, 0.0)],
}
# Mean / max over the layers of the imbalances.
EXPECTED_SUMMARY = {"current_mean": 1.28125, "current_max": 1.5625, "update_mean": 1.125, "update_max": 1.25}


def global_maps(placement, num_experts=3):
    """Local placement [L][ep][slot] -> vllm-ascend's global expert maps [L][ep][expert] (slot or -1)."""
    maps = []
    for layer in placement:
        rows = []
        for rank in layer:
            row = [-1] * num_experts
            for slot, expert in enumerate(rank):
                row[expert] = slot
            rows.append(row)
        maps.append(rows)
    return maps


def test_local_placement_inverts_the_global_maps():
    assert global_maps(OLD_PLACEMENT) == [[[0, 1, -1], [0, -1, 1]], [[0, 1, -1], [0, -1, 1]]]
    assert eplb.local_placement(global_maps(OLD_PLACEMENT)) == OLD_PLACEMENT
    assert eplb.local_placement(torch.tensor(global_maps(NEW_PLACEMENT))) == NEW_PLACEMENT


def test_hotness_sums_the_slots_of_each_expert():
    assert eplb.expert_hotness(OLD_PLACEMENT, LOAD) == [{0: 10, 1: 2, 2: 20}, {0: 0, 1: 0, 2: 0}]


def test_replicated_expert_splits_its_hotness():
    hot = {0: 10, 1: 2, 2: 20}
    assert eplb.rank_loads(OLD_PLACEMENT[0], hot) == [7.0, 25.0]
    assert eplb.rank_loads(NEW_PLACEMENT[0], hot) == [20.0, 12.0]
    assert eplb.imbalance([7.0, 25.0]) == 1.5625
    assert eplb.imbalance([20.0, 12.0]) == 1.25


def test_zero_load_layer_is_balanced_not_a_division_by_zero():
    assert eplb.rank_loads(OLD_PLACEMENT[1], {0: 0, 1: 0, 2: 0}) == [0.0, 0.0]
    assert eplb.imbalance([0.0, 0.0]) == 1.0
    assert eplb.imbalance([0, 0, 0]) == 1.0


@pytest.mark.parametrize("load", [LOAD, STAGED_LOAD, STAGED_LOAD_L_FIRST], ids=["single", "staged", "staged-L-first"])
def test_layer_stats(load):
    old, new = global_maps(OLD_PLACEMENT), global_maps(NEW_PLACEMENT)
    assert eplb.layer_stats(load, old, new) == EXPECTED_STATS
    # torch tensors, as vllm-ascend hands them (int64 load; int32 for multi-stage)
    dtype = torch.int64 if load is LOAD else torch.int32
    assert eplb.layer_stats(torch.tensor(load, dtype=dtype), torch.tensor(old), torch.tensor(new)) == EXPECTED_STATS


def test_slot_load_multi_stage_layouts():
    assert eplb.slot_load(STAGED_LOAD, OLD_PLACEMENT) == LOAD
    assert eplb.slot_load(STAGED_LOAD_L_FIRST, OLD_PLACEMENT) == LOAD
    # T == L == ep == E_local: ambiguous; vllm-ascend's multi_stage layout [T, L, ep, E] unless told otherwise
    cube = [[[[t * 8 + l * 4 + g * 2 + s for s in range(2)] for g in range(2)] for l in range(2)] for t in range(2)]
    placement = [[[0, 1], [0, 1]], [[0, 1], [0, 1]]]
    first = [[[cube[0][l][g][s] + cube[1][l][g][s] for s in range(2)] for g in range(2)] for l in range(2)]
    third = [[[cube[l][g][0][s] + cube[l][g][1][s] for s in range(2)] for g in range(2)] for l in range(2)]
    assert first != third
    assert eplb.slot_load(cube, placement) == first
    assert eplb.slot_load(cube, placement, multi_stage=True) == first
    assert eplb.slot_load(cube, placement, multi_stage=False) == third
    with pytest.raises(ValueError):
        eplb.slot_load([[[1, 2, 3]]], placement)


@pytest.fixture
def hooked():
    """EplbWorker.do_update (both fakes) wrapped by the real handler, through the real wrapper."""
    patch = patches.patch_method(FakeEplbWorker, "do_update", eplb.DoUpdate(), wrappers.SYNC)
    yield
    patch.remove()


def shared_dict(staged=False):
    load = torch.tensor(STAGED_LOAD, dtype=torch.int32) if staged else torch.tensor(LOAD, dtype=torch.int64)
    return {"expert_map": None, "moe_load": load, "expert_maps": torch.tensor(global_maps(OLD_PLACEMENT))}


def eplb_series(metrics):
    """{metric suffix: {labels without dp/role: value}} of every eplb gauge."""
    out = {}
    for name, series in metrics.points().items():
        if name.startswith("vllm_profiling_eplb:") and "duration" not in name:
            out[name[len("vllm_profiling_eplb:") :]] = {
                tuple((k, v) for k, v in key if k not in ("dp", "role")): value for key, value in series.items()
            }
    return out


def expected_series(rank="0"):
    out = {f"expert_hotness:{k}": {(("phase", "all"), ("rank", rank)): v} for k, v in EXPECTED_SUMMARY.items()}
    for name, position in (("expert_hotness:imbalance", 0), ("layer_load:mean", 1), ("layer_load:max", 2)):
        out[name] = {
            (("layer", str(layer)), ("phase", phase), ("rank", rank)): rows[layer][position]
            for phase, rows in EXPECTED_STATS.items()
            for layer in range(2)
        }
    return out


@pytest.mark.parametrize("cls", [FakeEplbWorker, FakeEplbWorkerWithoutHotness], ids=["with-hotness", "without"])
@pytest.mark.parametrize("staged", [False, True], ids=["single-stage", "multi-stage"])
def test_do_update_records_hotness_with_or_without_latest_expert_hotness(metrics, hooked, cls, staged):
    set_process("worker", "1", "decode")
    worker = cls(shared_dict(staged), rank_id=0, new_placement=NEW_PLACEMENT, policy_type=3 if staged else 2)
    result = worker.do_update()
    assert result == [("update info of layer", 0), ("update info of layer", 1)]  # untouched
    if cls is FakeEplbWorker:
        # vllm-ascend's own numbers: NaN for the layer without load, which we report as 1.0
        assert [float(v) for v in worker.latest_expert_hotness["current_imbalance_list"]][0] == 1.5625
        assert np.isnan(worker.latest_expert_hotness["current_imbalance_list"][1])
    else:
        assert not hasattr(worker, "latest_expert_hotness")
    assert eplb_series(metrics) == expected_series()
    points = metrics.points()
    labels = {dict(key)["dp"] + "/" + dict(key)["role"] for series in points.values() for key in series}
    assert labels == {"1/decode"}  # dp / role inherited from the (forked) worker
    assert context.PROCESS.process == "eplb"
    assert metrics.value("vllm_profiling_instrumented_processes", process="eplb", dp="1", role="decode") == 1


def test_both_versions_give_the_same_numbers(metrics, hooked):
    values = []
    for cls in (FakeEplbWorker, FakeEplbWorkerWithoutHotness):
        pipeline.reset(extra_readers=[metrics.reader])
        cls(shared_dict(), rank_id=0, new_placement=NEW_PLACEMENT).do_update()
        values.append(eplb_series(metrics))
    assert values[0] == values[1] == expected_series()


def test_latest_expert_hotness_values_are_the_ones_recorded(metrics, hooked, monkeypatch):
    """With latest_expert_hotness refreshed by the call, its per-layer list of the current placement is what is
    recorded; that of the update is ours, of the placement the cycle stored (vllm-ascend's is of the policy's,
    before EplbWorker.check_expert_placement may put the old one back: tests/contract/test_eplb_real.py)."""
    original = FakeEplbWorker._compute_imbalance

    def doctored(placement, hotness, return_list=False):
        mean, peak, values = original(placement, hotness, return_list=True)
        return mean, peak, [v * 2 for v in values]

    monkeypatch.setattr(FakeEplbWorker, "_compute_imbalance", staticmethod(doctored))
    FakeEplbWorker(shared_dict(), rank_id=0, new_placement=NEW_PLACEMENT).do_update()
    series = eplb_series(metrics)
    assert series["expert_hotness:imbalance"][(("layer", "0"), ("phase", "current"), ("rank", "0"))] == 3.125
    assert series["expert_hotness:current_max"] == {(("phase", "all"), ("rank", "0")): 3.125}
    assert series["expert_hotness:imbalance"][(("layer", "0"), ("phase", "update"), ("rank", "0"))] == 1.25
    assert series["expert_hotness:update_max"] == {(("phase", "all"), ("rank", "0")): 1.25}
    # per-layer loads are always our own
    assert series["layer_load:max"][(("layer", "0"), ("phase", "current"), ("rank", "0"))] == 25.0


def test_second_cycle_starts_from_the_new_placement(metrics, hooked):
    worker = FakeEplbWorkerWithoutHotness(shared_dict(), rank_id=0, new_placement=NEW_PLACEMENT)
    worker.do_update()
    # Next cycle: the placement in use is the new one; same load per expert id as before but laid out on it.
    worker.shared_dict["moe_load"] = torch.tensor([[[10, 10], [2, 10]], [[0, 0], [0, 0]]])
    worker.new_placement = OLD_PLACEMENT
    worker.do_update()
    series = eplb_series(metrics)
    # hotness e0 10, e1 2, e2 20 again: current is now NEW_PLACEMENT (1.25), update OLD_PLACEMENT (1.5625)
    assert series["expert_hotness:imbalance"][(("layer", "0"), ("phase", "current"), ("rank", "0"))] == 1.25
    assert series["expert_hotness:imbalance"][(("layer", "0"), ("phase", "update"), ("rank", "0"))] == 1.5625


def test_other_ranks_and_empty_cycles_record_nothing_but_the_process(metrics, hooked):
    set_process("worker", "0", "mixed")
    FakeEplbWorker(shared_dict(), rank_id=1, new_placement=NEW_PLACEMENT).do_update()
    empty = shared_dict()
    empty["moe_load"] = None
    assert FakeEplbWorker(empty, rank_id=0, new_placement=NEW_PLACEMENT).do_update() is None
    assert eplb_series(metrics) == {}
    assert metrics.value("vllm_profiling_instrumented_processes", process="eplb", dp="0", role="mixed") == 1


def test_own_computation_failing_still_records_vllm_ascends_numbers(metrics, hooked, monkeypatch, caplog):
    def broken(*args):
        raise ValueError("unexpected layout")

    monkeypatch.setattr(eplb, "layer_stats", broken)
    FakeEplbWorker(shared_dict(), rank_id=0, new_placement=NEW_PLACEMENT).do_update()
    expected = expected_series()
    del expected["layer_load:mean"], expected["layer_load:max"]
    assert eplb_series(metrics) == expected
    assert "hotness computation" in caplog.text


def test_vllm_ascends_numbers_unreadable_still_record_ours(metrics, hooked, monkeypatch):
    """latest_expert_hotness of a shape we cannot read (its per-layer imbalances are not numbers): our own
    computation from the maps and the load gives every gauge, the same exact values; the failed read is counted.
    (Before, the failure in reading vllm-ascend's values lost the cycle's gauges, our layer loads included.)"""
    original = FakeEplbWorker._compute_imbalance

    def unreadable(placement, hotness, return_list=False):
        mean, peak, values = original(placement, hotness, return_list=True)
        return mean, peak, [f"{v}" + "?" for v in values]

    monkeypatch.setattr(FakeEplbWorker, "_compute_imbalance", staticmethod(unreadable))
    FakeEplbWorker(shared_dict(), rank_id=0, new_placement=NEW_PLACEMENT).do_update()
    assert eplb_series(metrics) == expected_series()
    assert STATE.failures == {("DoUpdate", "latest_expert_hotness"): 1}


# -- a real forked EPLB process: /metrics and OTLP ------------------------------------------------------


@pytest.fixture
def exported(monkeypatch, tmp_path):
    monkeypatch.delenv(environment.PROMETHEUS_MULTIPROC_DIR, raising=False)
    monkeypatch.setenv(environment.FILES_DIR, str(tmp_path))
    monkeypatch.setenv(environment.METRICS_EXPORTER, "otlp_proto_http")
    monkeypatch.setenv(environment.METRIC_EXPORT_INTERVAL, "3600000")  # only explicit flushes / exit
    monkeypatch.setenv(environment.PROMETHEUS_INTERVAL_MS, "3600000")
    saved = (context.PROCESS.process, context.PROCESS.dp, context.PROCESS.role)
    with Receiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", receiver.endpoint)
        pipeline.reset()
        set_process("worker", "0", "mixed")
        yield str(tmp_path), receiver
        pipeline.reset()
    set_process(*saved)


def _eplb_process(worker, planner_q, block_update_q, done):
    """EplbProcess.worker_process, one cycle; stays alive (live gauges) until the parent has scraped."""
    planner_q.get()
    packed_update_info = worker.do_update()
    recording.flush()  # what the periodic files reader does within its interval
    block_update_q.put(packed_update_info)
    done.wait(60)


def test_forked_eplb_process_exports_its_gauges_once(exported, hooked):
    files_dir, receiver = exported
    recording.process_started()  # the NPU worker: its pipeline exists before the fork
    recording.flush()
    mp = multiprocessing.get_context("fork")  # EplbProcess._launch_process: the default context, fork
    manager = mp.Manager()
    try:
        shared = manager.dict(shared_dict())
        worker = FakeEplbWorker(shared, rank_id=0, new_placement=NEW_PLACEMENT)  # built in the NPU worker
        planner_q, block_update_q, done = mp.Queue(), mp.Queue(), mp.Event()
        child = mp.Process(target=_eplb_process, args=(worker, planner_q, block_update_q, done), daemon=True)
        child.start()
        planner_q.put(1)
        assert block_update_q.get(timeout=60) == [("update info of layer", 0), ("update info of layer", 1)]
        text = exposition(files_dir)
        done.set()
        child.join(60)
        assert child.exitcode == 0
    finally:
        manager.shutdown()

    lines = sample_lines(text, "vllm_profiling_eplb:")
    assert lines == sorted(
        [
            f'vllm_profiling_eplb:expert_hotness:{k}{{dp="0",phase="all",rank="0",role="mixed"}} {v}'
            for k, v in EXPECTED_SUMMARY.items()
        ]
        + [
            f'vllm_profiling_eplb:{name}{{dp="0",layer="{layer}",phase="{phase}",rank="0",role="mixed"}} '
            f"{float(EXPECTED_STATS[phase][layer][position])}"
            for name, position in (("expert_hotness:imbalance", 0), ("layer_load:mean", 1), ("layer_load:max", 2))
            for phase in ("current", "update")
            for layer in (0, 1)
        ]
    )
    assert len(lines) == len({line.rsplit(" ", 1)[0] for line in lines})  # one series per label set
    assert sample_lines(text, "vllm_profiling_instrumented_processes") == [
        'vllm_profiling_instrumented_processes{dp="0",process="eplb",role="mixed"} 1.0',
        'vllm_profiling_instrumented_processes{dp="0",process="worker",role="mixed"} 1.0',
    ]
    files = {f.rsplit("otel-", 1)[1][:-3] for f in os.listdir(files_dir)}
    assert files == {str(os.getpid())}  # the EPLB process exited: its (live) gauge files are gone
    assert "vllm_profiling_eplb:" not in exposition(files_dir)

    # OTLP: the child's own resource, its gauges only there.
    recording.flush()
    resources = {r["process.pid"]: r for r in receiver.resources()}
    assert set(resources) == {os.getpid(), child.pid}
    assert resources[child.pid]["vllm.process.role"] == "eplb"
    assert resources[os.getpid()]["vllm.process.role"] == "worker"
    assert resources[child.pid]["service.instance.id"] != resources[os.getpid()]["service.instance.id"]
    points = receiver.points("vllm_profiling_eplb:expert_hotness:current_max")
    assert {(p[0]["process.pid"], tuple(sorted(p[1].items())), p[2]) for p in points} == {
        (child.pid, (("dp", "0"), ("phase", "all"), ("rank", "0"), ("role", "mixed")), 1.5625)
    }
    imbalance = receiver.points("vllm_profiling_eplb:expert_hotness:imbalance")
    assert {p[0]["process.pid"] for p in imbalance} == {child.pid}
    assert {(p[1]["layer"], p[1]["phase"], p[2]) for p in imbalance} == {
        ("0", "current", 1.5625),
        ("1", "current", 1.0),
        ("0", "update", 1.25),
        ("1", "update", 1.0),
    }


# -- applying a new placement: the transfer timers ------------------------------------------------------


@pytest.fixture
def transfer_hooks():
    installed = [
        patches.patch_method(FakeLoader, "update_expert_map_and_weight", eplb.UpdateExpertMapAndWeight(), wrappers.SYNC)
    ]
    for method in ("do_update_expert_map", "do_update_log2phy_map", "do_update_expert_weight"):
        handler = handler_of(f"vllm_ascend.eplb.adaptor.vllm_adaptor:VllmEplbAdaptor.{method}")
        installed.append(patches.patch_method(FakeAdaptor, method, handler, wrappers.SYNC_TIMER))
    yield
    for patch in installed:
        patch.remove()


class Req:
    def __init__(self):
        self.waited = 0

    def wait(self):
        self.waited += 1


def counts(metrics):
    out = {}
    for name in ("expert_weight_update", "expert_map_update", "log2phy_map_update", "expert_weight_replace"):
        series = metrics.points().get(f"vllm_profiling_eplb:{name}:duration", {})
        out[name] = {tuple(v for _, v in key): point[0] for key, point in series.items()}
    return out


def test_transfer_timer_records_only_calls_that_did_work(metrics, transfer_hooks):
    set_process("worker", "3", "prefill")
    adaptor = FakeAdaptor()
    loader = FakeLoader(adaptor)
    for state in (ExpertWeightUpdateState.WAITING, ExpertWeightUpdateState.READY):
        loader.state = state
        assert loader.update_expert_map_and_weight([Req()]) is None
    assert adaptor.calls == []
    assert all(not c for c in counts(metrics).values())

    loader.state = ExpertWeightUpdateState.TRANSFERRING
    loader.layer_id = 1
    loader.recv_expert_list = [(0, 0), (1, 1)]
    reqs = [Req(), Req()]
    loader.update_expert_map_and_weight(reqs)
    assert [r.waited for r in reqs] == [1, 1]
    assert adaptor.calls == [("map", 1), ("log2phy", 1), ("weight", 1, 0, 0), ("weight", 1, 1, 1)]
    assert loader.state is ExpertWeightUpdateState.WAITING
    loader.update_expert_map_and_weight(reqs)  # the following steps: nothing to do, not recorded
    labels = ("3", "all", "prefill")  # dp, phase, role (sorted by label name)
    assert counts(metrics) == {
        "expert_weight_update": {labels: 1},
        "expert_map_update": {labels: 1},
        "log2phy_map_update": {labels: 1},
        "expert_weight_replace": {labels: 2},
    }
    (point,) = metrics.points()["vllm_profiling_eplb:expert_weight_update:duration"].values()
    assert point[1] > 0


def test_catalogue_and_targets_rows():
    from opentelemetry_instrumentation_vllm_ascend import targets

    rows = {t.symbol: t for t in targets.TARGETS if t.module.startswith("vllm_ascend.eplb")}
    assert set(rows) == {
        "vllm_ascend.eplb.core.eplb_worker:EplbWorker.do_update",
        "vllm_ascend.eplb.core.eplb_device_transfer_loader:D2DExpertWeightLoader.update_expert_map_and_weight",
        "vllm_ascend.eplb.adaptor.vllm_adaptor:VllmEplbAdaptor.do_update_expert_map",
        "vllm_ascend.eplb.adaptor.vllm_adaptor:VllmEplbAdaptor.do_update_log2phy_map",
        "vllm_ascend.eplb.adaptor.vllm_adaptor:VllmEplbAdaptor.do_update_expert_weight",
    }
    for row in rows.values():
        assert row.vllm_ascend == ">=0.23.0"
        handler = declarative.load_handler(row)
        assert handler.name == row.qualname
        for seed in row.feeds:
            assert seed in catalogue.BY_SEED
    fed = {seed for row in rows.values() for seed in row.feeds}
    assert {s.seed for s in catalogue.CATALOGUE if s.seed.startswith("eplb:")} <= fed
