"""Checks the target table against vLLM / vllm-ascend *source*, without importing it: every hooked
symbol exists, its parameters are where the handler reads them, and every attribute a handler reads
is defined. The machinery lives in the package (``opentelemetry_instrumentation_vllm_ascend.source``,
which ``check --vllm`` uses too) and, for what only the tests ask, in ``tests.support.source_checks``; the
contract tests import both from here, with ``READS``, the attributes handlers read."""

from __future__ import annotations

import importlib.util
import os

from opentelemetry_instrumentation_vllm_ascend import supported
from opentelemetry_instrumentation_vllm_ascend.source import (  # noqa: F401  (re-exported for the tests)
    PACKAGES,
    check_target,
    positional_params,
)
from tests.support.source_checks import (  # noqa: F401  (re-exported for the tests)
    Read,
    SourceTree,
    calls_base,
    check_read,
    fake_problems,
    overrides_without_base_call,
)

#: Set by the drift canary (``tox -e drift``): a vLLM release, and a vllm-ascend one as ``VERSION:VLLM_VERSION``,
#: that every contract test reads besides the supported ones (``supported.py``).
DRIFT_VLLM = os.environ.get("OTEL_VLLM_ASCEND_DRIFT_VLLM", "").strip()
DRIFT_VLLM_ASCEND = os.environ.get("OTEL_VLLM_ASCEND_DRIFT_VLLM_ASCEND", "").strip()

#: The vLLM releases the contract tests read, oldest first: the supported ones, and the canary's.
VLLM_VERSIONS: tuple[str, ...] = supported.VLLM + (
    (DRIFT_VLLM,) if DRIFT_VLLM and DRIFT_VLLM not in supported.VLLM else ()
)
#: (vllm-ascend release, the vLLM release it runs on): the supported pairs, and the canary's.
ASCEND_PAIRS: tuple[tuple[str, str], ...] = supported.VLLM_ASCEND + (
    (tuple(DRIFT_VLLM_ASCEND.split(":", 1)),)  # type: ignore[assignment]
    if DRIFT_VLLM_ASCEND and DRIFT_VLLM_ASCEND.split(":", 1)[0] not in dict(supported.VLLM_ASCEND)
    else ()
)
ASCEND_VERSIONS = tuple(ascend for ascend, _ in ASCEND_PAIRS)


def at_least(version: str, floor: str) -> bool:
    """``version`` >= ``floor`` (so a release added later inherits what its predecessors are expected to do)."""
    from packaging.version import Version

    return Version(version) >= Version(floor)


_VLLM_TREES: dict[str, SourceTree] = {}
_ASCEND_TREES: dict[str, SourceTree] = {}


def _installed_vllm_root(version: str) -> str | None:
    """The installed vLLM's site directory when it is ``version`` (read, never imported)."""
    from opentelemetry_instrumentation_vllm_ascend.wiring.installer import vllm_version

    installed = vllm_version()
    spec = importlib.util.find_spec("vllm") if installed is not None and str(installed) == version else None
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.dirname(list(spec.submodule_search_locations)[0])


def vllm_tree(version: str) -> SourceTree:
    """vLLM ``version``'s source: the installed vLLM when it is that version, else its release archive
    (``source_archives``: the sdist, cached)."""
    if version not in _VLLM_TREES:
        root = _installed_vllm_root(version)
        if root is not None:
            _VLLM_TREES[version] = SourceTree.from_directory(root, "vllm")
        else:
            from tests.support.source_archives import release

            _VLLM_TREES[version] = SourceTree.from_path(release("vllm", version))
    return _VLLM_TREES[version]


def ascend_tree(version: str) -> SourceTree:
    """vllm-ascend ``version``'s source together with the vLLM it runs on (``ASCEND_PAIRS``): its classes
    subclass vLLM's, and attributes they inherit are looked up in the bases."""
    if version not in _ASCEND_TREES:
        from tests.support.source_archives import release

        ascend = SourceTree.from_path(release("vllm-ascend", version))
        _ASCEND_TREES[version] = SourceTree({**vllm_tree(dict(ASCEND_PAIRS)[version]).files, **ascend.files})
    return _ASCEND_TREES[version]


def ascend_vllm(version: str) -> str:
    """The vLLM release vllm-ascend ``version`` runs on."""
    return dict(ASCEND_PAIRS)[version]


#: Attributes handlers read from vLLM objects (checked against source like the targets).
READS = tuple(
    Read(module, cls, attribute, *gate)
    for module, cls, attributes, *gate in (
        (
            "vllm.v1.core.sched.scheduler",
            "Scheduler",
            ("requests", "running", "waiting", "max_num_running_reqs", "kv_cache_manager"),
        ),
        ("vllm.v1.core.kv_cache_manager", "KVCacheManager", ("block_pool",)),
        ("vllm.v1.core.block_pool", "BlockPool", ("num_gpu_blocks", "get_num_free_blocks")),
        ("vllm.v1.core.sched.output", "NewRequestData", ("req_id", "num_computed_tokens")),
        ("vllm.v1.engine.core", "EngineCoreProc", ("has_work",)),
        # model runner V1 is gone from vLLM 0.34 (the V2 runner keeps no ``requests`` dict: its workers take
        # the step's phase from the SchedulerOutput only)
        ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", ("requests",), "<0.34.0"),
        (
            "vllm.v1.metrics.stats",
            "SchedulerStats",
            ("num_running_reqs", "num_waiting_reqs", "num_skipped_waiting_reqs", "spec_decoding_stats"),
        ),
        ("vllm.v1.spec_decode.metrics", "SpecDecodingStats", ("num_draft_tokens",)),
        (
            "vllm.v1.metrics.stats",
            "IterationStats",
            (
                "num_prompt_tokens",
                "prompt_token_stats",
                "num_generation_tokens",
                "time_to_first_tokens_iter",
                "inter_token_latencies_iter",
                "finished_requests",
            ),
        ),
        ("vllm.v1.metrics.stats", "PromptTokenStats", ("total",)),
        ("vllm.v1.metrics.stats", "FinishedRequestStats", ("num_generation_tokens", "decode_time")),
        ("vllm.v1.metrics.stats", "RequestStateStats", ("num_generation_tokens", "first_token_ts")),
        ("vllm.v1.engine", "EngineCoreOutput", ("new_token_ids",)),
        ("vllm.v1.engine", "EngineCoreOutputs", ("engine_index",)),
        (
            "vllm.v1.worker.gpu_worker",
            "Worker",
            (
                "init_snapshot",
                "requested_memory",
                "available_kv_cache_memory_bytes",
                "peak_activation_memory",
                "model_runner",
                "rank",
                "cache_config",
            ),
        ),
        ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", ("model_memory_usage",), "<0.34.0"),
        ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner", ("model_memory_usage",), ">=0.30.0"),
        ("vllm.config", "CacheConfig", ("gpu_memory_utilization", "kv_cache_memory_bytes")),
        ("vllm.utils.mem_utils", "MemorySnapshot", ("total_memory",)),
        # vllm-ascend (checked against its sdist)
        (
            "vllm_ascend.eplb.core.eplb_worker",
            "EplbWorker",
            ("rank_id", "old_expert_maps", "shared_dict", "latest_expert_hotness", "multi_stage"),
        ),
        ("vllm_ascend.eplb.core.eplb_device_transfer_loader", "D2DExpertWeightLoader", ("state",)),
        ("vllm_ascend.eplb.core.eplb_device_transfer_loader", "ExpertWeightUpdateState", ("TRANSFERRING",)),
        ("vllm_ascend.worker.model_runner_v1", "NPUModelRunner", ("attn_state", "requests", "model_memory_usage")),
        (
            "vllm_ascend.attention.attention_v1",
            "AscendAttentionState",
            ("PrefillNoCache", "PrefillCacheHit", "DecodeOnly", "ChunkedPrefill", "SpecDecoding"),
        ),
        ("vllm_ascend.core.recompute_scheduler", "RecomputeSchedulerOutput", ("recomputed_reqs",)),
        (
            "vllm_ascend.worker.worker",
            "NPUWorker",
            (
                "init_snapshot",
                "requested_memory",
                "available_kv_cache_memory_bytes",
                "non_torch_memory",
                "peak_activation_memory",
                "npugraph_memory_bytes",
                "model_runner",
                "rank",
                "cache_config",
            ),
        ),
        (
            "vllm.v1.request",
            "Request",
            ("request_id", "num_computed_tokens", "num_prompt_tokens", "num_tokens", "status"),
        ),
        (
            "vllm.v1.core.sched.output",
            "SchedulerOutput",
            (
                "num_scheduled_tokens",
                "total_num_scheduled_tokens",
                "scheduled_new_reqs",
                "scheduled_cached_reqs",
                "preempted_req_ids",
            ),
        ),
        (
            "vllm.v1.core.sched.output",
            "CachedRequestData",
            ("req_ids", "num_computed_tokens", "num_output_tokens"),
        ),
        # 0.34 sends resumed requests as new ones (handlers.steps reads it only where it exists)
        ("vllm.v1.core.sched.output", "CachedRequestData", ("resumed_req_ids",), "<0.34.0"),
        ("vllm.config", "VllmConfig", ("parallel_config", "kv_transfer_config", "model_config")),
        ("vllm.config", "ParallelConfig", ("data_parallel_index", "data_parallel_size", "data_parallel_rank")),
        ("vllm.config", "KVTransferConfig", ("kv_role",)),
        ("vllm.v1.engine.utils", "CoreEngineProcManager", ("processes", "_finalizer")),
        ("vllm.v1.executor.multiproc_executor", "MultiprocExecutor", ("workers", "shutting_down")),
        ("vllm.v1.executor.multiproc_executor", "WorkerProcHandle", ("proc",)),
        # handlers/traces.py:Rejections (a request rejected before registration): the error response, the fields
        # of the requests it reads, the helper that turns an exception into vLLM's response
        # handlers/traces.py's KV-load notes: the scheduler's connector, the headers a request carries and its
        # outputs send back, the tokens the connector loads
        ("vllm.v1.core.sched.scheduler", "Scheduler", ("connector",), ">=0.30.0"),
        ("vllm.v1.request", "Request", ("trace_headers",), ">=0.30.0"),
        ("vllm.v1.engine", "EngineCoreOutput", ("trace_headers", "prefill_stats"), ">=0.30.0"),
        ("vllm.v1.metrics.stats", "PrefillStats", ("num_external_cached_tokens",), ">=0.30.0"),
        ("vllm.entrypoints.serve.engine.protocol", "ErrorResponse", ("error",), ">=0.30.0"),
        ("vllm.entrypoints.serve.engine.protocol", "ErrorInfo", ("type", "code"), ">=0.30.0"),
        ("vllm.entrypoints.serve.engine.serving", "BaseServing", ("create_error_response",), ">=0.30.0"),
        # … the same on vLLM 0.23 (its serving helpers live on OpenAIServing), and the journey's reads in every
        # release (handlers/traces.py: Tracker.start / outputs / finished / _end)
        ("vllm.entrypoints.openai.engine.protocol", "ErrorResponse", ("error",), "<0.30.0"),
        ("vllm.entrypoints.openai.engine.protocol", "ErrorInfo", ("type", "code"), "<0.30.0"),
        ("vllm.entrypoints.openai.engine.serving", "OpenAIServing", ("create_error_response",), "<0.30.0"),
        ("vllm.v1.engine", "EngineCoreOutput", ("trace_headers", "prefill_stats"), "<0.30.0"),
        ("vllm.v1.metrics.stats", "PrefillStats", ("num_cached_tokens", "num_external_cached_tokens")),
        (
            "vllm.v1.engine",
            "EngineCoreRequest",
            # (and prompt_token_ids: 0.34 annotates it under ``if TYPE_CHECKING``, which the checker does not read)
            ("request_id", "external_req_id", "arrival_time", "sampling_params", "trace_headers"),
        ),
        ("vllm.v1.engine", "EngineCoreOutput", ("request_id", "events", "finish_reason")),
        ("vllm.v1.engine", "EngineCoreEvent", ("type", "timestamp")),
        ("vllm.v1.engine.output_processor", "OutputProcessor", ("request_states", "tracing_enabled")),
        ("vllm.v1.engine.output_processor", "RequestState", ("request_id", "stats")),
        ("vllm.v1.metrics.stats", "RequestStateStats", ("first_token_latency",)),
        ("vllm.v1.metrics.stats", "IterationStats", ("iteration_timestamp",)),
        (
            "vllm.sampling_params",
            "SamplingParams",
            ("max_tokens", "temperature", "top_p", "top_k", "seed", "presence_penalty", "frequency_penalty", "n"),
        ),
        *(
            (
                module,
                cls,
                ("model", "max_tokens", "temperature", "top_p", "top_k", "seed", "presence_penalty", "n")
                + ("frequency_penalty",)
                + extra,
            )
            for module, cls, extra in (
                (
                    "vllm.entrypoints.openai.chat_completion.protocol",
                    "ChatCompletionRequest",
                    ("max_completion_tokens",),
                ),
                ("vllm.entrypoints.openai.completion.protocol", "CompletionRequest", ()),
            )
        ),
    )
    for attribute in attributes
)
