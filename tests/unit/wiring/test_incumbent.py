"""ms-service-metric's current hook files and every handler name of its source (wiring/incumbent.py): each entry
maps, loads, or is rejected saying what to write instead, and says what differs from the incumbent.

The files under tests/unit/wiring/incumbent/ reproduce the incumbent's files entry by entry (each names its
upstream path and commit); the handler names below are every hook function of its handler modules, read from its
source (ms_service_metric/adapters/vllm/handlers/{metric,meta}_handlers.py at cf79a1ce, handlers/builtin.py, and
the older ms_service_profiler/patcher/vllm/handlers/v1/*.py)."""

import json
import logging
import os
import types

import pytest
from packaging.version import Version

from opentelemetry_instrumentation_vllm_ascend import environment
from opentelemetry_instrumentation_vllm_ascend.cli import docgen
from opentelemetry_instrumentation_vllm_ascend.cli import main as cli
from opentelemetry_instrumentation_vllm_ascend.wiring import incumbent, installer, userfile

HERE = os.path.dirname(__file__)
V1 = os.path.join(HERE, "incumbent", "v1_metrics.yaml")
SGLANG = os.path.join(HERE, "incumbent", "sglang_default.yaml")
OLDER_FILE = os.path.join(HERE, "incumbent", "ms_service_profiler_metrics.yaml")
V = Version("0.32.0")
MSM = "ms_service_metric.adapters.vllm.handlers."
MSP = "ms_service_profiler.patcher.vllm.handlers.v1."
M, L = userfile.MAPPED, userfile.LOADED

#: Every hook function of the incumbent's handler modules and its fate here (read from its source).
CURRENT_HANDLERS = {
    "metric_handlers:abort_requests_phase_handler": incumbent.METRICS,
    "metric_handlers:block_allocate_failure_hooker": incumbent.BUILT_IN,
    "metric_handlers:engine_core_pending_hooker": incumbent.BUILT_IN,
    "metric_handlers:engine_core_phase_handler": incumbent.METRICS,
    "metric_handlers:engine_memory_phase_handler": incumbent.SELECT,
    "metric_handlers:eplb_do_update_hotness_handler": incumbent.BUILT_IN,
    "metric_handlers:executor_execute_model_phase_handler": incumbent.METRICS,
    "metric_handlers:health_check_failed_hooker": incumbent.BUILT_IN,
    "metric_handlers:health_engine_client_hooker": incumbent.BUILT_IN,
    "metric_handlers:model_runner_phase_handler": incumbent.METRICS,
    "metric_handlers:phase_all_handler": incumbent.METRICS,
    "metric_handlers:process_outputs_phase_handler": incumbent.METRICS,
    "metric_handlers:record_function_timer_hook": incumbent.BUILT_IN,
    "metric_handlers:record_function_timer_hook_vllm_ascend": incumbent.BUILT_IN,
    "metric_handlers:record_stats_phase_handler": incumbent.METRICS,
    "metric_handlers:rpc_error_hooker": incumbent.BUILT_IN,
    "metric_handlers:runner_get_output_hooker": incumbent.BUILT_IN,
    "metric_handlers:runtime_memory_phase_handler": incumbent.SELECT,
    "metric_handlers:scheduler_preempt_request_hooker": incumbent.BUILT_IN,
    "metric_handlers:scheduler_scheduler_hooker": incumbent.BUILT_IN,
    "meta_handlers:init_data_parallel": incumbent.IDENTITY,
    "meta_handlers:init_data_parallel_worker": incumbent.IDENTITY,
    "meta_handlers:make_stats": incumbent.BUILT_IN,
    "meta_handlers:record": incumbent.BUILT_IN,
    "meta_handlers:record_dp_rank": incumbent.IDENTITY,
    "meta_handlers:iteration_stats_update_from_output_hooker": incumbent.BUILT_IN,
}
OLDER_HANDLERS = {
    "metric_handlers:record_function_timer_hook": incumbent.BUILT_IN,
    "metric_handlers:record_function_timer_hook_vllm_ascend": incumbent.BUILT_IN,
    "metric_handlers:runner_get_output_hooker": incumbent.BUILT_IN,
    "metric_handlers:scheduler_scheduler_hooker": incumbent.BUILT_IN,
    "meta_handlers:init_data_parallel": incumbent.IDENTITY,
    "meta_handlers:init_data_parallel_worker": incumbent.IDENTITY,
    "meta_handlers:make_stats": incumbent.BUILT_IN,
    "meta_handlers:record": incumbent.BUILT_IN,
    # msServiceProfiler's tracing handlers (its service_profiling_symbols.yaml names them)
    "batch_handlers:schedule": incumbent.REJECTED,
    "batch_handlers:add_request": incumbent.REJECTED,
    "kvcache_handlers:free": incumbent.REJECTED,
    "kvcache_handlers:get_computed_blocks": incumbent.REJECTED,
    "model_handlers:compute_logits": incumbent.REJECTED,
    "model_handlers:sampler_forward": incumbent.REJECTED,
    "model_handlers:execute_model": incumbent.REJECTED,
    "model_handlers:execute_model_runner": incumbent.REJECTED,
    "model_handlers:capture_async": incumbent.REJECTED,
    "model_handlers:record_function_or_nullcontext": incumbent.REJECTED,
    "mtp_handlers:propose_draft_token_ids_npu": incumbent.REJECTED,
    "mtp_handlers:capture_rejection_output": incumbent.REJECTED,
    "request_handlers:add_request_async": incumbent.REJECTED,
    "request_handlers:process_outputs": incumbent.REJECTED,
}


@pytest.fixture(autouse=True)
def _default_metrics(monkeypatch):
    monkeypatch.delenv(environment.ENABLED_METRICS, raising=False)  # the default set: opt-in metrics off
    monkeypatch.delenv(environment.CONFIG_MODULES, raising=False)


def write(tmp_path, text):
    path = tmp_path / "hooks.yaml"
    path.write_text(text)
    return str(path)


# -- the table ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("package", "names"), [(MSM, CURRENT_HANDLERS), (MSP, OLDER_HANDLERS)])
def test_every_handler_of_the_incumbents_source_has_its_fate(package, names):
    fates = {name: getattr(incumbent.find(package + name), "fate", None) for name in names}
    assert fates == names
    for name in names:
        row = incumbent.find(package + name)
        for seed in row.records:  # a built-in fate names metrics this package records
            assert seed in userfile.catalogue.BY_SEED, (name, seed)


def test_the_generic_default_handler_loads_the_metrics_and_an_unknown_handler_is_rejected_saying_what_to_write(
    tmp_path,
):
    text = "- symbol: vllm.x:C.f\n  handler: {}\n  metrics: [{{name: custom:f, type: timer}}]\n"
    (entry,) = userfile.load([write(tmp_path, text.format("ms_service_metric.handlers:default_handler"))], V, None)
    assert entry.status == L
    for handler, said in (
        (MSM + "metric_handlers:my_handler", "write metrics: [{name: <yours>, type: timer}]"),
        ("mine.handlers:timer", "write metrics: [{name: <yours>, type: timer}]"),
        (MSP + "batch_handlers:schedule", "to time the symbol, write metrics: [{name: <yours>, type: timer}]"),
        ("ms_service_profiler.patcher.vllm.handlers.torch_profiler:prof_start", "vLLM's own --profiler-config"),
    ):
        (entry,) = userfile.load([write(tmp_path, text.format(handler))], V, None)
        assert entry.status == userfile.REJECTED and said in entry.reason, entry.reason


def test_the_generated_incumbent_handlers_section_of_configuration_md_is_current():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "configuration.md")
    with open(path, encoding="utf-8") as f:
        committed = f.read()
    assert docgen.with_incumbent_section(committed) == committed, (
        "docs/configuration.md is stale: run python -m opentelemetry_instrumentation_vllm_ascend.cli.docgen "
        "--configuration docs/configuration.md"
    )
    assert "### Incumbent handlers\n" in committed
    for row in incumbent.HANDLERS:
        for name in row.names:
            assert f"`{name}`" in committed


# -- the incumbent's current files ------------------------------------------------------------------------
#: Each entry of v1_metrics.yaml (in order) and its verdict here, by reading the file against the table.
V1_VERDICTS = [
    (1, "AsyncGPUModelRunnerOutput.get_output", M),
    (2, "Scheduler.schedule", M),
    (3, "SchedulerDynamicBatch.schedule", M),
    (4, "ProfilingChunkScheduler.schedule", M),
    (5, "RecomputeScheduler.schedule", M),
    (6, "BalanceScheduler.schedule", M),
    (7, "IterationStats.update_from_output", M),
    (8, "Scheduler._preempt_request", M),
    (9, "KVCacheManager.allocate_slots", M),
    (10, "AsyncLLM.add_request", M),
    (11, "health:engine_client", M),
    (12, "utils:record_function_or_nullcontext", M),
    (13, "ProfileExecuteDuration.capture_async", M),
    (14, "OpenAIServingChat.create_chat_completion", M),
    (15, "OutputProcessor.process_outputs", M),
    (16, "AsyncLLM.generate", M),
    (17, "InputProcessor.process_inputs", M),
    (18, "Scheduler.update_from_output", M),
    (19, "StatLoggerManager.record", M),
    (20, ":AsyncMPClient.abort_requests_async", M),
    (21, ":DPAsyncMPClient.abort_requests_async", M),
    (22, ":DPLBAsyncMPClient.abort_requests_async", M),
    (23, "MultiprocExecutor.execute_model", M),
    (24, "MultiprocExecutor.collective_rpc", M),
    (25, "NPUModelRunner.execute_model", M),
    (26, "NPUModelRunner._prepare_inputs", M),
    (27, "EplbWorker.do_update", M),
    (28, "D2DExpertWeightLoader.update_expert_map_and_weight", M),
    (29, "VllmEplbAdaptor.do_update_expert_map", M),
    (30, "VllmEplbAdaptor.do_update_log2phy_map", M),
    (31, "VllmEplbAdaptor.do_update_expert_weight", M),
    (32, "NPUWorker.compile_or_warm_up_model", M),
    (33, "NPUWorker.profile_memory", L),  # the handler's two values, as gauges with its expressions
    (34, "MultiprocExecutor.sample_tokens", M),
    (35, "EngineCoreProc._process_input_queue", M),
    (36, "EngineCoreProc._process_engine_step", M),
    (37, "EngineCore.step", M),
    (38, "EngineCore.step", M),
    (39, "EngineCore.step_with_batch_queue", M),
    (40, "Scheduler.add_request", M),
]


def test_the_incumbents_current_v1_metrics_loads_every_entry_none_rejected():
    entries = userfile.load([V1], V, None, log=False)
    assert [(e.index, e.status) for e in entries] == [(i, status) for i, _, status in V1_VERDICTS]
    for entry, (_, symbol, _) in zip(entries, V1_VERDICTS):
        assert entry.symbol.endswith(symbol), (entry.symbol, symbol)
    handler_and_metrics = [e for e in entries if e.reason.startswith("handler ") and "built-in metric" in e.reason]
    assert len(handler_and_metrics) == 23  # every handler + metrics entry but profile_memory's (loaded)


def test_each_entry_says_what_differs_from_the_incumbent():
    by_index = {e.index: e for e in userfile.load([V1], V, None, log=False)}
    assert by_index[16].verdict == "mapped with differences" and by_index[16].differences == (
        "engine:generate:duration: what is timed: the whole output stream, until it ended; ms-service-metric timed "
        "the async generator's creation (about a microsecond)",
    )
    assert by_index[15].differences == (  # its buckets and expr, for the built-in's
        "engine_core_outputs_len: buckets: yours (22 bounds) are not used; the built-in's requests buckets apply",
        "engine_core_outputs_len: expr 'len(engine_core_outputs)' is not used; the built-in records: Request "
        "outputs in one chunk handed to OutputProcessor.process_outputs",
    )
    assert by_index[19].differences == (
        "async_llm:record_stats:duration is opt-in and off: name it in OTEL_VLLM_ASCEND_ENABLED_METRICS to record it",
    )
    assert by_index[23].differences == (
        "executor:execute_model:duration: hook point: recorded at vllm.v1.executor.multiproc_executor:"
        "MultiprocExecutor.collective_rpc, vllm.v1.executor.uniproc_executor:UniProcExecutor.collective_rpc, not at "
        "vllm.v1.executor.multiproc_executor:MultiprocExecutor.execute_model",
        "executor:execute_model:duration: what is timed: until the worker's model runner returned from "
        "execute_model; ms-service-metric timed the non-blocking RPC dispatch only",
    )
    assert by_index[20].differences == (
        "async_llm:abort_requests:duration: phase: ms-service-metric's abort_requests_phase_handler labels it with "
        'the phase of the API server\'s last iteration; here phase="all"',
    )
    assert "opt-in" not in " ".join(by_index[10].differences) and by_index[10].verdict == "mapped"
    # The same entry with the opt-in metric switched on: that difference is gone.
    os.environ[environment.ENABLED_METRICS] = "async_llm:record_stats:duration"
    try:
        assert userfile.load([V1], V, None, log=False)[18].differences == ()
    finally:
        del os.environ[environment.ENABLED_METRICS]


def test_the_older_tools_kv_block_histograms_are_said_to_be_gauges_here():
    entries = userfile.load([OLDER_FILE], V, None, log=False)
    assert [e.status for e in entries] == [M] * 9
    make_stats = entries[2]
    assert make_stats.reason.startswith("handler make_stats -> built-in Scheduler.schedule")
    assert make_stats.differences[0].startswith(
        "total_kvcache_blocks, free_kvcache_blocks, allocated_kvcache_blocks are gauges; ms-service-metric 26.0.0 "
        "recorded them as histograms"
    )


def test_the_runtime_memory_handler_becomes_gauges_with_its_values():
    entry = userfile.load([V1], V, None, log=False)[32]
    assert [m.metric for m in entry.measures] == ["engine:memory:torch_reserved_gb", "engine:memory:torch_allocated_gb"]
    worker = types.SimpleNamespace(torch_reserved=2684354560, torch_allocated=1288490189)  # 2.5 GiB, ~1.2 GiB
    # The incumbent's accessor: round(bytes / 1024**3, 2) of the worker's attribute, after the call.
    assert [m.value.evaluate({"self": worker}) for m in entry.measures] == [2.5, 1.2]
    assert all(m.kind == userfile.GAUGE for m in entry.measures)


def test_a_metrics_handler_records_the_entrys_metrics_as_without_it_and_says_the_phase(tmp_path):
    plain = "- symbol: vllm.x:C.f\n  metrics: [{name: custom:f:duration}, {name: custom:f:n, type: counter}]\n"
    handled = plain.replace("  metrics", f"  handler: {MSM}metric_handlers:phase_all_handler\n  metrics")
    (without,) = userfile.load([write(tmp_path, plain)], V, None, log=False)
    (entry,) = userfile.load([write(tmp_path, handled)], V, None, log=False)
    assert entry.key == without.key and entry.status == without.status == L
    assert entry.differences == (
        "phase of custom:f:duration, custom:f:n: ms-service-metric's phase_all_handler labels it with "
        'phase="all"; here the phase of the step most recently scheduled in its process (unknown where none is)',
    )
    assert without.differences == ()


def test_a_handler_with_fixed_metrics_given_metrics_maps_and_loads_both(tmp_path):
    text = (
        "- symbol: vllm.v1.core.sched.scheduler:Scheduler.schedule\n"
        f"  handler: {MSM}metric_handlers:scheduler_scheduler_hooker\n"
        "  metrics: [{name: custom:schedule:calls, type: counter}]\n"
    )
    (entry,) = userfile.load([write(tmp_path, text)], V, None, log=False)
    assert entry.status == L and entry.reason.startswith("handler scheduler_scheduler_hooker -> built-in")
    assert [m.metric for m in entry.measures] == ["custom:schedule:calls"]
    assert entry.differences[-1].startswith("ms-service-metric calls a handler given with metrics as a factory")


@pytest.mark.parametrize(
    ("vllm", "ascend", "index", "status"),
    [
        ("0.32.0", "0.13.0rc1", 13, M),  # capture_async: max_version 0.13.0rc1, inclusive
        ("0.32.0", "0.13.0", 13, userfile.GATED),
        ("0.9.0", None, 8, userfile.GATED),  # _preempt_request: min_version 0.9.1
        ("0.9.1", None, 8, M),
    ],
)
def test_handler_entries_keep_their_version_bounds(vllm, ascend, index, status):
    entries = userfile.load([V1], Version(vllm), Version(ascend) if ascend else None, log=False)
    assert entries[index - 1].status == status, entries[index - 1].reason


def test_the_runtime_log_says_each_entry_and_its_differences_in_one_line(caplog):
    with caplog.at_level(logging.INFO, logger=userfile.__name__):
        entries = userfile.load([V1, SGLANG], V, None)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == len(entries) == 42 and all("\n" not in line for line in lines)
    generate = lines[15]
    assert "async_llm:AsyncLLM.generate mapped with differences: handler phase_all_handler" in generate
    assert generate.endswith(
        " | engine:generate:duration: what is timed: the whole output stream, until it ended; ms-service-metric "
        "timed the async generator's creation (about a microsecond)"
    )
    assert [r.levelname for r in caplog.records].count("WARNING") == 1  # SGLang's `label:` only


# -- check --config ---------------------------------------------------------------------------------------
@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setattr(installer, "vllm_distribution", lambda: None)
    monkeypatch.setattr(installer, "vllm_version", lambda: None)
    monkeypatch.setattr(userfile, "vllm_version", lambda: None)


def test_check_config_prints_each_entrys_verdict_and_differences_first(offline, capsys, tmp_path):
    argv = ["check", "--config", V1, "--config", OLDER_FILE, "--config", SGLANG]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("Hook files:\n")
    assert "entries: 3 loaded, 48 mapped\n" in out
    assert (
        f"  {V1}:16  vllm.v1.engine.async_llm:AsyncLLM.generate  mapped with differences: handler phase_all_handler: "
        "the entry's metrics, as without handler; built-in metric recorded: engine:generate:duration by this symbol\n"
        "      differs: engine:generate:duration: what is timed: the whole output stream, until it ended; "
        "ms-service-metric timed the async generator's creation (about a microsecond)\n"
    ) in out
    assert f"  {V1}:17  vllm.v1.engine.input_processor:InputProcessor.process_inputs  mapped: " in out
    assert cli.main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = report["hook_files"]
    assert report["ok"] is True and len(rows) == 51
    assert rows[15]["differences"] == [
        "engine:generate:duration: what is timed: the whole output stream, until it ended; ms-service-metric timed "
        "the async generator's creation (about a microsecond)"
    ]
    bad = write(tmp_path, f"- symbol: vllm.x:C.f\n  handler: {MSM}metric_handlers:phase_all_handler\n")
    assert cli.main([*argv, "--config", bad]) == 1
    out = capsys.readouterr().out
    assert "entries: 3 loaded, 48 mapped, 1 rejected\n" in out
    assert "rejected: handler phase_all_handler records the entry's metrics and the entry has none" in out


def test_a_files_own_metrics_say_where_they_record_differently_from_the_incumbent(tmp_path):
    text = (
        "- symbol: vllm.x:C.f\n"
        "  metrics:\n"
        "    - {name: custom:f:hist, type: histogram}\n"
        "    - {name: custom:f:n, type: counter, expr: result}\n"
        "    - {name: custom:f:t}\n"
    )
    (entry,) = userfile.load([write(tmp_path, text)], V, None, log=False)
    assert entry.verdict == "loaded with differences"
    assert entry.differences == (
        "custom:f:hist: a histogram without expr records the call's duration here; ms-service-metric records 1 per "
        "call",
        "custom:f:n: where expr fails or is not a number the sample is skipped here (counted in "
        "vllm_profiling_hook_errors_total); ms-service-metric records 1",
        "custom:f:n: an expr value of 0 adds nothing here and a negative one is skipped; ms-service-metric adds 1 for "
        "any value <= 0",
    )


def test_the_engine_memory_handler_maps_the_gauges_it_names_whatever_their_type(tmp_path):
    text = (
        "- symbol: vllm_ascend.worker.worker:NPUWorker.compile_or_warm_up_model\n"
        f"  handler: {MSM}metric_handlers:engine_memory_phase_handler\n"
        "  metrics: [{name: engine:memory:kvcache_gb}, {name: engine:memory:total_gb, type: gauge}]\n"
    )
    (entry,) = userfile.load([write(tmp_path, text)], V, None, log=False)
    assert entry.status == M and not any("type:" in d for d in entry.differences), entry.differences
