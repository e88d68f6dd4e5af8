"""Contract of the KV transfer and KV-cache write handlers with vLLM's source, version by version:
the attributes they read from vLLM objects (gated like their target rows; the rows themselves are
checked by test_contract_vllm.py)."""

import pytest
from contract import Read, check_read
from packaging.version import Version
from test_contract_vllm import tree_for

from opentelemetry_instrumentation_vllm_ascend.hooks.installer import in_range

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
    (">=0.32.0", _OFFLOADING + ".worker", "OffloadingConnectorWorker", ("_connector_worker_meta", "_load_jobs")),
    (">=0.32.0", _OFFLOADING + ".common", "OffloadingWorkerMetadata", ("completed_jobs", "transfer_stats")),
    (">=0.32.0", _OFFLOADING + ".common", "TransferStats", ("load", "store")),
    (">=0.32.0", _OFFLOADING + ".common", "DirectionalTransferStats", ("sizes", "time", "bytes")),
    (">=0.32.0", _OFFLOADING + ".common", "OffloadingConnectorMetadata", ("load_jobs", "store_jobs")),
    (
        "<0.32.0",
        "vllm.v1.kv_offload.worker.worker",
        "TransferResult",
        ("job_id", "transfer_size", "transfer_time", "transfer_type"),
    ),
)


@pytest.mark.parametrize("version", ["0.23.0", "0.32.0", "0.33.0"])
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
