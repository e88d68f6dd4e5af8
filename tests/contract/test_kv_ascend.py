"""Contract of the vllm-ascend KV transfer handlers with the source of each supported vllm-ascend release
(``supported.VLLM_ASCEND``, with the vLLM it runs on beneath it): the fakes ``test_kv_ascend.py`` uses (tests/support/fakes.py) have the real classes' shape, the metered TransferEngine stands
in only where the thread uses it for nothing but the two batch calls, and the results the handlers read mean
what vllm-ascend itself reads them as. The rows themselves (symbols, parameters) are checked by
``tests/contract/test_ascend.py``."""

import ast

import pytest

from opentelemetry_instrumentation_vllm_ascend import supported
from tests.support.contract import ASCEND_VERSIONS, SourceTree, ascend_tree, fake_problems
from tests.support.source_archives import sdist

_KV = "vllm_ascend.distributed.kv_transfer."
_P2P = _KV + "kv_p2p."
_STORE = _KV + "kv_pool.ascend_store."


@pytest.fixture(scope="module", params=ASCEND_VERSIONS)
def tree(request):
    return ascend_tree(request.param)


def _fakes():
    from tests.support import fakes as t

    return [
        (
            t.KVCacheRecvingThread,
            t.KVCacheRecvingThread(0, 1, 1, None),
            _P2P + "mooncake_connector",
            "KVCacheRecvingThread",
            set(),
        ),
        (
            t.KVCacheRecvingThread,
            t.KVCacheRecvingThread(0, 1, 1, None),
            _P2P + "mooncake_hybrid_connector",
            "KVCacheRecvingThread",
            set(),
        ),
        (
            t.KVCacheSendingLayerThread,
            t.KVCacheSendingLayerThread(None),
            _P2P + "mooncake_layerwise_connector",
            "KVCacheSendingLayerThread",
            set(),
        ),
        # The backends' constructors connect to their stores: the fakes' own take the test's results instead.
        (t.MooncakeBackend, None, _STORE + "backend.mooncake_backend", "MooncakeBackend", {"__init__"}),
        (t.MemcacheBackend, None, _STORE + "backend.memcache_backend", "MemcacheBackend", {"__init__"}),
    ]


def test_fakes_have_the_real_classes_methods_and_attributes(tree):
    assert fake_problems(tree, _fakes(), check_init=True) == []


_BATCH = {"batch_transfer_sync_read", "batch_transfer_sync_write"}


@pytest.mark.parametrize(
    "module, cls, method",
    [
        (_P2P + "mooncake_connector", "KVCacheRecvingThread", "batch_transfer_sync_read"),
        (_P2P + "mooncake_hybrid_connector", "KVCacheRecvingThread", "batch_transfer_sync_read"),
        (_P2P + "mooncake_layerwise_connector", "KVCacheSendingLayerThread", "batch_transfer_sync_write"),
    ],
)
def test_the_metered_engine_stands_in_where_the_thread_only_makes_batch_calls(tree, module, cls, method):
    """Every use of ``self.engine`` in the thread class is its assignment in ``__init__`` or a call of a
    batch transfer with four positional arguments (``_MeteredEngine``'s signature): the stand-in changes
    nothing else the thread does. The thread's own batch call is the one the connector's transfers use."""
    _, node = tree.find_class(module, cls)
    parents = {child: parent for parent in ast.walk(node) for child in ast.iter_child_nodes(parent)}
    uses = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr == "engine" and getattr(sub.value, "id", None) == "self":
            parent = parents[sub]
            if isinstance(parent, ast.Assign) and sub in parent.targets:
                uses.append("assign")
            elif isinstance(parent, ast.Attribute) and parent.attr in _BATCH:
                call = parents[parent]
                assert isinstance(call, ast.Call) and len(call.args) == 4 and not call.keywords, ast.unparse(call)
                uses.append(parent.attr)
            else:
                uses.append(f"other: {ast.unparse(parent)}")
    assert uses.count("assign") == 1 and method in uses
    assert set(uses) <= {"assign"} | _BATCH, uses


def test_a_failed_p2p_read_is_a_negative_return(tree):
    _, node = tree.find_class(_P2P + "mooncake_connector", "KVCacheRecvingThread")
    func = next(n for n in node.body if getattr(n, "name", None) == "_transfer_kv_cache_all_groups")
    text = ast.unparse(func)
    assert "ret = self.engine.batch_transfer_sync_read(session_id, src_list, dst_list, length_list)" in text
    assert "if ret < 0:" in text


def test_store_results_mean_what_the_handlers_read(tree):
    """get: a code per key, 0 loaded (vllm-ascend's record_failed_blocks counts ``code != 0`` as failed);
    put: no result (every backend's put returns nothing)."""
    source = tree.files["vllm_ascend/distributed/kv_transfer/kv_pool/ascend_store/kv_transfer.py"]
    func = next(
        n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "record_failed_blocks"
    )
    assert "if code != 0:" in ast.unparse(func)
    assert "ret = self.m_store.get(key_list_c, addr_list_c, size_list_c)" in source
    for module, cls in (
        ("mooncake_backend", "MooncakeBackend"),
        ("memcache_backend", "MemcacheBackend"),
        ("yuanrong_backend", "YuanrongBackend"),
    ):
        _, node = tree.find_class(_STORE + "backend." + module, cls)
        put = next(n for n in node.body if getattr(n, "name", None) == "put")
        assert all(r.value is None for r in ast.walk(put) if isinstance(r, ast.Return)), cls
        get = next(n for n in node.body if getattr(n, "name", None) == "get")
        assert any(isinstance(r, ast.Return) and r.value is not None for r in ast.walk(get)), cls


# -- NPU KV offload: no row of its own, and why ------------------------------------------------------------------

#: The newest vllm-ascend on PyPI, where the NPU offload worker (``NPUOffloadingWorker``) exists. It runs on vLLM
#: 0.30.0 (its docs/source/community/versioning_policy.md, and its pair in supported.py): read over that source.
ASCEND_WITH_NPU_OFFLOAD = "0.30.0rc2"
_NATIVE = _KV + "kv_pool.kv_offload.native."


def test_npu_offload_of_0_23_0_post1_cannot_load_on_vllm_0_23():
    """vllm-ascend 0.23.0.post1's NPU offload spec (``vllm_ascend/kv_offload/npu.py``, the module its docs name
    in ``spec_module_path``) imports vLLM modules that vLLM 0.23.0 does not have: it fails with an ImportError,
    so there is nothing to hook on that combination."""
    tree = ascend_tree("0.23.0.post1")  # a fact about that release
    module = tree.module("vllm_ascend.kv_offload.npu")
    imported = {n.module for n in ast.walk(module) if isinstance(n, ast.ImportFrom) and n.module.startswith("vllm.")}
    missing = {m for m in imported if tree.module(m) is None}
    assert missing == {"vllm.v1.kv_offload.abstract", "vllm.v1.kv_offload.mediums", "vllm.v1.kv_offload.spec"}


def test_npu_offload_worker_reports_through_vllms_offloading_connector_worker():
    """Where vllm-ascend has an NPU offload worker (0.30.0rc2), its connector worker subclasses vLLM's
    OffloadingConnectorWorker without overriding the methods our rows hook (``handle_preemptions``,
    ``start_kv_transfers``, ``get_finished``) and its handlers complete jobs with ``TransferResult(transfer_size,
    transfer_time)`` timed by NPU events: vLLM's own ``transfer_stats``, which our OffloadingConnectorWorker rows
    read, carry them. Every vLLM module it imports exists in vLLM 0.30, the release it runs on."""
    from tests.contract.test_vllm import tree_for

    ascend = SourceTree.from_archive(sdist("vllm-ascend", ASCEND_WITH_NPU_OFFLOAD), strip_prefix=True)
    both = SourceTree({**tree_for(dict(supported.VLLM_ASCEND)[ASCEND_WITH_NPU_OFFLOAD]).files, **ascend.files})
    found = both.find_class(_NATIVE + "offloading_connector", "AscendOffloadingConnectorWorker")
    assert found is not None
    where, node = found
    base = both.resolve_base(where, node.bases[0])
    assert base is not None and base[1].name == "OffloadingConnectorWorker"
    assert base[0] == "vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker"
    defined = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
    assert defined.isdisjoint({"handle_preemptions", "start_kv_transfers", "get_finished"}), defined
    worker = both.find_class(_NATIVE + "cpu_npu", "NPUOffloadingWorker")
    assert worker is not None and both.resolve_base(worker[0], worker[1].bases[0])[1].name == "OffloadingWorker"
    source = ascend.files["vllm_ascend/distributed/kv_transfer/kv_pool/kv_offload/native/cpu_npu.py"]
    assert "transfer_size=transfer.num_bytes" in source
    assert "transfer_time = transfer.start_event.elapsed_time(transfer.end_event) * 1e-3" in source
    for path, text in ascend.files.items():
        if path.startswith("vllm_ascend/distributed/kv_transfer/kv_pool/kv_offload/native/"):
            for n in ast.walk(ast.parse(text)):
                if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("vllm."):
                    assert both.module(n.module) is not None, (path, n.module)


def test_npu_prefetch_offloader_sums_its_offloaded_bytes_in_post_init(tree):
    """0.23's NPUPrefetchOffloader sums them itself (its own row); 0.30's AscendPrefetchOffloader subclasses
    vLLM's PrefetchOffloader and calls its post_init, which sums them (vLLM's row reads it, once)."""
    module = "vllm_ascend.model_executor.offloader.prefetch"
    found = tree.find_class(module, "NPUPrefetchOffloader")
    if found is None:
        where, node = tree.find_class(module, "AscendPrefetchOffloader")
        base = tree.resolve_base(where, node.bases[0])
        assert base is not None and base[:1] == ("vllm.model_executor.offloader.prefetch",)
        assert base[1].name == "PrefetchOffloader"
        post_init = next(n for n in node.body if getattr(n, "name", None) == "post_init")
        assert "super().post_init()" in ast.unparse(post_init)
        base_post_init = next(n for n in base[1].body if getattr(n, "name", None) == "post_init")
        assert "self.total_offloaded_bytes += offloader.offloaded_bytes" in ast.unparse(base_post_init)
        return
    post_init = next(n for n in found[1].body if getattr(n, "name", None) == "post_init")
    assert "self.total_offloaded_bytes += offloader.offloaded_bytes" in ast.unparse(post_init)


def test_npu_runner_installs_its_prefetch_offloader(tree):
    """paths.py's NPU fact for memory:weight_offload_bytes."""
    source = tree.files["vllm_ascend/worker/model_runner_v1.py"]
    if "set_offloader(NPUPrefetchOffloader(" in source:  # 0.23
        return
    assert "set_offloader(create_offloader(self.offload_config))" in source
    factory = ast.unparse(tree.module("vllm_ascend.model_executor.offloader.base"))
    assert "return AscendPrefetchOffloader(" in factory
