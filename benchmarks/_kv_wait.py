"""Request traces' EngineCore part (docs/traces.md, KV load waits): what the wrapper of a connector scheduler's
``_set_kv_fetch_stage`` costs, on a real vLLM Scheduler with a real (test) KV connector, beside the same scheduler's
unwrapped method. Per call with ``None`` (vLLM's call for every request it takes in from its waiting queue, connector
or not) and per asynchronous load (its two notes: started, received).

``python -m benchmarks._kv_wait`` (vLLM installed): medians of 15 rounds, ns."""

from __future__ import annotations

import statistics
import tempfile
import time


def main() -> None:
    from vllm.v1.metrics.stats import KV_FETCH_COMPLETED_WAITING, KV_FETCH_IN_PROGRESS
    from vllm.v1.request import Request

    from opentelemetry_instrumentation_vllm_ascend.cli.demo import tiny_model
    from opentelemetry_instrumentation_vllm_ascend.handlers import traces
    from tests.support.async_load_connector import build_scheduler, engine_request

    model = tiny_model.build(tempfile.mkdtemp(prefix="kv-wait-bench-"))
    plain, wrapped = build_scheduler(model), build_scheduler(model)
    assert traces.watch_kv_loads(wrapped)
    request = Request.from_engine_core_request(engine_request("cmpl-load-x1"), None)
    calls = 20000

    def per_none(scheduler) -> float:
        f = scheduler._set_kv_fetch_stage
        start = time.perf_counter()
        for _ in range(calls):
            f(request, None)
        return (time.perf_counter() - start) / calls * 1e9

    def per_load(scheduler) -> float:
        f = scheduler._set_kv_fetch_stage
        start = time.perf_counter()
        for _ in range(calls):
            request.trace_headers = None
            f(request, KV_FETCH_IN_PROGRESS)
            f(request, KV_FETCH_COMPLETED_WAITING)
            f(request, None)
        return (time.perf_counter() - start) / calls * 1e9

    rows = {}
    for name, measure in (("call with None", per_none), ("async load (3 calls)", per_load)):
        pairs = [(measure(plain), measure(wrapped)) for _ in range(15)]
        rows[name] = (statistics.median(p for p, _ in pairs), statistics.median(w for _, w in pairs))
    print(f"{'case':<24}{'vLLM ns':>10}{'wrapped ns':>12}{'added ns':>10}")
    for name, (p, w) in rows.items():
        print(f"{name:<24}{p:>10.0f}{w:>12.0f}{w - p:>10.0f}")


if __name__ == "__main__":
    main()
