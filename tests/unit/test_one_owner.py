"""Each fact in one place: which symbol feeds which metric and in which process is the target
table's alone (the catalogue's "hooked" / "recorded in" and both tables of docs/metrics.md come from it);
plain timers, counters and value-of-an-argument hooks are data in their row; handler names, the arguments
a handler reads, the TTFT thresholds, the scope-name bound, the bucket sets and the EPLB names each have
one owner. The recipe "add a plain timer" is followed once here: two edits, a catalogue spec and a row."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import pathlib
import re
import sys
import textwrap
import types

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from opentelemetry_instrumentation_vllm_ascend import catalogue, context, environment, handlers, targets
from opentelemetry_instrumentation_vllm_ascend.cli import docgen
from opentelemetry_instrumentation_vllm_ascend.handlers import common, scopes
from opentelemetry_instrumentation_vllm_ascend.hooks import codegen
from opentelemetry_instrumentation_vllm_ascend.hooks.wrappers import COROUTINE_TIMER, SYNC, SYNC_TIMER
from opentelemetry_instrumentation_vllm_ascend.recording import pipeline
from opentelemetry_instrumentation_vllm_ascend.state import STATE
from opentelemetry_instrumentation_vllm_ascend.wiring import declarative
from opentelemetry_instrumentation_vllm_ascend.wiring.declarative import COUNTER, GAUGE, HISTOGRAM, TIMER, Measure
from opentelemetry_instrumentation_vllm_ascend.wiring.installer import Installer
from tests.support.fakes import Clock, problems
from tests.support.process import set_process

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
PACKAGE = ROOT / "opentelemetry_instrumentation_vllm_ascend"


# -- docs/metrics.md: the metric table and the target table agree --------------------------------------


def _table(text: str, header: str) -> list[list[str]]:
    """The rows (cells) of the markdown table whose header line starts with ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def _ticked(cell: str, sep: str) -> set[str]:
    return {part.strip().strip("`") for part in cell.split(sep) if part.strip().startswith("`")}


def test_docs_metric_table_and_target_table_name_the_same_symbols_for_every_metric():
    text = (ROOT / "docs" / "metrics.md").read_text()
    by_prometheus = {spec.prometheus_name: spec for spec in catalogue.CATALOGUE}
    hooked = {}  # exposed name -> symbols, from the metric table
    recorded = {}
    for cells in _table(text, "| Name on /metrics |"):
        spec = by_prometheus[cells[0].strip("`")]
        hooked[spec.exposed_name] = _ticked(cells[6], "<br>")
        recorded[spec.exposed_name] = cells[5]
    feeding: dict[str, set[str]] = {name: set() for name in hooked}
    for cells in _table(text, "| Symbol | vLLM |"):
        for name in _ticked(cells[5], ","):
            feeding[name].add(cells[0].strip("`"))
    assert len(hooked) == len(catalogue.CATALOGUE)
    disagree = {name: (hooked[name], feeding[name]) for name in hooked if hooked[name] != feeding[name]}
    assert disagree == {}
    # Every metric is fed by rows, but the package's own (hook_errors: every hook's handler failures).
    own = {catalogue.BY_SEED[seed].exposed_name for seed in catalogue.SELF_SEEDS}
    assert [name for name, symbols in hooked.items() if not symbols] == sorted(own)
    # "Recorded in": the processes of the rows that feed the metric.
    process_of = {t.symbol: t.process for t in targets.TARGETS}
    for name, symbols in hooked.items():
        if name in own:
            assert recorded[name] == targets.EVERY_PROCESS, name
            continue
        kinds = {process_of[s] for s in symbols}
        expected = ", ".join(k for k in catalogue.PROCESS_KINDS if k in kinds)
        assert recorded[name] in (expected, targets.EVERY_PROCESS), name


def test_the_catalogue_keeps_no_copy_of_the_target_table():
    fields = {f.name for f in dataclasses.fields(catalogue.MetricSpec)}
    assert not fields & {"hooked", "recorded_in", "process_labels", "feeds"}
    # derived, not stored: what the rows say
    spec = catalogue.M["engine_core:process_input_queue:duration"]
    assert targets.hooked_symbols(spec.seed) == (
        "vllm.v1.engine.core:EngineCoreProc._process_input_queue",
        "vllm.v1.engine.core:EngineCoreProc._handle_client_request",
    )
    assert targets.recorded_in(spec.seed) == "engine_core" and targets.process_labels(spec) == ()
    assert targets.recorded_in(catalogue.M["record_function_or_nullcontext"].seed) == "engine_core, worker"
    assert targets.recorded_in(catalogue.M["npu:forward_duration"].seed) == "worker"
    assert targets.recorded_in(catalogue.INSTRUMENTED_PROCESSES.seed) == targets.EVERY_PROCESS


def test_every_row_that_feeds_a_metric_names_its_process_and_real_metrics():
    for t in targets.TARGETS:
        if t.feeds:
            assert t.process in catalogue.PROCESS_KINDS and t.process != "unknown", t.symbol
        for seed in t.feeds:
            assert seed in catalogue.BY_SEED, (t.symbol, seed)


# -- declarative rows --------------------------------------------------------------------------------------


def test_declarative_rows_are_sound_and_feed_what_they_measure():
    declared = [t for t in targets.TARGETS if t.measures]
    assert len(declared) == 18  # AsyncLLM.add_request is a handler row (it keeps trace headers too)
    for t in targets.TARGETS:
        assert problems(t, catalogue.BY_SEED) == [], t.symbol
    for t in declared:
        assert t.handler == "" and t.feeds == tuple(dict.fromkeys(m.metric for m in t.measures))


def test_no_handler_class_only_binds_a_spec_to_a_timer():
    """Timer subclasses left in handlers/ are there for their own logic (they override ``timed``), and
    no handler class is only data (a body that assigns ``spec`` and nothing with logic: a row's measures)."""
    from opentelemetry_instrumentation_vllm_ascend.hooks.handler import Handler

    timers = (common.StepTimer, common.AllPhaseTimer, common.StreamTimer)
    for module in _handler_modules():
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__ or cls in timers or not issubclass(cls, Handler):
                continue
            if issubclass(cls, timers):
                assert "timed" in cls.__dict__, f"{cls.__qualname__}: a plain timer is a row's measures"
            node = ast.parse(inspect.getsource(cls).strip()).body[0]
            assert not _only_binds_a_spec(node), f"{cls.__qualname__}: a class that only sets spec is a row's measures"


def _only_binds_a_spec(node: ast.ClassDef) -> bool:
    """Whether the class body (its docstring aside) only assigns names, ``spec`` among them."""
    body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    names = set()
    for stmt in body:
        if isinstance(stmt, ast.Assign):
            names.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            names.add(stmt.target.id)
        else:
            return False
    return "spec" in names


def test_the_spec_only_check_catches_a_class_that_only_sets_spec():
    # What handlers/api.py had for AsyncLLM.generate before it became a row's measures.
    before = (
        'class Generate(_UntilStreamEnd):\n    """From the call until the stream ended."""\n\n    spec = GENERATE\n'
    )
    assert _only_binds_a_spec(ast.parse(before).body[0])
    assert not _only_binds_a_spec(ast.parse(inspect.getsource(common.StreamTimer)).body[0])


def _handler_modules():
    import importlib
    import pkgutil

    return [importlib.import_module(f"{handlers.__name__}.{m.name}") for m in pkgutil.iter_modules(handlers.__path__)]


def _row_classes():
    out = {}
    for t in targets.TARGETS:
        if t.handler and not t.measures:
            module, name = t.handler.split(":")
            out.setdefault(getattr(sys.modules[f"{handlers.__name__}.{module}"], name), []).append(t)
    return out


def _class_assignments(cls) -> dict[str, ast.expr]:
    node = ast.parse(inspect.getsource(cls).strip()).body[0]
    assert isinstance(node, ast.ClassDef)
    out = {}
    for stmt in node.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            out[stmt.targets[0].id] = stmt.value
    return out


def test_handler_names_come_from_the_row_and_the_parameters_it_reads_from_the_handler():
    for t in targets.TARGETS:
        declarative.load_handler(t)  # imports every handler module
    for cls, rows in _row_classes().items():
        for klass in cls.__mro__:
            if klass.__module__.startswith(handlers.__name__ + "."):
                assert "name" not in _class_assignments(klass), f"{klass.__qualname__}: name typed by hand"
        # A handler row states no parameters: the handler names those it reads (once, beside args[i]).
        assert {t.params for t in rows} == {()}, cls.__qualname__
        static = inspect.getattr_static(cls, "reads_args", None)
        params = getattr(cls, "params", ())
        # Reading its params by position: the count follows from them (self and each), never restated;
        # otherwise self at most, or every argument (None: the generic wrapper, by name or position).
        assert static is None or static in (0, 1) or static == len(params) + 1, cls.__qualname__
        if params and static is not None:
            assert static == len(params) + 1 and all(t.owner_qualname for t in rows), cls.__qualname__
    for t in targets.TARGETS:
        handler = declarative.load_handler(t)
        assert handler is None or handler.name == t.qualname


# -- other single-owner facts --------------------------------------------------------------------------------


def _constants(path: pathlib.Path):
    return [n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)]


def test_ttft_thresholds_scope_bound_and_bucket_sets_have_one_owner():
    names = [name for name, _ in catalogue.TTFT_THRESHOLDS]
    listed = ", ".join(names)
    assert listed in catalogue.M["prefill_over_threshold_count"].description
    assert not any(isinstance(v, str) and listed in v for v in _constants(PACKAGE / "catalogue.py"))
    assert scopes.MAX_SCOPE_NAMES is catalogue.MAX_SCOPE_NAMES
    assert catalogue.MAX_SCOPE_NAMES not in _constants(PACKAGE / "cli" / "docgen.py")
    assert f"after {catalogue.MAX_SCOPE_NAMES} distinct" in docgen.render_metrics_md()
    assert docgen.BUCKET_SETS is catalogue.BUCKET_SETS
    bounds = {catalogue.STEP_SECONDS, catalogue.TOKEN_SECONDS, catalogue.REQUEST_SECONDS, catalogue.REQUESTS}
    for path in (PACKAGE / "cli" / "docgen.py",):
        assert not {v for v in _constants(path) if isinstance(v, tuple)} & bounds


def _lists_every_placement(node: ast.AST) -> bool:
    """A tuple or list display naming every EPLB placement (directly, or as the first item of its pairs)."""
    if not isinstance(node, (ast.Tuple, ast.List)):
        return False
    heads = [e.elts[0] if isinstance(e, ast.Tuple) and e.elts else e for e in node.elts]
    named = {h.value for h in heads if isinstance(h, ast.Constant)}
    return set(catalogue.EPLB_PLACEMENTS) <= named


def test_eplb_names_are_built_in_one_place():
    """No f-string spells an ``eplb:`` seed outside catalogue.eplb_hotness_seed / eplb_layer_load_seed, no
    string literal is one of the seeds they build, and the placements are listed once (EPLB_PLACEMENTS)."""
    built = {
        *(catalogue.eplb_hotness_seed(p, s) for p in catalogue.EPLB_PLACEMENTS for s in catalogue.EPLB_STATS),
        *(catalogue.eplb_layer_load_seed(s) for s in catalogue.EPLB_STATS),
    }
    spelled, literals, placements = [], [], []
    for path in PACKAGE.rglob("*.py"):
        where = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
                if str(node.values[0].value).startswith("eplb:"):
                    spelled.append((where, node.lineno))
            elif isinstance(node, ast.Constant) and node.value in built:
                literals.append((where, node.lineno, node.value))
            elif _lists_every_placement(node):
                placements.append((where, node.lineno))
    assert [where for where, _ in spelled] == ["catalogue.py", "catalogue.py"]
    assert literals == []
    assert [where for where, _ in placements] == ["catalogue.py"]  # EPLB_PLACEMENTS itself
    assert set(catalogue.EPLB_CYCLE_SEEDS) <= set(catalogue.BY_SEED)
    do_update = next(t for t in targets.TARGETS if t.qualname == "EplbWorker.do_update")
    assert set(catalogue.EPLB_CYCLE_SEEDS) < set(do_update.feeds)


# -- the recipe: a plain timer is two edits --------------------------------------------------------------------


@pytest.fixture
def recipe(monkeypatch):
    """A module holding a vLLM-shaped class the recipe hooks, a controllable clock, and this process's
    pipeline with an in-memory reader, set up after the test's catalogue edit."""
    module = types.ModuleType("otel_recipe_engine")
    clock = Clock(10.0)

    class Engine:
        def work(self, n, scale=1.0):
            clock.t += 0.125 * n
            return n * scale

        async def awork(self, n):
            clock.t += 0.25 * n
            return n

    module.Engine = Engine
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(codegen, "perf_counter", clock)
    for name in (environment.PROMETHEUS_MULTIPROC_DIR, environment.FILES_DIR, environment.METRICS_EXPORTER):
        monkeypatch.delenv(name, raising=False)
    saved = (context.PROCESS.process, context.PROCESS.dp, context.PROCESS.role)
    set_process("engine_core", "0", "mixed")
    STATE.last_step_phase = "decode"
    installers = []

    def install(specs, rows):
        # Edit 1: the catalogue spec(s). Edit 2: the row(s). Nothing else.
        monkeypatch.setattr(catalogue, "CATALOGUE", catalogue.CATALOGUE + tuple(specs))
        for spec in specs:
            monkeypatch.setitem(catalogue.BY_SEED, spec.seed, spec)
        monkeypatch.setattr(targets, "TARGETS", targets.TARGETS + tuple(rows))
        reader = InMemoryMetricReader()
        pipeline.reset(extra_readers=[reader])
        installer = Installer(rows)
        installer.install()
        installers.append(installer)
        return reader

    yield types.SimpleNamespace(module=module, Engine=Engine, clock=clock, install=install)
    for installer in installers:
        installer.uninstall()
    pipeline.reset()
    set_process(*saved)


def _points(reader, seed):
    out = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == catalogue.PREFIX + seed:
                    for p in metric.data.data_points:
                        value = (p.count, p.sum) if hasattr(p, "bucket_counts") else p.value
                        out[tuple(sorted(p.attributes.items()))] = value
    return out


def _labels(phase):
    return (("dp", "0"), ("phase", phase), ("role", "mixed"))


def test_adding_a_plain_timer_takes_a_catalogue_spec_and_a_row(recipe):
    spec = catalogue.MetricSpec(  # edit 1, as catalogue._timer writes it
        seed="recipe:work:duration",
        kind=catalogue.HISTOGRAM,
        unit="s",
        description="Duration of Engine.work.",
        buckets=catalogue.FINE_SECONDS,
    )
    row = targets.Target(  # edit 2
        recipe.module.__name__, "Engine.work", SYNC_TIMER, measures=(Measure(spec.seed, TIMER),), process="engine_core"
    )
    reader = recipe.install([spec], [row])
    engine = recipe.Engine()
    assert [engine.work(n) for n in (1, 2, 4)] == [1.0, 2.0, 4.0]
    assert _points(reader, spec.seed) == {_labels("all"): (3, 0.875)}  # 0.125 + 0.25 + 0.5, exactly
    # Everything else follows from the two edits: feeds, hooked symbol, process, docs, check.
    assert row.feeds == (spec.seed,)
    assert targets.hooked_symbols(spec.seed) == (f"{recipe.module.__name__}:Engine.work",)
    assert targets.recorded_in(spec.seed) == "engine_core" and targets.process_labels(spec) == ()
    assert f"| `{row.symbol}` |" in docgen.render_metrics_md()
    assert isinstance(declarative.load_handler(row), common.AllPhaseTimer)


def test_declared_counter_histogram_and_gauge_of_an_argument(recipe):
    calls = catalogue.MetricSpec(seed="recipe:calls", kind=catalogue.COUNTER, unit="{call}", description="c")
    sizes = catalogue.MetricSpec(
        seed="recipe:n", kind=catalogue.HISTOGRAM, unit="1", description="h", buckets=catalogue.REQUESTS
    )
    last = catalogue.MetricSpec(seed="recipe:scale", kind=catalogue.GAUGE, unit="1", description="g")
    timed = catalogue.MetricSpec(
        seed="recipe:await:duration",
        kind=catalogue.HISTOGRAM,
        unit="s",
        description="t",
        buckets=catalogue.STEP_SECONDS,
    )
    rows = [
        targets.Target(
            recipe.module.__name__,
            "Engine.work",
            SYNC,
            params=("n", "scale"),
            measures=(
                Measure(calls.seed, COUNTER),
                Measure(sizes.seed, HISTOGRAM, value="n", phase="step"),
                Measure(last.seed, GAUGE, value="scale"),
            ),
            process="engine_core",
        ),
        targets.Target(
            recipe.module.__name__,
            "Engine.awork",
            COROUTINE_TIMER,
            measures=(Measure(timed.seed, TIMER, phase="step"), Measure(calls.seed, COUNTER)),
            process="engine_core",
        ),
    ]
    reader = recipe.install([calls, sizes, last, timed], rows)
    for row in rows:
        assert problems(row, catalogue.BY_SEED) == []
    engine = recipe.Engine()
    engine.work(3)
    engine.work(5, scale=0.5)
    engine.work(n=2, scale=2.0)
    import asyncio

    assert asyncio.run(engine.awork(2)) == 2
    assert _points(reader, calls.seed) == {_labels("all"): 4}
    assert _points(reader, sizes.seed) == {_labels("decode"): (3, 10)}
    assert _points(reader, last.seed) == {_labels("all"): 2.0}
    assert _points(reader, timed.seed) == {_labels("decode"): (1, 0.5)}


def test_unsound_declarations_are_named():
    spec = catalogue.M["scheduler:add_request:duration"]
    bad = [
        targets.Target("m", "C.f", SYNC, measures=(Measure(spec.seed, TIMER),)),  # a timer needs a timer kind
        targets.Target("m", "C.f", SYNC_TIMER, measures=(Measure("nope", TIMER),)),
        targets.Target("m", "C.f", SYNC_TIMER, measures=(Measure(spec.seed, COUNTER),)),  # a histogram
        targets.Target("m", "C.f", SYNC, measures=(Measure("running_to_waiting_count", COUNTER, value="x"),)),
        targets.Target("m", "C.f", SYNC_TIMER, "api:RecordStats", measures=(Measure(spec.seed, TIMER),)),
        targets.Target("m", "C.f", SYNC_TIMER, measures=(Measure("scheduler:phase_batch_size", HISTOGRAM, "n"),)),
    ]
    for row in bad:
        assert problems(row, catalogue.BY_SEED), row


# -- CONTRIBUTING.md's worked examples, run as written -----------------------------------------------------------

CONTRIBUTING = ROOT / "CONTRIBUTING.md"


def _examples(kind: str) -> dict[str, str]:
    """{file: code} of CONTRIBUTING.md's worked example ``kind`` (its ``<!-- worked example: kind, file -->`` blocks)."""
    text = CONTRIBUTING.read_text()
    pattern = r"<!-- worked example: (\w+), ([\w/.]+) -->\s*```python\n(.*?)```"
    return {m.group(2): textwrap.dedent(m.group(3)) for m in re.finditer(pattern, text, re.S) if m.group(1) == kind}


def _files_touched(heading: str) -> list[str]:
    """The items of the section's "Files touched:" sentence, before its "(then …)" of generated docs and CHANGELOG."""
    section = CONTRIBUTING.read_text().split(heading, 1)[1]
    sentence = section.split("Files touched:", 1)[1].split("(then", 1)[0]
    return [item.strip() for item in re.split(r",|\band\b", " ".join(sentence.split())) if item.strip()]


def test_every_symbol_has_one_row():
    """The installer keys a row's status by its symbol: a second row on one symbol would never be installed."""
    symbols = [t.symbol for t in targets.TARGETS]
    assert sorted(s for s in set(symbols) if symbols.count(s) > 1) == []


def test_the_worked_examples_of_contributing_md_run(recipe, monkeypatch):
    pytest.importorskip("vllm", reason="the example's symbol resolves in the installed vLLM")
    from opentelemetry_instrumentation_vllm_ascend.handlers import scheduler as scheduler_handlers
    from opentelemetry_instrumentation_vllm_ascend.wiring import installer as installer_module

    timer, handler = _examples("timer"), _examples("handler")
    # The plain timer: the catalogue and the target table, nothing else; the hook: at most five files.
    assert set(timer) == {"catalogue.py", "targets.py"}
    assert _files_touched("## Add a plain timer") == ["`catalogue.py`", "`targets.py`"]
    assert set(handler) == {"catalogue.py", "targets.py", "handlers/scheduler.py"}
    assert len(_files_touched("## Add a hook with a handler")) <= 5
    timed_spec = eval(timer["catalogue.py"], vars(catalogue))
    timed_row = eval(timer["targets.py"], vars(targets))
    counted_spec = eval(handler["catalogue.py"], vars(catalogue))
    counted_row = eval(handler["targets.py"], vars(targets))
    namespace = dict(vars(scheduler_handlers))
    exec(handler["handlers/scheduler.py"], namespace)
    monkeypatch.setattr(scheduler_handlers, "FinishRequests", namespace["FinishRequests"], raising=False)
    # Both rows name a symbol of the installed vLLM, as check sees it.
    assert [installer_module.resolve(row) for row in (timed_row, counted_row)] == [(installer_module.RESOLVED, "")] * 2

    class Scheduler:  # vLLM's signatures; 0.125 s per request finished, 0.5 s per make_stats
        def finish_requests(self, request_ids, finished_status):
            recipe.clock.t += 0.125 * len(request_ids)
            return list(request_ids)

        def make_stats(self, spec_decoding_stats=None, kv_connector_stats=None):
            recipe.clock.t += 0.5
            return None

    recipe.module.Scheduler = Scheduler
    rows = [dataclasses.replace(r, module=recipe.module.__name__) for r in (timed_row, counted_row)]
    reader = recipe.install([timed_spec, counted_spec], rows)
    scheduler = Scheduler()
    aborted, stopped = types.SimpleNamespace(name="FINISHED_ABORTED"), types.SimpleNamespace(name="FINISHED_STOPPED")
    calls = ((["a"], aborted), (["b", "c"], aborted), ([], aborted))
    assert [scheduler.finish_requests(ids, status) for ids, status in calls] == [["a"], ["b", "c"], []]
    assert scheduler.finish_requests(request_ids=["d"], finished_status=stopped) == ["d"]  # by name: not counted
    assert [scheduler.make_stats(), scheduler.make_stats()] == [None, None]
    assert _points(reader, timed_spec.seed) == {_labels("all"): (2, 1.0)}  # 0.5 + 0.5, exactly
    assert namespace["FinishRequests"].reads_args == 3  # self, request_ids, finished_status
    assert _points(reader, counted_spec.seed) == {_labels("all"): 3}
    rendered = docgen.render_metrics_md()
    assert all(f"| `{row.symbol}` |" in rendered for row in rows)
    assert targets.hooked_symbols(counted_spec.seed) == (rows[1].symbol,)
