"""Command-line entry points: ``python -m opentelemetry_instrumentation_vllm_ascend check``, the demo
(``python -m opentelemetry_instrumentation_vllm_ascend.cli.demo``) and the docs generator
(``python -m opentelemetry_instrumentation_vllm_ascend.cli.docgen``)."""
