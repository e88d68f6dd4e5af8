"""Contract of the KV transfer and KV-cache write handlers with vLLM's source, version by version:
the attributes they read from vLLM objects (gated like their target rows; the rows themselves are
checked by tests/contract/test_vllm.py)."""

import pytest
from packaging.version import Version

from opentelemetry_instrumentation_vllm_ascend import supported
from opentelemetry_instrumentation_vllm_ascend.wiring.installer import in_range
from tests.contract.test_vllm import tree_for
from tests.support.contract import VLLM_VERSIONS, Read, at_least, check_read

_EXAMPLE = "vllm.distributed.kv_transfer.kv_connector.v1.example_connector"
_OFFLOADING = "vllm.distributed.kv_transfer.kv_connector.v1.offloading"

#: (vLLM versions, module, class, attributes read).
KV_READS = (
    (">=0.23.0", _EXAMPLE, "ExampleConnector", ("_get_connector_metadata",)),
    (">=0.23.0", _EXAMPLE, "ExampleConnectorMetadata", ("requests",)),
    (">=0.23.0", _EXAMPLE, "ReqMeta", ("is_store", "slot_mapping")),
    (">=0.23.0", "vllm.forward_context", "ForwardContext", ("attn_metadata", "no_compile_layers")),
    (">=0.23.0", "vllm.v1.core.sched.scheduler", "Scheduler", ("kv_cache_config",)),
    (">=0.23.0", "vllm.v1.kv_cache_interface", "KVCacheConfig", ("kv_cache_groups",)),
    (">=0.23.0", "vllm.v1.kv_cache_interface", "KVCacheGroupSpec", ("kv_cache_spec", "layer_names")),
    (">=0.23.0", "vllm.v1.kv_cache_interface", "AttentionSpec", ("page_size_bytes", "block_size")),
    (
        ">=0.30.0",
        _OFFLOADING + ".worker",
        "OffloadingConnectorWorker",
        ("_connector_worker_meta", "_load_jobs", "_unsubmitted_store_jobs", "_is_store_writer", "worker"),
    ),
    (">=0.30.0", _OFFLOADING + ".common", "OffloadingWorkerMetadata", ("completed_jobs", "transfer_stats")),
    (">=0.30.0", _OFFLOADING + ".common", "TransferStats", ("load", "store")),
    (">=0.30.0", _OFFLOADING + ".common", "DirectionalTransferStats", ("sizes", "time", "bytes")),
    (">=0.30.0", _OFFLOADING + ".common", "OffloadingConnectorMetadata", ("load_jobs", "store_jobs", "jobs_to_flush")),
    (
        "<0.30.0",
        "vllm.v1.kv_offload.worker.worker",
        "TransferResult",
        ("job_id", "transfer_size", "transfer_time", "transfer_type"),
    ),
)


@pytest.mark.parametrize("version", VLLM_VERSIONS)
def test_every_attribute_the_kv_handlers_read_exists(version):
    tree = tree_for(version)
    problems = [
        p
        for spec, module, cls, attributes in KV_READS
        if in_range(Version(version), spec)
        for attribute in attributes
        for p in check_read(tree, Read(module, cls, attribute))
    ]
    assert problems == [], f"vLLM {version}"


def _method(tree, module, qualname):
    import ast

    cls, name = qualname.split(".")
    found = tree.find_class(module, cls)
    assert found is not None, f"{module}:{cls}"
    return next(n for n in found[1].body if isinstance(n, ast.FunctionDef) and n.name == name)


@pytest.mark.parametrize("version", VLLM_VERSIONS)
def test_nixl_record_transfer_reads_the_telemetry_fields_the_handler_reads(version):
    """NixlRecordTransfer reads ``res.totalBytes`` and ``res.xferDuration`` (µs) of the nixlXferTelemetry
    vLLM's own record_transfer receives (NIXL's type, not in vLLM's source): vLLM reads the same fields,
    and divides the duration by 1e6, in every version."""
    import ast

    func = _method(
        tree_for(version),
        "vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats",
        "NixlKVConnectorStats.record_transfer",
    )
    read = {n.attr for n in ast.walk(func) if isinstance(n, ast.Attribute) and getattr(n.value, "id", None) == "res"}
    assert {"totalBytes", "xferDuration", "descCount"} <= read
    assert "res.xferDuration / 1000000.0" in ast.unparse(func)  # 1e6, as ast writes it


@pytest.mark.parametrize("version", VLLM_VERSIONS)
def test_mooncake_records_the_timed_synchronous_send(version):
    """MooncakeRecordTransfer takes ``duration_s`` as the wall time of one synchronous
    ``batch_transfer_sync_write`` and ``total_bytes`` as its lengths' sum: what ``_send_blocks`` passes."""
    import ast

    func = _method(
        tree_for(version),
        "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector",
        "MooncakeConnectorWorker._send_blocks",
    )
    text = ast.unparse(func)
    assert "self.engine.batch_transfer_sync_write(" in text
    assert "total_bytes=sum(lengths)" in text and "duration_s=duration" in text
    assert "duration = time.perf_counter() - start_time" in text
    assert "self.xfer_stats.record_failed_transfer()" in text


@pytest.mark.parametrize("version", VLLM_VERSIONS)
def test_weight_offloaders_keep_the_totals_the_handlers_read(version):
    """UVAOffloader adds each offloaded parameter's bytes to ``cpu_offload_bytes`` (skipping parameters already
    on CPU); without UVA its copies run in a closure installed as the module's forward (``functional_call``: no
    hookable point, so no h2d bytes); PrefetchOffloader sums ``total_offloaded_bytes`` in ``post_init``."""
    import ast

    tree = tree_for(version)
    func = _method(tree, "vllm.model_executor.offloader.uva", "UVAOffloader._maybe_offload_to_cpu")
    text = ast.unparse(func)
    assert "self.cpu_offload_bytes += p.data.numel() * p.data.element_size()" in text
    assert "if device == torch.device('cpu'):\n        return module" in text
    closures = [n for n in func.body if isinstance(n, ast.If) for s in ast.walk(n) if isinstance(s, ast.FunctionDef)]
    assert closures and "functional_call(" in ast.unparse(closures[0]) and "module.forward = forward" in text
    assert "cpu_offload_bytes" in tree.members("vllm.model_executor.offloader.uva", "UVAOffloader")
    post_init = _method(tree, "vllm.model_executor.offloader.prefetch", "PrefetchOffloader.post_init")
    assert "self.total_offloaded_bytes += offloader.offloaded_bytes" in ast.unparse(post_init)


def _calls_on(func, owner: str) -> list[str]:
    """The methods ``func`` calls on ``self.<owner>``, in source order."""
    import ast

    calls = [
        n
        for n in ast.walk(func)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and ast.unparse(n.func.value) == f"self.{owner}"
    ]
    return [n.func.attr for n in sorted(calls, key=lambda n: (n.lineno, n.col_offset))]


@pytest.mark.parametrize("version", [v for v in VLLM_VERSIONS if at_least(v, "0.30")])
def test_offloading_transfers_block_the_step_only_through_the_metered_worker_calls(version):
    """What OffloadingStartTransfers / OffloadingHandlePreemptions and their metered worker rely on:
    ``start_kv_transfers`` submits the queued stores (``_unsubmitted_store_jobs``: job id first) before this
    step's loads (0.33: then waits for its sync loads), ``handle_preemptions`` moves the ``jobs_to_flush`` among
    ``store_jobs`` into the queue, submits it and waits for ``jobs_to_flush``; neither calls anything else on its
    ``worker``. vLLM's CPU worker launches each job's copies on the calling thread (``transfer_async``: streams,
    events, ``_swap_blocks_batch``) and its ``wait`` synchronizes on the jobs' events: host time the step spends."""
    import ast

    tree = tree_for(version)
    module = _OFFLOADING + ".worker"
    start = _method(tree, module, "OffloadingConnectorWorker.start_kv_transfers")
    expected = ["submit_store", "submit_load"] + (["submit_load", "wait"] if at_least(version, "0.33") else [])
    assert _calls_on(start, "worker") == expected
    text = ast.unparse(start)
    assert "for job_id, src_spec, dst_spec in self._unsubmitted_store_jobs:" in text
    assert text.index("_unsubmitted_store_jobs") < text.index("metadata.load_jobs")
    preempt = _method(tree, module, "OffloadingConnectorWorker.handle_preemptions")
    assert _calls_on(preempt, "worker") == ["submit_store", "wait"]
    text = ast.unparse(preempt)
    assert "entry = kv_connector_metadata.store_jobs.pop(job_id, None)" in text
    assert "if not self._is_store_writer:" in text
    assert "self.worker.wait(kv_connector_metadata.jobs_to_flush)" in text
    prepare = _method(tree, module, "OffloadingConnectorWorker.prepare_store_kv")
    assert _calls_on(prepare, "worker") == []  # queues only: the submission is the next step's
    cpu = "vllm.v1.kv_offload.cpu.gpu_worker"
    for name in ("submit_store", "submit_load"):
        assert "transfer_async(" in ast.unparse(_method(tree, cpu, f"CPUOffloadingWorker.{name}"))
    handler = ast.unparse(_method(tree, cpu, "SingleDirectionOffloadingHandler.transfer_async"))
    assert "end_event.record(stream)" in handler and "self._swap_blocks_batch(" in handler
    assert "event.synchronize()" in ast.unparse(_method(tree, cpu, "SingleDirectionOffloadingHandler.wait"))


@pytest.mark.parametrize("version", [v for v in supported.VLLM if Version(v) >= Version("0.34.0")])
def test_offloading_failed_jobs_are_marked_completed_without_stats(version):
    """What OffloadingGetFinished relies on from vLLM 0.34: a failed TransferResult is marked completed with
    ``success=False`` (``OffloadingWorkerMetadata.failed_jobs``) before anything else, records no transfer stats
    (``continue``), and a failed sync load raises only after it was marked; the load / store split is still
    ``job_id in self._load_jobs`` taken before the job is popped."""
    import ast

    tree = tree_for(version)
    problems = check_read(tree, Read(_OFFLOADING + ".common", "OffloadingWorkerMetadata", "failed_jobs"))
    assert problems == []
    mark = ast.unparse(_method(tree, _OFFLOADING + ".common", "OffloadingWorkerMetadata.mark_completed"))
    assert "self.completed_jobs[job_id] = 1" in mark and "self.failed_jobs.add(job_id)" in mark
    func = _method(tree, _OFFLOADING + ".worker", "OffloadingConnectorWorker.get_finished")
    (loop,) = [n for n in func.body if isinstance(n, ast.For)]
    assert ast.unparse(loop.body[1]) == "is_load = job_id in self._load_jobs"
    (failed,) = [n for n in loop.body if isinstance(n, ast.If) and ast.unparse(n.test) == "not transfer_result.success"]
    body = [ast.unparse(n) for n in failed.body]
    assert body[0] == "self._connector_worker_meta.mark_completed(job_id, success=False)"
    assert body[-1] == "continue" and not any(".record(" in line for line in body)
    raises = [i for i, line in enumerate(body) if "raise RuntimeError" in line]
    assert raises and raises[0] > 0
