"""Other vLLM instrumentations loaded in the same process: ms-service-metric's vLLM plugin,
tapm-instrumentation-vllm (Tencent) and ddtrace's vLLM integration. Each wraps some of the functions this
package wraps; both work, but each call then pays for two wrappers, and the two sets of metrics measure
overlapping things under different names. ``check(patches)`` logs ONE warning per process naming the
neighbours found and the symbols both wrap; it never raises.

A symbol counts as double-wrapped when, in the ``__wrapped__`` chain of what its owner holds now (a wrapper
put over ours) or of the original we wrapped (a wrapper under ours), a layer's own module — or, for a wrapt
proxy, its wrapper function's module — belongs to a neighbour. A neighbour that rewrites the function's code in
place (ddtrace's bytecode wrapping) leaves no layer: it is named as loaded, without symbols."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass

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

_warned = [False]


def _belongs(module: str | None, neighbour: Neighbour) -> bool:
    return module is not None and any(module == m or module.startswith(m + ".") for m in neighbour.modules)


def loaded(modules=None) -> list[Neighbour]:
    modules = sys.modules if modules is None else modules
    # A loaded submodule implies its package's entry: dictionary look-ups only (this runs at every hooked import).
    return [n for n in NEIGHBOURS if any(m in modules for m in n.modules)]


def _layers(obj, limit: int = 16):
    """obj and what it wraps (``__wrapped__``), outermost first."""
    seen = 0
    while obj is not None and seen < limit:
        yield obj
        seen += 1
        try:
            obj = getattr(obj, "__wrapped__", None)
        except Exception:
            return


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


def _wrapped_by(obj, neighbours, stop=None) -> set[str]:
    found = set()
    for layer in _layers(obj):
        if layer is stop:
            break
        modules = [_defined_in(layer)]
        try:
            modules.append(_defined_in(object.__getattribute__(layer, "_self_wrapper")))  # wrapt.FunctionWrapper
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
    """Log the warning once, the first time a neighbour is loaded; True when it logged now."""
    if _warned[0]:
        return False
    try:
        found = loaded(modules)
        if not found:
            return False
        _warned[0] = True
        both = double_wrapped(patches, found)
        symbols = "; ".join(f"{s} ({', '.join(sorted(n))})" for s, n in sorted(both.items())) or "none found yet"
        logger.warning(
            "opentelemetry-instrumentation-vllm-ascend: other vLLM instrumentation loaded in this process: %s. "
            "Both wrap the same functions (each call pays for both); double-wrapped symbols: %s",
            ", ".join(n.name for n in found),
            symbols,
        )
        return True
    except Exception:  # never break the host
        return False
