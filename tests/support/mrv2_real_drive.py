"""Run by tests/contract/test_mrv2_real.py with vLLM 0.34's (or 0.30's) pure-Python package on sys.path (beside the CPU torch): the
real installer on the real MRV2 modules, the real StepTimingCollector driving our forward mark. Prints one
``RESULT {json}`` line."""

import json

from opentelemetry_instrumentation_vllm_ascend import targets
from opentelemetry_instrumentation_vllm_ascend.handlers import model_runner
from opentelemetry_instrumentation_vllm_ascend.state import STATE
from opentelemetry_instrumentation_vllm_ascend.wiring import installer as inst

out = {"vllm": str(inst.vllm_version())}
installer = inst.Installer(on_first_load=lambda: None)
installer.install()
import vllm.v1.worker.gpu.async_utils as au  # noqa: E402
import vllm.v1.worker.gpu.model_runner  # noqa: E402, F401  (its rows resolve on import)

try:
    import vllm.v1.worker.cpu.standalone_model_runner  # noqa: F401
except Exception as exc:  # may need parts this machine lacks
    out["standalone_import"] = repr(exc)
rows = [t for t in targets.TARGETS if t.vllm_ascend is None and t.path in ("mrv1", "mrv2", "cpu_standalone")]
out["status"] = {t.symbol: installer.status.get(t.symbol) for t in rows}
out["marked"] = STATE.mrv2_forward_marked
# The real collector, hooked by the real installer: inside a step it opens the forward; outside, nothing.
STATE.device = None
collector = au.StepTimingCollector()
collector.forward_start()
out["outside"] = STATE.worker_step is None
step = model_runner.begin_step("decode")
collector.record_batch(type("B", (), {"num_tokens": 4, "num_reqs": 1})(), False)
collector.forward_start()
out["forward_start_set"] = step.forward_start is not None and step.forward_start >= step.start
out["collector_untouched"] = collector._step is None and collector._timed == []
installer.uninstall()
print("RESULT " + json.dumps(out))
