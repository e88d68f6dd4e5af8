"""Worker memory gauges (handlers/memory.py) on vLLM 0.34's changes, and their narrow degradation.

vLLM 0.34 defaults ``gpu_memory_utilization`` to None and resolves it in a property
(``CacheConfig.resolved_gpu_memory_utilization``), compiled here from 0.34's own source onto a stand-in config;
its extensible KV cache (the default on CUDA) is sized after warm-up by ``Worker.extend_kv_cache``. The
contract test pins, in each supported release from 0.34 on, the source structure the handlers rely on."""

import ast
import logging
import types
from types import SimpleNamespace as NS

import pytest
from packaging.version import Version

from opentelemetry_instrumentation_vllm_ascend import supported
from opentelemetry_instrumentation_vllm_ascend.handlers import memory
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import SYNC, wrap
from tests.support.fakes import handler_of
from tests.support.vllm_source import functions

GIB = 1 << 30
LABELS = (("dp", "0"), ("phase", "all"), ("rank", "3"), ("role", "mixed"))
V034 = [v for v in supported.VLLM if Version(v) >= Version("0.34.0")]
_TREES: dict = {}


def tree(version):
    from tests.contract.test_vllm import tree_for

    if version not in _TREES:
        _TREES[version] = tree_for(version)
    return _TREES[version]


def values(metrics):
    return {
        name.split(":")[-1]: series[LABELS]
        for name, series in metrics.points().items()
        if name.startswith("vllm_profiling_engine:memory:") and LABELS in series
    }


def cache_config_034(version, **fields):
    """A CacheConfig with vLLM ``version``'s own ``resolved_gpu_memory_utilization`` (compiled from its source)
    and its class default, ``fields`` set as vLLM's config leaves them."""
    t = tree(version)
    module = "vllm.config.cache"
    cls = t.find_class(module, "CacheConfig")[1]
    (default,) = [
        n.value.value
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", None) == "DEFAULT_GPU_MEMORY_UTILIZATION"
    ]
    resolved = functions(t, module, ["CacheConfig.resolved_gpu_memory_utilization"], {})
    Config = type(
        "CacheConfig",
        (),
        {
            "DEFAULT_GPU_MEMORY_UTILIZATION": default,
            "resolved_gpu_memory_utilization": property(resolved["CacheConfig.resolved_gpu_memory_utilization"]),
        },
    )
    config = Config()
    config.gpu_memory_utilization = None
    config.enable_extensible_kv_cache = False
    config.kv_cache_memory_bytes = None
    for k, v in fields.items():
        setattr(config, k, v)
    return config


def worker(cache_config, runner=None, **stored):
    w = NS(rank=3, cache_config=cache_config, model_runner=runner or NS(model_memory_usage=2 * GIB))
    base = dict(
        init_snapshot=NS(total_memory=64 * GIB),
        requested_memory=48 * GIB,
        available_kv_cache_memory_bytes=40 * GIB,
        peak_activation_memory=3 * GIB,
    )
    base.update(stored)
    for k, v in base.items():
        setattr(w, k, v)
    return w


@pytest.mark.parametrize("version", V034)
def test_the_utilization_ratio_is_the_value_vllm_resolved_when_the_flag_is_not_given(metrics, version):
    """0.34: no flag, extensible KV cache -> 1.0; no flag, estimate-based sizing -> the class default (0.92);
    the flag given -> its value. Before the fix the first two were absent."""
    for fields, expected in (
        (dict(enable_extensible_kv_cache=True), 1.0),
        (dict(), 0.92),
        (dict(gpu_memory_utilization=0.625), 0.625),
    ):
        config = cache_config_034(version, **fields)
        assert config.resolved_gpu_memory_utilization == expected  # vLLM's own answer
        memory.capture(worker(config))
        assert values(metrics)["utilization_ratio"] == expected, fields


def test_the_utilization_ratio_of_a_release_without_the_resolution_is_the_configured_field(metrics):
    """0.23-0.33 (here: the installed vLLM's real CacheConfig) have no resolved property: the field."""
    config = pytest.importorskip("vllm.config").CacheConfig(gpu_memory_utilization=0.75)
    assert not hasattr(config, "resolved_gpu_memory_utilization")
    memory.capture(worker(config))
    assert values(metrics)["utilization_ratio"] == 0.75


class ExtensibleKVCache:
    """The two members of vLLM 0.34's ``ExtensibleKVCache`` the handler reads (checked below against its
    source): ``physical_bytes`` (what the committed blocks map) grows when ``commit`` backs more blocks."""

    def __init__(self, bytes_per_block):
        self.bytes_per_block = bytes_per_block
        self.num_committed_blocks = 1  # the null block, at allocation

    @property
    def physical_bytes(self):
        return self.num_committed_blocks * self.bytes_per_block


@pytest.mark.parametrize("version", V034)
def test_the_extensible_kv_cache_reports_its_final_size_not_the_profiling_estimate(metrics, version):
    """vLLM 0.34's worker order (the contract test below): warm-up (which itself runs execute_model), then
    extend_kv_cache(num_blocks) commits the final size. kvcache_gb is absent after warm-up (the stored
    available_kv_cache_memory_bytes is the profiling estimate, 40 GiB here) and is the committed cache's size
    once extend_kv_cache returned (96 blocks of 256 MiB = 24 GiB); the other values are the warm-up's."""
    cache = ExtensibleKVCache(GIB // 4)

    class Worker:
        def compile_or_warm_up_model(self):
            cache.num_committed_blocks = 7  # warm-up commits blocks as it goes ...
            self.execute_model(None)  # ... through the worker's own execute_model (warmup_kernels)
            cache.num_committed_blocks = 1  # ... and shrinks back before capture
            return "times"

        def execute_model(self, scheduler_output):
            return None

        def extend_kv_cache(self, num_blocks):
            cache.num_committed_blocks = num_blocks

    for name in ("compile_or_warm_up_model", "execute_model", "extend_kv_cache"):
        handler = handler_of(f"vllm.v1.worker.gpu_worker:Worker.{name}")
        setattr(Worker, name, wrap(getattr(Worker, name), handler, SYNC)[0])
    w = worker(cache_config_034(version, enable_extensible_kv_cache=True), NS(model_memory_usage=2 * GIB))
    w.model_runner.extensible_kv_cache = cache
    for name in ("compile_or_warm_up_model", "execute_model", "extend_kv_cache"):
        setattr(w, name, types.MethodType(getattr(Worker, name), w))
    assert w.compile_or_warm_up_model() == "times"
    after_warm_up = values(metrics)
    assert "kvcache_gb" not in after_warm_up
    assert after_warm_up == {
        "total_gb": 64.0,
        "utilization_ratio": 1.0,
        "reserved_gb": 48.0,
        "weights_gb": 2.0,
        "activation_gb": 3.0,
    }
    w.extend_kv_cache(96)
    assert values(metrics) == {**after_warm_up, "kvcache_gb": 24.0}


def test_without_the_extensible_kv_cache_the_warm_up_reports_the_stored_size(metrics):
    w = worker(NS(gpu_memory_utilization=0.5, kv_cache_memory_bytes=None))
    handler = handler_of("vllm.v1.worker.gpu_worker:Worker.compile_or_warm_up_model")
    handler.after(None, (w,), None, None)
    assert values(metrics)["kvcache_gb"] == 40.0


def test_a_failing_memory_read_loses_only_its_value(metrics, caplog):
    """One stored value whose read raises (here ``requested_memory``): the other values are recorded exactly,
    one warning names the failed read, the worker's warm-up returns its result."""

    class Broken(NS):
        @property
        def requested_memory(self):
            raise RuntimeError("moved")

    w = Broken(
        rank=3,
        cache_config=NS(gpu_memory_utilization=0.5, kv_cache_memory_bytes=None),
        model_runner=NS(model_memory_usage=2 * GIB),
        init_snapshot=NS(total_memory=64 * GIB),
        available_kv_cache_memory_bytes=40 * GIB,
        peak_activation_memory=3 * GIB,
    )

    class Worker:
        def compile_or_warm_up_model(self):
            return "times"

    Worker.compile_or_warm_up_model = wrap(Worker.compile_or_warm_up_model, memory.WarmUp(), SYNC)[0]
    with caplog.at_level(logging.WARNING):
        assert Worker.compile_or_warm_up_model(w) == "times"
        memory.capture(w)  # a second failure of the same read is not logged again
    assert values(metrics) == {
        "total_gb": 64.0,
        "utilization_ratio": 0.5,
        "weights_gb": 2.0,
        "kvcache_gb": 40.0,
        "activation_gb": 3.0,
    }
    warnings = [r for r in caplog.records if "memory:capture" in r.getMessage()]
    assert len(warnings) == 1 and "engine:memory:reserved_gb" in warnings[0].getMessage()


# -- contract -------------------------------------------------------------------------------------------------


def _calls(func) -> list[str]:
    out = []
    for node in ast.walk(func):
        if isinstance(node, ast.Call):
            f = node.func
            out.append(
                (node.lineno, node.col_offset, f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None))
            )
    return [name for *_, name in sorted(out)]


def _method(t, module, qualname):
    cls, name = qualname.rsplit(".", 1)
    found = t.find_class(module, cls)
    assert found is not None, f"{module}:{cls}"
    matches = [n for n in found[1].body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert matches, f"{module}:{qualname}"
    return matches[0]


@pytest.mark.parametrize("version", V034)
def test_vllm_sizes_the_extensible_kv_cache_after_warm_up_and_resolves_the_utilization(version):
    """What the memory handlers rely on from 0.34: ``gpu_memory_utilization`` defaults to None and
    ``resolved_gpu_memory_utilization`` is a property; the EngineCore runs the workers' warm-up, then (extensible
    only) ``extend_kv_cache``; ``Worker.extend_kv_cache`` commits the size on ``model_runner.extensible_kv_cache``
    (set by model runner V2) whose ``physical_bytes`` is a property of the buffer's mapped bytes; the warm-up
    runs the worker's ``execute_model`` (so LateCapture must not take it for a first serving step);
    ``available_kv_cache_memory_bytes`` is the profiling estimate of ``determine_available_memory``."""
    t = tree(version)
    cache = t.find_class("vllm.config.cache", "CacheConfig")[1]
    (field,) = [n for n in cache.body if isinstance(n, ast.AnnAssign) and n.target.id == "gpu_memory_utilization"]
    assert "default=None" in ast.unparse(field.value)
    resolved = _method(t, "vllm.config.cache", "CacheConfig.resolved_gpu_memory_utilization")
    assert [ast.unparse(d) for d in resolved.decorator_list] == ["property"]
    init = _calls(_method(t, "vllm.v1.engine.core", "EngineCore._initialize_kv_caches"))
    assert init.index("compile_or_warm_up_model") < init.index("extend_kv_cache"), init
    extend = ast.unparse(_method(t, "vllm.v1.worker.gpu_worker", "Worker.extend_kv_cache"))
    assert "extend_kv_cache(self.model_runner, self._kv_cache_config, num_blocks)" in extend
    commit = [
        n
        for n in t.module("vllm.v1.worker.extensible_kv_cache").body
        if isinstance(n, ast.FunctionDef) and n.name == "extend_kv_cache"
    ]
    assert commit and "kv_cache = runner.extensible_kv_cache" in ast.unparse(commit[0])
    assert "kv_cache.commit(" in ast.unparse(commit[0])
    physical = _method(t, "vllm.v1.worker.extensible_kv_cache", "ExtensibleKVCache.physical_bytes")
    assert [ast.unparse(d) for d in physical.decorator_list] == ["property"]
    assert ast.unparse(physical.body[-1]) == "return self.buffer.physical_bytes"
    assert "self.num_committed_blocks = num_blocks" in ast.unparse(
        _method(t, "vllm.v1.worker.extensible_kv_cache", "ExtensibleKVCache.commit")
    )
    runner = ast.unparse(t.find_class("vllm.v1.worker.gpu.model_runner", "GPUModelRunner")[1])
    assert "self.extensible_kv_cache: ExtensibleKVCache | None = None" in runner
    warm = ast.unparse(_method(t, "vllm.v1.worker.gpu_worker", "Worker._compile_or_warm_up_model"))
    assert "warmup_kernels(self.model_runner, self.execute_model, self.sample_tokens)" in warm
    estimate = ast.unparse(_method(t, "vllm.v1.worker.gpu_worker", "Worker.determine_available_memory"))
    assert "self.available_kv_cache_memory_bytes = " in estimate
