"""Weight offloading: the resident offloaded bytes, read from vLLM's real UVAOffloader (the default
--cpu-offload-gb backend) run on a tiny module by the installed hook. Oracle: the offloader's own
``cpu_offload_bytes`` and, by hand, vLLM's rule that parameters already on CPU are not offloaded (uva.py
``_maybe_offload_to_cpu``), so the CPU build keeps 0 bytes off the device."""

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch", reason="needs vLLM's torch (the cpu extra)")

from opentelemetry_instrumentation_vllm_ascend import catalogue
from opentelemetry_instrumentation_vllm_ascend.handlers import weight_offload
from opentelemetry_instrumentation_vllm_ascend.state import STATE

uva = pytest.importorskip("vllm.model_executor.offloader.uva")

P = catalogue.PREFIX


def series(metrics, offloader):
    return metrics.value(P + "memory:weight_offload_bytes", dp="0", role="mixed", phase="all", offloader=offloader)


def test_vllms_uva_offloader_on_a_cpu_module_keeps_nothing_off_the_device(instrumentation):
    metrics = instrumentation
    offloader = uva.UVAOffloader(cpu_offload_max_bytes=1 << 30)
    layers = [torch.nn.Linear(16, 16), torch.nn.Linear(16, 8)]  # 1 088 bytes of float32 weights and biases
    wrapped = offloader.wrap_modules(iter(layers))
    assert wrapped == layers
    assert series(metrics, "UVAOffloader") == offloader.cpu_offload_bytes == 0


def test_the_gauge_follows_the_offloaders_own_totals(metrics):
    """What a device run gives the hooks: ``cpu_offload_bytes`` accumulates over wrap_modules calls (the gauge
    is its latest value), ``total_offloaded_bytes`` is set by post_init."""
    UVA = type("UVAOffloader", (), {})
    offloader = UVA()
    offloader.cpu_offload_bytes = 4096
    weight_offload.UVAWrapModules().after(None, (offloader,), None, [])
    offloader.cpu_offload_bytes = 4096 + 1088
    weight_offload.UVAWrapModules().after(None, (offloader,), None, [])
    assert series(metrics, "UVAOffloader") == 5184
    prefetch = type("NPUPrefetchOffloader", (), {})()
    prefetch.total_offloaded_bytes = 3 * 2**20
    weight_offload.PrefetchPostInit().after(None, (prefetch,), None, None)
    assert series(metrics, "NPUPrefetchOffloader") == 3 * 2**20
    weight_offload.PrefetchPostInit().after(None, (SimpleNamespace(),), None, None)  # no total: nothing set
    assert series(metrics, "SimpleNamespace") is None


def test_an_offloader_without_its_total_is_reported_not_silent(metrics):
    """The weight-offload family: the total an offloader keeps (set in its __init__ by every supported release)
    missing is drift: the gauge is absent (never a plausible 0) and the failed read counted, one per call; another
    offloader's gauge is unaffected."""
    prefetch = type("NPUPrefetchOffloader", (), {})()
    prefetch.total_offloaded_bytes = 2**20
    weight_offload.PrefetchPostInit().after(None, (prefetch,), None, None)
    moved = type("UVAOffloader", (), {})()  # cpu_offload_bytes renamed
    for _ in range(2):
        weight_offload.UVAWrapModules().after(None, (moved,), None, [])
    weight_offload.PrefetchPostInit().after(None, (SimpleNamespace(),), None, None)
    assert series(metrics, "UVAOffloader") is None
    assert series(metrics, "NPUPrefetchOffloader") == 2**20
    assert STATE.failures == {
        ("UVAWrapModules", "cpu_offload_bytes"): 2,
        ("PrefetchPostInit", "total_offloaded_bytes"): 1,
    }


def test_disabled_gauge_leaves_the_offloader_unhooked(metrics, monkeypatch):
    from tests.conftest import instrumented

    monkeypatch.setenv("OTEL_VLLM_ASCEND_DISABLED_METRICS", "memory:weight_offload_bytes")
    original = uva.UVAOffloader.wrap_modules
    with instrumented(monkeypatch):
        assert uva.UVAOffloader.wrap_modules is original
        uva.UVAOffloader(cpu_offload_max_bytes=1).wrap_modules(iter([torch.nn.Linear(2, 2)]))
    assert series(metrics, "UVAOffloader") is None
