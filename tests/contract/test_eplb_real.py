"""vllm-ascend's EPLB on its real code: its ``EplbWorker`` and policy classes (``vllm_ascend/eplb/core/policy/``,
picked by its ``PolicyFactory``) from the sdists of 0.30.0rc2 (over vLLM 0.30.0's sdist ``vllm/``) and 0.23.0.post1
(over vLLM 0.23.0's), run on CPU tensors in a subprocess with the package instrumented
(tests/support/eplb_real_drive.py, which names the stand-ins: an empty ``torch_npu``, the EP group's rank, and
where one is not installed ``numba`` / ``scipy`` for FlashLB's module only). One EPLB cycle
(``EplbWorker.do_update``) per load; our hotness / imbalance gauges per MoE layer and placement (``phase`` current
/ update), their summaries over layers, and the per-layer rank loads equal the values worked out by hand below
from the same tensors.

Policies driven: DefaultEplb (1), RandomLoadBalance (0) and, on 0.30.0rc2 where numba and scipy are installed
(vLLM brings numba, the ``test`` extra scipy), FlashLB (3, the multi-stage one: its load has a stage axis). Not
driven: SwiftBalanceEplb (2; its constructor calls ``torch.npu.device_count()``)."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from tests.support.source_archives import importable, importable_ascend  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DRIVER = os.path.join(ROOT, "tests", "support", "eplb_real_drive.py")
#: vllm-ascend release -> the vLLM release it runs on.
RELEASES = {"0.30.0rc2": "0.30.0", "0.23.0.post1": "0.23.0"}


def global_maps(placement, num_experts):
    """Placement ``[L][ep][slot] = logical expert`` -> vllm-ascend's global expert maps ``[L][ep][logical] = slot``
    (-1 where the rank does not hold the expert): the tensor ``shared_dict["expert_maps"]`` holds."""
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


# -- the cases, worked out by hand ----------------------------------------------------------------------
# The load is per slot: moe_load[layer][rank][slot], tokens routed to the expert in that slot. An expert's
# hotness is the sum over the slots holding it; a rank's load is the sum over its slots of hotness / replicas;
# imbalance = max / mean of the rank loads.
#
# "default": DefaultEplb (policy 1), 2 layers x 4 experts x 2 ranks x 2 slots, no replica.
#   Layer 0: placement rank 0 [e0, e1], rank 1 [e2, e3]; load [[8, 6], [1, 1]]
#     -> hotness e0 8, e1 6, e2 1, e3 1; current rank loads 8 + 6 = 14, 1 + 1 = 2: mean 8, max 14, 14 / 8 = 1.75.
#     DefaultEplb packs by falling hotness, each expert to the lightest rank with room: e0 -> rank 0, e1 -> rank 1,
#     e3 (the stable sort reversed puts e3 before e2) -> rank 1 (6 < 8), e2 -> rank 0 (rank 1 full); experts it
#     keeps stay in their slot: rank 0 [e0, e2], rank 1 [e1, e3].
#     update rank loads 8 + 1 = 9, 6 + 1 = 7: mean 8, max 9, 9 / 8 = 1.125.
#   Layer 1: placement rank 0 [e0, e2], rank 1 [e1, e3]; load [[3, 5], [2, 2]]
#     -> hotness e0 3, e1 2, e2 5, e3 2; current 3 + 5 = 8, 2 + 2 = 4: mean 6, max 8, 8 / 6.
#     packing: e2 -> rank 0, e0 -> rank 1, e3 -> rank 1 (3 < 5), e1 -> rank 0 (rank 1 full); e2 keeps slot 1 of
#     rank 0, e3 slot 1 of rank 1: rank 0 [e1, e2], rank 1 [e0, e3].
#     update 2 + 5 = 7, 3 + 2 = 5: mean 6, max 7, 7 / 6.
#   Summaries over the 2 layers: current mean (14/8 + 8/6) / 2, max 14/8; update mean (9/8 + 7/6) / 2, max 7/6.
DEFAULT_OLD = [[[0, 1], [2, 3]], [[0, 2], [1, 3]]]
DEFAULT_NEW = [[[0, 2], [1, 3]], [[1, 2], [0, 3]]]
DEFAULT_LOAD = [[[8, 6], [1, 1]], [[3, 5], [2, 2]]]
DEFAULT_EXPECTED = {
    # phase -> per layer (imbalance, rank-load mean, rank-load max)
    "current": [(14 / 8, 8.0, 14.0), (8 / 6, 6.0, 8.0)],
    "update": [(9 / 8, 8.0, 9.0), (7 / 6, 6.0, 7.0)],
}

# "replicated": DefaultEplb (policy 1), 1 layer x 3 experts x 2 ranks x 2 slots, one redundant slot.
#   placement rank 0 [e0, e1], rank 1 [e0, e2] (e0 twice); load [[4, 2], [6, 20]]
#     -> hotness e0 4 + 6 = 10, e1 2, e2 20; current: e0 counts 10 / 2 = 5 per replica: rank loads 5 + 2 = 7,
#     5 + 20 = 25: mean 16, max 25, 25 / 16 = 1.5625.
#   DefaultEplb gives the redundant slot to the hottest expert, e2 (its weight halves to 10), puts that replica on
#   rank 0, then e0 (10) -> rank 1, the other e2 -> rank 1 (rank 0 holds e2), e1 -> rank 0; kept slots stay:
#   rank 0 [e2, e1], rank 1 [e0, e2].
#   update: e2 counts 20 / 2 = 10 per replica: rank loads 10 + 2 = 12, 10 + 10 = 20: mean 16, max 20, 20 / 16.
REPLICATED_OLD = [[[0, 1], [0, 2]]]
REPLICATED_NEW = [[[2, 1], [0, 2]]]
REPLICATED_LOAD = [[[4, 2], [6, 20]]]
REPLICATED_EXPECTED = {"current": [(25 / 16, 16.0, 25.0)], "update": [(20 / 16, 16.0, 20.0)]}

# "random": RandomLoadBalance (policy 0), 1 layer x 8 experts x 4 ranks x 2 slots: it swaps the last slot of
#   ranks 3 and 1. placement [e0, e1], [e2, e3], [e4, e5], [e6, e7]; load [[1, 1], [5, 5], [1, 1], [1, 0]]
#     -> hotness e0 1, e1 1, e2 5, e3 5, e4 1, e5 1, e6 1, e7 0; current rank loads 2, 10, 2, 1: mean 15 / 4,
#     max 10, 10 / 3.75.
#   new placement [e0, e1], [e2, e7], [e4, e5], [e6, e3]: rank loads 2, 5 + 0 = 5, 2, 1 + 5 = 6: mean 3.75, max 6,
#   6 / 3.75 = 1.6.
RANDOM_OLD = [[[0, 1], [2, 3], [4, 5], [6, 7]]]
RANDOM_NEW = [[[0, 1], [2, 7], [4, 5], [6, 3]]]
RANDOM_LOAD = [[[1, 1], [5, 5], [1, 1], [1, 0]]]
RANDOM_EXPECTED = {"current": [(10 / 3.75, 3.75, 10.0)], "update": [(6 / 3.75, 3.75, 6.0)]}

# "rejected": RandomLoadBalance (policy 0), 1 layer x 7 experts x 4 ranks x 2 slots, e3 on ranks 1 and 3.
#   placement [e0, e1], [e2, e3], [e4, e5], [e3, e6]; load [[1, 1], [2, 4], [1, 1], [4, 1]]
#     -> hotness e0 1, e1 1, e2 2, e3 4 + 4 = 8, e4 1, e5 1, e6 1; current: e3 counts 8 / 2 = 4 per replica: rank
#     loads 2, 2 + 4 = 6, 2, 4 + 1 = 5: mean 15 / 4 = 3.75, max 6, 6 / 3.75 = 1.6.
#   The swap of the last slots of ranks 3 and 1 gives rank 1 [e2, e6] and rank 3 [e3, e3]: e3 twice on one rank, so
#   EplbWorker.check_expert_placement keeps the layer's old placement. The update is the current placement: 1.6.
#   (vllm-ascend's own update list is of the rejected placement: rank loads 2, 2 + 1 = 3, 2, 4 + 4 = 8: 8 / 3.75.)
REJECTED_OLD = [[[0, 1], [2, 3], [4, 5], [3, 6]]]
REJECTED_LOAD = [[[1, 1], [2, 4], [1, 1], [4, 1]]]
REJECTED_EXPECTED = {"current": [(6 / 3.75, 3.75, 6.0)], "update": [(6 / 3.75, 3.75, 6.0)]}
#: vllm-ascend's own update imbalance list where it differs from the stored placement's (what we record)
VLLM_ASCEND_UPDATE = {"rejected": [8 / 3.75]}

# "replicated", second cycle: the placement in use is the one the first cycle computed, rank 0 [e2, e1],
#   rank 1 [e0, e2]; load [[5, 3], [7, 5]] -> hotness e2 5 + 5 = 10, e1 3, e0 7; current: e2 counts 5 per replica:
#   rank loads 5 + 3 = 8, 7 + 5 = 12: mean 10, max 12, 12 / 10 = 1.2. (Read on the first placement instead, the
#   same slots would give e0 12, e1 3, e2 5: rank loads 9 and 11.)
#   DefaultEplb replicates e2 again (10 -> 5), that replica to rank 0, then e0 (7) -> rank 1, e2 -> rank 1, e1 ->
#   rank 0: the same placement, so update = current.
REPLICATED_NEXT_LOAD = [[[5, 3], [7, 5]]]
REPLICATED_NEXT_EXPECTED = {"current": [(12 / 10, 10.0, 12.0)], "update": [(12 / 10, 10.0, 12.0)]}

# "flashlb": FlashLB (policy 3, the multi-stage one), the "default" case's placement and load collected over 3
#   stages: moe_load[stage][layer][rank][slot], summing over the stages to DEFAULT_LOAD (layer 0 [[8, 6], [1, 1]] =
#   [[4, 2], [1, 0]] + [[4, 4], [0, 1]] + [[0, 0], [0, 0]]; layer 1 [[3, 5], [2, 2]] = [[1, 2], [1, 1]] +
#   [[1, 2], [0, 1]] + [[1, 1], [1, 0]]). Hotness and current as in "default". FlashLB searches for the most
#   balanced placement; 2 experts a rank, the splits are few: layer 0 (hotness 8, 6, 1, 1): {e0, e1} | {e2, e3}
#   14 / 2, {e0, e2 or e3} | {e1, the other} 9 / 7 (best); layer 1 (3, 2, 5, 2): {e2, e0} | {e1, e3} 8 / 4,
#   {e2, e1 or e3} | {e0, the other} 7 / 5 (best). So update is "default"'s, whichever of the two best it picks.
FLASHLB_LOAD = [
    [[[4, 2], [1, 0]], [[1, 2], [1, 1]]],
    [[[4, 4], [0, 1]], [[1, 2], [0, 1]]],
    [[[0, 0], [0, 0]], [[1, 1], [1, 0]]],
]
FLASHLB_BEST = [  # per layer, the best splits as (rank 0's experts, rank 1's), either way round
    [({0, 2}, {1, 3}), ({0, 3}, {1, 2})],
    [({1, 2}, {0, 3}), ({2, 3}, {0, 1})],
]
#: FlashLB runs where numba (vLLM's dependency) and scipy (the ``test`` extra's) are installed.
FLASHLB = all(importlib.util.find_spec(name) is not None for name in ("numba", "scipy"))

#: name -> (policy_type, EP rank, first placement, logical experts, per cycle: (load, new placement, expected));
#: a new placement of None: one of FLASHLB_BEST.
CASES = {
    "default": (1, 0, DEFAULT_OLD, 4, [(DEFAULT_LOAD, DEFAULT_NEW, DEFAULT_EXPECTED)]),
    "replicated": (
        1,
        0,
        REPLICATED_OLD,
        3,
        [
            (REPLICATED_LOAD, REPLICATED_NEW, REPLICATED_EXPECTED),
            (REPLICATED_NEXT_LOAD, REPLICATED_NEW, REPLICATED_NEXT_EXPECTED),
        ],
    ),
    "random": (0, 0, RANDOM_OLD, 8, [(RANDOM_LOAD, RANDOM_NEW, RANDOM_EXPECTED)]),
    "rejected": (0, 0, REJECTED_OLD, 7, [(REJECTED_LOAD, REJECTED_OLD, REJECTED_EXPECTED)]),
    # EP rank 1: vllm-ascend computes no hotness there, nor do we record any (rank 0 records the global values)
    "rank-1": (1, 1, DEFAULT_OLD, 4, [(DEFAULT_LOAD, DEFAULT_NEW, None)]),
    "flashlb": (3, 0, DEFAULT_OLD, 4, [(FLASHLB_LOAD, None, DEFAULT_EXPECTED)]),
}
POLICY_CLASS = {0: "RandomLoadBalance", 1: "DefaultEplb", 3: "FlashLB"}
#: The cases each release runs: FlashLB's warm-up (vllm-ascend's, on 58 layers x 100 stages) costs seconds, so on
#: 0.30.0rc2 only (0.23.0.post1's policy_flashlb.py differs in one lambda made a function).
PAIRS = [(ascend, name) for ascend in RELEASES for name, case in CASES.items() if case[0] != 3 or ascend == "0.30.0rc2"]
DRIVEN = {
    ascend: [name for a, name in PAIRS if a == ascend and (FLASHLB or CASES[name][0] != 3)] for ascend in RELEASES
}


def summaries(expected):
    """The cycle's summary gauges by hand: per placement, the mean and the max over layers of the imbalance."""
    out = {}
    for phase, rows in expected.items():
        values = [row[0] for row in rows]
        out[f"{phase}_mean"] = sum(values) / len(values)
        out[f"{phase}_max"] = max(values)
    return out


def test_hand_summaries_of_the_default_case():
    assert summaries(DEFAULT_EXPECTED) == pytest.approx(
        {
            "current_mean": (1.75 + 4 / 3) / 2,
            "current_max": 1.75,
            "update_mean": (1.125 + 7 / 6) / 2,
            "update_max": 7 / 6,
        }
    )


# -- the real code, in subprocesses -------------------------------------------------------------------------


def _cases_json(ascend: str) -> str:
    return json.dumps(
        [
            {
                "policy_type": policy,
                "rank": rank,
                "expert_maps": global_maps(old, experts),
                "moe_loads": [load for load, _new, _expected in cycles],
            }
            for policy, rank, old, experts, cycles in (CASES[name] for name in DRIVEN[ascend])
        ]
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both releases' drives, run side by side: {vllm-ascend version: the driver's RESULT, its cases by name}."""
    stubs = tmp_path_factory.mktemp("stubs")
    (stubs / "torch_npu").mkdir()
    (stubs / "torch_npu" / "__init__.py").write_text("")  # empty: imported, never used (eplb_real_drive.py)
    procs = {}
    for ascend, vllm in RELEASES.items():
        path = [importable(vllm), importable_ascend(ascend), str(stubs), ROOT]
        path += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]  # where scipy may be
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "VLLM_NO_USAGE_STATS": "1", "VLLM_PLUGINS": ""}
        procs[ascend] = subprocess.Popen(
            [sys.executable, DRIVER, _cases_json(ascend)],
            env=env,
            cwd=path[1],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    out = {}
    for ascend, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, stderr[-4000:]
        out[ascend] = result = json.loads(lines[-1][len("RESULT ") :])
        result["cases"] = dict(zip(DRIVEN[ascend], result["cases"], strict=True))
    return out


def gauges(points):
    """{metric suffix: {(phase, layer or None): value}} of the eplb gauges, checking dp / role / rank."""
    out: dict = {}
    for name, series in points.items():
        if not name.startswith("vllm_profiling_eplb:"):
            continue
        for attrs, value in series:
            assert (attrs.pop("dp"), attrs.pop("role"), attrs.pop("rank")) == ("0", "mixed", "0")
            key = (attrs.pop("phase"), attrs.pop("layer", None))
            assert not attrs
            out.setdefault(name[len("vllm_profiling_eplb:") :], {})[key] = value
    return out


def expected_gauges(expected):
    out: dict = {
        f"expert_hotness:{k}": {("all", None): pytest.approx(v, rel=1e-12)} for k, v in summaries(expected).items()
    }
    for name, position in (("expert_hotness:imbalance", 0), ("layer_load:mean", 1), ("layer_load:max", 2)):
        out[name] = {
            (phase, str(layer)): row[position] for phase, rows in expected.items() for layer, row in enumerate(rows)
        }
    return out


@pytest.mark.parametrize("ascend", list(RELEASES))
def test_the_real_eplb_rows_resolve(runs, ascend):
    result = runs[ascend]
    assert result["vllm"].startswith(RELEASES[ascend])
    assert f"vllm_ascend-{ascend}" in result["vllm_ascend_file"]
    assert result["status"] and set(result["status"].values()) == {"resolved"}, result["status"]
    assert result["failures"] == []


@pytest.mark.parametrize(("ascend", "case"), PAIRS)
def test_eplb_gauges_equal_the_hand_computation(runs, ascend, case):
    policy, _rank, placement, _experts, cycles = CASES[case]
    if case not in DRIVEN[ascend]:
        pytest.skip("FlashLB needs numba and scipy (vLLM brings numba, the test extra scipy)")
    got = runs[ascend]["cases"][case]
    assert got["policy"] == POLICY_CLASS[policy]
    assert len(got["cycles"]) == len(cycles)
    for cycle, (_load, new, expected) in zip(got["cycles"], cycles):
        # the real policy placed the experts as worked out by hand, and the cycle produced one update per layer
        assert cycle["old_placement"] == placement
        if new is None:  # FlashLB: one of the best splits, each kept expert in its slot (vllm-ascend checks that)
            new = cycle["new_placement"]
            for layer, best in zip(new, FLASHLB_BEST, strict=True):
                assert tuple(set(rank) for rank in layer) in best + [tuple(reversed(split)) for split in best]
        assert cycle["new_placement"] == new
        assert cycle["layers_packed"] == len(placement)
        placement = new
        if expected is None:  # EP rank 1
            assert cycle["latest_expert_hotness"] is None
            assert gauges(cycle["points"]) == {}
            continue
        assert gauges(cycle["points"]) == expected_gauges(expected)
        # vllm-ascend's own numbers (what the current imbalance gauges carry; its update list is of the policy's
        # placement, before EplbWorker's check) and our own arithmetic on the same tensors (what the layer loads and
        # the update imbalances carry) agree with the hand values
        hotness = cycle["latest_expert_hotness"]
        for phase, rows in expected.items():
            values = [row[0] for row in rows]
            if phase == "update" and case in VLLM_ASCEND_UPDATE:
                values = VLLM_ASCEND_UPDATE[case]
            assert hotness[f"{phase}_imbalance_list"] == values
            assert hotness[f"{phase}_mean"] == pytest.approx(sum(values) / len(values), rel=1e-12)
            assert hotness[f"{phase}_max"] == max(values)
        assert {phase: [tuple(row) for row in rows] for phase, rows in cycle["layer_stats"].items()} == expected
