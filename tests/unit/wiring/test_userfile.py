"""Users' hook files (OTEL_VLLM_ASCEND_CONFIG): loading, the expression language, recording, and
what malformed or hostile files do (one log line each, nothing executed)."""

import asyncio
import logging
import os
import re
import sys
import types

import pytest
from packaging.version import Version

from opentelemetry_instrumentation_vllm_ascend import catalogue, environment
from opentelemetry_instrumentation_vllm_ascend.hooks.handler import Hook
from opentelemetry_instrumentation_vllm_ascend.hooks.patches import patch_method
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import SYNC_TIMER
from opentelemetry_instrumentation_vllm_ascend.recording import control
from opentelemetry_instrumentation_vllm_ascend.state import STATE
from opentelemetry_instrumentation_vllm_ascend.wiring import incumbent, installer, userfile
from opentelemetry_instrumentation_vllm_ascend.wiring.expressions import ExpressionError, compile_expression
from tests.support import source_archives
from tests.support.fakes import handler_of, problems
from tests.support.source_archives import incumbent_hook_files, incumbent_sglang_file

P = catalogue.PREFIX
V = Version("0.32.0")
#: The stand-in modules these tests hook, besides vLLM's.
TEST_MODULES = "m,fake_target_module,otel_userfile_reload_target"


@pytest.fixture(autouse=True)
def _test_modules(monkeypatch):
    monkeypatch.setenv(environment.CONFIG_MODULES, TEST_MODULES)


def write(tmp_path, text, name="hooks.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def load(tmp_path, text):
    return userfile.load([write(tmp_path, text)], V, None)


# -- the expression language --------------------------------------------------------------------------
def test_expressions_read_parameters_attributes_subscripts_and_fixed_functions():
    request = types.SimpleNamespace(num_prompt_tokens=7, ids=[3, 4, 5], meta={"k": 2})
    e = compile_expression(
        "max(request.num_prompt_tokens, 1) * 2 + len(request.ids) + request.ids[-1] + request.meta['k'] "
        "+ (1 if result is None else 0) + round(duration, 1) + sum(request.ids[0:2]) + abs(-1) + int(2.5) "
        "+ float(1) + min(3, 4) + 2 ** 3",
        ("self", "request"),
    )
    assert e.names == ("request", "result", "duration")
    assert (
        e.evaluate({"request": request, "result": None, "duration": 0.04})
        == 14 + 3 + 5 + 2 + 1 + 0 + 7 + 1 + 2 + 1 + 3 + 8
    )


def test_unknown_parameter_names_are_rejected_when_the_parameters_are_known():
    with pytest.raises(ExpressionError, match="unknown name 'other'"):
        compile_expression("other + 1", ("self", "request"))


HOSTILE = [
    "__import__('os').system('touch PWNED')",
    "().__class__.__bases__[0].__subclasses__()",
    "request.__init__.__globals__['os']",
    "request.fn.__globals__",
    "(lambda: 0).__code__",
    "request.gen.gi_frame.f_globals",
    "request.coro.cr_frame.f_back",
    "request.tb.tb_frame",
    "2 ** 10 ** 10",
    "(2 ** 64) ** 64",
    "2 ** request.n",
    "1 << 100000",
    "'x' * 10 ** 9",
    "[0] * 100000000",
    "(" * 40 + "1" + ")" * 40,
    "-" * 60 + "1",
    "open('/etc/passwd')",
    "eval('1')",
    "exec('1')",
    "getattr(request, 'x')",
    "globals()",
    "vars(request)",
    "print(1)",
    "request.method()",
    "len(request.ids, key=1)",
    "max(*request.ids)",
    "[x for x in request.ids]",
    "{x: 1 for x in request.ids}",
    "(x for x in request.ids)",
    "lambda: 1",
    "f'{request}'",
    "(y := 1)",
    "request.__dict__",
    "request._OtherClass__private.__class__",
    "len",
    "__builtins__",
    "request.format(1)",
    "'{0.__class__}'.format(request)",
    "{1, 2}",
    "{'a': 1}",
    "await request",
    "yield 1",
    "",
    "   ",
    "1 +",
    "request.num_prompt_tokens; import os",
    "import os",
    "x" * 1001,
    "a if b else",
    "request[1:2:3].mro()",
    # What the incumbent's functions and keyword arguments could open: still no callable reaches a call.
    "max(request.ids, key=request.clear)",
    "min(request.ids, key=len)",
    "str(request, **request.kw)",
    "math.system('x')",
    "os.path.join('a')",
    "math.sqrt.__self__",
    "sqrt",
    "pow(2, 10 ** 10 ** 2)",
]


@pytest.mark.parametrize("source", HOSTILE)
def test_hostile_expressions_are_rejected_at_load(source):
    with pytest.raises(ExpressionError):
        compile_expression(source, None)


#: (expression, the call's result, duration): what ms-service-metric's own evaluator reads as ``ret`` and ``duration``.
INCUMBENT_FORMS = [
    ("ret * 2", 21, 0.5),
    ("sqrt(ret)", 16, 0.5),
    ("math.sqrt(ret) + 1", 16, 0.5),
    ("ceil(duration * 1000)", None, 0.0123),
    ("floor(ret / 3)", 10, 0.5),
    ("pow(ret, 2)", 7, 0.5),
    ("pow(ret, 2, 5)", 7, 0.5),
    ("log(ret)", 100, 0.5),
    ("math.log(ret, 10)", 1000, 0.5),
    ("exp(duration)", None, 0.25),
    ("sin(ret) + cos(ret) + tan(ret)", 1, 0.5),
    ("round(ret, ndigits=2)", 3.14159, 0.5),
    ("int(ret, base=16)", "ff", 0.5),
    ("max(ret, default=0)", [], 0.5),
    ("len(ret) + 1", [1, 2, 3], 0.5),
    ("str(ret)", 5, 0.5),
    ("ret.n * 2", types.SimpleNamespace(n=3), 0.5),
    ("ret['k'] - 1", {"k": 4}, 0.5),
    ("ret ** 2 - ret // 2 + -ret % 7", 9, 0.5),
    ("abs(min(ret, 2)) / float(4)", -3, 0.5),
]


@pytest.fixture(scope="module")
def incumbent_evaluator():
    """ms-service-metric 26.0.0's own expression evaluator (``ExprEval``), from its wheel."""
    import importlib

    try:
        path = source_archives.wheel(*source_archives.INCUMBENT)
    except (LookupError, RuntimeError, OSError) as exc:  # offline
        pytest.skip(f"cannot download the incumbent's wheel: {exc}")
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(path)  # its wheel as a zip import
        try:
            yield importlib.import_module("ms_service_metric.utils.expr_eval").ExprEval
        finally:
            for name in [n for n in sys.modules if n.split(".")[0] == "ms_service_metric"]:
                del sys.modules[name]


@pytest.mark.parametrize(("source", "ret", "duration"), INCUMBENT_FORMS)
def test_an_expression_the_incumbent_accepts_gives_the_incumbents_value(incumbent_evaluator, source, ret, duration):
    theirs = incumbent_evaluator(source)({"ret": ret, "duration": duration})
    ours = compile_expression(source, None).evaluate({"result": ret, "duration": duration})
    assert ours == theirs and type(ours) is type(theirs)


def test_ret_reads_the_result_and_pow_keeps_the_exponent_bound():
    assert compile_expression("ret + 1", ()).names == ("result",)
    with pytest.raises(ValueError, match="exponent above 64"):
        compile_expression("pow(2, result)", ()).evaluate({"result": 10**6})


# -- malformed files and entries: one log line each, nothing executed ----------------------------------
GOOD = "- symbol: m:C.f\n  metrics:\n    - name: custom:x\n      type: counter\n"

MALFORMED = {
    "bad yaml": "- symbol: [unclosed\n",
    "bad yaml indentation": "- symbol: m:C.f\n metrics: 1\n   - x",
    "yaml python tag": "- !!python/object/apply:os.system ['touch PWNED']\n",
    "yaml python name tag": "- symbol: !!python/name:os.system\n  metrics: [{name: a}]\n",
    "not a list": "symbol: m:C.f\n",
    "a scalar": "42\n",
    "entry not a mapping": "- just a string\n",
    "entry a list": "- [1, 2]\n",
    "unknown entry key": "- symbol: m:C.f\n  handlr: x\n  metrics: [{name: a}]\n",
    "unknown metric key": "- symbol: m:C.f\n  metrics: [{name: a, exprs: x}]\n",
    "missing symbol": "- metrics: [{name: a}]\n",
    "symbol not a string": "- symbol: 12\n  metrics: [{name: a}]\n",
    "symbol without colon": "- symbol: m.C.f\n  metrics: [{name: a}]\n",
    "symbol two colons": "- symbol: m:C:f\n  metrics: [{name: a}]\n",
    "symbol empty module": "- symbol: ':C.f'\n  metrics: [{name: a}]\n",
    "symbol bad chars": "- symbol: 'm:C.f()'\n  metrics: [{name: a}]\n",
    "symbol spaces": "- symbol: 'm:C f'\n  metrics: [{name: a}]\n",
    "symbol dunder": "- symbol: m:C.__getattribute__\n  metrics: [{name: a}]\n",
    "symbol dunder module": "- symbol: __main__:f\n  metrics: [{name: a}]\n",
    "min_version not a version": "- symbol: m:C.f\n  min_version: banana\n  metrics: [{name: a}]\n",
    "max_version a list": "- symbol: m:C.f\n  max_version: [1]\n  metrics: [{name: a}]\n",
    "min above max": "- symbol: m:C.f\n  min_version: '0.30'\n  max_version: '0.20'\n  metrics: [{name: a}]\n",
    "min_version a bool": "- symbol: m:C.f\n  min_version: true\n  metrics: [{name: a}]\n",
    "foreign handler": "- symbol: m:C.f\n  handler: os:system\n",
    "handler a list": "- symbol: m:C.f\n  handler: [a]\n",
    "metrics handler without metrics": "- symbol: m:C.f\n  handler: "
    + incumbent.CURRENT
    + "metric_handlers:phase_all_handler\n",
    "tracing handler": "- symbol: m:C.f\n  handler: ms_service_profiler.patcher.vllm.handlers.v1.batch_handlers:schedule\n",
    "memory handler, a name it does not record": "- symbol: m:C.f\n  handler: "
    + incumbent.CURRENT
    + "metric_handlers:engine_memory_phase_handler\n  metrics: [{name: engine:memory:free_gb, type: gauge}]\n",
    "no metrics": "- symbol: m:C.f\n",
    "metrics empty": "- symbol: m:C.f\n  metrics: []\n",
    "metrics a mapping": "- symbol: m:C.f\n  metrics: {name: a}\n",
    "metric not a mapping": "- symbol: m:C.f\n  metrics: [a]\n",
    "metric without name": "- symbol: m:C.f\n  metrics: [{type: counter}]\n",
    "metric bad name": "- symbol: m:C.f\n  metrics: [{name: 'a b'}]\n",
    "metric name digit": "- symbol: m:C.f\n  metrics: [{name: '1abc'}]\n",
    "metric bad type": "- symbol: m:C.f\n  metrics: [{name: a, type: summary}]\n",
    "gauge without expr": "- symbol: m:C.f\n  metrics: [{name: a, type: gauge}]\n",
    "buckets unsorted": "- symbol: m:C.f\n  metrics: [{name: a, type: histogram, expr: '1', buckets: [2, 1]}]\n",
    "buckets strings": "- symbol: m:C.f\n  metrics: [{name: a, type: histogram, expr: '1', buckets: [a]}]\n",
    "buckets on counter": "- symbol: m:C.f\n  metrics: [{name: a, type: counter, buckets: [1]}]\n",
    "buckets too many": "- symbol: m:C.f\n  metrics: [{name: a, buckets: [" + ", ".join(map(str, range(70))) + "]}]\n",
    "buckets infinite": "- symbol: m:C.f\n  metrics: [{name: a, buckets: [1, .inf]}]\n",
    "label reserved": "- symbol: m:C.f\n  metrics: [{name: a, labels: [{name: dp, expr: '1'}]}]\n",
    "label bad expr": "- symbol: m:C.f\n  metrics: [{name: a, labels: [{name: k, expr: 'open(1)'}]}]\n",
    "label not mapping": "- symbol: m:C.f\n  metrics: [{name: a, labels: [k]}]\n",
    "too many labels": "- symbol: m:C.f\n  metrics: [{name: a, labels: ["
    + ", ".join(f"{{name: l{i}, expr: '1'}}" for i in range(6))
    + "]}]\n",
    "label twice": "- symbol: m:C.f\n  metrics: [{name: a, labels: [{name: k, expr: '1'}, {name: k, expr: '2'}]}]\n",
    "expr import": "- symbol: m:C.f\n  metrics: [{name: a, type: counter, expr: \"__import__('os').system('touch PWNED')\"}]\n",
    "expr dunder chain": "- symbol: m:C.f\n  metrics: [{name: a, type: gauge, expr: 'self.__init__.__globals__'}]\n",
    "expr subclasses": "- symbol: m:C.f\n  metrics: [{name: a, type: gauge, expr: '().__class__.__bases__[0].__subclasses__()'}]\n",
    "expr huge power": "- symbol: m:C.f\n  metrics: [{name: a, type: gauge, expr: '9 ** 9 ** 9'}]\n",
    "expr deep nesting": "- symbol: m:C.f\n  metrics: [{name: a, type: gauge, expr: '"
    + "(" * 50
    + "1"
    + ")" * 50
    + "'}]\n",
    "expr call": "- symbol: m:C.f\n  metrics: [{name: a, type: gauge, expr: 'self.shutdown()'}]\n",
    "expr not a string": "- symbol: m:C.f\n  metrics: [{name: a, type: gauge, expr: [1]}]\n",
    "builtin name redefined kind": "- symbol: m:C.f\n  metrics: [{name: a, type: counter}, {name: a, type: histogram}]\n",
    "need_locals": "- symbol: m:C.f\n  need_locals: true\n  metrics: [{name: a}]\n",
    "type not wrap": "- symbol: m:C.f\n  type: inject\n  metrics: [{name: a}]\n",
    "lock_patch not bool": "- symbol: m:C.f\n  lock_patch: maybe\n  metrics: [{name: a}]\n",
    "too many entries": GOOD * (userfile.MAX_ENTRIES + 1),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_files_and_entries_give_one_clear_log_line_and_run_nothing(name, tmp_path, caplog, monkeypatch):
    monkeypatch.chdir(tmp_path)
    caplog.set_level(logging.INFO, logger=userfile.logger.name)
    entries = load(tmp_path, MALFORMED[name])
    assert [e.status for e in entries] == [userfile.REJECTED], [(e.status, e.reason) for e in entries]
    lines = [r for r in caplog.records if r.name == userfile.logger.name]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert "rejected" in lines[0].getMessage() and entries[0].reason in lines[0].getMessage()
    assert not os.path.exists(tmp_path / "PWNED")


def test_at_least_fifty_malformed_cases():
    assert len(MALFORMED) + len(HOSTILE) >= 100 and len(MALFORMED) >= 50


def test_an_unreadable_file_is_one_rejected_entry_and_the_others_load(tmp_path):
    entries = userfile.load([str(tmp_path / "absent.yaml"), write(tmp_path, GOOD)], V, None)
    assert [e.status for e in entries] == [userfile.REJECTED, userfile.LOADED]
    assert "cannot read" in entries[0].reason


def test_version_ranges_gate_and_vllm_ascend_symbols_gate_on_vllm_ascend(tmp_path):
    text = (
        "- symbol: m:C.f\n  min_version: '0.33.0'\n  metrics: [{name: a}]\n"
        "- symbol: m:C.g\n  max_version: '0.32.0'\n  metrics: [{name: b}]\n"
        "- symbol: vllm_ascend.x:C.f\n  min_version: '0.20.0'\n  max_version: '0.22.0'\n  metrics: [{name: c}]\n"
        "- symbol: m:C.h\n  enabled: false\n  metrics: [{name: d}]\n"
    )
    entries = userfile.load([write(tmp_path, text)], V, Version("0.23.0"))
    assert [e.status for e in entries] == [userfile.GATED, userfile.LOADED, userfile.GATED, userfile.GATED]
    assert "vLLM 0.32.0" in entries[0].reason and "vllm-ascend 0.23.0" in entries[2].reason


def test_counter_names_ending_in_total_are_not_doubled(tmp_path):
    (entry,) = load(tmp_path, "- symbol: m:C.f\n  metrics: [{name: my_calls_total, type: counter}]\n")
    assert entry.measures[0].spec.prometheus_name == P + "my_calls_total"


def test_incumbent_handlers_map_and_lock_patch_is_accepted_with_a_reason(tmp_path):
    text = f"- symbol: vllm.v1.metrics.loggers:StatLoggerManager.record\n  handler: {incumbent.CURRENT}meta_handlers:record_dp_rank\n  lock_patch: true\n"
    (entry,) = load(tmp_path, text)
    assert entry.status == userfile.MAPPED and "lock_patch ignored" in entry.reason


def test_a_mapped_scope_handler_says_when_its_opt_in_histogram_is_off(tmp_path, monkeypatch):
    text = (
        "- symbol: vllm.v1.utils:record_function_or_nullcontext\n"
        f"  handler: {incumbent.CURRENT}metric_handlers:record_function_timer_hook\n"
    )
    monkeypatch.delenv("OTEL_VLLM_ASCEND_ENABLED_METRICS", raising=False)  # the default: scopes off
    (entry,) = load(tmp_path, text)
    assert (entry.status, entry.verdict) == (userfile.MAPPED, "mapped with differences")
    assert entry.differences[-1] == (
        "record_function_or_nullcontext is opt-in and off: name it in OTEL_VLLM_ASCEND_ENABLED_METRICS to record it"
    )
    monkeypatch.setenv("OTEL_VLLM_ASCEND_ENABLED_METRICS", "record_function_or_nullcontext")
    (entry,) = load(tmp_path, text)
    assert entry.status == userfile.MAPPED and not any("opt-in" in d for d in entry.differences)


@pytest.mark.parametrize(
    ("installed", "bounds", "status"),
    [
        ("0.13.0rc1", 'max_version: "0.13.0rc1"', "loaded"),  # a pre-release bound keeps that very version
        ("0.13.0rc1", 'min_version: "0.13.0rc1"', "loaded"),
        ("0.13.0rc2", 'max_version: "0.13.0rc1"', "gated"),
        ("0.13.0", 'max_version: "0.13.0rc1"', "gated"),  # the final release comes after its candidates
        ("0.13.0rc1", 'max_version: "0.12.9"', "gated"),
        ("0.13.0rc1", 'min_version: "0.13.0"', "loaded"),  # a final bound: the candidate counts as its release
        ("0.13.0", 'max_version: "0.13.0"', "loaded"),  # both bounds inclusive
        ("0.13.0+cpu", 'min_version: "0.13.0"', "loaded"),
    ],
)
def test_version_bounds_are_inclusive_and_a_pre_release_bound_keeps_its_pre_release(
    tmp_path, installed, bounds, status
):
    text = f"- symbol: vllm.x:C.f\n  {bounds}\n  metrics: [{{name: t:calls, type: counter}}]\n"
    (entry,) = userfile.load([write(tmp_path, text)], Version(installed), None)
    assert entry.status == status, entry.reason


@pytest.mark.parametrize("symbol", ["os:system", "subprocess:run", "builtins:eval", "mm:C.f", "vllmx.y:f"])
def test_a_symbol_outside_vllm_vllm_ascend_and_sglang_is_rejected(tmp_path, symbol):
    (entry,) = load(tmp_path, f"- symbol: {symbol}\n  metrics: [{{name: t:calls, type: counter}}]\n")
    assert entry.status == userfile.REJECTED
    assert entry.reason == (
        f"symbol {symbol!r}: hook files hook the code of vllm, vllm_ascend, sglang, m, fake_target_module, "
        "otel_userfile_reload_target only (name another module root in OTEL_VLLM_ASCEND_CONFIG_MODULES)"
    )


def test_named_module_roots_are_hooked_too(tmp_path, monkeypatch):
    text = "- symbol: {}:C.f\n  metrics: [{{name: t:calls, type: counter}}]\n"
    monkeypatch.delenv(environment.CONFIG_MODULES)
    statuses = [load(tmp_path, text.format(m))[0].status for m in ("vllm.x", "vllm_ascend.x", "sglang.x", "mine.x")]
    assert statuses == [userfile.LOADED, userfile.LOADED, userfile.LOADED, userfile.REJECTED]
    monkeypatch.setenv(environment.CONFIG_MODULES, " mine , other")
    assert load(tmp_path, text.format("mine.x"))[0].status == userfile.LOADED


def test_a_built_in_gauge_without_expr_is_mapped_not_rejected(tmp_path):
    """The incumbent's files name built-in gauges (``engine:memory:*``) without ``expr``: the built-in lookup comes
    before the rule that a file's own gauge needs one."""
    text = (
        "- symbol: vllm.v1.worker.gpu_worker:Worker.determine_available_memory\n"
        "  metrics: [{name: engine:memory:kvcache_gb, type: gauge}, {name: custom:free, type: gauge}]\n"
    )
    (entry,) = load(tmp_path, text)
    assert entry.status == userfile.REJECTED and entry.reason == "metric 2 (custom:free): a gauge needs expr"
    (entry,) = load(tmp_path, text.replace(", {name: custom:free, type: gauge}", ""))
    assert entry.status == userfile.MAPPED and entry.reason.startswith(
        "built-in metric recorded: engine:memory:kvcache_gb"
    )


def test_a_handler_entry_keeps_its_version_bounds(tmp_path):
    text = (
        "- symbol: vllm.v1.metrics.loggers:StatLoggerManager.record\n"
        f"  handler: {incumbent.CURRENT}meta_handlers:record_dp_rank\n"
        '  max_version: "0.31.0"\n'
    )
    (entry,) = load(tmp_path, text)  # vLLM 0.32.0
    assert (entry.status, entry.reason) == (userfile.GATED, "vLLM 0.32.0 is outside <=0.31.0")


# -- the incumbent's own files (ms-service-metric 26.0.0, downloaded at test time) ------------------
@pytest.fixture(scope="module")
def incumbent_files(tmp_path_factory):
    try:
        return incumbent_hook_files(str(tmp_path_factory.mktemp("msm")))
    except (LookupError, RuntimeError, OSError) as exc:  # offline
        pytest.skip(f"cannot download the incumbent's wheel: {exc}")


def test_the_incumbents_files_load_with_every_entry_mapped_or_rejected_with_a_reason(incumbent_files):
    entries = userfile.load(incumbent_files, V, None)
    assert len(entries) == 4 + 18
    for entry in entries:
        assert entry.status in (userfile.MAPPED, userfile.REJECTED, userfile.GATED), entry.as_row()
        assert entry.reason, entry.as_row()
    handlers = [e for e in entries if e.status == userfile.MAPPED and "handler" in e.reason]
    assert len(handlers) == 4 + 4  # every handler entry of both files names a mapped built-in handler


@pytest.fixture(scope="module")
def incumbent_sglang(tmp_path_factory):
    try:
        return incumbent_sglang_file(str(tmp_path_factory.mktemp("msm-sglang")))
    except (LookupError, RuntimeError, OSError) as exc:  # offline
        pytest.skip(f"cannot download the incumbent's wheel: {exc}")


def test_the_incumbents_sglang_example_loads_its_label_key_ignored_as_the_incumbent_ignores_it(
    incumbent_sglang, caplog
):
    """Its second entry writes ``label:`` (singular), which ms-service-metric never reads (it reads ``labels``):
    the metric is recorded without that label, as there, and the entry's log line is a warning naming ``labels:``."""
    with caplog.at_level("INFO", logger=userfile.__name__):
        first, second = userfile.load([incumbent_sglang], V, None)
    assert first.status == second.status == userfile.LOADED
    assert second.symbol == "sglang.srt.managers.tp_worker:TpModelWorker.forward"
    assert second.reason == (
        "vllm_profiling_sglang_model_forward_duration; metric 1: 'label' ignored, as ms-service-metric ignores it "
        "(write 'labels:' for a label)"
    )
    (measure,) = second.measures
    assert measure.labels == () and measure.spec.labels == catalogue.STEP_LABELS
    assert [r.levelname for r in caplog.records if "TpModelWorker" in r.getMessage()] == ["WARNING"]
    assert [r.levelname for r in caplog.records if "event_loop" in r.getMessage()] == ["INFO"]


def test_check_config_without_vllm_passes_the_incumbents_files_and_fails_one_bad_entry(
    incumbent_files, incumbent_sglang, tmp_path, capsys, monkeypatch
):
    from opentelemetry_instrumentation_vllm_ascend.cli import main as cli
    from opentelemetry_instrumentation_vllm_ascend.wiring import installer

    monkeypatch.setattr(installer, "vllm_distribution", lambda: None)
    monkeypatch.setattr(installer, "vllm_version", lambda: None)
    monkeypatch.setattr(userfile, "vllm_version", lambda: None)
    files = [*incumbent_files, incumbent_sglang]
    argv = ["check"] + [a for f in files for a in ("--config", f)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("Hook files:\n") and "entries: 2 loaded, 22 mapped\n" in out
    bad = write(tmp_path, CHECKED_BAD, "bad.yaml")
    assert cli.main([*argv, "--config", bad]) == 1
    assert "entries: 3 loaded, 22 mapped, 1 rejected\n" in capsys.readouterr().out


# -- recording -----------------------------------------------------------------------------------------
class Target:
    def add_request(self, request, flag=False):
        return request.n

    async def agen(self, n):
        for i in range(n):
            yield i

    async def coro(self, n):
        await asyncio.sleep(0)
        return n


def _install(tmp_path, text, cls=Target):
    (entry,) = [e for e in load(tmp_path, text) if e.status == userfile.LOADED]
    hooks = installer.Installer(table=(), ready_points=())
    module = types.ModuleType("fake_target_module")
    module.C = cls
    entry.symbol = entry.symbol.replace("m:", "fake_target_module:")
    hooks.file_pending.add(entry.key)
    hooks.active = True
    hooks._apply(module, entries=[entry])
    assert entry.status == userfile.LOADED, entry.reason
    for m in entry.measures:
        catalogue.EXTRA.setdefault(m.metric, m.spec)
    return hooks


ADD = """- symbol: m:C.add_request
  metrics:
    - {name: t:calls, type: counter}
    - {name: t:n, type: histogram, expr: request.n, buckets: [0, 8, 16]}
    - {name: t:last, type: gauge, expr: 'result * 2'}
    - {name: t:time, type: timer}
    - {name: t:bad, type: counter, expr: request.missing}
    - name: t:kind
      type: counter
      labels: [{name: k, expr: request.k}]
"""


class Cls(Target):
    pass


def test_a_hook_file_records_exact_values_and_skips_failing_samples(tmp_path, metrics):
    cls = type("C", (Target,), {"add_request": Target.add_request})
    hooks = _install(tmp_path, ADD, cls)
    try:
        obj = cls()
        for n, k in [(3, "a"), (10, "b"), (5, "a")]:
            assert obj.add_request(types.SimpleNamespace(n=n, k=k)) == n
        obj.add_request(request=types.SimpleNamespace(n=1, k="a"))
        labels = {"dp": "0", "role": "mixed", "phase": "unknown"}
        assert metrics.value(P + "t:calls", **labels) == 4
        assert metrics.value(P + "t:n", **labels)[:2] == (4, 19)
        assert metrics.value(P + "t:n", **labels)[2] == (0, 3, 1, 0)
        assert metrics.value(P + "t:last", **labels) == 2
        assert metrics.value(P + "t:time", **labels)[0] == 4
        assert metrics.value(P + "t:bad", **labels) is None  # never "records 1"
        errors = metrics.value(
            P + "hook_errors",
            process="engine_core",
            dp="0",
            role="mixed",
            hook="fake_target_module:C.add_request",
            where="t:bad",
        )
        assert errors == 4
        assert metrics.value(P + "t:kind", k="a", **labels) == 3 and metrics.value(P + "t:kind", k="b", **labels) == 1
    finally:
        hooks.uninstall()
    assert cls.add_request is Target.add_request


def test_label_values_are_capped_per_label(tmp_path, metrics):
    cls = type("C", (Target,), {"add_request": Target.add_request})
    hooks = _install(tmp_path, ADD, cls)
    try:
        for i in range(userfile.MAX_LABEL_VALUES + 10):
            cls().add_request(types.SimpleNamespace(n=1, k=f"v{i}"))
        series = metrics.points()[P + "t:kind"]
        values = {dict(key)["k"] for key in series}
        assert len(values) == userfile.MAX_LABEL_VALUES + 1 and "other" in values
        assert series[tuple(sorted({"k": "other", "dp": "0", "role": "mixed", "phase": "unknown"}.items()))] == 10
    finally:
        hooks.uninstall()


def test_a_user_hook_composes_with_a_built_in_hook_on_the_same_function(tmp_path, metrics):
    from opentelemetry_instrumentation_vllm_ascend.handlers.common import StepTimer

    cls = type("C", (Target,), {"add_request": Target.add_request})
    builtin = patch_method(cls, "add_request", StepTimer(catalogue.M["scheduler:add_request:duration"]), SYNC_TIMER)
    hooks = _install(tmp_path, ADD, cls)
    try:
        cls().add_request(types.SimpleNamespace(n=2, k="a"))
        labels = {"dp": "0", "role": "mixed", "phase": "unknown"}
        assert metrics.value(P + "t:calls", **labels) == 1
        assert metrics.value(P + "scheduler:add_request:duration", **labels)[0] == 1
    finally:
        hooks.uninstall()
        builtin.remove()


def _apply_to_class(tmp_path, text, cls):
    """The entries of ``text`` (symbols ``m:C.…``) installed on ``cls`` as class ``C`` of a fake module, as the
    hook-file reloader installs them once the module is imported; returns the hooks (``uninstall()`` them)."""
    hooks = installer.Installer(table=(), ready_points=())
    hooks.active = True
    module = types.ModuleType("fake_target_module")
    module.C = cls
    entries = load(tmp_path, text)
    for e in entries:
        e.symbol = e.symbol.replace("m:", "fake_target_module:")
        hooks.file_pending.add(e.key)
        for m in e.measures:
            catalogue.EXTRA.setdefault(m.metric, m.spec)
    hooks._apply(module, entries=entries)
    return hooks


def test_timers_time_coroutines_awaited_and_async_generators_to_exhaustion(tmp_path, metrics):
    cls = type("C", (Target,), {"agen": Target.agen, "coro": Target.coro})
    text = (
        "- symbol: m:C.agen\n  metrics: [{name: t:agen, type: histogram, expr: 'n', buckets: [1, 5]}]\n"
        "- symbol: m:C.coro\n  metrics: [{name: t:coro, type: gauge, expr: 'result + 1'}]\n"
    )
    hooks = _apply_to_class(tmp_path, text, cls)
    try:

        async def drive():
            out = [i async for i in cls().agen(3)]
            return out, await cls().coro(4)

        assert asyncio.run(drive()) == ([0, 1, 2], 4)
        labels = {"dp": "0", "role": "mixed", "phase": "unknown"}
        assert metrics.value(P + "t:agen", **labels)[:2] == (1, 3)
        assert metrics.value(P + "t:coro", **labels) == 5
    finally:
        hooks.uninstall()


def test_an_expression_naming_no_parameter_of_the_target_is_rejected_at_install(tmp_path, caplog):
    cls = type("C", (Target,), {"add_request": Target.add_request})
    text = "- symbol: m:C.add_request\n  metrics: [{name: t:x, type: gauge, expr: requests.n}]\n"
    (entry,) = load(tmp_path, text)
    hooks = installer.Installer(table=(), ready_points=())
    hooks.active = True
    module = types.ModuleType("fake_target_module")
    module.C = cls
    hooks.file_pending.add(entry.key)
    hooks._apply(module, entries=[entry])
    assert entry.status == userfile.REJECTED and "'requests'" in entry.reason
    assert cls.add_request is Target.add_request


# -- runtime control: the switch -------------------------------------------------------------------
def test_control_off_gates_every_registered_hook_and_on_restores_exact_counting(tmp_path, metrics):
    cls = type("C", (Target,), {"add_request": Target.add_request})
    hooks = _install(tmp_path, ADD, cls)
    try:
        request = types.SimpleNamespace(n=1, k="a")
        labels = {"dp": "0", "role": "mixed", "phase": "unknown"}
        cls().add_request(request)
        control.set_state(False)
        wrapper = cls.__dict__["add_request"]
        assert wrapper.__otel_vllm_ascend_hook__.handler is None  # still patched, gated
        for _ in range(5):
            cls().add_request(request)
        assert metrics.value(P + "t:calls", **labels) == 1
        control.set_state(True)
        for _ in range(3):
            cls().add_request(request)
        assert metrics.value(P + "t:calls", **labels) == 4
        control.set_state(True, ("t:c*",))  # patterns: only those metrics off
        cls().add_request(request)
        assert metrics.value(P + "t:calls", **labels) == 4
        assert metrics.value(P + "t:n", **labels)[0] == 5
    finally:
        control.set_state(True)
        hooks.uninstall()


def test_the_off_path_of_a_hook_is_one_attribute_check():
    hook = Hook(None)
    assert control.switched_off("x") is False
    control.register(hook)  # a hook without handler is not registered
    assert hook not in STATE.control.hooks


# -- timers the right way for each kind, composed with built-in hooks --------------------------------------
def _clock(monkeypatch):
    """The clock of the timer wrappers and of the stream timers (which read it themselves)."""
    from opentelemetry_instrumentation_vllm_ascend.handlers import common
    from tests.support.fakes import patch_clock

    return patch_clock(monkeypatch, common)


STEP_UNKNOWN = {"dp": "0", "role": "mixed", "phase": "unknown"}


@pytest.mark.parametrize("user_first", [False, True])
def test_a_user_timer_on_a_built_in_async_generator_hook_times_the_whole_stream(
    tmp_path, metrics, monkeypatch, user_first
):
    from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import ASYNC_GENERATOR

    clock = _clock(monkeypatch)

    class C:
        async def agen(self, n):
            for i in range(n):
                clock.t += 0.25
                yield i

    def builtin():  # the built-in row of AsyncLLM.generate (an ASYNC_GENERATOR hook)
        handler = handler_of("vllm.v1.engine.async_llm:AsyncLLM.generate")
        return patch_method(C, "agen", handler, ASYNC_GENERATOR)

    text = "- symbol: m:C.agen\n  metrics: [{name: t:stream, type: timer}]\n"
    if user_first:
        hooks = _install(tmp_path, text, C)
        patch = builtin()
    else:
        patch = builtin()
        hooks = _install(tmp_path, text, C)
    try:

        async def drive():
            return [i async for i in C().agen(3)]

        assert asyncio.run(drive()) == [0, 1, 2]
        assert metrics.value(P + "t:stream", **STEP_UNKNOWN)[:2] == (1, 0.75)  # the stream, not its creation
        generate = metrics.value(P + "engine:generate:duration", dp="0", role="mixed", phase="all")
        assert generate[:2] == (1, 0.75)
    finally:
        hooks.uninstall()
        patch.remove()


def test_user_timers_time_async_generators_to_exhaustion_and_coroutines_awaited(tmp_path, metrics, monkeypatch):
    clock = _clock(monkeypatch)

    class C:
        async def agen(self, n):
            for i in range(n):
                clock.t += 0.5
                yield i

        async def coro(self, n):
            clock.t += 0.125
            await asyncio.sleep(0)
            clock.t += 0.125
            return n

    text = (
        "- symbol: m:C.agen\n  metrics: [{name: t:agen_time, type: timer}]\n"
        "- symbol: m:C.coro\n  metrics: [{name: t:coro_time, type: timer}]\n"
    )
    hooks = _apply_to_class(tmp_path, text, C)
    try:

        async def drive():
            items = [i async for i in C().agen(3)]
            return items, await C().coro(4)

        assert asyncio.run(drive()) == ([0, 1, 2], 4)
        assert metrics.value(P + "t:agen_time", **STEP_UNKNOWN)[:2] == (1, 1.5)  # to exhaustion
        assert metrics.value(P + "t:coro_time", **STEP_UNKNOWN)[:2] == (1, 0.25)  # the awaited call

        async def first_then_close():
            stream = C().agen(3)
            item = await stream.__anext__()
            await stream.aclose()
            return item

        # A stream closed early is timed until it was closed, as the built-in stream timers do.
        assert asyncio.run(first_then_close()) == 0
        assert metrics.value(P + "t:agen_time", **STEP_UNKNOWN)[:2] == (2, 2.0)
    finally:
        hooks.uninstall()


def test_a_counter_with_expr_adds_the_value(tmp_path, metrics):
    cls = type("C", (Target,), {"add_request": Target.add_request})
    text = "- symbol: m:C.add_request\n  metrics: [{name: t:tokens, type: counter, expr: 'request.n * 2'}]\n"
    hooks = _install(tmp_path, text, cls)
    try:
        for n in (3, 0, 5):
            cls().add_request(types.SimpleNamespace(n=n))
        assert metrics.value(P + "t:tokens", **STEP_UNKNOWN) == 16  # 6 + 0 + 10
    finally:
        hooks.uninstall()


# -- reload: changed entries are replaced ----------------------------------------------------------------
RELOAD_MODULE = "otel_userfile_reload_target"


@pytest.fixture
def reload_target(monkeypatch):
    module = types.ModuleType(RELOAD_MODULE)
    module.C = type("C", (Target,), {"add_request": Target.add_request})
    monkeypatch.setitem(sys.modules, RELOAD_MODULE, module)
    yield module.C
    for seed in ("t:r", "t:r2"):
        catalogue.EXTRA.pop(seed, None)


def _reload_file(buckets="[1, 4]", label="request.k", name="t:r"):
    return (
        f"- symbol: {RELOAD_MODULE}:C.add_request\n  metrics:\n"
        f"    - {{name: '{name}', type: histogram, expr: request.n, buckets: {buckets},"
        f' labels: [{{name: k, expr: "{label}"}}]}}\n'
    )


def test_reload_replaces_an_entry_whose_label_expression_changed(tmp_path, metrics, reload_target):
    path = write(tmp_path, _reload_file())
    hooks = installer.Installer(table=(), ready_points=(), hook_files=[path])
    hooks.install()
    try:
        reload_target().add_request(types.SimpleNamespace(n=2, k="a"))
        write(tmp_path, _reload_file(label="request.k + '!'"))
        hooks.reload()
        reload_target().add_request(types.SimpleNamespace(n=3, k="a"))
        assert metrics.value(P + "t:r", k="a", **STEP_UNKNOWN)[:2] == (1, 2)
        assert metrics.value(P + "t:r", k="a!", **STEP_UNKNOWN)[:2] == (1, 3)  # the new expression's value
    finally:
        hooks.uninstall()
    assert reload_target.add_request is Target.add_request


def test_reload_refuses_to_change_a_defined_metrics_buckets_and_stops_the_old_hook(
    tmp_path, metrics, reload_target, caplog
):
    path = write(tmp_path, _reload_file())
    hooks = installer.Installer(table=(), ready_points=(), hook_files=[path])
    hooks.install()
    try:
        reload_target().add_request(types.SimpleNamespace(n=2, k="a"))
        assert metrics.value(P + "t:r", k="a", **STEP_UNKNOWN) == (1, 2, (0, 1, 0))
        write(tmp_path, _reload_file(buckets="[1, 2, 8]"))
        hooks.reload()
        (entry,) = hooks.entries
        assert entry.status == userfile.REJECTED
        assert "t:r" in entry.reason and "restart" in entry.reason
        reload_target().add_request(types.SimpleNamespace(n=3, k="a"))
        assert metrics.value(P + "t:r", k="a", **STEP_UNKNOWN) == (1, 2, (0, 1, 0))  # the old hook is gone
        assert catalogue.EXTRA["t:r"].buckets == (1.0, 4.0)
        write(tmp_path, _reload_file(buckets="[1, 2, 8]", name="t:r2"))  # a new name: loaded, its own buckets
        hooks.reload()
        assert [e.status for e in hooks.entries] == [userfile.LOADED]
        reload_target().add_request(types.SimpleNamespace(n=3, k="a"))
        assert metrics.value(P + "t:r2", k="a", **STEP_UNKNOWN) == (1, 3, (0, 0, 1, 0))
        assert catalogue.EXTRA["t:r2"].buckets == (1.0, 2.0, 8.0)
    finally:
        hooks.uninstall()


# -- messages name the entry and the position ------------------------------------------------------------
@pytest.mark.parametrize("source", HOSTILE)
def test_hostile_expressions_are_rejected_with_their_column(source):
    with pytest.raises(ExpressionError, match=r"at column \d+"):
        compile_expression(source, None)


EXPRESSION_CASES = sorted(name for name in MALFORMED if name.startswith(("expr ", "label bad expr")))


@pytest.mark.parametrize("name", EXPRESSION_CASES)
def test_a_rejected_expression_names_its_file_entry_and_column(name, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger=userfile.logger.name)
    path = write(tmp_path, GOOD + MALFORMED[name])  # the bad entry is the file's second
    entries = userfile.load([path], V, None)
    assert [e.status for e in entries] == [userfile.LOADED, userfile.REJECTED]
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"{path} entry 2: m:C.f rejected: metric 1 (a): " in line
    if name != "expr not a string":
        assert re.search(r"at column \d+", line), line


def test_a_gated_entry_with_lock_patch_says_it_is_ignored(tmp_path):
    text = "- symbol: m:C.f\n  lock_patch: true\n  min_version: '9.0'\n  metrics: [{name: a}]\n"
    (entry,) = load(tmp_path, text)
    assert entry.status == userfile.GATED
    assert entry.reason == "vLLM 0.32.0 is outside >=9.0; lock_patch ignored (control gates every hook alike)"
    text = "- symbol: m:C.f\n  lock_patch: true\n  enabled: false\n  metrics: [{name: a}]\n"
    (entry,) = load(tmp_path, text)
    assert entry.reason == "enabled: false; lock_patch ignored (control gates every hook alike)"


# -- check --config ------------------------------------------------------------------------------------------
CHECKED = """\
- symbol: vllm.v1.core.sched.scheduler:Scheduler.add_request
  metrics: [{name: custom:calls, type: counter}]
- symbol: vllm.v1.core.sched.scheduler:Scheduler.add_request
  max_version: "0.1.0"
  metrics: [{name: custom:old, type: counter}]
"""
CHECKED_BAD = """\
- symbol: vllm.v1.core.sched.scheduler:Scheduler.add_request
  metrics: [{name: custom:bad, type: gauge, expr: "len(request) + __import__('os')"}]
- symbol: vllm.v1.core.sched.scheduler:Scheduler.add_request
  metrics: [{name: custom:x, type: gauge, expr: requests.n}]
"""


def test_check_config_prints_each_entry_loaded_gated_or_rejected_and_fails_on_a_rejected_one(tmp_path, capsys):
    pytest.importorskip("vllm")
    from opentelemetry_instrumentation_vllm_ascend.cli import main as cli
    from opentelemetry_instrumentation_vllm_ascend.wiring import installer

    good = write(tmp_path, CHECKED, "good.yaml")
    bad = write(tmp_path, CHECKED_BAD, "bad.yaml")
    symbol = "vllm.v1.core.sched.scheduler:Scheduler.add_request"
    assert cli.main(["check", "--config", good]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Hook files:\n")  # the verdicts first, then the target table
    hook_files = out[: out.index("\n", out.index("entries: ")) + 1].splitlines()
    assert hook_files == [
        "Hook files:",
        f"  {good}:1  {symbol}  loaded: vllm_profiling_custom:calls",
        f"  {good}:2  {symbol}  gated: vLLM {installer.vllm_version()} is outside <=0.1.0",
        "entries: 1 gated, 1 loaded",
    ]
    assert cli.main(["check", "--config", good, "--config", bad]) == 1
    out = capsys.readouterr().out
    hook_files = out[: out.index("\n", out.index("entries: ")) + 1].splitlines()
    assert hook_files[3:] == [
        f"  {bad}:1  {symbol}  rejected: metric 1 (custom:bad): expr: call of '__import__' not allowed (allowed: "
        "len, min, max, sum, abs, int, float, round, str, pow, sqrt, log, exp, sin, cos, tan, ceil, floor) at column 16",
        f"  {bad}:2  {symbol}  rejected: cannot hook: ValueError: custom:x: expr 'requests.n' reads 'requests', not "
        f"a parameter of {symbol} (self, request)",
        "entries: 1 gated, 1 loaded, 2 rejected",
    ]


def test_check_config_without_vllm_checks_the_file_offline(tmp_path, capsys, monkeypatch):
    """Where vLLM is not installed (a laptop, a config repository's CI), check --config checks each entry's
    syntax, expressions and shape, resolves no symbol, skips the target table, and exits 0 for a clean file."""
    import json

    from opentelemetry_instrumentation_vllm_ascend.cli import main as cli
    from opentelemetry_instrumentation_vllm_ascend.wiring import installer

    def never(*args):
        raise AssertionError("nothing is imported or resolved without vLLM")

    monkeypatch.setattr(installer, "vllm_distribution", lambda: None)
    monkeypatch.setattr(installer, "vllm_version", lambda: None)
    monkeypatch.setattr(userfile, "vllm_version", lambda: None)
    monkeypatch.setattr(userfile, "resolve_entries", never)
    monkeypatch.setattr(installer, "check", never)
    good = write(tmp_path, CHECKED, "good.yaml")
    bad = write(tmp_path, CHECKED_BAD, "bad.yaml")
    symbol = "vllm.v1.core.sched.scheduler:Scheduler.add_request"
    unresolved = "(not resolved: vLLM is not installed here)"
    assert cli.main(["check", "--config", good]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "Hook files:",
        f"  {good}:1  {symbol}  loaded: vllm_profiling_custom:calls {unresolved}",
        f"  {good}:2  {symbol}  loaded: vllm_profiling_custom:old {unresolved}",  # no version to gate on
        "entries: 2 loaded",
        "vLLM is not installed here: each entry's syntax, expressions and shape are checked, not its symbol "
        "(check resolves symbols where vLLM is installed; check --vllm VERSION checks the target table).",
    ]
    assert cli.main(["check", "--json", "--config", good, "--config", bad]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["vllm"] is None and report["ok"] is False
    assert [(e["file"], e["entry"], e["status"]) for e in report["hook_files"]] == [
        (good, 1, userfile.LOADED),
        (good, 2, userfile.LOADED),
        (bad, 1, userfile.REJECTED),  # its expression, checked offline
        (bad, 2, userfile.LOADED),  # reads a name the symbol's signature would reject: only vLLM can tell
    ]


def test_an_entry_compiles_to_the_declarative_form_of_the_built_in_rows(tmp_path):
    from opentelemetry_instrumentation_vllm_ascend.handlers.common import MeasuresHandler, StepTimer
    from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import ASYNC_GENERATOR
    from opentelemetry_instrumentation_vllm_ascend.targets import Target as Row
    from opentelemetry_instrumentation_vllm_ascend.wiring import declarative

    (entry,) = load(tmp_path, ADD)
    row = userfile.row_of(entry, Target.add_request)
    assert isinstance(row, Row) and row.kind == SYNC_TIMER and row.params == ("request", "flag")
    assert all(isinstance(m, declarative.Measure) for m in row.measures)
    assert row.feeds == ("t:calls", "t:n", "t:last", "t:time", "t:bad", "t:kind")
    assert problems(row, catalogue.BY_SEED) == []
    handler = declarative.build_handler(row)
    assert type(handler) is MeasuresHandler and handler.reads_args is None  # its expressions read arguments
    # One plain timer is the built-in timer handler itself, with the entry's own metric.
    (entry,) = load(tmp_path, "- symbol: m:C.agen\n  metrics: [{name: t:one, type: timer}]\n")
    row = userfile.row_of(entry, Target.agen)
    assert row.kind == ASYNC_GENERATOR and problems(row, catalogue.BY_SEED) == []
    (entry,) = load(tmp_path, "- symbol: m:C.add_request\n  metrics: [{name: t:one, type: timer}]\n")
    handler = declarative.build_handler(userfile.row_of(entry, Target.add_request))
    assert type(handler) is StepTimer and handler.spec is entry.measures[0].spec
