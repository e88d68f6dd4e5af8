"""Reads vLLM / vllm-ascend *source* without importing it: a ``SourceTree`` of a wheel, an sdist or a
directory, and the checks of the target table against it (every hooked symbol exists, its parameters
are where the handler reads them). The contract tests run them over every supported release
(``supported.py``) and ``check --vllm VERSION|PATH`` over a release that is not installed: nothing here
imports vLLM. What only the tests ask of a tree (class hierarchies, fakes against real classes) is in
tests/support/source_checks.py."""

from __future__ import annotations

import ast
import os
import re
import zipfile


class SourceTree:
    """Python sources by module name, from a wheel/sdist archive or a directory."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = files  # "vllm/v1/request.py" -> source
        self._asts: dict[str, ast.Module | None] = {}

    @classmethod
    def from_archive(cls, path: str, strip_prefix: bool = False) -> SourceTree:
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
                        data = t.extractfile(member)
                        if data is not None:
                            files[name] = data.read().decode("utf-8", "replace")
        return cls(files)

    @classmethod
    def from_directory(cls, root: str, package: str) -> SourceTree:
        files = {}
        base = os.path.join(root, package)
        for dirpath, _, names in os.walk(base):
            for name in names:
                if name.endswith(".py"):
                    full = os.path.join(dirpath, name)
                    with open(full, encoding="utf-8", errors="replace") as f:
                        files[os.path.relpath(full, root).replace(os.sep, "/")] = f.read()
        return cls(files)

    @classmethod
    def from_path(cls, path: str) -> SourceTree:
        """A wheel (``.whl``), an sdist (``.tar.gz``: its top directory stripped) or a directory: a source
        tree or an unpacked sdist (holding ``vllm/`` or ``vllm_ascend/``), or such a package directory
        itself (``site-packages/vllm``)."""
        if os.path.isdir(path):
            path = os.path.abspath(path)
            if os.path.basename(path) in PACKAGES and os.path.exists(os.path.join(path, "__init__.py")):
                return cls.from_directory(os.path.dirname(path), os.path.basename(path))
            files: dict[str, str] = {}
            for package in PACKAGES:
                if os.path.isdir(os.path.join(path, package)):
                    files.update(cls.from_directory(path, package).files)
            return cls(files)
        if path.endswith((".whl", ".zip")):
            return cls.from_archive(path)
        return cls.from_archive(path, strip_prefix=True)

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
        imported = self.imported_as(module, qualname)  # imported into the module under that name: follow it
        return self.find_class(*imported, _depth + 1) if imported is not None else None

    def imported_as(self, module: str, name: str) -> tuple[str, str] | None:
        """(module, name) that a top-level ``from … import`` of ``module`` binds ``name`` to (relative imports
        too), else None."""
        tree = self.module(module)
        for n in _top_level(tree.body) if tree is not None else ():
            if isinstance(n, ast.ImportFrom):
                for alias in n.names:
                    if (alias.asname or alias.name) == name:
                        return self._absolute(module, n), alias.name
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


#: Top-level packages of a release's source (an sdist's tests, examples and benchmarks are not what runs).
PACKAGES = ("vllm", "vllm_ascend")


def _top_level(body):
    """Module-level statements, also inside ``if`` / ``try`` blocks (``if TYPE_CHECKING:``, optional imports)."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If):
            yield from _top_level(stmt.body + stmt.orelse)
        elif isinstance(stmt, ast.Try):
            yield from _top_level(stmt.body + stmt.orelse + stmt.finalbody + [s for h in stmt.handlers for s in h.body])


def positional_params(func: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    return [a.arg for a in func.args.posonlyargs + func.args.args]


def check_target(tree: SourceTree, target) -> list[str]:
    """Problems with one target row (empty: fine)."""
    module = tree.module(target.module)
    if module is None:
        return [f"module {target.module} not found"]
    if target.owner_qualname is None and target.kind == "scope_factory":  # a factory a function calls every call
        return _check_module_factory(module, target)
    if target.owner_qualname is None:  # a module-level function, defined there or imported by name
        return _check_module_function(tree, target)
    found = tree.find_class(target.module, target.owner_qualname)
    if found is None:
        return [f"class {target.module}:{target.owner_qualname} not found"]
    if target.attribute is None:  # a class-level hook: the class exists
        return []
    _, node = found
    func = next(
        (n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == target.attribute),
        None,
    )
    if func is None:
        return [f"{target.symbol} is not defined on {target.owner_qualname}"]
    return _signature_problems(func, target, target.symbol, first=1)


def _signature_problems(func, target, label: str, first: int) -> list[str]:
    """``func`` against the row: its positional parameters from index ``first`` (1 after a method's ``self``, 0 for
    a module-level function) are the ones the handler reads (``params_of``), first to last, and it is of the row's
    kind (coroutine, async generator). ``label`` names it in the problems."""
    from .wiring.declarative import params_of

    problems = []
    params = positional_params(func)
    for index, expected in enumerate(params_of(target), start=first):
        if len(params) <= index or params[index] != expected:
            problems.append(
                f"{label}: positional parameter {index} is "
                f"{params[index] if len(params) > index else 'missing'}, the handler expects {expected!r}"
            )
    is_async = isinstance(func, ast.AsyncFunctionDef)
    has_yield = any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in ast.walk(func))
    if target.kind in ("coroutine", "coroutine_timer") and not (is_async and not has_yield):
        problems.append(f"{label} is not a coroutine function")
    if target.kind == "async_generator" and not (is_async and has_yield):
        problems.append(f"{label} is not an async generator")
    return problems


def _check_module_factory(module: ast.Module, target) -> list[str]:
    """``target.attribute`` is assigned at module level and some function of the module calls it
    through a ``global`` declaration (so replacing the module attribute reaches every caller)."""
    name = target.attribute

    def targets_of(node):
        return node.targets if isinstance(node, ast.Assign) else [node.target]

    assigned = any(
        isinstance(node, (ast.Assign, ast.AnnAssign))
        and any(isinstance(t, ast.Name) and t.id == name for t in targets_of(node))
        for node in module.body
    )
    if not assigned:
        return [f"{target.module}.{name} is not assigned at module level"]
    for node in module.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        declares = any(isinstance(n, ast.Global) and name in n.names for n in ast.walk(node))
        calls = any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name for n in ast.walk(node)
        )
        if declares and calls:
            return []
    return [f"no function of {target.module} calls the global {name}"]


def _check_module_function(tree: SourceTree, target) -> list[str]:
    """``target.attribute`` is a module-level name of ``target.module`` (a function defined there, or imported by
    name: followed to its definition) that a function of the module reads at call time (so replacing the module
    attribute reaches that reader), with the parameters the handler reads, first to last, and the row's kind."""
    module = tree.module(target.module)
    name = target.attribute
    func, where = _module_function(tree, target.module, name)
    if func is None:
        return [f"{target.module}.{name} is not a function defined or imported there"]
    readers = [
        node.name
        for node in module.body  # type: ignore[union-attr]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.name != name
        and any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load) for n in ast.walk(node))
    ]
    problems = [] if readers else [f"no function of {target.module} reads its global {name}"]
    return problems + _signature_problems(func, target, f"{where}.{name}", first=0)


def _module_function(tree: SourceTree, module_name: str, name: str, depth: int = 0):
    """(the definition of ``module_name``'s module-level function ``name``, the module defining it), following
    ``from … import name``; (None, module_name) when there is none."""
    module = tree.module(module_name)
    if module is None or depth > 5:
        return None, module_name
    for node in module.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node, module_name
    imported = tree.imported_as(module_name, name)
    return _module_function(tree, *imported, depth + 1) if imported is not None else (None, module_name)


def module_function(tree: SourceTree, module_name: str, name: str):
    """The definition of ``module_name``'s module-level function ``name`` (followed through ``from … import``), or
    None."""
    return _module_function(tree, module_name, name)[0]


def release_version(path: str, project: str) -> str | None:
    """The version of ``project`` that an archive or a directory holds: its file name (``vllm-0.34.0.tar.gz``,
    ``vllm-0.34.0-…whl``), its metadata (an sdist's ``PKG-INFO``, a wheel's ``METADATA``, a ``*.dist-info`` or
    ``*.egg-info`` beside a package directory) or the package's generated ``_version.py``; None when none says."""
    stem = re.sub(r"[-_.]+", "_", project).lower()
    name = os.path.basename(os.path.abspath(path))
    match = re.match(r"([A-Za-z0-9_.]+?)-(\d[^-]*?)(?:\.tar\.gz|\.zip|-.+\.whl)?$", name)
    if match and re.sub(r"[-_.]+", "_", match.group(1)).lower() == stem:
        return match.group(2)

    def from_metadata(text: str) -> str | None:
        found = re.search(r"^Name:\s*(\S+)\s*$", text, re.M)
        if found and re.sub(r"[-_.]+", "_", found.group(1)).lower() == stem:
            version = re.search(r"^Version:\s*(\S+)\s*$", text, re.M)
            return version.group(1) if version else None
        return None

    def from_version_file(text: str) -> str | None:
        found = re.search(
            r"^(?:__version__|version)\s*(?::[^=]*)?=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]", text, re.M
        )
        return found.group(1) if found else None

    if os.path.isdir(path):
        root = os.path.abspath(path)
        if os.path.basename(root) == stem:
            root = os.path.dirname(root)
        candidates = [os.path.join(root, "PKG-INFO")]
        for entry in sorted(os.listdir(root)):
            if entry.lower().startswith(stem + "-") and entry.endswith((".dist-info", ".egg-info")):
                candidates += [os.path.join(root, entry, "METADATA"), os.path.join(root, entry, "PKG-INFO")]
        for candidate in candidates:
            if os.path.isfile(candidate):
                with open(candidate, encoding="utf-8", errors="replace") as f:
                    version = from_metadata(f.read())
                if version:
                    return version
        version_file = os.path.join(root, stem, "_version.py")
        if os.path.isfile(version_file):
            with open(version_file, encoding="utf-8", errors="replace") as f:
                return from_version_file(f.read())
        return None
    if path.endswith((".whl", ".zip")):
        with zipfile.ZipFile(path) as z:
            for member in z.namelist():
                if member.endswith(".dist-info/METADATA"):
                    version = from_metadata(z.read(member).decode("utf-8", "replace"))
                    if version:
                        return version
        return None
    import tarfile

    with tarfile.open(path) as t:
        for info in t.getmembers():
            data = t.extractfile(info) if info.isfile() and info.name.count("/") == 1 else None
            if data is not None and info.name.endswith("/PKG-INFO"):
                version = from_metadata(data.read().decode("utf-8", "replace"))
                if version:
                    return version
    return None


# -- check --vllm VERSION|PATH: the target table against a release that is not installed ------------------------


def expected_on(target, configuration) -> bool | None:
    """Whether the execution paths of ``configuration`` (``paths.detect``) expect ``target``: True for a
    row of every path (``Target.path`` "") or of the path taken on its axis, False for another path's
    row, None when the configuration cannot tell that axis's path."""
    if not target.path:
        return True
    from . import paths

    taken = configuration.paths.get(paths.BY_KEY[target.path].axis)
    if taken is None:
        return None
    return paths.includes(taken, target.path)


def release_rows(tree: SourceTree, vllm, ascend, configuration, table=None) -> list[dict]:
    """Per target, as ``installer.check`` reports the installed versions' (``symbol``, ``status``, ``detail``,
    ``kind``, ``vllm``, ``vllm_ascend``, ``feeds``), for the release whose source is ``tree`` (``vllm`` /
    ``ascend``: its versions, ``ascend`` None without vllm-ascend); with ``path`` (the row's execution
    path, "" for every one) and ``expected`` (``expected_on``: True, False or None for cannot tell)."""
    from . import targets as targets_module
    from .wiring import installer

    rows = []
    for target in table if table is not None else targets_module.TARGETS:
        gate = installer.gate_of(target, vllm, ascend)
        if gate == installer.NOT_INSTALLED:
            gate = "dormant: no vllm-ascend given"
        if gate is not None:
            status, detail = gate, ""
        else:
            problems = check_target(tree, target)
            status, detail = (installer.MISSING, "; ".join(problems)) if problems else (installer.RESOLVED, "")
        rows.append(
            {
                **installer.target_row(target, status, detail),
                "path": target.path,
                "expected": expected_on(target, configuration) if gate is None else False,
            }
        )
    return rows


def by_path(rows: list[dict], configuration=None) -> dict[str, dict]:
    """Per execution path (``paths.PATHS``): the metrics absent there (``paths.TRUTH``, that path alone), those
    it changes (fed with a meaning of its own there) and those lost there to targets of the release that do
    not resolve (rows of every path, and that path's own; off the worker axis, over the worker path
    ``configuration`` takes, or any when it cannot tell)."""
    from . import catalogue, paths

    out = {}
    for path in paths.PATHS:
        absent, changed = [], []
        for spec in catalogue.CATALOGUE:
            on = paths.on(spec.seed, path.key)
            if not on.fed:
                absent.append(spec.exposed_name)
            elif on.note:
                changed.append(spec.exposed_name)
        worker = path.key if path.axis == "worker" else (configuration.paths.get("worker") if configuration else None)
        missing = [r for r in rows if r["status"] == "missing" and (not r["path"] or paths.includes(worker, r["path"]))]
        lost = sorted(costs(rows, worker, missing))
        out[path.key] = {"axis": path.axis, "absent": absent, "changed": changed, "lost_to_missing_targets": lost}
    return out


def costs(rows: list[dict], path: str | None, missing: list[dict]) -> set[str]:
    """The metrics that ``missing`` rows feed and no resolved row of every path (or of ``path``; of any path
    when ``path`` is None) feeds: what their absence costs on that path."""
    from . import paths as paths_module

    fed = {
        name
        for row in rows
        if row["status"] == "resolved" and (not row["path"] or path is None or paths_module.includes(path, row["path"]))
        for name in row["feeds"]
    }
    return {name for row in missing for name in row["feeds"]} - fed
