"""Hooks: the target table (which vLLM / vllm-ascend symbol feeds which metric), the installer that
resolves and patches it, and the wrapper machinery (handler protocol, wrapper kinds, code
generation, future completion hooking, patch records)."""
