"""Checks the target table against vLLM / vllm-ascend *source*, without importing it: every hooked
symbol exists, its parameters are where the handler reads them, and every attribute a handler reads
is defined. Used by the contract tests (on downloaded wheels / sdists of other versions) and usable
on any source tree (an installed package directory, a wheel, an sdist)."""

from __future__ import annotations

import ast
import os
import zipfile
from dataclasses import dataclass


@dataclass(frozen=True)
class Read:
    """An attribute a handler reads: ``module:Class.attribute`` (defined in the class or a base)."""

    module: str
    cls: str
    attribute: str


class SourceTree:
    """Python sources by module name, from a wheel/sdist archive or a directory."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = files  # "vllm/v1/request.py" -> source
        self._asts: dict[str, ast.Module | None] = {}

    @classmethod
    def from_archive(cls, path: str, strip_prefix: bool = False) -> "SourceTree":
        files = {}
        if path.endswith((".whl", ".zip")):
            with zipfile.ZipFile(path) as z:
                for name in z.namelist():
                    if name.endswith(".py"):
                        files[name] = z.read(name).decode("utf-8", "replace")
        else:
            import tarfile

            with tarfile.open(path) as t:
                for member in t.getmembers():
                    if member.isfile() and member.name.endswith(".py"):
                        name = member.name.split("/", 1)[1] if strip_prefix else member.name
                        files[name] = t.extractfile(member).read().decode("utf-8", "replace")
        return cls(files)

    @classmethod
    def from_directory(cls, root: str, package: str) -> "SourceTree":
        files = {}
        base = os.path.join(root, package)
        for dirpath, _, names in os.walk(base):
            for name in names:
                if name.endswith(".py"):
                    full = os.path.join(dirpath, name)
                    with open(full, encoding="utf-8", errors="replace") as f:
                        files[os.path.relpath(full, root).replace(os.sep, "/")] = f.read()
        return cls(files)

    def module(self, name: str) -> ast.Module | None:
        if name not in self._asts:
            path = name.replace(".", "/")
            source = self.files.get(path + ".py", self.files.get(path + "/__init__.py"))
            self._asts[name] = ast.parse(source) if source is not None else None
        return self._asts[name]

    def find_class(self, module: str, qualname: str, _depth: int = 0) -> tuple[str, ast.ClassDef] | None:
        tree = self.module(module)
        if tree is None or _depth > 5:
            return None
        body = tree.body
        node = None
        for part in qualname.split("."):
            node = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == part), None)
            if node is None:
                break
            body = node.body
        if node is not None:
            return module, node
        # Imported into the module under that name: follow the import (relative ones too).
        for n in tree.body:
            if isinstance(n, ast.ImportFrom):
                for alias in n.names:
                    if (alias.asname or alias.name) == qualname:
                        return self.find_class(self._absolute(module, n), alias.name, _depth + 1)
        return None

    def _absolute(self, module: str, node: ast.ImportFrom) -> str:
        if node.level == 0:
            return node.module or ""
        is_package = module.replace(".", "/") + "/__init__.py" in self.files
        parts = module.split(".")
        if not is_package:
            parts = parts[:-1]
        if node.level > 1:
            parts = parts[: len(parts) - (node.level - 1)]
        return ".".join(parts + ([node.module] if node.module else []))

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
                    targets = sub.targets if isinstance(sub, ast.Assign) else (
                        [sub.target] if isinstance(sub, (ast.AnnAssign, ast.AugAssign)) else [])
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


def positional_params(func: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    return [a.arg for a in func.args.posonlyargs + func.args.args]


def check_target(tree: SourceTree, target) -> list[str]:
    """Problems with one target row (empty: fine)."""
    module = tree.module(target.module)
    if module is None:
        return [f"module {target.module} not found"]
    if target.owner_qualname is None:  # a module-level factory that a function calls on every call
        return _check_module_factory(module, target)
    found = tree.find_class(target.module, target.owner_qualname)
    if found is None:
        return [f"class {target.module}:{target.owner_qualname} not found"]
    if target.attribute is None:  # a class-level hook: the class exists
        return []
    _, node = found
    func = next((n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and n.name == target.attribute), None)
    if func is None:
        return [f"{target.symbol} is not defined on {target.owner_qualname}"]
    problems = []
    params = positional_params(func)
    for index, expected in enumerate(target.params, start=1):
        if len(params) <= index or params[index] != expected:
            problems.append(f"{target.symbol}: positional parameter {index} is "
                            f"{params[index] if len(params) > index else 'missing'}, the handler expects {expected!r}")
    is_async = isinstance(func, ast.AsyncFunctionDef)
    has_yield = any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in ast.walk(func))
    if target.kind in ("coroutine", "coroutine_timer") and not (is_async and not has_yield):
        problems.append(f"{target.symbol} is not a coroutine function")
    if target.kind == "async_generator" and not (is_async and has_yield):
        problems.append(f"{target.symbol} is not an async generator")
    return problems


def _check_module_factory(module: ast.Module, target) -> list[str]:
    """``target.attribute`` is assigned at module level and some function of the module calls it
    through a ``global`` declaration (so replacing the module attribute reaches every caller)."""
    name = target.attribute
    def targets_of(node):
        return node.targets if isinstance(node, ast.Assign) else [node.target]

    assigned = any(isinstance(node, (ast.Assign, ast.AnnAssign))
                   and any(isinstance(t, ast.Name) and t.id == name for t in targets_of(node))
                   for node in module.body)
    if not assigned:
        return [f"{target.module}.{name} is not assigned at module level"]
    for node in module.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        declares = any(isinstance(n, ast.Global) and name in n.names for n in ast.walk(node))
        calls = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name
                    for n in ast.walk(node))
        if declares and calls:
            return []
    return [f"no function of {target.module} calls the global {name}"]


def check_read(tree: SourceTree, read: Read) -> list[str]:
    if read.attribute in tree.members(read.module, read.cls):
        return []
    return [f"{read.module}:{read.cls}.{read.attribute} not found"]
