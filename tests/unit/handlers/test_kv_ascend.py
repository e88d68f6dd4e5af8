"""vllm-ascend's KV transfers: Mooncake P2P / layerwise transfer threads (their TransferEngine metered) and
the AscendStore backends' put / get, through the handlers of their target rows wrapped around fakes whose
shape ``tests/contract/test_kv_ascend.py`` checks in vllm-ascend's real source. Oracle: bytes, counts and failures
computed by hand from the lengths and sizes the fakes are given."""

import pytest

from opentelemetry_instrumentation_vllm_ascend import catalogue
from opentelemetry_instrumentation_vllm_ascend.handlers import kv_transfer
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import SYNC, wrap
from opentelemetry_instrumentation_vllm_ascend.state import STATE
from tests.support.fakes import (
    KVCacheRecvingThread,
    KVCacheSendingLayerThread,
    MemcacheBackend,
    MooncakeBackend,
    TransferEngine,
    handler_of,
)

P = catalogue.PREFIX
_P2P = "vllm_ascend.distributed.kv_transfer.kv_p2p."
_STORE = "vllm_ascend.distributed.kv_transfer.kv_pool.ascend_store.backend."


def hooked(cls, module, methods):
    """A subclass of the fake with the methods wrapped by the handlers of their target rows."""
    return type(
        cls.__name__,
        (cls,),
        {m: wrap(getattr(cls, m), handler_of(f"{module}:{cls.__name__}.{m}"), SYNC)[0] for m in methods},
    )


def labels(connector, direction="remote", phase="unknown"):
    return {"dp": "0", "role": "mixed", "phase": phase, "direction": direction, "connector": connector}


def test_mooncake_p2p_reads_count_the_lengths_of_each_batch(metrics):
    Thread = hooked(KVCacheRecvingThread, _P2P + "mooncake_connector", ("__init__",))
    engine = TransferEngine()
    thread = Thread(0, 1, 1, engine)
    assert thread.engine._engine is engine  # metered, the real engine behind it
    assert thread.engine.get_rpc_port() == 12345  # anything else reaches the engine
    STATE.last_step_phase = "decode"  # the main thread's step: not the receiving thread's
    thread._transfer_kv_cache_all_groups({"session": "p:1", "src": [1, 2, 3], "dst": [4, 5, 6], "len": [4096] * 3})
    thread._transfer_kv_cache_all_groups({"session": "p:1", "src": [7], "dst": [8], "len": [1024]})
    assert engine.calls == [("read", "p:1", [4096] * 3), ("read", "p:1", [1024])]  # each ran once
    ours = labels("MooncakeConnector")
    assert metrics.value(P + "kv_transfer:bytes", **ours) == 3 * 4096 + 1024
    assert metrics.value(P + "kv_transfer:count", **ours) == 2
    assert metrics.value(P + "kv_transfer:duration", **ours)[0] == 2
    engine.ret = -1
    with pytest.raises(RuntimeError):  # vllm-ascend's own error reaches the caller unchanged
        thread._transfer_kv_cache_all_groups({"session": "p:1", "src": [9], "dst": [9], "len": [512]})
    assert metrics.value(P + "kv_transfer:failures", **ours) == 1
    assert metrics.value(P + "kv_transfer:bytes", **ours) == 3 * 4096 + 1024  # the failed batch moved nothing


def test_hybrid_and_layerwise_threads_are_metered_under_their_connectors(metrics):
    Hybrid = hooked(KVCacheRecvingThread, _P2P + "mooncake_hybrid_connector", ("__init__",))
    Layerwise = hooked(KVCacheSendingLayerThread, _P2P + "mooncake_layerwise_connector", ("__init__",))
    hybrid, layerwise = Hybrid(0, 1, 1, TransferEngine()), Layerwise(TransferEngine())
    hybrid.engine.batch_transfer_sync_read("p:1", [1], [2], [100, 200])
    layerwise.engine.batch_transfer_sync_write("d:1", [1, 2], [3, 4], [300, 400])
    assert metrics.value(P + "kv_transfer:bytes", **labels("MooncakeConnector")) == 300
    assert metrics.value(P + "kv_transfer:bytes", **labels("MooncakeLayerwiseConnector")) == 700


def test_a_failing_record_never_reaches_the_transfer(metrics, monkeypatch):
    engine = TransferEngine()
    metered = kv_transfer._MeteredEngine(engine, "MooncakeConnector")

    def broken(*args, **kwargs):
        raise ValueError("recording broke")

    monkeypatch.setattr(kv_transfer, "record_transfer", broken)
    assert metered.batch_transfer_sync_read("p:1", [1], [2], [10]) == 0
    assert engine.calls == [("read", "p:1", [10])]


def test_ascend_store_put_and_get_count_keys_bytes_and_failed_keys(metrics):
    Backend = hooked(MooncakeBackend, _STORE + "mooncake_backend", ("put", "get"))
    backend = Backend()
    sizes = [[1024, 1024], [2048, 2048], [512, 512]]  # per key: its K and V buffers
    backend.put(["a", "b", "c"], [[1, 2], [3, 4], [5, 6]], sizes)
    backend.put([], [], [])  # nothing to store: nothing recorded
    assert backend.puts == [["a", "b", "c"], []]
    store = labels("AscendStoreConnector", "d2h")
    assert metrics.value(P + "kv_transfer:bytes", **store) == 2 * 1024 + 2 * 2048 + 2 * 512
    assert metrics.value(P + "kv_transfer:count", **store) == 3
    backend.codes = [0, -706, 0]  # the second key missing
    backend.get(["a", "b", "c"], [[1, 2], [3, 4], [5, 6]], sizes)
    backend.codes = None  # the backend caught an error: every key failed
    backend.get(["d", "e"], [[1, 2], [3, 4]], [[8, 8], [8, 8]])
    load = labels("AscendStoreConnector", "h2d")
    assert metrics.value(P + "kv_transfer:bytes", **load) == 2 * 1024 + 2 * 512
    assert metrics.value(P + "kv_transfer:count", **load) == 2
    assert metrics.value(P + "kv_transfer:failures", **load) == 1 + 2
    assert metrics.value(P + "kv_transfer:duration", **load)[0] == 1  # the all-failed call has no transfer


def test_memcache_backend_rows_read_its_own_parameter_names(metrics):
    Backend = hooked(MemcacheBackend, _STORE + "memcache_backend", ("put", "get"))
    backend = Backend(codes=[0, 0])
    backend.put(key=["a"], addr=[[1]], size=[[4096]])  # by name: the wrapper has the real signature
    backend.get(["a", "b"], [[1], [2]], [[4096], [100]])
    assert metrics.value(P + "kv_transfer:bytes", **labels("AscendStoreConnector", "d2h")) == 4096
    assert metrics.value(P + "kv_transfer:bytes", **labels("AscendStoreConnector", "h2d")) == 4196


def test_uninstrument_gives_each_transfer_thread_its_engine_back(metrics):
    """``uninstrument()`` runs ``restore_stand_ins()``."""
    from opentelemetry_instrumentation_vllm_ascend.hooks.patches import restore_stand_ins

    restore_stand_ins()  # earlier tests' stand-ins
    Hybrid = hooked(KVCacheRecvingThread, _P2P + "mooncake_hybrid_connector", ("__init__",))
    engine = TransferEngine()
    thread = Hybrid(0, 1, 1, engine)
    assert isinstance(thread.engine, kv_transfer._MeteredEngine)
    assert restore_stand_ins() == 1
    assert thread.engine is engine
    assert restore_stand_ins() == 0
