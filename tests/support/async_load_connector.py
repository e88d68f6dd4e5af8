"""A KV connector for in-process scheduler tests (a real ``KVConnectorBase_V1``): it tells the scheduler that a
request whose id contains ``load`` has ``LOADED`` of its prompt tokens elsewhere, to be loaded asynchronously
(vLLM's OffloadingConnector and P/D connectors answer so), and one whose id contains ``sync`` the same, loaded
inside the step that computes the rest (ExampleConnector's way); the worker side is never built. The test reports
an async load received itself (``KVConnectorOutput.finished_recving``)."""

from __future__ import annotations

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata

#: Tokens "found" for a ``…load…`` request (two 16-token blocks).
LOADED = 32


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
