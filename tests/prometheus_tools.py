"""Finds ``prometheus`` and ``promtool`` for the tests, installing Debian's ``prometheus`` package (2.42, which
brings ``promtool``) where they are missing and the tests run as root with apt-get (CI: a fresh Debian machine).
Anywhere else (a developer's machine, not root) the tests that need them skip, saying how to get them; in CI
(the ``CI`` environment variable set, as CI services set it and tox passes it through) they fail instead, so that
a CI machine without the tools cannot pass by skipping them.

Set ``OTEL_VLLM_ASCEND_NO_APT=1`` to forbid the installation even as root."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

import pytest

HINT = "install Debian's prometheus package (sudo apt-get install prometheus) or put prometheus and promtool on PATH"


@functools.lru_cache(maxsize=1)
def _provision() -> str | None:
    """None when both tools are on PATH (after installing them if we may), else why not."""
    if shutil.which("promtool") and shutil.which("prometheus"):
        return None
    if os.environ.get("OTEL_VLLM_ASCEND_NO_APT") == "1":
        return f"prometheus/promtool missing and OTEL_VLLM_ASCEND_NO_APT=1; {HINT}"
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("apt-get"):
        return f"prometheus/promtool missing (and not root with apt-get to install them); {HINT}"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "prometheus"]
    for commands in ([install], [["apt-get", "update", "-q"], install]):
        ok = all(
            subprocess.run(c, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=900).returncode
            == 0
            for c in commands
        )
        if ok and shutil.which("promtool") and shutil.which("prometheus"):
            return None
    return f"apt-get install prometheus failed; {HINT}"


def in_ci() -> bool:
    """``CI`` is set (GitHub Actions, GitLab CI and most others set ``CI=true``); ``0``/``false`` do not count."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def tool(name: str) -> str:
    """The path of ``prometheus`` or ``promtool``, or skip the calling test (fail it in CI)."""
    reason = _provision()
    if reason:
        if in_ci():
            pytest.fail(f"CI is set: {reason}", pytrace=False)
        pytest.skip(reason)
    path = shutil.which(name)
    assert path
    return path


def promtool(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([tool("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=120)
