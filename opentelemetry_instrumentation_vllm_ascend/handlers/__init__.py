"""Handlers, one module per vLLM subsystem: arguments in, measurements out (through ``recording``).

Each handler is a :class:`~opentelemetry_instrumentation_vllm_ascend.wrappers.Handler`; none imports
vLLM, so all are testable on plain objects.
"""
