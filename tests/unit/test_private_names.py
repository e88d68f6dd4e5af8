"""Design rule: the package's private names of prometheus_client, OpenTelemetry and wrapt live in one module per
dependency (issue 49, "public ground or pinned ground").

The rule reads the installed dependencies (so it checks against the floor and the newest release alike): every
private name they define (``_x``: a function, class, attribute or module variable they assign, or a string they
hand to ``setattr``), then every place the package touches one — ``obj._x`` on an object not its own
(``self``/``cls``), a ``"_x"`` string (``getattr(obj, "_x")``), an import of a private module (``…._internal``) or
name. Each must be in ``ALLOWED``, under the one module that owns that dependency's private names.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "opentelemetry_instrumentation_vllm_ascend"
DEPENDENCIES = ("prometheus_client", "opentelemetry", "wrapt")

#: The one module per dependency that may name its private names, and the names it uses (the place they are listed).
ALLOWED = {
    "recording/private_otel.py": {
        "opentelemetry.sdk.metrics._internal.instrument",
        "_Counter",
        "_Gauge",
        "_Histogram",
        "_set_collect_callback",
        "_instrument_class_temporality",
        "_preferred_temporality",
        "_preferred_aggregation",
        "_shutdown_event",
        "_active_span_processor",
        "opentelemetry.sdk._logs",
        "opentelemetry.sdk._logs.export",
    },
    "recording/private_prometheus.py": {"_names_to_collectors"},
    "neighbours.py": {"_self_wrapper"},  # wrapt's, on a neighbour's FunctionWrapper
}
#: prometheus_client: the registry's names only (the files writer counts its file itself; the guard wraps the public
#: ``merge``).
#: The owner of each dependency's private names (one module each).
OWNERS = {
    "opentelemetry": "recording/private_otel.py",
    "prometheus_client": "recording/private_prometheus.py",
    "wrapt": "neighbours.py",
}

#: Names that equal a dependency's private name but are something else's, with whose.
NOT_THEIRS = {
    ("handlers/executor.py", "_result"): "a concurrent.futures.Future of vLLM's executor (the standard library's)",
}
#: Sample-name suffixes (``name + "_sum"``), strings that are no attribute.
SUFFIXES = frozenset({"_sum", "_count", "_total", "_bucket", "_created", "_gsum", "_gcount", "_info"})


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and len(name) > 1


@functools.lru_cache(maxsize=1)
def dependency_private_names() -> frozenset[str]:
    names: set[str] = set()
    for top in DEPENDENCIES:
        spec = importlib.util.find_spec(top)
        assert spec is not None and spec.submodule_search_locations, top
        for location in spec.submodule_search_locations:
            for path in pathlib.Path(location).rglob("*.py"):
                try:
                    tree = ast.parse(path.read_text(encoding="utf-8"))
                except (SyntaxError, UnicodeDecodeError):
                    continue
                for node in ast.walk(tree):
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        names.add(node.name)
                    elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                        names.add(node.attr)
                    elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                        names.add(node.id)
                    elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("setattr"):
                        names.update(a.value for a in node.args[1:2] if isinstance(a, ast.Constant))
    # wrapt's C extension sets _self_wrapper where its pure-Python copy does not name it as a store
    names.add("_self_wrapper")
    return frozenset(n for n in names if isinstance(n, str) and _private(n))


def _not_checked(tree: ast.AST) -> set[int]:
    """ids of the string constants that name no attribute: f-string parts and our own ``__slots__``."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip.update(id(v) for v in node.values)
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__slots__" for t in node.targets):
            skip.update(id(v) for v in ast.walk(node.value))
    return skip


def private_uses(source: str, theirs: frozenset[str]) -> list[tuple[int, str]]:
    """(line, name) of each private name of the dependencies that ``source`` touches."""
    tree = ast.parse(source)
    skip = _not_checked(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in DEPENDENCIES:
            if any(_private(part) for part in node.module.split(".")):
                found.append((node.lineno, node.module))
            found += [(node.lineno, a.name) for a in node.names if _private(a.name)]
        elif isinstance(node, ast.Import):
            found += [
                (node.lineno, a.name)
                for a in node.names
                if a.name.split(".")[0] in DEPENDENCIES and any(_private(p) for p in a.name.split("."))
            ]
        elif isinstance(node, ast.Attribute) and node.attr in theirs:
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append((node.lineno, node.attr))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if node.value in theirs and node.value.isidentifier() and node.value not in SUFFIXES:
                found.append((node.lineno, node.value))
    return sorted(set(found))


def package_private_uses() -> dict[str, list[tuple[int, str]]]:
    theirs = dependency_private_names()
    uses = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        found = [(line, name) for line, name in private_uses(path.read_text(encoding="utf-8"), theirs)]
        found = [(line, name) for line, name in found if (module, name) not in NOT_THEIRS]
        if found:
            uses[module] = found
    return uses


def test_private_names_of_dependencies_stay_in_their_one_module():
    uses = package_private_uses()
    outside = [
        f"{module}:{line} {name}"
        for module, found in uses.items()
        for line, name in found
        if name not in ALLOWED.get(module, set())
    ]
    assert outside == [], "a private name of prometheus_client/OpenTelemetry/wrapt outside its module: " + ", ".join(
        outside
    )


def test_the_allow_list_is_what_is_used():
    """Nothing stale: each allowed name is used where it is listed (a name no longer used leaves the list)."""
    uses = package_private_uses()
    used = {module: {name for _, name in found} for module, found in uses.items()}
    assert {m: names for m, names in ALLOWED.items()} == {m: used.get(m, set()) for m in ALLOWED}
    assert sorted(set(OWNERS.values())) == sorted(ALLOWED)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("f._positions\n", [(1, "_positions")]),
        ("getattr(registry, '_collector_to_names', {})\n", [(1, "_collector_to_names")]),
        (
            "from opentelemetry.sdk.metrics._internal.instrument import _Counter\n",
            [(1, "_Counter"), (1, "opentelemetry.sdk.metrics._internal.instrument")],
        ),
        ("import opentelemetry.util._importlib_metadata\n", [(1, "opentelemetry.util._importlib_metadata")]),
        ("self._positions\n__slots__ = ('_positions',)\nf'{x}_positions'\n", []),
    ],
)
def test_the_rule_finds_each_kind_of_use(source, expected):
    assert private_uses(source, dependency_private_names()) == sorted(expected)
