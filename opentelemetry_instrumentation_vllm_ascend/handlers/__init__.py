"""Handlers, one module per vLLM subsystem: arguments in, measurements out (through ``recording``).

Each handler is a :class:`~opentelemetry_instrumentation_vllm_ascend.hooks.handler.Handler`. They read vLLM's
objects by attribute and import nothing of vLLM at module level, so all are testable on plain objects; one
import runs inside a handler, when its hook first fires in a server (``kv_transfer``: vLLM's ``AttentionSpec``,
to tell attention layers' KV caches from others).
"""
