"""Reading a real server's /metrics in the end-to-end tests and benchmarks: series per family, and scraping until
a condition holds."""

from __future__ import annotations

import time

from prometheus_client.parser import text_string_to_metric_families

from opentelemetry_instrumentation_vllm_ascend.cli.demo.server import Server


def series_counts(text: str, prefix: str = "vllm_profiling_") -> dict[str, tuple[int, int]]:
    """Series per metric family of a /metrics text, for the families whose name starts with ``prefix`` (``""``:
    all): ``{family: (series, of which recorded by a worker: carrying rank)}``; a histogram's ``_bucket`` (one per
    bound and ``+Inf``), ``_sum`` and ``_count`` series all count, as Prometheus stores them."""
    out: dict[str, tuple[int, int]] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(prefix):
            continue
        n = len(family.samples)
        worker = sum(1 for s in family.samples if "rank" in s.labels)
        out[family.name] = (n, worker)
    return out


def settle(server: Server, done, timeout: float = 40.0, interval: float = 1.0) -> str:
    """Scrape ``server`` until ``done(text)`` holds on two scrapes in a row (exports lag by an
    interval); the last scrape, also when ``timeout`` passed first (the caller's assertions then say
    what is missing)."""
    deadline = time.monotonic() + timeout
    previous = None
    while True:
        text = server.scrape()
        if done(text) and previous is not None and done(previous):
            return text
        if time.monotonic() > deadline:
            return text
        previous = text
        time.sleep(interval)
