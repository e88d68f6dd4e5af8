"""ms-service-metric 26.0.0's own timer and counter hooks on the synthetic target, timed in a
subprocess (its control plane needs the main thread, a SIGUSR1 handler and POSIX shm).
Prints one JSON line: {"timer": [ns, ...], "counter": [ns, ...], "bare": [...]} or {"error": ...}."""

import json
import os
import sys
import time
import timeit

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
PREFIX = f"/otel_vllm_bench_msm_{os.getpid()}"
os.environ["MS_SERVICE_METRIC_SHM_PREFIX"] = PREFIX
os.environ.pop("MS_SERVICE_METRIC_CONFIG_PATH", None)
os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
os.environ.setdefault("PROF_LOG_LEVEL", "WARNING")


def main(number: int, repeat: int) -> dict:
    try:
        from ms_service_metric.core.symbol_handler_manager import SymbolHandlerManager
        from ms_service_metric.metrics.metrics_manager import get_metrics_manager
        from ms_service_metric.utils.shm_manager import SharedMemoryManager
    except Exception as exc:  # not installed: the suite says so and goes on
        return {"error": f"{type(exc).__name__}: {exc}"}
    import tempfile

    import _targets

    config = os.path.join(tempfile.mkdtemp(), "bench.yaml")
    with open(config, "w") as f:
        f.write(
            "- symbol: _targets:Target.step\n  metrics: [{name: bench_step_duration, type: timer}]\n"
            "- symbol: _targets:Target.tick\n  metrics: [{name: bench_tick_total, type: counter}]\n"
        )
    get_metrics_manager().metric_prefix = "vllm_profiling"
    manager = SymbolHandlerManager()
    manager.initialize(config)
    shm = SharedMemoryManager(shm_prefix=PREFIX)
    shm.connect(create=False)
    try:
        shm.send_control_command(is_start=True)  # what `ms-service-metric on` does
        deadline = time.monotonic() + 5
        while not manager.is_enabled() and time.monotonic() < deadline:
            time.sleep(0.001)
        t = _targets.Target()
        if _targets.Target.__dict__["step"].__name__ == "step":
            return {"error": "ms-service-metric did not hook the target"}
        g = {"t": t}
        out = {}
        for key, stmt in (("timer", "t.step(1)"), ("counter", "t.tick(1)")):
            runs = timeit.Timer(stmt, globals=g).repeat(repeat=repeat, number=number)
            out[key] = [r / number * 1e9 for r in runs]
        return out
    finally:
        shm.disconnect()
        manager.shutdown()
        SharedMemoryManager(shm_prefix=PREFIX).destroy()


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]))))
