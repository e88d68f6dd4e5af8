"""Contract of the time budgets (handlers/budget.py) with vLLM's source, version by version (``supported.VLLM``;
parsed, never imported): the calls whose hooks are the stage boundaries happen in the order the budgets
assume, in ``EngineCore.step``, ``EngineCore.step_with_batch_queue``, the busy loops of ``EngineCoreProc`` and
``DPEngineCoreProc`` (``run_busy_loop``, ``_process_input_queue``, ``_process_engine_step``),
``WorkerProc.worker_busy_loop`` and AsyncLLM's output handler. Calls are listed in evaluation order (a call's
arguments before the call), so ``f(g())`` lists ``g`` then ``f``."""

import ast

import pytest

from tests.contract.test_vllm import tree_for
from tests.support.contract import VLLM_VERSIONS, at_least, overrides_without_base_call

_CORE = "vllm.v1.engine.core"


@pytest.fixture(scope="module", params=VLLM_VERSIONS)
def source(request):
    return request.param, tree_for(request.param)


def _wait(version: str) -> str:
    """The context manager whose call opens ``wait_workers`` (the rows of handlers.engine.WaitForWorkers)."""
    return "capture_iteration_details" if at_least(version, "0.30") else "log_iteration_details"


def _result(version: str) -> str:
    """What the step calls, inside the wait context, to get the workers' output: ``future.result()``, or from
    vLLM 0.34 ``self._wait_for_output(future)`` (which ends in ``future.result()``)."""
    return "_wait_for_output" if at_least(version, "0.34") else "result"


def _method(tree, module: str, qualname: str):
    cls, name = qualname.rsplit(".", 1)
    found = tree.find_class(module, cls)
    assert found is not None, f"{module}:{cls}"
    matches = [n for n in found[1].body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name]
    assert matches, f"{module}:{qualname}"
    return matches[0]


def _name(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def calls(node) -> list[str]:
    """The names of the calls under ``node``, in evaluation order (nested function definitions skipped)."""
    out: list[str] = []

    def visit(n):
        for child in ast.iter_child_nodes(n):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child)
        if isinstance(n, ast.Call):
            out.append(_name(n))

    for statement in node.body:
        visit(statement)
    return out


def in_order(names: list[str], expected: list[str]) -> bool:
    """Whether ``expected`` is a subsequence of ``names``."""
    it = iter(names)
    return all(any(n == e for n in it) for e in expected)


def _inside_wait(func, wait: str, target: str) -> list[int]:
    """Line numbers of the ``<x>.{target}()`` calls of ``func`` that are not inside a ``with`` whose items call
    ``wait``."""
    covered = set()
    for node in ast.walk(func):
        if isinstance(node, ast.With) and any(
            isinstance(i.context_expr, ast.Call) and _name(i.context_expr) == wait for i in node.items
        ):
            covered.update(id(n) for statement in node.body for n in ast.walk(statement))
    return [
        n.lineno
        for n in ast.walk(func)
        if isinstance(n, ast.Call) and _name(n) == target and isinstance(n.func, ast.Attribute) and id(n) not in covered
    ]


def test_step_schedules_dispatches_waits_inside_the_wait_context_and_updates(source):
    """``schedule`` (schedule stage), ``execute_model`` and ``get_grammar_bitmask`` (dispatch), the wait context
    manager right before ``future.result()`` and step's blocking ``sample_tokens`` (wait_workers), the abort queue,
    then ``update_from_output`` (update)."""
    version, tree = source
    func = _method(tree, _CORE, "EngineCore.step")
    wait = _wait(version)
    expected = ["schedule", "execute_model", "get_grammar_bitmask", wait, _result(version), "sample_tokens"]
    assert in_order(calls(func), expected + ["_process_aborts_queue", "update_from_output"]), calls(func)
    assert _inside_wait(func, wait, _result(version)) == []
    assert calls(func).count(wait) == 1


def test_step_with_batch_queue_waits_only_inside_the_wait_context(source):
    """The batch queue: schedule, dispatch (execute_model, grammar bitmask, the non-blocking sample_tokens), the
    queue's oldest entry popped, the wait context manager opened before every ``.result()`` (so a call that
    scheduled nothing, or found nothing to schedule, still waits in wait_workers), the abort queue, the update,
    then the deferred structured-output sampling (grammar bitmask, sample_tokens) in the output stage."""
    version, tree = source
    func = _method(tree, _CORE, "EngineCore.step_with_batch_queue")
    wait = _wait(version)
    names = calls(func)
    assert in_order(
        names,
        ["schedule", "execute_model", "get_grammar_bitmask", "sample_tokens", "pop", wait, _result(version)]
        + ["_process_aborts_queue", "update_from_output", "get_grammar_bitmask", "sample_tokens"],
    ), names
    assert _inside_wait(func, wait, _result(version)) == []  # future.result() (0.34: _wait_for_output)
    assert _inside_wait(func, wait, "result") == []  # and exec_model_fut.result()
    assert names.count(wait) == 1 and names.count("update_from_output") == 1


def test_the_busy_loops_handle_input_then_step_and_queue_outputs_before_post_step(source):
    """``run_busy_loop``: ``_process_input_queue`` (idle / input) then ``_process_engine_step``; the DP loop's
    dummy batch runs inside the wait context manager (wait_workers); ``_process_input_queue`` blocks only while
    ``has_work()`` is false and hands each request to ``_handle_client_request``; ``_process_engine_step`` queues
    the step's outputs (output) before ``post_step`` (other), which precedes its short sleep."""
    version, tree = source
    wait = _wait(version)
    loop = calls(_method(tree, _CORE, "EngineCoreProc.run_busy_loop"))
    assert in_order(loop, ["_process_input_queue", "_process_engine_step"]), loop
    dp = _method(tree, _CORE, "DPEngineCoreProc.run_busy_loop")
    assert in_order(calls(dp), ["_process_input_queue", "_process_engine_step", wait, "execute_dummy_batch"])
    assert _inside_wait(dp, wait, "execute_dummy_batch") == []
    pass_ = calls(_method(tree, _CORE, "EngineCoreProc._process_input_queue"))
    assert in_order(pass_, ["has_work", "get", "_handle_client_request", "get_nowait", "_handle_client_request"])
    step = calls(_method(tree, _CORE, "EngineCoreProc._process_engine_step"))
    assert in_order(step, ["step_fn", "put_nowait", "post_step", "has_requests", "sleep"]), step
    for owner, names in (
        ("EngineCore", ("step", "step_with_batch_queue", "post_step", wait)),
        ("EngineCoreProc", ("_process_engine_step", "_process_input_queue")),
    ):
        for name in names:  # no subclass (DP, Ray actors) replaces them
            assert overrides_without_base_call(tree, _CORE, owner, name) == [], (version, owner, name)


def test_the_worker_runs_one_rpc_at_a_time_dequeue_call_reply(source):
    """The worker budget's ``idle`` spans the RPC loop between two model-runner calls: ``worker_busy_loop``
    dequeues an RPC, calls the worker's method and replies (``handle_output``) in the one thread, one RPC at a
    time (0.32+ through ``_execute_worker_rpc``)."""
    version, tree = source
    module = "vllm.v1.executor.multiproc_executor"
    names = calls(_method(tree, module, "WorkerProc.worker_busy_loop"))
    if "_execute_worker_rpc" in names:
        at = names.index("_execute_worker_rpc")
        names[at : at + 1] = calls(_method(tree, module, "WorkerProc._execute_worker_rpc"))
    assert in_order(names, ["dequeue", "func", "handle_output"]), names
    assert names.count("dequeue") == 1 and names.count("func") == 1


def test_the_output_handler_awaits_the_engine_then_processes_its_outputs(source):
    """The API server's budget: ``wait_engine`` is the awaited ``get_output_async``, ``process`` the
    ``process_outputs`` call that follows for each chunk, the rest of the loop (stat logging, aborts, the
    yields between chunks) ``other``; the loop awaits the engine nowhere else before processing."""
    version, tree = source
    runner = _method(tree, "vllm.v1.engine.async_llm", "AsyncLLM._run_output_handler")
    (handler,) = [n for n in ast.walk(runner) if isinstance(n, ast.AsyncFunctionDef) and n.name == "output_handler"]
    (loop,) = [n for n in ast.walk(handler) if isinstance(n, ast.While)]
    names = calls(loop)
    assert in_order(names, ["get_output_async", "process_outputs", "record"]), names
    awaited = [_name(n.value) for n in ast.walk(loop) if isinstance(n, ast.Await) and isinstance(n.value, ast.Call)]
    assert awaited[0] == "get_output_async" and awaited.count("get_output_async") == 1, awaited
    assert names.index("get_output_async") < names.index("process_outputs")


@pytest.mark.parametrize("version", VLLM_VERSIONS)
def test_client_requests_are_handled_in_a_pass_or_while_a_step_waits(version):
    """handlers.engine.HandleClientRequest takes a request handled outside ``_process_input_queue`` for one
    handled while a step waits for its output (input, not wait_workers; its seconds go to the next pass). That
    holds while the only callers of ``_handle_client_request`` are ``_process_input_queue``, vLLM 0.34's
    ``EngineCoreProc._wait_for_output`` and the DP engine's override (which calls the base). On 0.34 the wait
    handles requests only between polls of the future and before its blocking ``result()``; both steps call it
    inside the wait context (the test above); no subclass replaces it."""
    import ast

    tree = tree_for(version)
    callers = set()
    for cls in ("EngineCore", "EngineCoreProc", "DPEngineCoreProc"):
        found = tree.find_class(_CORE, cls)
        for node in found[1].body if found else ():
            if isinstance(node, ast.FunctionDef) and "_handle_client_request" in calls(node):
                callers.add(f"{cls}.{node.name}")
    expected = {"EngineCoreProc._process_input_queue", "DPEngineCoreProc._handle_client_request"}
    if at_least(version, "0.34"):
        expected.add("EngineCoreProc._wait_for_output")
        wait = calls(_method(tree, _CORE, "EngineCoreProc._wait_for_output"))
        assert in_order(wait, ["poll", "get_nowait", "_handle_client_request", "wait_briefly", "result"]), wait
        assert wait[-1] == "result" and wait.count("_handle_client_request") == 1
        assert calls(_method(tree, _CORE, "EngineCore._wait_for_output")) == ["result"]
        assert overrides_without_base_call(tree, _CORE, "EngineCoreProc", "_wait_for_output") == []
        # deferred requests are handled first thing in the next pass
        pass_ = calls(_method(tree, _CORE, "EngineCoreProc._process_input_queue"))
        assert pass_[:2] == ["popleft", "_handle_client_request"], pass_
    assert callers == expected, version
    assert overrides_without_base_call(tree, _CORE, "EngineCoreProc", "_handle_client_request") == []
