"""Contract with vLLM's source, version by version (every release of ``supported.VLLM``, and the drift
canary's): every target of the table exists with the parameters its handler reads, and every attribute
handlers read is defined. Each release is read from its sdist, downloaded at test time
(``source_archives``, cached) and parsed, never imported; the installed vLLM's own files where it is
that release."""

import ast
import dataclasses

import pytest
from packaging.version import Version

from opentelemetry_instrumentation_vllm_ascend import targets
from opentelemetry_instrumentation_vllm_ascend.wiring.installer import in_range
from tests.support.contract import (
    _VLLM_TREES,
    READS,
    VLLM_VERSIONS,
    SourceTree,
    check_read,
    check_target,
    vllm_tree,
)


def tree_for(version: str) -> SourceTree:
    """vLLM ``version``'s source (``contract.vllm_tree``: parsed once per session)."""
    return vllm_tree(version)


_TREES = _VLLM_TREES  # the trees parsed so far, by version


@pytest.fixture(scope="module", params=VLLM_VERSIONS)
def version_tree(request):
    return request.param, tree_for(request.param)


def test_every_target_exists_with_the_parameters_its_handler_reads(version_tree):
    version, tree = version_tree
    problems = []
    for target in targets.TARGETS:
        if target.vllm_ascend is not None or not in_range(Version(version), target.vllm):
            continue
        problems += check_target(tree, target)
    assert problems == [], f"vLLM {version}"


def test_every_attribute_handlers_read_exists(version_tree):
    version, tree = version_tree
    problems = [
        p
        for read in READS
        if not read.module.startswith("vllm_ascend") and in_range(Version(version), read.vllm)
        for p in check_read(tree, read)
    ]
    assert problems == [], f"vLLM {version}"


def test_future_wrapper_completes_through_set_result_and_set_exception(version_tree):
    """The FUTURE_CLASS hook relies on FutureWrapper being a concurrent.futures.Future whose replies
    land through set_result / set_exception."""
    version, tree = version_tree
    found = tree.find_class("vllm.v1.executor.multiproc_executor", "FutureWrapper")
    assert found is not None
    _, node = found
    assert any(getattr(b, "id", getattr(b, "attr", None)) == "Future" for b in node.bases)
    source = tree.files["vllm/v1/executor/multiproc_executor.py"]
    assert "self.set_result(" in source and "self.set_exception(" in source


def test_the_worker_reply_can_carry_the_workers_stamp(version_tree):
    """What executor:execute_model / sample_tokens rely on (handlers.model_runner.reply): vLLM's
    ModelRunnerOutput is a dataclass with an instance dict (no slots), so an attribute set in the
    worker travels pickled with it; the shared empty output the worker must not stamp is
    ``EMPTY_MODEL_RUNNER_OUTPUT``; the worker process turns an async output into its reply by calling
    ``get_output()`` right before sending it (so get_output's return is the reply's ready moment); and
    UniProcExecutor's AsyncOutputFuture calls get_output only inside ``result()`` (the engine's read)."""
    import ast

    version, tree = version_tree
    module = tree.module("vllm.v1.outputs")
    (cls,) = [n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "ModelRunnerOutput"]
    decorators = [d for d in cls.decorator_list if "dataclass" in ast.unparse(d)]
    assert decorators and all("slots=True" not in ast.unparse(d) for d in decorators), version
    assert not any(isinstance(n, ast.Assign) and "__slots__" in ast.unparse(n) for n in cls.body), version
    assert any(
        isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "EMPTY_MODEL_RUNNER_OUTPUT" for n in module.body
    ), version
    _, worker = tree.find_class("vllm.v1.executor.multiproc_executor", "WorkerProc")
    (enqueue,) = [n for n in worker.body if isinstance(n, ast.FunctionDef) and n.name == "enqueue_output"]
    body = ast.unparse(enqueue)
    assert body.index("output.get_output()") < body.index("response_mq.enqueue(result)"), version
    _, future = tree.find_class("vllm.v1.executor.uniproc_executor", "AsyncOutputFuture")
    (result,) = [n for n in future.body if isinstance(n, ast.FunctionDef) and n.name == "result"]
    assert "self.async_output.get_output()" in ast.unparse(result), version


def test_the_checker_catches_drift():
    """The contract is not vacuous: a renamed parameter or a missing attribute is reported."""
    tree = SourceTree({"m.py": "class A:\n    def f(self, req, x):\n        self.y = 1\n"})
    good = targets.Target("m", "A.f", "sync", "", params=("req",))
    bad = targets.Target("m", "A.f", "sync", "", params=("request",))
    missing = targets.Target("m", "A.g", "sync", "")
    assert check_target(tree, good) == []
    assert "handler expects 'request'" in check_target(tree, bad)[0]
    assert "not defined" in check_target(tree, missing)[0]
    from tests.support.contract import Read

    assert check_read(tree, Read("m", "A", "y")) == []
    assert check_read(tree, Read("m", "A", "z")) != []


def test_the_worker_budgets_scopes_are_model_runner_v1s_and_v2_has_none(version_tree):
    """handlers/budget.py's worker stages: model runner V1 (until vLLM 0.33; 0.34 removed it) enters its forward
    scope in execute_model and its sample scope in sample_tokens (the forward / sample stages); model runner V2
    enters no profiling scope anywhere (its stages come from its own methods: tests/contract/test_mrv2.py)."""
    import ast

    version, tree = version_tree
    found = tree.find_class("vllm.v1.worker.gpu_model_runner", "GPUModelRunner")
    if Version(version) >= Version("0.34.0"):
        assert found is None, version
    else:
        _, runner = found
        methods = {n.name: ast.unparse(n) for n in runner.body if isinstance(n, ast.FunctionDef)}
        assert "record_function_or_nullcontext('gpu_model_runner: forward')" in methods["execute_model"], version
        assert "record_function_or_nullcontext('gpu_model_runner: sample')" in methods["sample_tokens"], version
    v2 = [path for path in tree.files if path.startswith("vllm/v1/worker/gpu/")]
    assert v2 and not [path for path in v2 if "record_function_or_nullcontext(" in tree.files[path]], version


def test_allocate_slots_can_be_copied_with_its_returns_rewritten(version_tree):
    """The default set's per-request hook (block_allocate_failures) is a copy of
    KVCacheManager.allocate_slots whose own returns tell it of a None result (hooks/rewrite.py), not a
    wrapper frame on every call: each supported version's method must be one that can be copied."""
    from opentelemetry_instrumentation_vllm_ascend.hooks import rewrite

    version, tree = version_tree
    _, cls = tree.find_class("vllm.v1.core.kv_cache_manager", "KVCacheManager")
    (method,) = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "allocate_slots"]
    assert rewrite.refusal(method) is None, f"vLLM {version}"
    returns = [n for n in ast.walk(method) if isinstance(n, ast.Return)]
    assert any(isinstance(r.value, ast.Constant) and r.value.value is None for r in returns), f"vLLM {version}"


def test_the_openai_handlers_await_their_work_through_the_rejection_hook(version_tree):
    """handlers/traces.py:Rejections hooks GenerateBaseServing._with_kv_transfer_rejection_cleanup: a request is
    rejected there only while create_chat_completion and create_completion hand it their whole work (the request
    object second, the raw HTTP request third), and BaseServing.create_error_response turns an exception into the
    error vLLM's exception handlers send (its first parameter takes one). vLLM 0.23: OpenAIServing's, the same."""
    version, tree = version_tree
    for module, cls, method in (
        ("vllm.entrypoints.openai.chat_completion.serving", "OpenAIServingChat", "create_chat_completion"),
        ("vllm.entrypoints.openai.completion.serving", "OpenAIServingCompletion", "create_completion"),
    ):
        _, node = tree.find_class(module, cls)
        (function,) = [n for n in node.body if isinstance(n, ast.AsyncFunctionDef) and n.name == method]
        (statement,) = function.body[1:]  # after the docstring: the one return
        assert isinstance(statement, ast.Return), (version, method)
        call = statement.value.value  # return await self._with_kv_transfer_rejection_cleanup(...)
        assert ast.unparse(call.func) == "self._with_kv_transfer_rejection_cleanup", (version, method)
        assert [ast.unparse(a) for a in call.args[1:]] == ["request", "raw_request"], (version, method)
    if Version(version) >= Version("0.30.0"):
        _, base = tree.find_class("vllm.entrypoints.serve.engine.serving", "BaseServing")
        (helper,) = [n for n in base.body if isinstance(n, ast.FunctionDef) and n.name == "create_error_response"]
        assert "Exception" in ast.unparse(helper.args.args[0].annotation), version
    else:  # a staticmethod of OpenAIServing: the exception is its first parameter
        _, base = tree.find_class("vllm.entrypoints.openai.engine.serving", "OpenAIServing")
        (helper,) = [n for n in base.body if isinstance(n, ast.FunctionDef) and n.name == "create_error_response"]
        assert [ast.unparse(d) for d in helper.decorator_list] == ["staticmethod"], version
        assert "Exception" in ast.unparse(helper.args.args[0].annotation), version
    # The trace rows of this release: every handler, each symbol hooked once.
    rows = [t for t in targets.TARGETS if t.traces and in_range(Version(version), t.vllm)]
    handlers = ("TraceHeaders", "Rejections", "AddRequest", "FinishRequest", "AbortRequests", "Unparsed")
    handlers += ("Admission",) if Version(version) >= Version("0.30.0") else ()  # 0.23: no admission limits
    assert {t.handler for t in rows} == {f"traces:{h}" for h in handlers}, version
    assert len({t.symbol for t in rows}) == len(rows), version


def test_engine_events_and_the_finish_order_the_journey_relies_on(version_tree):
    """handlers/traces.py: EngineCoreEventType's members QUEUED / SCHEDULED / PREEMPTED (their values 1, 2, 3: the
    fallback for plain ints); process_outputs finishes a request (``_finish_request``) right before it records
    the request's stats (``_update_stats_from_finished``, whose IterationStats call carries the exemplar), and
    passes its ``iteration_stats`` on; vLLM's own request span is built only where ``self.tracing_enabled`` (the
    flag ``Tracker.start`` turns off)."""
    version, tree = version_tree
    _, enum = tree.find_class("vllm.v1.engine", "EngineCoreEventType")
    members = {ast.unparse(n.targets[0]): ast.literal_eval(n.value) for n in enum.body if isinstance(n, ast.Assign)}
    assert members == {"QUEUED": 1, "SCHEDULED": 2, "PREEMPTED": 3}, version
    _, processor = tree.find_class("vllm.v1.engine.output_processor", "OutputProcessor")
    (process,) = [n for n in processor.body if isinstance(n, ast.FunctionDef) and n.name == "process_outputs"]
    assert [a.arg for a in process.args.args[:4]] == [
        "self",
        "engine_core_outputs",
        "engine_core_timestamp",
        "iteration_stats",
    ], version
    source = ast.unparse(process)
    stats = source.index("self._update_stats_from_finished(req_state, finish_reason, iteration_stats)")
    finish = source.rindex("self._finish_request(req_state)", 0, stats)
    assert 0 < stats - finish < 400, version
    assert "if self.tracing_enabled:" in source[stats:], version
    # TraceHeaders reads the inbound headers as vLLM's extract_trace_headers does (0.23 returns None without
    # its own tracing on).
    from opentelemetry_instrumentation_vllm_ascend.handlers import traces

    utils = tree.module("vllm.tracing.utils")
    (names,) = [
        n.value for n in utils.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "TRACE_HEADERS"
    ]
    assert tuple(ast.literal_eval(names)) == traces._TRACE_HEADERS, version


def test_the_kv_load_notes_hook_exists_where_gated_and_its_stages_travel_back(version_tree):
    """handlers/traces.py:KvFetchStage (``targets.KV_FETCH_STAGE``, hooked per scheduler instance): the method exists
    exactly in the releases its gate names, with the parameters the handler reads; the stages it keys on are vLLM's
    constants' values and are set where a load starts (the request goes to WAITING_FOR_REMOTE_KVS) and where the
    worker reported it received; and every output the scheduler builds for a request sends its ``trace_headers``
    back (the channel of the notes)."""
    from opentelemetry_instrumentation_vllm_ascend.handlers import traces

    version, tree = version_tree
    target = targets.KV_FETCH_STAGE
    _, scheduler = tree.find_class(target.module, "Scheduler")
    methods = {n.name: n for n in scheduler.body if isinstance(n, ast.FunctionDef)}
    if not in_range(Version(version), target.vllm):
        assert "_set_kv_fetch_stage" not in methods, version
        return
    assert check_target(tree, target) == [], version
    stats = tree.module("vllm.v1.metrics.stats")
    constants = {
        ast.unparse(n.targets[0]): n.value.value
        for n in stats.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
    }
    assert {constants["KV_FETCH_IN_PROGRESS"], constants["KV_FETCH_COMPLETED_WAITING"]} == set(traces._KV_MARKS)
    schedule = ast.unparse(methods["schedule"])
    waiting = schedule.index("request.status = RequestStatus.WAITING_FOR_REMOTE_KVS")
    started = schedule.index("self._set_kv_fetch_stage(request, KV_FETCH_IN_PROGRESS)")
    assert 0 < started - waiting < 2000, version  # in the same branch, right after
    received = ast.unparse(methods["_update_from_kv_xfer_finished"])
    assert "self._set_kv_fetch_stage(req, KV_FETCH_COMPLETED_WAITING)" in received, version
    update = methods["update_from_output"]
    outputs = [n for n in ast.walk(update) if isinstance(n, ast.Call) and ast.unparse(n.func) == "EngineCoreOutput"]
    assert outputs and all(
        any(k.arg == "trace_headers" and ast.unparse(k.value) == "request.trace_headers" for k in call.keywords)
        for call in outputs
    ), version


def test_the_checker_follows_a_module_level_function_imported_by_name():
    """A module-level row (``Unparsed``): the name is imported from the defining module, a function of the importing
    module reads it at call time (so the hooked global reaches it), and the defining function has the parameters."""
    defining = "async def handler(req, exc):\n    return 1\n"
    tree = SourceTree(
        {
            "p/__init__.py": "",
            "p/h.py": defining,
            "p/reg.py": "from .h import handler\n\ndef init(app):\n    app.on(handler)\n",
            "p/unread.py": "from .h import handler\n\ndef init(app):\n    pass\n",
        }
    )
    row = targets.Target("p.reg", "handler", "coroutine", "", params=("req", "exc"))
    assert check_target(tree, row) == []
    assert "reads its global handler" in check_target(tree, dataclasses.replace(row, module="p.unread"))[0]
    renamed = SourceTree({**tree.files, "p/h.py": defining.replace("req", "request")})
    assert "the handler expects 'req'" in check_target(renamed, row)[0]
    sync = SourceTree({**tree.files, "p/h.py": defining.replace("async def", "def")})
    assert "not a coroutine function" in check_target(sync, row)[0]


def _function(tree, module, name, cls=None):
    body = tree.find_class(module, cls)[1].body if cls else tree.module(module).body
    (found,) = [n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name]
    return found


def test_a_body_that_never_parsed_reaches_the_hooked_name_and_is_a_400(version_tree):
    """handlers/traces.py:Unparsed hooks ``register.validation_exception_handler`` (the global that
    ``init_exception_handler`` registers for FastAPI's RequestValidationError when the app is built): the three
    OpenAI generation routes (their paths the handler names the span by) check the content type with
    ``validate_json_request``, which raises RequestValidationError, and the handler answers 400 ``Bad Request``.
    vLLM 0.23: ``api_server.py``'s ``build_app`` registers it, ``serve/utils/server_utils.py`` defines it."""
    version, tree = version_tree
    if Version(version) >= Version("0.30.0"):
        register, init_name = "vllm.entrypoints.serve.exception_handling.register", "init_exception_handler"
        where = "vllm.entrypoints.serve.exception_handling.handlers.validation"
    else:
        register, init_name = "vllm.entrypoints.openai.api_server", "build_app"
        where = "vllm.entrypoints.serve.utils.server_utils"
    assert {
        t.module for t in targets.TARGETS if t.handler == "traces:Unparsed" and in_range(Version(version), t.vllm)
    } == {register}, version
    init = ast.unparse(_function(tree, register, init_name))
    assert "app.exception_handler(RequestValidationError)(validation_exception_handler)" in init, version
    handler = ast.unparse(_function(tree, where, "validation_exception_handler"))
    defined = _function(tree, where, "validation_exception_handler")
    assert [a.arg for a in defined.args.args] == ["req", "exc"], version  # what Unparsed reads, by position
    assert "type=HTTPStatus.BAD_REQUEST.phrase" in handler and "HTTPStatus.BAD_REQUEST" in handler, version
    assert "JSONResponse(err.model_dump(), status_code=" in handler, version
    validate = ast.unparse(_function(tree, "vllm.entrypoints.serve.utils.api_utils", "validate_json_request"))
    assert "raise RequestValidationError" in validate, version
    from opentelemetry_instrumentation_vllm_ascend.handlers.traces import _PATHS

    for (path, _), module in zip(_PATHS, ("chat_completion", "completion", "responses"), strict=True):
        source = ast.unparse(tree.module(f"vllm.entrypoints.openai.{module}.api_router"))
        assert f"@router.post('{path}', dependencies=[Depends(validate_json_request)]" in source, (version, path)


def test_the_admission_limits_refuse_before_registering_and_a_stream_sends_it_as_a_chunk(version_tree):
    """handlers/traces.py:Admission hooks ``AsyncLLM.check_admission``: where a request id is given (AsyncLLM's
    add_request and _add_request) it is called before ``OutputProcessor.add_request`` (a refused request was never
    registered); a handler's preflight gives none; its two refusals are GracefulHTTPErrors carrying ``http_status``,
    which ``create_error_response`` answers with that status's phrase; the completion and chat stream generators
    send any exception as an error chunk (``create_streaming_error_response(e)``)."""
    version, tree = version_tree
    if Version(version) < Version("0.30.0"):  # no admission limits, no check_admission (its row is gated >=0.30)
        assert "check_admission" not in tree.members("vllm.v1.engine.async_llm", "AsyncLLM"), version
        return
    engine = "vllm.v1.engine.async_llm"
    for name in ("add_request", "_add_request"):
        lines = ast.unparse(_function(tree, engine, name, "AsyncLLM")).splitlines()
        checks = [i for i, line in enumerate(lines) if "self.check_admission(" in line]
        registers = [i for i, line in enumerate(lines) if "self.output_processor.add_request(" in line]
        if not registers and name == "add_request":  # 0.30: it registers through _add_request (checked next)
            registers = [i for i, line in enumerate(lines) if "self._add_request(" in line]
        assert checks and registers and max(checks) < min(registers), (version, name)
        assert all("request_id" in lines[i] for i in checks), (version, name)
    check = _function(tree, engine, "check_admission", "AsyncLLM")
    raised = {ast.unparse(n.exc) for n in ast.walk(check) if isinstance(n, ast.Raise)}
    assert {"QueueOverflowError()", "MaxQueuedTokensError()"} <= raised, version  # 0.34: EngineFaultedError too
    for cls in sorted(r.removesuffix("()") for r in raised):
        _, node = tree.find_class("vllm.exceptions", cls)
        assert [ast.unparse(b) for b in node.bases] == ["GracefulHTTPError"], (version, cls)
    assert "http_status" in tree.members("vllm.exceptions", "GracefulHTTPError"), version
    module = "vllm.entrypoints.serve.exception_handling.error_response"
    (graceful,) = [
        n
        for n in ast.walk(_function(tree, module, "create_error_response"))
        if isinstance(n, ast.If) and ast.unparse(n.test) == "isinstance(exc, GracefulHTTPError)"
    ]
    assert [ast.unparse(n) for n in graceful.body[:2]] == [
        "err_type = HTTPStatus(exc.http_status).phrase",
        "status_code = exc.http_status",
    ], version
    preflight = ast.unparse(
        _function(tree, "vllm.entrypoints.generate.base.serving", "_preflight", "GenerateBaseServing")
    )
    assert "self.engine_client.check_admission(n)" in preflight, version
    for module, cls, generator in (
        ("vllm.entrypoints.openai.completion.serving", "OpenAIServingCompletion", "completion_stream_generator"),
        ("vllm.entrypoints.openai.chat_completion.serving", "OpenAIServingChat", "chat_completion_stream_generator"),
    ):
        handlers = [
            h
            for h in ast.walk(_function(tree, module, generator, cls))
            if isinstance(h, ast.ExceptHandler) and h.type is not None and ast.unparse(h.type) == "Exception"
        ]
        assert any("self.create_streaming_error_response(e)" in ast.unparse(h) for h in handlers), (version, generator)
