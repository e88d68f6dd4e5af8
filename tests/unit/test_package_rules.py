"""Rules of the package's source, read from its syntax trees: per-process state lives in ``state.STATE``
(no module-level mutable containers, no ``global`` rebinding, no import-time registration into another
module's objects), constant tables are not mutated, and no module imports or reads another module's
private names; docs/architecture.md names every module. Each exception is in an allow-list below, with its reason."""

from __future__ import annotations

import ast
import collections
import importlib
import io
import pathlib
import re
import tokenize

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
PACKAGE = ROOT / "opentelemetry_instrumentation_vllm_ascend"
PACKAGE_NAME = PACKAGE.name

#: Module-level containers that may exist: (module, name) -> why. ``constant`` entries are never mutated
#: by the package (test_constant_tables_are_never_mutated); the others are state that has no place in
#: STATE, with the reason.
ALLOWED_CONTAINERS = {
    # Constant tables read on the hot path: a dict lookup is ~30 ns cheaper than one through a
    # MappingProxyType (its bound ``get`` forwards to the dict's).
    ("handlers.executor", "TIMED"): "constant: read per RPC (its bound get is a default argument)",
    ("handlers.scopes", "_SCOPE_STAGES"): "constant: read per profiling scope",
    ("wiring.expressions", "FUNCTIONS"): "constant: read per evaluation of a user's expression",
    # The catalogue's index: tests extend it as a catalogue edit would (monkeypatch.setitem in
    # test_one_owner's recipe), so modules that bound it (``M``) at import see the new spec.
    ("catalogue", "BY_SEED"): "constant",
    # Constant tables kept as dicts (read only, as the next test checks).
    ("cli.dashboards", "EVENT_ONLY"): "constant",
    # A log-once flag kept as a one-element list: it belongs in STATE.warned.
}

#: Modules whose private names another module may import: (importing module, imported module, name) -> why.
ALLOWED_PRIVATE_IMPORTS = {
    # opentelemetry-python-contrib's convention: every instrumentation's package.py declares
    # ``_instruments`` (and ``_instruments_any``), and its __init__ imports them from there.
    ("__init__", "package", "_instruments"): "opentelemetry-contrib convention",
    ("__init__", "package", "_instruments_any"): "opentelemetry-contrib convention",
}

#: Methods that change a list, dict, set or deque in place.
MUTATORS = frozenset(
    (
        "append",
        "appendleft",
        "extend",
        "extendleft",
        "insert",
        "add",
        "update",
        "setdefault",
        "pop",
        "popitem",
        "popleft",
        "remove",
        "discard",
        "clear",
        "sort",
        "reverse",
        "difference_update",
        "intersection_update",
        "symmetric_difference_update",
        "__setitem__",
        "__delitem__",
    )
)
#: Calls that build a mutable container.
MUTABLE_CALLS = frozenset(
    (
        "dict",
        "list",
        "set",
        "bytearray",
        "deque",
        "defaultdict",
        "OrderedDict",
        "Counter",
        "WeakKeyDictionary",
        "WeakValueDictionary",
        "WeakSet",
        "fromkeys",  # dict.fromkeys
    )
)
MUTABLE_DISPLAYS = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)


def _modules():
    """(dotted name relative to the package, syntax tree) of every module of the package."""
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)
        yield name, ast.parse(path.read_text(), str(path))


MODULES = dict(_modules())


def _is_package(name: str) -> bool:
    return (PACKAGE / name.replace(".", "/") / "__init__.py").exists()


def _resolve(module: str, node: ast.ImportFrom) -> str | None:
    """The package-relative name of the module ``node`` imports from; None: outside the package."""
    if node.level == 0:
        if node.module == PACKAGE_NAME:
            return "__init__"
        if node.module and node.module.startswith(PACKAGE_NAME + "."):
            return node.module[len(PACKAGE_NAME) + 1 :]
        return None
    if module == "__init__":
        base = []
    elif _is_package(module):
        base = module.split(".")
    else:
        base = module.split(".")[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    parts = base + (node.module.split(".") if node.module else [])
    return ".".join(parts) or "__init__"


def _from_imports(module: str, tree: ast.Module):
    """(alias, the name's full package-relative path, the module it is imported from, node) of every
    ``from … import`` of the package in ``tree``, wherever it stands."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (source := _resolve(module, node)) is not None:
            for alias in node.names:
                yield alias, alias.name if source == "__init__" else f"{source}.{alias.name}", source, node


def _module_aliases(module: str, tree: ast.Module) -> dict[str, str]:
    """Local names bound to modules of the package (``from .. import catalogue``, ``import pkg.x as y``)."""
    out = {}
    for alias, full, _, _ in _from_imports(module, tree):
        if full in MODULES:
            out[alias.asname or alias.name] = full
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PACKAGE_NAME + ".") and alias.asname:
                    out[alias.asname] = alias.name[len(PACKAGE_NAME) + 1 :]
    return out


def _top_level(body):
    """Statements run at import (module and class bodies, inside if / try / with blocks)."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        yield node
        if isinstance(node, ast.ClassDef):
            yield from _top_level(node.body)
        for field in ("body", "orelse", "finalbody", "handlers"):
            inner = getattr(node, field, None)
            if isinstance(inner, list) and not isinstance(node, ast.ClassDef):
                yield from _top_level(inner)


def _mutable(value: ast.expr | None) -> bool:
    if isinstance(value, MUTABLE_DISPLAYS):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        return name in MUTABLE_CALLS
    return False


def _bound_names(node) -> list[str]:
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    else:
        return []
    return [t.id for t in targets if isinstance(t, ast.Name)]


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def _mutations(tree: ast.AST):
    """(receiver expression, line) of every in-place change: a mutator call, an item store or delete."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            yield node.func.value, node.lineno
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                if isinstance(target, ast.Subscript):
                    yield target.value, node.lineno


def _containers(module: str, tree: ast.Module) -> list[str]:
    """Names bound at import to a mutable container, outside ALLOWED_CONTAINERS."""
    return [
        f"{module}.{name}:{node.lineno}"
        for node in _top_level(tree.body)
        if _mutable(getattr(node, "value", None))
        for name in _bound_names(node)
        if name != "__all__" and (module, name) not in ALLOWED_CONTAINERS
    ]


def _globals(module: str, tree: ast.Module) -> list[str]:
    return [f"{module}:{n.lineno} global {', '.join(n.names)}" for n in ast.walk(tree) if isinstance(n, ast.Global)]


def _registrations(module: str, tree: ast.Module) -> list[str]:
    """In-place changes, at import, of objects reached through an imported name."""
    imported = set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imported.update((a.asname or a.name).split(".")[0] for a in node.names)
    simple = (ast.Expr, ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Delete)  # blocks: their statements
    found = []
    for node in _top_level(tree.body):
        if isinstance(node, simple):
            for receiver, line in _mutations(node):
                root = _root(receiver)
                if isinstance(root, ast.Name) and root.id in imported:
                    found.append(f"{module}:{line} {ast.unparse(receiver)}")
    return found


CONSTANTS = frozenset(key for key, why in ALLOWED_CONTAINERS.items() if why.startswith("constant"))


def _constant_mutations(module: str, tree: ast.Module) -> list[str]:
    """In-place changes of the allow-listed constant tables: by name in their module, through a module
    alias (``catalogue.BY_SEED``) or a from-import (``from ..catalogue import BY_SEED``) elsewhere."""
    aliases = _module_aliases(module, tree)
    imported_names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (source := _resolve(module, node)) is not None:
            for alias in node.names:
                imported_names[alias.asname or alias.name] = (source, alias.name)
    found = []
    for receiver, line in _mutations(tree):
        key = None
        if isinstance(receiver, ast.Name):
            key = imported_names.get(receiver.id, (module, receiver.id))
        elif isinstance(receiver, ast.Attribute) and isinstance(receiver.value, ast.Name):
            if receiver.value.id in aliases:
                key = (aliases[receiver.value.id], receiver.attr)
        if key in CONSTANTS:
            found.append(f"{module}:{line} {ast.unparse(receiver)}")
    return found


def _private_reads(module: str, tree: ast.Module) -> list[str]:
    """``from .x import _y`` and ``x._y`` for another module ``x`` of the package."""
    aliases = _module_aliases(module, tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (source := _resolve(module, node)) is not None:
            for alias in node.names:
                name = alias.name
                if name.startswith("_") and not name.startswith("__") and source != module:
                    if (module, source, name) not in ALLOWED_PRIVATE_IMPORTS:
                        found.append(f"{module}:{node.lineno} from {source} import {name}")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            target = aliases.get(node.value.id)
            private = node.attr.startswith("_") and not node.attr.startswith("__")
            if target is not None and target != module and private:
                found.append(f"{module}:{node.lineno} {node.value.id}.{node.attr}")
    return found


def _everywhere(rule) -> list[str]:
    return [found for module, tree in MODULES.items() for found in rule(module, tree)]


def test_modules_hold_no_mutable_containers_outside_the_allow_list():
    assert _everywhere(_containers) == [], "per-process state goes into state.STATE"
    # The allow-list names what exists: a stale entry is an error too.
    for module, name in ALLOWED_CONTAINERS:
        assert any(name in _bound_names(n) for n in _top_level(MODULES[module].body)), (module, name)


def test_no_module_rebinds_its_globals():
    assert _everywhere(_globals) == []


def test_no_module_registers_into_another_modules_objects_at_import():
    """Import-time ``other.LIST.append(x)`` (a registry another module reads) is state outside STATE and
    an import-order dependency: the reader calls what it needs instead."""
    assert _everywhere(_registrations) == []


def test_constant_tables_are_never_mutated():
    assert _everywhere(_constant_mutations) == []


def test_no_module_imports_or_reads_another_modules_private_names():
    assert _everywhere(_private_reads) == []


def test_one_module_registers_the_fork_handler():
    """recording.pipeline's fork handler is the package's only one: it resets STATE and gives the child
    what a fork leaves behind (its own pipeline, flush listener and control poller), in one order."""
    registered = [
        module
        for module, tree in MODULES.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "register_at_fork"
    ]
    assert registered == ["recording.pipeline"]


def _layout_rows() -> dict[str, str]:
    """docs/architecture.md's Layout table: package (``hooks/``, …, ``top level``) -> its "what" cell."""
    lines = (ROOT / "docs" / "architecture.md").read_text().split("## Layout", 1)[1].splitlines()
    rows = [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in lines if line.startswith("| ")]
    return {cells[0].strip("`"): cells[1] for cells in rows[1:]}


def test_architecture_md_names_every_module_in_its_package_s_row():
    rows = _layout_rows()
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if len(parts) > 2:  # a subpackage of a package (cli/demo): named as a whole
            parts = parts[:2]
        package, name = ("top level", parts[0]) if len(parts) == 1 else (parts[0] + "/", parts[1])
        if name == "__init__" and package != "top level":
            continue  # the package itself: its row
        if f"`{name}`" not in rows.get(package, ""):
            missing.append(f"{package} {name}")
    assert sorted(set(missing)) == []


def test_the_rules_see_what_they_forbid():
    """Each rule finds its shape in a sample module (the package passes because it has none of them,
    not because a rule is blind)."""
    sample = ast.parse(
        "from .. import catalogue\n"
        "from . import pipeline\n"
        "from .metrics_endpoint import _write_owner\n"
        "from ..catalogue import BY_SEED\n"
        "CACHE = {}\n"
        "CELL: list = [None]\n"
        "SEEN = set()\n"
        "pipeline.before_collect_hooks.append(print)\n"
        "def f():\n"
        "    global CACHE\n"
        "    catalogue.BY_SEED['x'] = None\n"
        "    BY_SEED.pop('x')\n"
        "    return pipeline._pipeline\n"
    )
    module = "recording.control"
    assert _containers(module, sample) == [f"{module}.CACHE:5", f"{module}.CELL:6", f"{module}.SEEN:7"]
    assert _globals(module, sample) == [f"{module}:10 global CACHE"]
    assert _registrations(module, sample) == [f"{module}:8 pipeline.before_collect_hooks"]
    assert _constant_mutations(module, sample) == [f"{module}:11 catalogue.BY_SEED", f"{module}:12 BY_SEED"]
    assert _private_reads(module, sample) == [
        f"{module}:3 from recording.metrics_endpoint import _write_owner",
        f"{module}:13 pipeline._pipeline",
    ]


# -- layers: what may import what ---------------------------------------------------------------------

#: The package's layers, bottom to top (docs/architecture.md draws them). A module imports, at module level or
#: inside a function, only modules of its own layer or of layers below; in a layer whose packages stand apart
#: (recording/ and hooks/: recording knows nothing of hooks, the mechanism nothing of recording) a package
#: imports none of the others. No imports form a cycle (test_no_import_cycle), within a layer neither.
LAYERS = (
    ("base", ("state", "supported", "version", "package", "errors", "kinds", "archives", "semconv")),
    ("facts", ("catalogue", "targets", "environment", "context", "paths", "neighbours")),
    ("recording and mechanism", ("recording", "hooks")),
    ("handlers", ("handlers",)),
    ("wiring", ("wiring",)),
    ("instrumentor and CLI", ("__init__", "__main__", "plugin", "source", "cli")),
)
APART = frozenset({"recording and mechanism"})


def _layer_of(module: str) -> tuple[int, str]:
    """(rank, package) of a package-relative module name."""
    first = module.split(".")[0]
    for rank, (_, members) in enumerate(LAYERS):
        if first in members:
            return rank, first if "." in module or (PACKAGE / first).is_dir() else "top level"
    raise AssertionError(f"{module} is in no layer: add it to LAYERS (and to docs/architecture.md)")


def _imports(module: str, tree: ast.Module):
    """(imported module, line) of every import of a package module in ``tree``, wherever it stands (module
    level, inside functions and classes, under ``if TYPE_CHECKING``)."""
    for _, full, source, node in _from_imports(module, tree):
        yield (full if full in MODULES else source), node.lineno
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE_NAME or alias.name.startswith(PACKAGE_NAME + "."):
                    name = alias.name[len(PACKAGE_NAME) + 1 :] or "__init__"
                    while name not in MODULES and "." in name:
                        name = name.rsplit(".", 1)[0]
                    yield name, node.lineno


def _upward(modules: dict[str, ast.Module]) -> list[str]:
    found = []
    for module, tree in modules.items():
        rank, package = _layer_of(module)
        for imported, line in _imports(module, tree):
            if imported == module or imported not in MODULES:
                continue
            other_rank, other_package = _layer_of(imported)
            apart = other_rank == rank and LAYERS[rank][0] in APART and other_package != package
            if other_rank > rank or apart:
                found.append(f"{module}:{line} imports {imported} ({LAYERS[other_rank][0]})")
    return found


def _cycles(modules: dict[str, ast.Module]) -> list[list[str]]:
    """The import graph's strongly connected components of more than one module (Tarjan)."""
    edges = {m: {i for i, _ in _imports(m, tree) if i in modules and i != m} for m, tree in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(modules):
        if v not in index:
            visit(v)
    return found


def test_every_import_points_down_the_layers():
    assert _upward(MODULES) == []


def test_no_import_cycle():
    assert _cycles(MODULES) == []


def test_the_layer_and_cycle_rules_see_function_level_imports():
    """A lazy import upward (recording asking hooks for report()) and a lazy cycle are both found."""
    recording = ast.parse("def f():\n    from ..hooks.handler import report\n")
    assert _upward({"recording.deferred": recording}) == [
        "recording.deferred:2 imports hooks.handler (recording and mechanism)"
    ]
    pair = {
        "catalogue": ast.parse("def f():\n    from .targets import recorded_in\n"),
        "targets": ast.parse("from . import catalogue\n"),
    }
    assert _cycles(pair) == [["catalogue", "targets"]]


# -- no test-only code in the wheel ---------------------------------------------------------------------

#: Module-level names no other line of the package reads, with why they ship: facts the package states
#: (design numbers, version lists, label vocabularies) that tests, the bench and the docs read from here.
#: Code only tests use belongs in tests/support.
ALLOWED_UNREFERENCED = {
    ("catalogue", "SERIES_BUDGET"): "a documented design number (performance.md); the bench and e2e read it",
    ("catalogue", "WORKER_SERIES_BUDGET"): "a documented design number (performance.md); the bench and e2e read it",
    ("catalogue", "SCRAPE_BUDGET_MS"): "a documented design number (performance.md); the bench reads it",
    ("catalogue", "KV_DIRECTIONS"): "the ``direction`` label's values, stated beside the label",
    ("supported", "LIVE"): "the one list of supported versions: the release the live e2e tests run",
    ("supported", "NEWEST"): "the one list of supported versions: its newest vLLM",
    ("paths", "AXES"): "the vocabulary of ``Path.axis``, stated beside it",
    ("cli.demo.tiny_model", "STEP_SIZED"): "the bench's model size, beside the tests' (one place for model sizes)",
    ("handlers.kv_transfer", "MemcacheStorePut"): "a handler targets.py names as f'{prefix}StorePut'",
    ("handlers.kv_transfer", "MemcacheStoreGet"): "a handler targets.py names as f'{prefix}StoreGet'",
}

#: Test helpers that moved to tests/support (test_no_test_only_helpers_ship): (module, name, attribute).
TEST_HELPERS = (
    ("source", "fake_problems", None),
    ("source", "overrides_without_base_call", None),
    ("source", "calls_base", None),
    ("source", "check_read", None),
    ("source", "Read", None),
    ("source", "SourceTree", "members"),
    ("source", "SourceTree", "subclasses"),
    ("source", "SourceTree", "classes"),
    ("source", "SourceTree", "resolve_base"),
    ("archives", "newest_release", None),
    ("wiring.declarative", "CATALOGUE_KIND", None),
)

#: ``module:Name`` and ``module.Name`` inside a string (a target row's ``handler``), or a string that is a name.
_NAME_IN_STRING = re.compile(r"[\w.]+[:.](\w+)|^(\w+)$")


def _defined_names(tree: ast.Module) -> list[str]:
    """Public module-level names a module defines (functions, classes, assignments)."""
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        else:
            names.extend(_bound_names(node))
    return [n for n in names if not n.startswith("_")]


def _used_words(text: str) -> collections.Counter:
    """The names a module's code uses: its NAME tokens (definitions included) and the names its strings hold
    (``"kv_transfer:AscendStorePut"``), docstrings and comments aside."""
    words: collections.Counter = collections.Counter()
    docstrings = {
        (node.lineno, node.col_offset)
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.start in docstrings:
            continue
        if token.type == tokenize.NAME:
            words[token.string] += 1
        elif token.type == tokenize.STRING and "f" in token.string.split(token.string[-1], 1)[0].lower():
            words.update(re.findall(r"[A-Za-z_]\w*", token.string))  # an f-string: its every word (before 3.12)
        elif token.type == tokenize.STRING:
            try:
                value = ast.literal_eval(token.string)
            except (ValueError, SyntaxError):
                continue
            if isinstance(value, str) and "\n" not in value:
                for match in _NAME_IN_STRING.finditer(value.strip()):
                    words[match.group(1) or match.group(2)] += 1
    return words


def _unreferenced() -> list[str]:
    """Public module-level names of the package that no line of the package (nor pyproject's entry points)
    uses besides their definition: what only tests (or nothing) use. A name that is also a word elsewhere in
    the package's code passes unseen, so this finds the clear cases, never a false one."""
    used: collections.Counter = collections.Counter()
    for path in PACKAGE.rglob("*.py"):
        used.update(_used_words(path.read_text()))
    used.update(re.findall(r"\w+", (ROOT / "pyproject.toml").read_text()))
    return [
        f"{module}.{name}"
        for module, tree in MODULES.items()
        for name in _defined_names(tree)
        if used[name] <= 1 and (module, name) not in ALLOWED_UNREFERENCED
    ]


def test_every_public_name_of_the_package_is_used_by_the_package():
    """No test-only code in the wheel: a function, class or constant that only tests use goes to tests/support
    (``ALLOWED_UNREFERENCED``: facts the package states for its readers)."""
    assert _unreferenced() == []
    for module, name in ALLOWED_UNREFERENCED:  # a stale entry is an error too
        assert name in _defined_names(MODULES[module]), (module, name)


def test_no_test_only_helpers_ship():
    """The helpers that moved to tests/support (tests/support/source_checks.py, source_archives.py, fakes.py)
    are not importable from the package."""
    shipped = []
    for module, name, attribute in TEST_HELPERS:
        found = getattr(importlib.import_module(f"{PACKAGE_NAME}.{module}"), name, None)
        if found is not None and (attribute is None or hasattr(found, attribute)):
            shipped.append(f"{module}.{name}" + (f".{attribute}" if attribute else ""))
    assert shipped == []


def test_the_unused_name_rule_sees_a_test_only_function():
    words = _used_words('def helper():\n    """helper"""\n    # helper\nX = "handlers.kv:Put"\nY = f"{Z.a}"\n')
    assert words["helper"] == 1 and words["Put"] == 1 and words["Z"] == 1 and words["a"] == 1


# -- modules a newcomer can read ----------------------------------------------------------------------

MAX_MODULE_LINES = 400

#: Modules over MAX_MODULE_LINES, each with why (package-relative path -> reason). An entry whose module is back
#: under the bound is an error too, so the list only shrinks.
LONG_MODULES = {
    "catalogue.py": "the metric catalogue: one table, one fact per metric (each fact in one place)",
    "targets.py": "the target table: one row per hooked symbol (each fact in one place)",
    "paths.py": "the path table (what each metric measures per path) and its detection; cli/* imports both",
    "environment.py": "every setting's reader, in one place; a file other work edits at the same time",
    "wiring/incumbent.py": "the incumbent's handlers and their fates: one table, docs generated from it",
    "recording/fastpath.py": "the fast-path aggregator: code on the step, not moved",
    "recording/files_writer.py": "the /metrics files' writer: code on the step, not moved",
    "handlers/scheduler.py": "the scheduler's step handlers: code on the step, not moved",
    "handlers/model_runner.py": "the worker's step handlers: code on the step, not moved",
    "handlers/kv_transfer.py": "KV-transfer handlers; target rows name their classes by module (kv_transfer:…)",
    "handlers/traces.py": "request-trace handlers; target rows name their classes by module (traces:…)",
    "handlers/api.py": "the API server's per-request handlers: code on each request, not moved",
    "cli/dashboards.py": "the dashboards and alerts generator: one table of panels; cli/* is other work's this round",
}


def _lengths() -> dict[str, int]:
    return {
        str(path.relative_to(PACKAGE)): len(path.read_text().splitlines()) for path in sorted(PACKAGE.rglob("*.py"))
    }


def test_every_module_is_at_most_400_lines_but_the_named_ones():
    lengths = _lengths()
    assert {m: n for m, n in lengths.items() if n > MAX_MODULE_LINES and m not in LONG_MODULES} == {}
    assert {m: lengths.get(m) for m in LONG_MODULES if lengths.get(m, 0) <= MAX_MODULE_LINES} == {}
