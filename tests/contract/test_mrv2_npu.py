"""Contract with vllm-ascend's V2 NPU runner (``vllm_ascend/worker/v2/model_runner.py``, paths.py "npu_v2"), over
every supported vllm-ascend release parsed over the vLLM it runs on: what its rows and model runner V2's rows rely on
to feed the worker timeline under V2's names (handlers/model_runner.py: ExecuteModelV2, ForwardStartV2, SampleV2).

Its real module does not import on CPU: ``vllm_ascend.worker.v2.model_runner`` pulls in
``vllm_ascend.quantization.utils``, which reads ``torch_npu.float4_e2m1fn_x2`` at import (an empty ``torch_npu`` stub
is not enough, and a fake one would not be its code). So the source is the proof, and this test fails when a method we
rely on moves: the classes subclass V2's ``GPUModelRunner``; from 0.30.0rc2 its ``execute_model`` calls V2's once,
passing ``dummy_run`` on, and returns what V2's returned (None: sample_tokens ends the step), with no sampling or
logits outside a dummy run's branch; ``sample_tokens`` calls V2's once and returns its output; ``sample`` calls V2's
or computes the logits itself; ``prepare_inputs`` (and the 310P runner's ``prepare_inputs`` and ``sample``) never call
the base's (their own rows time them, so a base call would count twice); the 310P runner's ``execute_model`` calls
the NPU runner's; no file of those packages marks a forward (``step_timing``) or enters a profiling scope; the
worker builds these classes where vLLM's ``use_v2_model_runner`` holds. Each row's gate matches the source: the
overrides hooked from 0.30.0rc2 exist exactly there. The fake of tests/support/fakes.py has the real class's shape."""

import ast

import pytest
from packaging.version import Version

from opentelemetry_instrumentation_vllm_ascend import targets
from opentelemetry_instrumentation_vllm_ascend.source import positional_params
from opentelemetry_instrumentation_vllm_ascend.wiring.installer import in_range
from tests.support.contract import ASCEND_VERSIONS, SourceTree, ascend_tree, fake_problems
from tests.support.fakes import MRV2_NPU_FAKES
from tests.support.source_checks import calls_base

V2 = ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner")
NPU = ("vllm_ascend.worker.v2.model_runner", "NPUModelRunner")
P310 = ("vllm_ascend._310p.worker.v2.model_runner", "NPUModelRunner310V2")
ROWS = {t.symbol: t for t in targets.TARGETS}
NPU_ROWS = [t for t in targets.TARGETS if t.path == "npu_v2"]


@pytest.fixture(scope="module", params=ASCEND_VERSIONS)
def version_tree(request):
    return Version(request.param), ascend_tree(request.param)


def _method(tree: SourceTree, where: tuple[str, str], name: str) -> ast.FunctionDef | None:
    found = tree.find_class(*where)
    if found is None:
        return None
    return next((n for n in found[1].body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _super_calls(func: ast.FunctionDef, method: str) -> list[ast.Call]:
    return [
        n
        for n in ast.walk(func)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == method
        and isinstance(n.func.value, ast.Call)
        and ast.unparse(n.func.value) == "super()"
    ]


def _returns_the_base_result(func: ast.FunctionDef, method: str) -> bool:
    """Every ``return`` of ``func`` returns the base's result: ``return super().m(…)`` or the name it was bound to."""
    bound = {
        t.id
        for n in ast.walk(func)
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and _super_calls_in(n.value, method)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    returns = [n for n in ast.walk(func) if isinstance(n, ast.Return)]
    return bool(returns) and all(
        r.value is not None
        and (
            (isinstance(r.value, ast.Name) and r.value.id in bound)
            or (isinstance(r.value, ast.Call) and _super_calls_in(r.value, method))
        )
        for r in returns
    )


def _super_calls_in(call: ast.Call, method: str) -> bool:
    return (
        isinstance(call.func, ast.Attribute) and call.func.attr == method and ast.unparse(call.func.value) == "super()"
    )


def _outside_dummy_branches(func: ast.FunctionDef) -> list[ast.AST]:
    """The nodes of ``func`` not inside an ``if`` whose test reads ``dummy_run``."""
    out: list[ast.AST] = []

    def visit(node):
        if (
            isinstance(node, ast.If)
            and "dummy_run" in ast.unparse(node.test)
            and "not dummy_run" not in ast.unparse(node.test)
        ):
            for child in node.orelse:
                visit(child)
            return
        out.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    for statement in func.body:
        visit(statement)
    return out


def npu_v2_problems(tree: SourceTree, hooked_overrides: bool) -> list[str]:
    """Where the V2 NPU runner of ``tree`` breaks what the timeline relies on (empty: none). ``hooked_overrides``:
    the release's execute_model / sample overrides are hooked (0.30.0rc2+)."""
    problems = []
    if not [s for s in tree.subclasses(*V2) if s[1].name == NPU[1] and s[0] == NPU[0]]:
        return [f"{NPU[0]}:{NPU[1]} is not a subclass of model runner V2's GPUModelRunner"]
    prepare = _method(tree, NPU, "prepare_inputs")
    if prepare is None or calls_base(prepare, "prepare_inputs"):
        problems.append("NPUModelRunner.prepare_inputs is not its own (its row would miss it or count it twice)")
    execute = _method(tree, NPU, "execute_model")
    if hooked_overrides:
        if execute is None:
            return problems + ["NPUModelRunner.execute_model is not overridden"]
        calls = _super_calls(execute, "execute_model")
        if len(calls) != 1:
            problems.append(f"execute_model calls V2's {len(calls)} times, not once")
        elif ast.unparse(calls[0].args[0]) != "scheduler_output" or "dummy_run=dummy_run" not in ast.unparse(calls[0]):
            problems.append("execute_model does not pass scheduler_output and dummy_run on to V2's")
        if positional_params(execute)[:4] != ["self", "scheduler_output", "intermediate_tensors", "dummy_run"]:
            problems.append(f"execute_model's parameters are {positional_params(execute)}")
        if not _returns_the_base_result(execute, "execute_model"):
            problems.append("execute_model does not return what V2's returned")
        for node in _outside_dummy_branches(execute):
            called = ast.unparse(node.func) if isinstance(node, ast.Call) else ""
            if called.endswith((".sample", "compute_logits", ".sampler", "forward_start")) or "step_timing" in called:
                problems.append(f"execute_model calls {called}(…) outside a dummy run")
        sample = _method(tree, NPU, "sample")
        if sample is None:
            problems.append("NPUModelRunner.sample is not overridden")
        elif not (calls_base(sample, "sample") or "compute_logits" in ast.unparse(sample)):
            problems.append("NPUModelRunner.sample neither calls V2's nor computes the logits")
    elif execute is not None or _method(tree, NPU, "sample") is not None:
        problems.append("execute_model / sample are overridden where their rows are gated off")
    sample_tokens = _method(tree, NPU, "sample_tokens")
    if sample_tokens is not None:
        if len(_super_calls(sample_tokens, "sample_tokens")) != 1:
            problems.append("sample_tokens does not call V2's once")
        elif not _returns_the_base_result(sample_tokens, "sample_tokens"):
            problems.append("sample_tokens does not return what V2's returned")
    if tree.find_class(*P310) is not None:
        for name in ("prepare_inputs", "sample"):
            own = _method(tree, P310, name)
            if own is None or calls_base(own, name):
                problems.append(f"NPUModelRunner310V2.{name} is not its own")
        execute_310 = _method(tree, P310, "execute_model")
        if execute_310 is not None and len(_super_calls(execute_310, "execute_model")) != 1:
            problems.append("NPUModelRunner310V2.execute_model does not call the NPU runner's once")
    for path, text in tree.files.items():
        if path.startswith(("vllm_ascend/worker/v2/", "vllm_ascend/_310p/worker/v2/")) and (
            "step_timing" in text or "record_function_or_nullcontext(" in text
        ):
            problems.append(f"{path} marks a forward or enters a profiling scope")
    return problems


def test_the_v2_npu_runner_calls_what_the_timeline_relies_on(version_tree):
    version, tree = version_tree
    hooked = in_range(version, ROWS[f"{NPU[0]}:{NPU[1]}.execute_model"].vllm_ascend)
    assert npu_v2_problems(tree, hooked) == [], str(version)
    worker = tree.files["vllm_ascend/worker/worker.py"]
    assert "self.use_v2_model_runner" in worker and "from vllm_ascend.worker.v2.model_runner import" in worker
    if tree.find_class(*P310) is not None:
        assert "NPUModelRunner310V2(" in tree.files["vllm_ascend/_310p/worker_310p.py"]


def test_each_npu_v2_row_is_gated_to_the_releases_that_have_its_method(version_tree):
    version, tree = version_tree
    assert {t.qualname for t in NPU_ROWS} == {
        "NPUModelRunner.prepare_inputs",
        "NPUModelRunner.execute_model",
        "NPUModelRunner.sample",
        "NPUModelRunner310V2.prepare_inputs",
        "NPUModelRunner310V2.sample",
    }
    for row in NPU_ROWS:
        cls, method = row.qualname.rsplit(".", 1)
        exists = _method(tree, (row.module, cls), method) is not None
        assert in_range(version, row.vllm_ascend) == exists, (str(version), row.symbol)
        assert row.process == targets.WORKER
    if in_range(version, ROWS[f"{NPU[0]}:{NPU[1]}.execute_model"].vllm_ascend):
        assert (
            fake_problems(tree, [(fake, None, module, cls, only) for fake, module, cls, only in MRV2_NPU_FAKES]) == []
        )


def test_the_checker_fails_when_a_method_we_rely_on_moves():
    """Not vacuous: the real 0.30.0rc2 source, changed where the timeline would go wrong, is refused."""
    real = ascend_tree("0.30.0rc2")
    path = "vllm_ascend/worker/v2/model_runner.py"
    source = real.files[path]
    variants = {
        "no super execute_model": (
            "output = super().execute_model(\n                    scheduler_output,",
            "output = self._own_execute(\n                    scheduler_output,",
        ),
        "dummy_run dropped": ("                    dummy_run=dummy_run,\n", ""),
        "prepare_inputs calls the base": (
            '        """Override GPUModelRunner.prepare_inputs for Ascend NPUs.',
            "        super().prepare_inputs(scheduler_output, batch_req_state, batch_desc)\n"
            '        """Override GPUModelRunner.prepare_inputs for Ascend NPUs.',
        ),
        "a forward mark of its own": (
            "        self.kvpp.complete_forward()\n",
            "        self.kvpp.complete_forward()\n        self.step_timing.forward_start()\n",
        ),
        "sample_tokens drops V2's": (
            "output = super().sample_tokens(grammar_output)",
            "output = self.sample(None, None, grammar_output)",
        ),
    }
    for what, (old, new) in variants.items():
        assert source.count(old) >= 1, what
        tree = SourceTree({**real.files, path: source.replace(old, new, 1)})
        assert npu_v2_problems(tree, True), what
