"""Start real vLLM (CPU) on a tiny model, drive load, scrape /metrics."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import IO

from prometheus_client.parser import text_string_to_metric_families

#: Settings that make a 2-core CPU machine preempt under 16 concurrent 150-token requests.
DEFAULT_ARGS = (
    "--num-gpu-blocks-override",
    "16",
    "--block-size",
    "32",
    "--max-model-len",
    "256",
    "--max-num-seqs",
    "16",
    "--dtype",
    "float32",
    "--enforce-eager",
    "--served-model-name",
    "tiny",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``[opentelemetry-instrument] python -m vllm.entrypoints.openai.api_server …`` as a subprocess; with
    ``cli=True``, ``[opentelemetry-instrument] vllm serve MODEL …`` (the command users run: it alone starts
    several API servers, ``--api-server-count``, the default with ``--data-parallel-size`` > 1)."""

    def __init__(
        self,
        model: str,
        *,
        instrument: bool = True,
        env: dict | None = None,
        extra_args=(),
        log_path: str | None = None,
        port: int | None = None,
        cli: bool = False,
    ) -> None:
        self.model = model
        self.cli = cli
        self.port = port or free_port()
        self.instrument = instrument
        self.env = dict(env or {})
        self.extra_args = tuple(extra_args)
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self._log: IO[bytes] | int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        if self.cli:
            vllm = shutil.which("vllm", path=os.path.dirname(sys.executable)) or shutil.which("vllm")
            if vllm is None:
                raise RuntimeError("the vllm command was not found next to this Python")
            cmd = [vllm, "serve", self.model]
        else:
            cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port), *DEFAULT_ARGS, *self.extra_args]
        if self.instrument:
            launcher = shutil.which("opentelemetry-instrument", path=os.path.dirname(sys.executable))
            launcher = launcher or shutil.which("opentelemetry-instrument")
            if launcher is None:
                raise RuntimeError("opentelemetry-instrument not found (install opentelemetry-instrumentation)")
            cmd = [launcher, *cmd]
        return cmd

    def start(self, timeout: float = 300.0) -> Server:
        env = os.environ.copy()
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env.setdefault("OTEL_METRICS_EXPORTER", "none")
        env.setdefault("OTEL_TRACES_EXPORTER", "none")
        env.setdefault("OTEL_LOGS_EXPORTER", "none")
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("DO_NOT_TRACK", "1")
        env.update(self.env)
        self._log = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            self.command(), env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode} during start-up; log: {self.log_path}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"vLLM did not become healthy in {timeout:.0f} s; log: {self.log_path}")

    def stop(self, timeout: float = 60.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self._log is not None and not isinstance(self._log, int):  # not DEVNULL
            self._log.close()
        return self.proc.returncode

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- client ------------------------------------------------------------------------------
    def complete(self, prompt: str, max_tokens: int = 150, *, ignore_eos: bool = True, timeout: float = 300.0) -> dict:
        body = {
            "model": "tiny",
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": ignore_eos,
            "return_token_ids": True,
        }
        req = urllib.request.Request(
            self.url + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def batch(self, prompts, max_tokens: int = 150, timeout: float = 300.0) -> dict:
        """All prompts in one completion request (vLLM accepts a list): the API server hands them to the
        engine together, so they compete for KV blocks however busy the machine is. Concurrent clients (one
        thread per prompt) do not guarantee that: on a loaded 2-core machine
        their requests were seen to arrive one after another, and 16 of them into 16 KV blocks then caused
        no preemption at all."""
        body = {
            "model": "tiny",
            "prompt": list(prompts),
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
        }
        req = urllib.request.Request(
            self.url + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:
            response = json.loads(r.read())
        assert len(response["choices"]) == len(prompts), response
        return response

    def post(self, path: str, body: dict, timeout: float = 60.0) -> tuple[int, str]:
        req = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def scrape(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as r:
            return r.read().decode()


def samples(text: str) -> list:
    """Every sample of a /metrics text: (name, labels dict, value)."""
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.append((s.name, dict(s.labels), s.value))
    return out


def total(text: str, name: str, **match) -> float:
    return sum(
        v for n, labels, v in samples(text) if n == name and all(labels.get(k) == val for k, val in match.items())
    )
