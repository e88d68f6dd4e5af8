"""KV transfers (connectors moving KV cache in and out of the paged KV cache) and KV-cache writes.

Transfers are recorded in the worker that runs them, labelled ``direction`` (h2d: into the KV cache,
d2h: out of it, remote: another node), ``connector`` (the connector's class name) and the ``phase``
of the worker step that submitted them (``LAST_STEP_PHASE``, set by the model runner hook when the
step began). ExampleConnector copies synchronously inside the step, so its submit step is the step.

KV-cache writes are recorded in the EngineCore with each scheduled step (``scheduler.py``'s deferred
records call ``kv_writes``): tokens scheduled per req_phase times the KV bytes per token that
``Scheduler.__init__`` found in its ``KVCacheConfig`` (``bytes_per_token``)."""

from __future__ import annotations

from time import perf_counter

from .. import context, recording
from ..catalogue import M
from ..context import LAST_STEP_PHASE
from ..hooks.handler import Handler

_BYTES = M["kv_transfer:bytes"]
_COUNT = M["kv_transfer:count"]
_DURATION = M["kv_transfer:duration"]
_BLOCKING = M["kv_transfer:blocking:duration"]
_WRITES = M["kv_cache:write_bytes"]

_labels: dict = {}
context.LABEL_CACHES.append(_labels)


def labels_of(phase: str, direction: str, connector: str) -> tuple:
    """``(dp, role, phase, direction, connector)`` (cached)."""
    key = (phase, direction, connector)
    labels = _labels.get(key)
    if labels is None:
        labels = _labels[key] = (context.PROCESS.dp, context.PROCESS.role, phase, direction, connector)
    return labels


def record_transfer(
    direction: str,
    connector: str,
    nbytes: int,
    count: int,
    seconds: float | None = None,
    blocking: float | None = None,
    phase: str | None = None,
) -> None:
    """One connector call's transfers: ``count`` transfers of ``nbytes`` bytes in all, taking ``seconds``
    (None: not measured), of which ``blocking`` seconds blocked the step's host thread."""
    labels = labels_of(phase or LAST_STEP_PHASE[0], direction, connector)
    recording.add(_BYTES, nbytes, labels)
    recording.add(_COUNT, count, labels)
    if seconds is not None:
        recording.record(_DURATION, seconds, labels)
    if blocking is not None:
        recording.record(_BLOCKING, blocking, labels)


def _token_bytes(kv_layer) -> int:
    """Bytes one token occupies in a layer's standardized ``[blocks, heads, block_size, head_size]``
    view (``[blocks, 1, block_size, latent]`` for MLA): what ExampleConnector copies per slot."""
    return kv_layer[0, :, 0].numel() * kv_layer.element_size()


def _connector_name(connector) -> str:
    return type(connector).__name__


class ExampleSaveKvLayer(Handler):
    """``ExampleConnector.save_kv_layer(layer_name, kv_layer, attn_metadata)``: one safetensors file
    per storing request of the step's metadata for this layer (d2h): its slots times the layer's
    bytes per token; the call's wall time (a synchronous copy and file write)."""

    name = "ExampleConnector.save_kv_layer"
    reads_args = 3  # self, layer_name, kv_layer

    def before(self, args, kwargs):
        return perf_counter()

    def after(self, start, args, kwargs, result):
        seconds = perf_counter() - start
        connector, kv_layer = args[0], args[2]
        tokens = files = 0
        for request in connector._get_connector_metadata().requests:
            if request.is_store:
                tokens += len(request.slot_mapping)
                files += 1
        if files:
            record_transfer("d2h", _connector_name(connector), tokens * _token_bytes(kv_layer), files, seconds, seconds)


class ExampleStartLoadKv(Handler):
    """``ExampleConnector.start_load_kv(forward_context)``: per loading request (h2d) and attention
    layer of the forward context (one file each), its slots times that layer's bytes per token; the
    call's wall time (it reads and copies every file before it returns)."""

    name = "ExampleConnector.start_load_kv"
    reads_args = 2  # self, forward_context

    def before(self, args, kwargs):
        return perf_counter()

    def after(self, start, args, kwargs, result):
        seconds = perf_counter() - start
        connector, forward_context = args[0], args[1]
        if getattr(forward_context, "attn_metadata", None) is None:
            return  # vLLM returns before loading anything
        loads = [len(r.slot_mapping) for r in connector._get_connector_metadata().requests if not r.is_store]
        if not loads:
            return
        nbytes = files = 0
        for layer in forward_context.no_compile_layers.values():
            kv_layer = getattr(layer, "kv_cache", None)
            if kv_layer is None:
                continue
            per_token = _token_bytes(kv_layer)
            for tokens in loads:
                nbytes += tokens * per_token
                files += 1
        record_transfer("h2d", _connector_name(connector), nbytes, files, seconds, seconds)


# -- KV-cache writes ------------------------------------------------------------------------------------

#: KV bytes one scheduled token writes in this process's engine (0: unknown, nothing recorded).
BYTES_PER_TOKEN = [0]


def bytes_per_token(kv_cache_config) -> int:
    """KV bytes one token writes: over the attention groups of a ``KVCacheConfig``, the page size per
    token of the group's spec times its layers (state-space groups hold per-request state: skipped)."""
    try:
        from vllm.v1.kv_cache_interface import AttentionSpec
    except ImportError:  # pragma: no cover - vLLM without it
        AttentionSpec = None
    total = 0
    for group in kv_cache_config.kv_cache_groups:
        spec = group.kv_cache_spec
        if AttentionSpec is not None and not isinstance(spec, AttentionSpec):
            continue
        total += spec.page_size_bytes // spec.block_size * len(group.layer_names)
    return total


class SchedulerInit(Handler):
    """``Scheduler.__init__(vllm_config, kv_cache_config, …)``: the KV bytes per scheduled token."""

    name = "Scheduler.__init__"
    reads_args = 3  # self, vllm_config, kv_cache_config

    def after(self, state, args, kwargs, result):
        config = getattr(args[0], "kv_cache_config", None) or args[2]
        BYTES_PER_TOKEN[0] = bytes_per_token(config)


def kv_writes(tokens: int, labels: tuple, _per_token=BYTES_PER_TOKEN) -> None:
    """``tokens`` scheduled tokens of one req_phase (``labels``: dp, role, phase, req_phase)."""
    per_token = _per_token[0]
    if per_token and tokens:
        recording.add(_WRITES, tokens * per_token, labels)
