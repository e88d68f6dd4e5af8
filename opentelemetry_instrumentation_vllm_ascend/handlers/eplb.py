"""vllm-ascend dynamic EPLB (expert-parallel load balancing): expert hotness and imbalance, and the
durations of applying a new expert placement.

Where things run (vllm-ascend 0.23.0.post1 and 0.30.0rc2: the same ``eplb_worker.py``):

- Each NPU worker forks an EPLB process (``EplbProcess._launch_process``, multiprocessing's default
  context: fork). Once per EPLB cycle the worker all-gathers the expert load into
  ``shared_dict["moe_load"]`` and wakes the process, which calls ``EplbWorker.do_update()``: it turns
  the current global expert maps (``old_expert_maps``, or ``shared_dict["expert_maps"]`` the first
  time) into a placement, asks the policy for a new one and stores the new maps in
  ``old_expert_maps``. Only EP rank 0 (``rank_id == 0``) also computes hotness and imbalance
  (``latest_expert_hotness``, vllm-ascend >= 0.21).
- The workers then apply the new placement one MoE layer per step:
  ``D2DExpertWeightLoader.update_expert_map_and_weight`` (called on those steps, a no-op unless its
  ``state`` is TRANSFERRING) calls ``VllmEplbAdaptor.do_update_expert_map`` / ``do_update_log2phy_map`` /
  ``do_update_expert_weight``.

Who records the hotness gauges: the EPLB process of EP rank 0 only. The data is global (the load is
all-gathered over the EP group, the maps cover every rank), so every rank would record the same values;
rank 0 is the one vllm-ascend computes on, and the incumbent's ``rank`` label is kept (it is the EP rank,
``rank_id``). Every EPLB process claims the process kind ``eplb`` (``instrumented_processes``), keeping
the dp / role it inherited from its worker.

The numbers: for the current placement, vllm-ascend's own per-layer imbalance list when the call refreshed
``latest_expert_hotness``, otherwise our own computation from the gathered load and the old / new placements (the
same arithmetic, below; tests/contract/test_eplb_real.py checks both against hand-computed values on vllm-ascend's
real policies). For the update, ours wherever we computed it: vllm-ascend computes its update list on the policy's
placement *before* ``check_expert_placement``, which keeps a layer's old placement where the policy's is invalid
(an expert twice on one rank, an expert lost, an expert moved inside a rank), so its number can describe a
placement that is never applied; ours is of the maps the cycle stored. Per-layer loads (``eplb:layer_load:*``)
always come from our computation. A layer without any load has imbalance 1.0 (every rank carries the same, zero,
load; vllm-ascend's own value is NaN there).
"""

from __future__ import annotations

from time import perf_counter

from .. import catalogue, context, recording
from ..hooks.handler import Handler, report

_M = catalogue.M
_ALL = catalogue.ALL
PHASES = catalogue.EPLB_PLACEMENTS  # placement before / after the rebalance (label ``phase`` of the layer gauges)


# -- arithmetic (plain Python, on anything with .tolist() or nested lists) -------------------------


def nested(value):
    """A torch tensor / numpy array as nested lists (lists pass through)."""
    tolist = getattr(value, "tolist", None)
    return tolist() if tolist is not None else value


def _shape(value) -> tuple:
    dims = []
    while isinstance(value, (list, tuple)):
        dims.append(len(value))
        if not value:
            break
        value = value[0]
    return tuple(dims)


def local_placement(expert_maps) -> list:
    """Global expert maps ``[L][ep][num_logical]`` (the local slot of each logical expert on each rank,
    -1 where absent) → placement ``[L][ep][E_local]``: the logical expert in each slot (-1: empty).
    ``E_local`` is the largest slot + 1, as ``EplbWorker`` takes it."""
    maps = nested(expert_maps)
    slots = 1 + max((slot for layer in maps for rank in layer for slot in rank), default=-1)
    placement = []
    for layer in maps:
        ranks = []
        for rank in layer:
            row = [-1] * slots
            for expert, slot in enumerate(rank):
                if slot >= 0:
                    row[slot] = expert
            ranks.append(row)
        placement.append(ranks)
    return placement


def slot_load(load, placement, multi_stage=None) -> list:
    """The gathered load as ``[L][ep][E_local]`` (per slot), summing a multi-stage load over its stages:
    ``[T, L, ep, E_local]`` (vllm-ascend's layout with ``multi_stage``) or, unpermuted, ``[L, ep, T, E_local]``.
    Raises ValueError when the shape matches neither the placement nor these."""
    load = nested(load)
    shape = _shape(load)
    want = _shape(placement)[:3]
    if shape == want:
        return load
    if len(shape) == 4:
        staged_first = shape[1:] == want
        staged_third = (shape[0], shape[1], shape[3]) == want
        if staged_first and (not staged_third or multi_stage is not False):
            return [
                [
                    [_total([stage[layer][rank][slot] for stage in load]) for slot in range(want[2])]
                    for rank in range(want[1])
                ]
                for layer in range(want[0])
            ]
        if staged_third:
            return [
                [[_total([stages[t][slot] for t in range(shape[2])]) for slot in range(want[2])] for stages in layer]
                for layer in load
            ]
    raise ValueError(f"moe_load of shape {shape} does not match the expert placement {want}")


def _total(values) -> float:
    """Left-to-right sum (what numpy's sum gives for short rows and Python's sum over numpy scalars)."""
    total = 0
    for v in values:
        total = total + v
    return total


def expert_hotness(placement, load) -> list:
    """Per layer, {logical expert: load summed over the slots holding it} (``EplbWorker._calculate_hotness``)."""
    hotness = []
    for layer_placement, layer_load in zip(placement, load):
        hot: dict = {}
        for rank_placement, rank_load in zip(layer_placement, layer_load):
            for expert, value in zip(rank_placement, rank_load):
                if expert >= 0:
                    hot[expert] = hot.get(expert, 0) + value
        hotness.append(hot)
    return hotness


def rank_loads(layer_placement, layer_hotness: dict) -> list:
    """Per EP rank: the sum over its slots of the expert's hotness divided by the expert's replica count
    (``EplbWorker._compute_imbalance``'s stage load)."""
    replicas: dict = {}
    for rank in layer_placement:
        for expert in rank:
            if expert >= 0:
                replicas[expert] = replicas.get(expert, 0) + 1
    return [_total([layer_hotness.get(e, 0) / replicas[e] for e in rank if e >= 0]) for rank in layer_placement]


def imbalance(loads) -> float:
    """max / mean of the per-rank loads; 1.0 for a layer without load (no division by zero)."""
    mean = _total(loads) / len(loads)
    if not mean > 0:
        return 1.0
    return max(loads) / mean


def mean_max(values) -> tuple:
    return _total(values) / len(values), max(values)


def layer_stats(load, old_maps, new_maps, multi_stage=None) -> dict:
    """``{"current" | "update": [(imbalance, load mean, load max) per MoE layer]}``: hotness from the
    load and the placement it was collected on (old maps), evaluated on the old and the new placement."""
    old = local_placement(old_maps)
    new = local_placement(new_maps)
    hotness = expert_hotness(old, slot_load(load, old, multi_stage))
    out = {}
    for phase, placement in zip(PHASES, (old, new), strict=True):
        rows = []
        for layer_placement, layer_hotness in zip(placement, hotness):
            loads = rank_loads(layer_placement, layer_hotness)
            mean, peak = mean_max(loads)
            rows.append((imbalance(loads), float(mean), float(peak)))
        out[phase] = rows
    return out


def _finite(value) -> float:
    value = float(value)
    return 1.0 if value != value else value  # vllm-ascend's 0/0 for a layer without load


# -- handlers ------------------------------------------------------------------------------------------


class DoUpdate(Handler):
    """``EplbWorker.do_update`` (EPLB process): claims the process, then, on EP rank 0, records the
    cycle's hotness / imbalance gauges."""

    reads_args = 1

    def before(self, args, kwargs):
        if context.PROCESS.process != "eplb":
            context.claim("eplb")  # dp / role stay those inherited from the forked worker
            recording.process_started()
        worker = args[0]
        if worker.rank_id != 0:
            return None
        # Two independent sources: our computation from the maps and the gathered load, and vllm-ascend's own
        # latest_expert_hotness. A read of one that fails (reported) leaves the other's gauges.
        try:
            shared = worker.shared_dict
            old_maps = worker.old_expert_maps
            if old_maps is None:  # first cycle: do_update reads the same entry
                old_maps = shared.get("expert_maps")
            load = shared.get("moe_load")
        except Exception:
            report(self, "expert maps")
            old_maps = load = None
        return old_maps, load, getattr(worker, "latest_expert_hotness", None)

    def after(self, state, args, kwargs, result):
        if state is None or result is None:  # not rank 0, or no load yet (nothing computed)
            return
        worker = args[0]
        old_maps, load, previous = state
        stats = None
        if old_maps is not None and load is not None:
            try:
                stats = layer_stats(load, old_maps, worker.old_expert_maps, getattr(worker, "multi_stage", None))
            except Exception:
                report(self, "hotness computation")
        latest = getattr(worker, "latest_expert_hotness", None)
        if latest is previous:
            latest = None  # not refreshed by this call
        record_cycle("0", stats, latest, self)  # rank 0 only (before)


class _Cycle:
    name = "EplbWorker.do_update"


_STORED = PHASES[1]  # "update": the placement the cycle computed and stored


def record_cycle(rank: str, stats, latest=None, handler=_Cycle) -> None:
    """Set the gauges of one EPLB cycle from ``layer_stats`` output and/or vllm-ascend's
    ``latest_expert_hotness`` (its per-layer imbalance list of the current placement takes precedence; that of the
    update is ours where we computed it: vllm-ascend evaluates the policy's placement before
    ``EplbWorker.check_expert_placement``, which puts a layer's old placement back where the policy's is invalid).
    vllm-ascend's values that cannot be read are reported (``handler``'s failure in ``latest_expert_hotness``):
    ours are used instead."""
    ctx = context.PROCESS
    dp, role = ctx.dp, ctx.role
    imbalances = {}
    if latest is not None:
        try:
            if all(f"{p}_imbalance_list" in latest for p in PHASES):
                imbalances = {p: [_finite(v) for v in latest[f"{p}_imbalance_list"]] for p in PHASES}
        except Exception:
            report(handler, "latest_expert_hotness")
            latest = None
    if stats is not None:
        ours = {p: [row[0] for row in stats[p]] for p in PHASES}
        if not imbalances:
            imbalances = ours
        else:  # the placement the cycle stored: vllm-ascend's list is of the policy's, before its check (above)
            imbalances[_STORED] = ours[_STORED]
    set_gauge = recording.set_gauge
    scalar_labels = (dp, role, _ALL, rank)
    if all(imbalances.get(p) for p in PHASES):
        for phase in PHASES:
            values = imbalances[phase]
            mean, peak = mean_max(values)
            set_gauge(_M[catalogue.eplb_hotness_seed(phase, "mean")], mean, scalar_labels)
            set_gauge(_M[catalogue.eplb_hotness_seed(phase, "max")], peak, scalar_labels)
            spec = _M["eplb:expert_hotness:imbalance"]
            for layer, value in enumerate(values):
                set_gauge(spec, value, (dp, role, phase, rank, str(layer)))
    elif latest is not None:  # only the summary values
        try:
            summary = [
                (_M[catalogue.eplb_hotness_seed(phase, stat)], _finite(value))
                for phase in PHASES
                for stat in catalogue.EPLB_STATS
                if (value := latest.get(f"{phase}_{stat}")) is not None
            ]
        except Exception:
            report(handler, "latest_expert_hotness")
            summary = []
        for spec, value in summary:
            set_gauge(spec, value, scalar_labels)
    if stats is not None:
        mean_spec, max_spec = (_M[catalogue.eplb_layer_load_seed(s)] for s in ("mean", "max"))
        for phase in PHASES:
            for layer, (_, mean, peak) in enumerate(stats[phase]):
                labels = (dp, role, phase, rank, str(layer))
                set_gauge(mean_spec, mean, labels)
                set_gauge(max_spec, peak, labels)


class UpdateExpertMapAndWeight(Handler):
    """``D2DExpertWeightLoader.update_expert_map_and_weight`` (worker): timed only when it did work,
    i.e. when its ``state`` was TRANSFERRING before the call (otherwise it returns at once)."""

    reads_args = 1

    def __init__(self) -> None:
        self._states = (None, None)  # (enum class, its TRANSFERRING member), resolved on first sight

    def before(self, args, kwargs):
        state = args[0].state
        cls, transferring = self._states
        if state.__class__ is not cls:
            cls = state.__class__
            transferring = getattr(cls, "TRANSFERRING", None)
            self._states = (cls, transferring)
        return perf_counter() if state is transferring and transferring is not None else None

    def after(self, state, args, kwargs, result):
        if state is not None:
            recording.record(
                _M["eplb:expert_weight_update:duration"], perf_counter() - state, context.step_labels(_ALL)
            )
