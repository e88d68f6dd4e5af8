"""A target row's status (the installer's, and the ``check`` command's): whether this environment gates it off
(``gate_of``), whether its symbol resolves (``resolve``, without patching), the row ``check`` prints for it, and
per catalogue metric whether a server started here will feed it (``metric_status``)."""

from __future__ import annotations

from packaging.version import Version

from .. import catalogue
from ..environment import traces_enabled
from ..hooks.patches import original_class
from .versions import in_range

RESOLVED = "resolved"
GATED = "gated off by version"
NOT_INSTALLED = "dormant: vllm-ascend not installed"
MISSING = "missing"
DISABLED = "disabled by configuration (OTEL_VLLM_ASCEND_DISABLED_METRICS, or opt-in)"
TRACES_OFF = "request traces off (OTEL_VLLM_ASCEND_TRACES)"
PENDING = "waiting for import"


def gate_of(target, vllm: Version | None, ascend: Version | None, checking: bool = False) -> str | None:
    """Why a target is not to be hooked with these installed versions and this configuration, or None.
    ``checking`` (the ``check`` command): request-trace rows are resolved whether traces are on or not."""
    from ..environment import disabled_metric_patterns, metric_disabled

    if target.traces and not checking and not traces_enabled():
        return TRACES_OFF
    patterns = disabled_metric_patterns()
    if (
        patterns
        and target.feeds
        and not target.provides_context
        and not (target.feeds_traces and traces_enabled())
        and all(metric_disabled(seed, patterns) for seed in target.feeds)
    ):
        return DISABLED
    if target.vllm_ascend is not None:
        if ascend is None:
            return NOT_INSTALLED
        if not in_range(ascend, target.vllm_ascend):
            return GATED
    if not in_range(vllm, target.vllm):
        return GATED
    return None


def resolve(target) -> tuple[str, str]:
    """Import the target's module and look the symbol up, without patching: (status, detail)."""
    import importlib

    try:
        module = importlib.import_module(target.module)
    except Exception as exc:
        return MISSING, f"import failed: {type(exc).__name__}: {exc}"
    if target.owner_qualname is None:  # a module-level attribute
        if not hasattr(module, target.attribute):
            return MISSING, f"{target.module}.{target.attribute} is not defined"
        return RESOLVED, ""
    try:
        owner = original_class(module, target.owner_qualname)
    except AttributeError as exc:
        return MISSING, str(exc)
    if target.attribute is not None and target.attribute not in getattr(owner, "__dict__", {}):
        return MISSING, f"{target.owner_qualname}.{target.attribute} is not defined"
    return RESOLVED, ""


def exposed_name(seed: str) -> str:
    """The name a seed's metric is exposed under (``MetricSpec.exposed_name``: the prefix, or the explicit name of
    the ``gen_ai.server.*`` ones), what ``metric_status`` matches the rows' feeds against."""
    spec = catalogue.BY_SEED.get(seed)
    return spec.exposed_name if spec is not None else catalogue.PREFIX + seed


def target_row(target, status: str, detail: str) -> dict:
    """One target's row of ``check`` (installed, or ``check --vllm`` on a release's source)."""
    return {
        "symbol": target.symbol,
        "status": status,
        "detail": detail,
        "kind": target.kind,
        "vllm": target.vllm,
        "vllm_ascend": target.vllm_ascend,
        "feeds": [exposed_name(seed) for seed in target.feeds],
    }


def metric_status(rows: list[dict], config) -> list[dict]:
    """Per catalogue metric, whether a server with this environment and ``config`` will feed it:
    ``fed`` / ``depends`` (on a path the environment cannot tell) with what it measures there where
    that differs from its description, ``absent`` on this path (why), or ``not hooked`` (no resolved
    target feeds it: each feeding target's status), ``disabled`` by configuration."""
    from .. import paths
    from ..environment import ENABLED_METRICS, metric_disabled, opt_in_off

    feeding: dict[str, list[dict]] = {}
    for row in rows:
        for name in row["feeds"]:
            feeding.setdefault(name, []).append(row)
    out = []
    for spec in catalogue.CATALOGUE:
        sources = feeding.get(spec.exposed_name, [])
        if metric_disabled(spec.seed):
            status, detail = DISABLED, f"opt-in: {ENABLED_METRICS} records it" if opt_in_off(spec.seed) else ""
        elif spec.seed in catalogue.SELF_SEEDS:  # the package's own (hook_errors): no row feeds it, every hook does
            status, detail = paths.verdict(spec.seed, config)
            detail = detail or "the package's own: recorded in every instrumented process (no target row feeds it)"
        elif not any(r["status"] == RESOLVED for r in sources):
            status = "not hooked"
            detail = "; ".join(f"{r['symbol']}: {r['status']}" for r in sources) or "no target feeds it"
        else:
            status, detail = paths.verdict(spec.seed, config)
        out.append({"metric": spec.exposed_name, "status": status, "detail": detail})
    return out
