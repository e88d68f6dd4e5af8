"""Finds ``prometheus`` and ``promtool`` for the tests, installing Debian's ``prometheus`` package (2.42, which
brings ``promtool``) where they are missing and the tests run as root with apt-get (CI: a fresh Debian machine).
Anywhere else (a developer's machine, not root) the tests that need them skip, saying how to get them; in CI
(the ``CI`` environment variable set, as CI services set it and tox passes it through) they fail instead, so that
a CI machine without the tools cannot pass by skipping them.

Set ``OTEL_VLLM_ASCEND_NO_APT=1`` to forbid the installation even as root."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from opentelemetry_instrumentation_vllm_ascend.cli.demo.server import free_port

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


class Prometheus:
    """A real Prometheus on a free local port scraping ``targets`` (host:port) every second, its data and log
    under ``root``; ``stop()`` ends it. ``flags``: further command-line flags (``--enable-feature=…``);
    ``metrics_path``: the path it scrapes."""

    def __init__(
        self,
        root,
        targets: list[str],
        job: str = "vllm",
        rule_files: tuple[str, ...] = (),
        flags: tuple[str, ...] = (),
        metrics_path: str = "/metrics",
    ) -> None:
        self.port = free_port()
        config = root / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            + (f"rule_files: {json.dumps(list(rule_files))}\n" if rule_files else "")
            + "scrape_configs:\n"
            f"  - job_name: {job}\n"
            f"    metrics_path: {json.dumps(metrics_path)}\n"
            f"    static_configs: [{{targets: {json.dumps(targets)}}}]\n"
        )
        self.log = open(root / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [
                tool("prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={root / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                *flags,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"prometheus did not start; log: {root / 'prometheus.log'}")
            time.sleep(0.25)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def get(self, path: str, **params) -> dict:
        """The ``data`` of a successful API answer."""
        url = f"http://127.0.0.1:{self.port}{path}?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=30) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list:
        """An instant query, now or at unix time ``at`` (queries compared with each other need the same time)."""
        params = {"query": expr} if at is None else {"query": expr, "time": f"{float(at):.3f}"}
        return self.get("/api/v1/query", **params)["result"]

    def scalar(self, expr: str) -> float:
        result = self.query(expr)
        assert len(result) == 1, (expr, result)
        return float(result[0]["value"][1])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
        self.log.close()
