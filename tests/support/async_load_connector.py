"""A KV connector for in-process scheduler tests (a real ``KVConnectorBase_V1``): it tells the scheduler that a
request whose id contains ``load`` has ``LOADED`` of its prompt tokens elsewhere, to be loaded asynchronously
(vLLM's OffloadingConnector and P/D connectors answer so), and one whose id contains ``sync`` the same, loaded
inside the step that computes the rest (ExampleConnector's way); the worker side is never built. The test reports
an async load received itself (``KVConnectorOutput.finished_recving``)."""

from __future__ import annotations

import time

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata

#: Tokens "found" for a ``…load…`` request (two 16-token blocks).
LOADED = 32
#: The prompt of ``engine_request``: 40 tokens, LOADED of them loaded, 8 computed.
PROMPT = list(range(4, 44))


class AsyncLoadConnector(KVConnectorBase_V1):
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        if "load" in request.request_id:
            return LOADED - num_computed_tokens, True
        if "sync" in request.request_id:
            return LOADED - num_computed_tokens, False
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        pass

    def build_connector_meta(self, scheduler_output):
        return KVConnectorMetadata()

    # worker side: unused here
    def start_load_kv(self, forward_context, **kwargs):
        pass

    def wait_for_layer_load(self, layer_name):
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass

    def wait_for_save(self):
        pass


def build_scheduler(model_path, connector=True):
    """A real vLLM Scheduler (20 KV blocks of 16 tokens, a 64-token step budget, chunked prefill), with this
    ``AsyncLoadConnector`` as its KV connector or none."""
    import torch
    from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    model_config = ModelConfig(model=model_path, dtype="float32", max_model_len=256, skip_tokenizer_init=True)
    scheduler_config = SchedulerConfig(
        max_num_seqs=4,
        max_num_batched_tokens=64,
        max_model_len=256,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
    )
    cache_config = CacheConfig(block_size=16, cache_dtype="auto", enable_prefix_caching=False)
    cache_config.num_gpu_blocks = 20
    transfer = (
        KVTransferConfig(
            kv_connector="AsyncLoadConnector",
            kv_connector_module_path="tests.support.async_load_connector",
            kv_role="kv_both",
        )
        if connector
        else None
    )
    config = VllmConfig(
        model_config=model_config,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        kv_transfer_config=transfer,
    )
    spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=20, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    return Scheduler(
        vllm_config=config,
        kv_cache_config=kv,
        log_stats=True,
        structured_output_manager=StructuredOutputManager(config),
        block_size=16,
    )


def engine_request(request_id):
    """An EngineCoreRequest of ``PROMPT``, two tokens to generate (its external id: ``request_id`` less its suffix)."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.v1.engine import EngineCoreRequest

    params = SamplingParams(max_tokens=2, detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY)
    req = EngineCoreRequest(
        request_id=request_id,
        prompt_token_ids=list(PROMPT),
        mm_features=None,
        sampling_params=params,
        pooling_params=None,
        arrival_time=time.time(),
        lora_request=None,
        cache_salt=None,
        data_parallel_rank=None,
    )
    req.external_req_id = request_id.rsplit("-", 1)[0]
    return req
