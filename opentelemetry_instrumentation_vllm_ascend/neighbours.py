"""Other vLLM instrumentations loaded in the same process: ms-service-metric's vLLM plugin,
tapm-instrumentation-vllm (Tencent) and ddtrace's vLLM integration. Each wraps some of the functions this
package wraps; both work, but each call then pays for two wrappers, and the two sets of metrics measure
overlapping things under different names. ``check(patches)`` logs ONE warning per process naming the
neighbours found and the symbols both wrap; ``recheck()``, run once at the process's first metrics collection,
logs a second one only if more was found since (a neighbour that patched after the first warning, or one loaded
only later). Neither ever raises.

A symbol counts as double-wrapped when, among the layers of what its owner holds now (a wrapper put over ours)
or of the original we wrapped (a wrapper under ours), one belongs to a neighbour. Layers: the ``__wrapped__``
chain, and ms-service-metric's hook chain (its ``execute_hook_chain`` carries ``_hook_chain``, whose
``ori_func`` is what it wraps; it sets no ``__wrapped__``). A layer belongs to a neighbour when its own module
is one of the neighbour's, or, for a wrapt proxy, its wrapper function's module, or when its code was rewritten
to call a neighbour's function: a function object among its code's constants (bytecode wrapping in place, as
ddtrace's), or, in a function whose globals are a copy rather than its module's own (ms-service-metric's
``inject_function``: the original's code with calls to ``hook_func_when_enter`` / ``hook_func_when_return``
inserted), a function its code names from those globals. A neighbour that leaves none of these is named as
loaded, without symbols."""

from __future__ import annotations

import logging
import sys
import types
from dataclasses import dataclass

from .state import STATE

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Neighbour:
    name: str
    #: Module name prefixes: loaded when one is in sys.modules; a wrapper defined in one is theirs.
    modules: tuple[str, ...]


NEIGHBOURS = (
    Neighbour("ms-service-metric", ("ms_service_metric",)),
    Neighbour("tapm-instrumentation-vllm", ("opentelemetry.instrumentation.vllm", "tapm_hook_vllm")),
    Neighbour("ddtrace vLLM integration", ("ddtrace.contrib.internal.vllm", "ddtrace.contrib.vllm")),
)


def _belongs(module: str | None, neighbour: Neighbour) -> bool:
    return module is not None and any(module == m or module.startswith(m + ".") for m in neighbour.modules)


def loaded(modules=None) -> list[Neighbour]:
    modules = sys.modules if modules is None else modules
    # A loaded submodule implies its package's entry: dictionary look-ups only (this runs at every hooked import).
    return [n for n in NEIGHBOURS if any(m in modules for m in n.modules)]


def _inner(obj):
    """What ``obj`` wraps: ``__wrapped__``, or the function an ms-service-metric hook chain calls."""
    try:
        inner = getattr(obj, "__wrapped__", None)
        if inner is None:
            chain = getattr(obj, "_hook_chain", None)
            inner = getattr(chain, "ori_func", None) if chain is not None else None
        return inner
    except Exception:
        return None


def _layers(obj, limit: int = 16):
    """obj and what it wraps, outermost first."""
    seen = 0
    while obj is not None and seen < limit:
        yield obj
        seen += 1
        inner = _inner(obj)
        if inner is obj:
            return
        obj = inner


def _defined_in(obj) -> str | None:
    """The module a function was defined in (functools.wraps copies ``__module__`` from the function it
    wraps, so the function's globals tell, not its ``__module__``)."""
    try:
        module_globals = getattr(obj, "__globals__", None)
        if isinstance(module_globals, dict):
            return module_globals.get("__name__")
        return getattr(type(obj), "__module__", None)
    except Exception:
        return None


def _injected(obj) -> list:
    """Functions that code rewriting put into ``obj``'s code: function objects among its constants, and, where its
    globals are a copy rather than its module's own dict, the functions its code names from them."""
    if not isinstance(obj, types.FunctionType):
        return []
    code = obj.__code__
    found = [c for c in code.co_consts if isinstance(c, types.FunctionType)]
    module = sys.modules.get(obj.__globals__.get("__name__", ""))
    if module is None or getattr(module, "__dict__", None) is not obj.__globals__:
        found += [f for f in (obj.__globals__.get(n) for n in code.co_names) if isinstance(f, types.FunctionType)]
    return found


def wrapt_wrapper(layer):
    """The wrapper function of a ``wrapt.FunctionWrapper`` layer (wrapt keeps it in ``_self_wrapper``: the
    package's one private name of wrapt, here), None for any other layer. A wrapt proxy without it (a wrapt that
    moved it) is one log line: a neighbour wrapping through wrapt is then known by its layers' own modules only."""
    try:
        return object.__getattribute__(layer, "_self_wrapper")
    except AttributeError:
        pass
    import wrapt

    if isinstance(layer, (wrapt.FunctionWrapper, wrapt.BoundFunctionWrapper)):
        from . import environment

        environment.warn_once(
            ("private shape", "wrapt._self_wrapper"),
            "opentelemetry-instrumentation-vllm-ascend: this wrapt keeps no _self_wrapper on its FunctionWrapper; "
            "a neighbour that wraps a symbol through wrapt is recognised by its layers' own modules only",
        )
    return None


def _wrapped_by(obj, neighbours, stop=None) -> set[str]:
    found = set()
    for layer in _layers(obj):
        if layer is stop:
            break
        modules = [_defined_in(layer)]
        try:
            wrapper = wrapt_wrapper(layer)
            if wrapper is not None:
                modules.append(_defined_in(wrapper))
        except Exception:
            pass
        try:
            modules += [_defined_in(f) for f in _injected(layer)]
        except Exception:
            pass
        for n in neighbours:
            if any(isinstance(m, str) and _belongs(m, n) for m in modules):
                found.add(n.name)
    return found


def double_wrapped(patches, neighbours) -> dict[str, set[str]]:
    """{symbol: names of the neighbours wrapping it too}, for our patches (objects with ``owner``,
    ``attribute``, ``original``, ``wrapper``)."""
    out: dict[str, set[str]] = {}
    for patch in patches:
        try:
            owner = getattr(patch, "owner", None)
            attribute = getattr(patch, "attribute", None)
            if owner is None or attribute is None:
                continue
            names = set()
            current = getattr(owner, "__dict__", {}).get(attribute)
            if current is not None and current is not patch.wrapper:
                names |= _wrapped_by(current, neighbours, stop=patch.wrapper)  # over ours
            names |= _wrapped_by(patch.original, neighbours)  # under ours
            if names:
                symbol = f"{getattr(owner, '__module__', '?')}:{getattr(owner, '__qualname__', '?')}.{attribute}"
                out[symbol] = names
        except Exception:  # one odd patch record does not hide the others
            continue
    return out


def check(patches, modules=None) -> bool:
    """Log the warning once, the first time a neighbour is loaded; True when it logged now. Keeps ``patches``
    (the installer's list, which grows as modules are hooked) for ``recheck``."""
    s = STATE
    s.neighbour_patches = patches
    if s.neighbours_reported is not None:
        return False
    try:
        return _report(patches, loaded(modules), later=False)
    except Exception:  # never break the host
        return False


def recheck(modules=None) -> bool:
    """Run once per process, at its first collection (recording.pipeline): look again, and log only what is new
    since ``check``'s warning (or the first warning, if ``check`` found no neighbour then); True when it logged."""
    s = STATE
    if s.neighbours_rechecked:
        return False
    s.neighbours_rechecked = True
    try:
        return _report(s.neighbour_patches or (), loaded(modules), later=True)
    except Exception:  # never break the host
        return False


def _report(patches, found: list[Neighbour], later: bool) -> bool:
    if not found:
        return False
    s = STATE
    names = tuple(n.name for n in found)
    both = double_wrapped(patches, found)
    if s.neighbours_reported is not None:
        old_names, old_symbols = s.neighbours_reported
        if set(names) <= set(old_names) and all(old_symbols.get(k, set()) >= v for k, v in both.items()):
            return False
    s.neighbours_reported = (names, both)
    symbols = "; ".join(f"{k} ({', '.join(sorted(v))})" for k, v in sorted(both.items())) or "none found yet"
    logger.warning(
        "opentelemetry-instrumentation-vllm-ascend: on, beside other vLLM instrumentation loaded in this process: "
        "%s. %s. "
        "Both wrap the same functions (each call pays for both); double-wrapped symbols%s: %s",
        ", ".join(names),
        owned_names(found),
        " (looked again at the first metrics collection)" if later else "",
        symbols,
    )
    return True


#: ms-service-metric's vLLM adapter: the module that holds its metric prefix (``VLLM_METRICS_PREFIX``).
_MSM_PREFIX_MODULE = "ms_service_metric.adapters.vllm.metrics_init"
_MSM_DEFAULT_PREFIX = "vllm_profiling"


def our_prefixes() -> list[str]:
    """The prefixes of this package's Prometheus names (catalogue.py), sorted: ``catalogue.PREFIX``, else a name's
    first two words (``gen_ai_``)."""
    from . import catalogue

    out = set()
    for spec in catalogue.CATALOGUE:
        name = spec.prometheus_name
        out.add(catalogue.PREFIX if name.startswith(catalogue.PREFIX) else "_".join(name.split("_")[:2]) + "_")
    return sorted(out)


def incumbent_prefix(modules=None) -> str:
    """ms-service-metric's Prometheus prefix as its loaded adapter says (its 26.0.0 default where not loaded)."""
    modules = sys.modules if modules is None else modules
    try:
        prefix = getattr(modules.get(_MSM_PREFIX_MODULE), "VLLM_METRICS_PREFIX", None)
    except Exception:
        prefix = None
    prefix = prefix if isinstance(prefix, str) and prefix else _MSM_DEFAULT_PREFIX
    return prefix if prefix.endswith("_") else prefix + "_"


def owned_names(found, modules=None) -> str:
    """Which Prometheus names each side exports, for the warning: ours by prefix, ms-service-metric's by its
    prefix, and the prefix both use, under which ours are renamed on /metrics while it exports there
    (recording/files_reader.py)."""
    from . import catalogue

    try:
        ours = our_prefixes()
        text = "Names: this instrumentation " + ", ".join(p + "*" for p in ours)
        if any(n.name == "ms-service-metric" for n in found):
            theirs = incumbent_prefix(modules)
            text += f"; ms-service-metric {theirs}*"
            shared = [p for p in ours if p.startswith(theirs) or theirs.startswith(p)]
            if shared:
                text += (
                    f"; both write {', '.join(p + '*' for p in shared)}: while ms-service-metric exports such names, "
                    f"this instrumentation's {catalogue.PREFIX}* are served as {catalogue.SHARED_PREFIX}* on /metrics "
                    "(OTLP names unchanged; `ms-service-metric off` switches it off, docs/deploy.md)"
                )
        return text
    except Exception:  # never break the host
        return ""
