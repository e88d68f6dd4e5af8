"""What only the tests ask of a release's source (``source.SourceTree``): its class hierarchy (every
subclass of a hooked class, the members a class and its bases define), whether an override calls the
base, where a test fake differs from the real class it stands for, and whether an attribute a handler
reads (``Read``) is defined. The package's ``check --vllm`` needs none of it, so it lives here, not in the
wheel; ``tests.support.contract`` re-exports it with the package's checks."""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass

from opentelemetry_instrumentation_vllm_ascend import source
from opentelemetry_instrumentation_vllm_ascend.source import PACKAGES, _top_level, positional_params

_CLASS_STATEMENT = re.compile(r"^[ \t]*class\s+\w+\s*\(([^)]*)\)", re.M)


@dataclass(frozen=True)
class Read:
    """An attribute a handler reads: ``module:Class.attribute`` (defined in the class or a base)."""

    module: str
    cls: str
    attribute: str
    #: PEP 440 specifier of the vLLM releases whose handlers read it (None: every release).
    vllm: str | None = None


class SourceTree(source.SourceTree):
    """The package's tree (``from_path``, ``from_archive``, ``from_directory`` build this class), with the
    class hierarchy over the whole tree."""

    def __init__(self, files: dict[str, str]) -> None:
        super().__init__(files)
        self._base_words: dict[str, set[str]] | None = None

    def resolve_base(self, module: str, base: ast.expr) -> tuple[str, ast.ClassDef] | None:
        """The class a base-class expression of a class in ``module`` names: ``Name`` (defined there or
        imported, ``from … import``), ``alias.Name`` / ``package.module.Name`` (``import …``), or either
        subscripted (``Generic[…]``)."""
        if isinstance(base, ast.Subscript):
            base = base.value
        if isinstance(base, ast.Name):
            return self.find_class(module, base.id)
        if not isinstance(base, ast.Attribute):
            return None
        parts = []
        node: ast.expr = base
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        parts.append(node.id)
        dotted = ".".join(reversed(parts))  # e.g. "sched.Scheduler" or "vllm.v1.core.sched.scheduler.Scheduler"
        head, _, cls = dotted.rpartition(".")
        tree = self.module(module)
        for stmt in _top_level(tree.body if tree is not None else []):
            if isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    name = alias.asname or alias.name
                    if head == name or head.startswith(name + "."):
                        target = alias.name if alias.asname else name
                        return self.find_class(target + head[len(name) :], cls)
            elif isinstance(stmt, ast.ImportFrom):
                for alias in stmt.names:
                    name = alias.asname or alias.name
                    if head == name or head.startswith(name + "."):  # ``from pkg import module``
                        sub = self._absolute(module, stmt) + "." + alias.name + head[len(name) :]
                        return self.find_class(sub, cls)
        return None

    def classes(self, names: set[str] | None = None) -> list[tuple[str, ast.ClassDef]]:
        """Every top-level class of the tree's packages (``PACKAGES``: an sdist's tests, examples and
        benchmarks are not what runs), as ``(module, ClassDef)``; with ``names``, only those in files
        whose text has a class statement naming one of them among its bases (a cheap filter before
        parsing)."""
        if self._base_words is None:  # per file: the words of its class statements' base lists
            self._base_words = {
                path: set(re.findall(r"\w+", " ".join(m.group(1) for m in _CLASS_STATEMENT.finditer(source))))
                for path, source in self.files.items()
                if path.split("/", 1)[0] in PACKAGES and "class " in source
            }
        out: list[tuple[str, ast.ClassDef]] = []
        for path in self._base_words:
            if names is not None and self._base_words[path].isdisjoint(names):
                continue
            module = _module_name(path)
            try:
                tree = self.module(module)
            except SyntaxError:
                continue
            if tree is None:
                continue
            out.extend((module, node) for node in tree.body if isinstance(node, ast.ClassDef))
        return out

    def subclasses(self, module: str, qualname: str) -> list[tuple[str, ast.ClassDef]]:
        """Every class of the tree that subclasses ``module:qualname``, directly or through other
        classes of the tree, as ``(defining module, ClassDef)``."""
        found = self.find_class(module, qualname)
        if found is None:
            return []
        known = {(found[0], found[1].name)}
        names = {found[1].name}
        result: dict[tuple[str, str], tuple[str, ast.ClassDef]] = {}
        while True:
            added = False
            for where, node in self.classes(names):
                key = (where, node.name)
                if key in known:
                    continue
                for base in node.bases:
                    resolved = self.resolve_base(where, base)
                    if resolved is not None and (resolved[0], resolved[1].name) in known:
                        known.add(key)
                        names.add(node.name)
                        result[key] = (where, node)
                        added = True
                        break
            if not added:
                return list(result.values())

    def members(self, module: str, qualname: str, _depth: int = 0) -> dict[str, ast.AST]:
        """Names defined by the class or its bases: methods, class-level fields, ``self.x = …``."""
        found = self.find_class(module, qualname)
        if found is None or _depth > 8:
            return {}
        where, node = found
        out: dict[str, ast.AST] = {}
        for base in node.bases:
            name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", None)
            if isinstance(base, ast.Subscript):  # Generic[...] and the like
                value = base.value
                name = value.attr if isinstance(value, ast.Attribute) else getattr(value, "id", None)
            if name:
                out.update(self.members(where, name, _depth + 1))
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[item.name] = item
                for sub in ast.walk(item):
                    targets = (
                        sub.targets
                        if isinstance(sub, ast.Assign)
                        else ([sub.target] if isinstance(sub, (ast.AnnAssign, ast.AugAssign)) else [])
                    )
                    for t in targets:
                        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                            out.setdefault(t.attr, sub)
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                out[item.target.id] = item
            elif isinstance(item, ast.Assign):
                for t in item.targets:
                    if isinstance(t, ast.Name):
                        out[t.id] = item
        return out


def _module_name(path: str) -> str:
    name = path[:-3].replace("/", ".")
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def calls_base(func: ast.FunctionDef | ast.AsyncFunctionDef, method: str) -> bool:
    """Whether ``func`` calls the method it overrides: ``super().method(…)``, ``super(C, self).method(…)``
    or ``Base.method(self, …)``."""
    for node in ast.walk(func):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == method):
            continue
        owner = node.func.value
        if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
            return True
        if (
            isinstance(owner, (ast.Name, ast.Attribute))
            and node.args
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id == "self"
        ):
            return True
    return False


def overrides_without_base_call(tree: SourceTree, module: str, qualname: str, method: str) -> list[str]:
    """``module:Class.method`` of every class of ``tree`` that subclasses ``module:qualname``
    (transitively) and defines ``method`` itself — a ``def`` that never calls the base's, or a
    class-level assignment — so a hook on the base never sees its calls."""
    out = []
    for where, node in tree.subclasses(module, qualname):
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == method:
                if not calls_base(item, method):
                    out.append(f"{where}:{node.name}.{method}")
            elif isinstance(item, ast.Assign) and any(isinstance(t, ast.Name) and t.id == method for t in item.targets):
                out.append(f"{where}:{node.name}.{method}")
    return sorted(set(out))


def fake_problems(tree: SourceTree, fakes, *, check_init: bool = False) -> list[str]:
    """Where test fakes differ from the real classes they stand for: ``fakes`` are (fake class, an instance
    or None, module, class name, names only the tests use). Each method of the fake (``__init__`` too with
    ``check_init``) is a method of the real class whose positional parameters begin with the fake's; each
    instance attribute is a member of the real class."""
    problems = []
    for fake, instance, module, cls, test_only in fakes:
        members = tree.members(module, cls)
        if not members:
            problems.append(f"{module}:{cls}: class not found")
            continue
        for name, value in vars(fake).items():
            dunder = name.startswith("__") and not (check_init and name == "__init__")
            if dunder or name in test_only or not callable(value):
                continue
            real = members.get(name)
            if not isinstance(real, (ast.FunctionDef, ast.AsyncFunctionDef)):
                problems.append(f"{cls}.{name}: not a method of the real class")
                continue
            parameters = inspect.signature(getattr(value, "__wrapped__", value)).parameters.values()
            positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            fake_params = [p.name for p in parameters if p.kind in positional]
            if positional_params(real)[: len(fake_params)] != fake_params:
                problems.append(f"{cls}.{name}: fake {fake_params} vs real {positional_params(real)}")
        for name in vars(instance) if instance is not None else ():
            if name not in test_only and name not in members:
                problems.append(f"{cls}.{name}: attribute not in the real class")
    return problems


def check_read(tree: SourceTree, read: Read) -> list[str]:
    if read.attribute in tree.members(read.module, read.cls):
        return []
    return [f"{read.module}:{read.cls}.{read.attribute} not found"]
