"""Users' hook files (``OTEL_VLLM_ASCEND_CONFIG``): YAML lists of entries in ms-service-metric's shape,
compiled once at load into the declarative form of the built-in rows (wiring/declarative.py: a
``Target`` row with ``Measure``s, each with its metric's spec); nothing from a file is imported or
executed.

An entry::

    - symbol: vllm.v1.core.sched.scheduler:Scheduler.add_request   # module:Class.method or module:function
      min_version: "0.23.0"        # optional, inclusive; vllm_ascend.* symbols gate on vllm-ascend's version
      max_version: "0.40.0"        # optional, inclusive
      metrics:
        - name: custom:add_request:prompt_tokens   # exposed as vllm_profiling_<name>
          type: histogram          # timer (default) | histogram | counter | gauge
          expr: request.num_prompt_tokens           # wiring/expressions.py
          buckets: [0, 8, 16, 32]
          labels: [{name: kind, expr: "'long' if request.num_prompt_tokens > 64 else 'short'"}]

Every entry ends in one state, logged in one line and shown by ``check --config``: ``loaded`` (its
hook is installed when its module is imported), ``mapped`` (an incumbent ``handler:``, or a metric a
built-in hook of ours already records: nothing new is installed), ``gated`` (version range, or
``enabled: false``) or ``rejected`` (why, where, and what to write instead). A file that cannot be read or
parsed is one rejected entry; the other files load. An incumbent ``handler:`` is looked up in
wiring/incumbent.py (with or without ``metrics:``); a loaded or mapped entry also lists what differs from
ms-service-metric (``Entry.differences``: type, buckets, expr, labels, hook point, what is timed, opt-in state,
phase), in its log line and in ``check --config``."""

from __future__ import annotations

import logging
import re

from packaging.version import Version

from .. import catalogue, environment
from ..targets import TARGETS
from . import incumbent
from .declarative import (  # noqa: F401  (MAX_LABEL_VALUES, MAX_LABEL_LENGTH: the bounds this format documents)
    COUNTER,
    GAUGE,
    HISTOGRAM,
    MAX_LABEL_LENGTH,
    MAX_LABEL_VALUES,
    PHASE_ALL,
    PHASE_ENGINE_STEP,
    PHASE_STEP,
    TIMER,
    Measure,
    argument_names,
    expressions_of,
)
from .differences import (
    builtin_differences,
    handler_row,
    phase_difference,
    plain,
    recorded_differences,
    selected,
    user_differences,
)
from .entries import (  # noqa: F401  (the format's vocabulary, read through userfile by cli/* and the tests)
    ENTRY_COMPAT_KEYS,
    ENTRY_KEYS,
    GATED,
    HISTOGRAM_BUCKETS,
    LOADED,
    MAPPED,
    MAX_ENTRIES,
    MAX_FILE_BYTES,
    MAX_LABELS,
    METRIC_KEYS,
    REJECTED,
    RESERVED_LABELS,
    TIMER_BUCKETS,
    TYPES,
    Entry,
    Rejected,
    buckets_of,
    outside,
    short,
    version_of,
    within,
)
from .expressions import ExpressionError, compile_expression
from .hook_rows import (  # noqa: F401  (cli/*, the installer and the tests reach them through userfile)
    check_names,
    function_of,
    resolve_entries,
    row_of,
    unresolved,
)
from .versions import vllm_ascend_version, vllm_version

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z_:][A-Za-z0-9_:\-]{0,127}$")
_LABEL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_QUALNAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_DUNDER_OK = frozenset({"__init__", "__call__"})


def _builtin_feeds() -> dict[str, set[str]]:
    """Catalogue seed -> the symbols whose built-in hooks feed it."""
    out: dict[str, set[str]] = {}
    for target in TARGETS:
        for seed in target.feeds:
            out.setdefault(seed, set()).add(target.symbol)
    return out


def _metric(raw, n: int, seen: dict, defined: dict) -> Measure:
    """The measure of the YAML metric ``raw`` (the entry's ``n``-th); ``seen``: the specs of user metrics
    of this load so far, ``defined``: those this process defined before (earlier loads)."""
    if not isinstance(raw, dict):
        raise Rejected(f"metric {n} is not a mapping")
    unknown = sorted(set(map(str, raw)) - METRIC_KEYS)
    if unknown:
        raise Rejected(f"metric {n}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(METRIC_KEYS))})")
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.match(name.strip()):
        raise Rejected(f"metric {n}: name {name!r} is not a metric name ([A-Za-z_:][A-Za-z0-9_:-]*)")
    kind = raw.get("type", TIMER)
    if kind not in TYPES:
        raise Rejected(f"metric {n} ({name}): type {kind!r} is not one of {', '.join(TYPES)}")
    seed = name.strip().replace("-", "_")
    if kind == COUNTER and seed.endswith("_total"):
        seed = seed[: -len("_total")]  # exposed with _total once, never doubled
    try:
        value = compile_expression(raw["expr"], None) if raw.get("expr") not in (None, "") else None
    except ExpressionError as exc:
        raise Rejected(f"metric {n} ({name}): expr: {exc}") from None
    # OTEL_VLLM_ASCEND_HOOK_SEMANTICS=ms-service-metric: the incumbent's value rules (declarative._incumbent_reader;
    # a timer records the duration, its expr unused; a histogram or gauge without expr records 1).
    incumbent = environment.hook_semantics() == environment.INCUMBENT_SEMANTICS
    if incumbent and kind == TIMER:
        value = None
    if kind == GAUGE and value is None and seed not in catalogue.BY_SEED and not incumbent:  # a built-in is mapped
        raise Rejected(f"metric {n} ({name}): a gauge needs expr")
    buckets = None
    if kind in (TIMER, HISTOGRAM):
        try:
            buckets = buckets_of(raw["buckets"]) if raw.get("buckets") is not None else None
        except ValueError as exc:
            raise Rejected(f"metric {n} ({name}): {exc}") from None
        buckets = buckets or (TIMER_BUCKETS if kind == TIMER else HISTOGRAM_BUCKETS)
    elif raw.get("buckets") is not None:
        raise Rejected(f"metric {n} ({name}): buckets only apply to timer and histogram")
    labels = []
    raw_labels = raw.get("labels") or []
    if not isinstance(raw_labels, list) or len(raw_labels) > MAX_LABELS:
        raise Rejected(f"metric {n} ({name}): labels must be a list of at most {MAX_LABELS} {{name, expr}}")
    for label in raw_labels:
        if not isinstance(label, dict) or set(label) - {"name", "expr"}:
            raise Rejected(f"metric {n} ({name}): a label is a mapping with name and expr")
        lname = label.get("name")
        if not isinstance(lname, str) or not _LABEL.match(lname) or lname in RESERVED_LABELS:
            raise Rejected(f"metric {n} ({name}): label name {lname!r} is not allowed")
        try:
            labels.append((lname, compile_expression(label.get("expr"), None)))
        except ExpressionError as exc:
            raise Rejected(f"metric {n} ({name}): label {lname}: {exc}") from None
    if len({lname for lname, _ in labels}) != len(labels):
        raise Rejected(f"metric {n} ({name}): a label name appears twice")
    spec = catalogue.MetricSpec(
        seed,
        catalogue.HISTOGRAM
        if kind in (TIMER, HISTOGRAM)
        else catalogue.COUNTER
        if kind == COUNTER
        else catalogue.GAUGE,
        "s" if value is None and (kind == TIMER or (kind == HISTOGRAM and not incumbent)) else "1",  # a duration
        f"User hook metric ({kind}) from {OTEL_CONFIG_NAME}.",
        labels=catalogue.STEP_LABELS + tuple(lname for lname, _ in labels),
        buckets=buckets,
    )
    known = seen.get(seed)
    if known is not None and known != spec:
        if defined.get(seed) == known:
            # Its series exist with that definition (the /metrics files keep a process's series for its
            # life): a histogram whose buckets changed would show both sets, a label set two shapes.
            raise Rejected(
                f"metric {n} ({name}): {seed} is defined since start-up with another type, unit, buckets or "
                "labels, which cannot change while the server runs: rename the metric, or restart"
            )
        raise Rejected(f"metric {n} ({name}): declared before with another type, unit, buckets or labels")
    # A histogram without expr records the duration: a timer measure, with a histogram's default buckets.
    measure_kind = TIMER if kind == HISTOGRAM and value is None and not incumbent else kind
    return Measure(seed, measure_kind, value, PHASE_STEP, tuple(labels), spec, incumbent)


OTEL_CONFIG_NAME = "OTEL_VLLM_ASCEND_CONFIG"


def _entry(raw, entry: Entry, seen: dict, defined: dict, feeds: dict, vllm, ascend) -> None:
    """Fill ``entry`` from the YAML item ``raw`` (status and reason); raises Rejected."""

    if not isinstance(raw, dict):
        raise Rejected(f"an entry must be a mapping, not {type(raw).__name__}")
    symbol = raw.get("symbol")
    if isinstance(symbol, str):
        entry.symbol = symbol.strip()
    keys = set(map(str, raw))
    unknown = sorted(keys - ENTRY_KEYS - ENTRY_COMPAT_KEYS)
    if unknown:
        raise Rejected(f"unknown key {unknown[0]!r} (allowed: {', '.join(sorted(ENTRY_KEYS | ENTRY_COMPAT_KEYS))})")
    if not isinstance(symbol, str) or symbol.count(":") != 1:
        raise Rejected(f"symbol {symbol!r} is not 'module:Class.method' or 'module:function'")
    module, qualname = entry.symbol.split(":")
    if not _MODULE.match(module) or not _QUALNAME.match(qualname):
        raise Rejected(f"symbol {symbol!r} is not 'module:Class.method' or 'module:function'")
    if any(p.startswith("__") and p not in _DUNDER_OK for p in (*module.split("."), *qualname.split("."))):
        raise Rejected(f"symbol {symbol!r}: dunder names other than __init__ / __call__ are not hooked")
    roots = environment.hook_module_roots()
    if module.split(".")[0] not in roots:
        raise Rejected(
            f"symbol {symbol!r}: hook files hook the code of {', '.join(roots)} only (name another module root "
            f"in {environment.CONFIG_MODULES})"
        )
    if raw.get("type", "wrap") != "wrap":
        raise Rejected(f"type {raw.get('type')!r}: only the incumbent's default 'wrap' is supported")
    if raw.get("need_locals") not in (None, False):
        raise Rejected("need_locals: reading a function's local variables needs bytecode injection, never done here")
    lock = raw.get("lock_patch", False)
    if not isinstance(lock, bool):
        raise Rejected(f"lock_patch must be true or false, not {lock!r}")
    entry.lock_patch = lock
    try:
        entry.min_version = version_of(raw["min_version"], "min_version") if "min_version" in raw else None
        entry.max_version = version_of(raw["max_version"], "max_version") if "max_version" in raw else None
    except ValueError as exc:
        raise Rejected(str(exc)) from None
    if entry.min_version and entry.max_version and Version(entry.min_version) > Version(entry.max_version):
        raise Rejected(f"min_version {entry.min_version} is above max_version {entry.max_version}")
    handler, metrics = raw.get("handler"), raw.get("metrics")
    version = ascend if module.split(".")[0] == "vllm_ascend" else vllm
    lock_note = "; lock_patch ignored (control gates every hook alike)" if lock else ""
    differences: list[str] = []
    row = handler_row(handler) if handler is not None else None
    handler_note = ""
    name = handler.rsplit(":", 1)[1] if isinstance(handler, str) else ""
    if row is not None:
        if row.fate in (incumbent.BUILT_IN, incumbent.IDENTITY):
            handler_note = f"handler {name} -> built-in {plain(row.here)}"
            if row.records:  # which of our metrics record what it recorded
                handler_note += ": records " + ", ".join(row.records)
            differences += map(plain, row.differences)
            differences += recorded_differences(row.records, entry.symbol, feeds)
            if metrics:
                differences.append(
                    f"ms-service-metric calls a handler given with metrics as a factory of the metrics' hook; {name} "
                    "is not one, so there this entry's hook records nothing; here the built-in and the metrics record"
                )
        else:
            if not metrics:
                raise Rejected(
                    f"handler {name} records the entry's metrics and the entry has none (ms-service-metric's hook "
                    "would fail to build): add metrics: [{name: <yours>, type: timer}], or drop the entry"
                )
            if row.fate == incumbent.SELECT:
                metrics = selected(row, name, metrics)
            handler_note = f"handler {name}: {plain(row.here)}"
            differences += map(plain, row.differences)
    if row is not None and not metrics:
        entry.differences = tuple(dict.fromkeys(differences))
        if raw.get("enabled", True) is False:
            entry.status, entry.reason = GATED, "enabled: false" + lock_note
            return
        if not within(version, entry.min_version, entry.max_version):
            entry.status, entry.reason = GATED, outside(version, vllm, entry) + lock_note
            return
        entry.status, entry.reason = MAPPED, handler_note + lock_note
        return
    if not isinstance(metrics, list) or not metrics:
        raise Rejected("an entry needs a non-empty metrics list (or a handler)")
    measures: list[Measure] = []
    mapped_names: list[str] = []
    notes = ""
    local = dict(seen)
    for n, raw_metric in enumerate(metrics, 1):
        if isinstance(raw_metric, dict) and "label" in raw_metric:
            # ms-service-metric reads only 'labels' and ignores 'label' (its SGLang example writes it): so do we.
            raw_metric = {k: v for k, v in raw_metric.items() if k != "label"}
            notes += f"; metric {n}: 'label' ignored, as ms-service-metric ignores it (write 'labels:' for a label)"
            entry.warning = True
        measure = _metric(raw_metric, n, local, defined)
        if any(m.metric == measure.metric for m in measures):
            raise Rejected(f"metric {n}: {measure.metric} appears twice in this entry")
        local.setdefault(measure.metric, measure.spec)
        if measure.metric in catalogue.BY_SEED:
            # A built-in metric: the built-in definition and hooks apply (a file cannot redefine it).
            by = sorted(feeds.get(measure.metric, ()))
            here = "this symbol" if entry.symbol in by else (", ".join(by) or "a built-in hook")
            unused = " (its expr/labels/buckets are not used)" if set(raw_metric) - {"name", "type"} else ""
            mapped_names.append(f"{measure.metric} by {here}{unused}")
            differences += builtin_differences(raw_metric, measure.metric, entry.symbol, feeds)
            if row is not None and row.phase:
                differences += phase_difference(measure.metric, row, name)
            continue
        measures.append(measure)
        if row is None or row.fate != incumbent.SELECT:  # a SELECT handler's values are not the file's expr
            differences += user_differences(raw_metric, measure)
    seen.update(local)
    entry.measures = tuple(measures)
    if measures and row is not None and row.phase:
        differences.append(
            f"phase of {', '.join(m.metric for m in measures)}: ms-service-metric's {name} "
            f"labels it with {plain(row.phase)}; here {plain(incumbent.STEP_PHASE)}"
        )
    entry.differences = tuple(dict.fromkeys(differences))  # each once, in order
    ignored = lock_note + notes
    prefix = handler_note + "; " if handler_note else ""
    if raw.get("enabled", True) is False:
        entry.status, entry.reason = GATED, "enabled: false" + ignored
        return
    if not within(version, entry.min_version, entry.max_version):
        entry.status, entry.reason = GATED, outside(version, vllm, entry) + ignored
        return
    if not measures:
        entry.status = MAPPED
        entry.reason = prefix + "built-in metric recorded: " + "; ".join(mapped_names) + ignored
        return
    entry.status = LOADED
    entry.reason = (
        prefix
        + ", ".join(catalogue.PREFIX + m.metric for m in measures)
        + (f" (built-in: {'; '.join(mapped_names)})" if mapped_names else "")
        + ignored
    )


def paths_from_environment() -> list[str]:
    import os

    return [p.strip() for p in os.environ.get(OTEL_CONFIG_NAME, "").split(",") if p.strip()]


def load(paths, vllm=None, ascend=None, *, log: bool = True, defined=None) -> list[Entry]:
    """Every entry of every file, each with its state and reason; never raises. ``vllm`` /
    ``ascend``: the installed versions (default: looked up). ``defined``: seed -> spec of the user
    metrics this process defined before (a reload: a metric keeps its definition)."""
    import yaml

    vllm = vllm_version() if vllm is None else vllm
    ascend = vllm_ascend_version() if ascend is None else ascend
    feeds = _builtin_feeds()
    defined = dict(defined or {})
    seen: dict[str, catalogue.MetricSpec] = dict(defined)
    entries: list[Entry] = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_FILE_BYTES + 1)
            if len(data) > MAX_FILE_BYTES:
                raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
            items = yaml.safe_load(data)  # safe_load: plain data only, no tags that build objects
        except Exception as exc:
            entries.append(_log(Entry(path, 0, reason=f"cannot read: {type(exc).__name__}: {short(exc)}"), log))
            continue
        if items is None:
            items = []
        if not isinstance(items, list):
            entries.append(_log(Entry(path, 0, reason="the file must be a YAML list of entries"), log))
            continue
        if len(items) > MAX_ENTRIES:
            entries.append(_log(Entry(path, 0, reason=f"more than {MAX_ENTRIES} entries"), log))
            continue
        for index, raw in enumerate(items, 1):
            entry = Entry(path, index)
            try:
                _entry(raw, entry, seen, defined, feeds, vllm, ascend)
            except Rejected as exc:
                entry.status, entry.reason, entry.measures, entry.differences = REJECTED, str(exc), (), ()
            except Exception as exc:  # a defect of ours: the entry, not the host, pays
                entry.status, entry.reason = REJECTED, f"internal error: {type(exc).__name__}: {exc}"
            entries.append(_log(entry, log))
    return entries


def _log(entry: Entry, log: bool) -> Entry:
    if log:
        level = logging.WARNING if entry.status == REJECTED or entry.warning else logging.INFO
        logger.log(
            level,
            "opentelemetry-instrumentation-vllm-ascend: %s: %s %s: %s%s",
            entry.where,
            entry.symbol or "(no symbol)",
            entry.verdict,
            entry.reason,
            "".join(f" | {d}" for d in entry.differences) if entry.status != REJECTED else "",
        )
    return entry


def reject(entry: Entry, reason: str) -> None:
    """The installer could not hook ``entry``: it is rejected, with ``reason``, logged."""
    entry.status, entry.reason = REJECTED, reason
    _log(entry, True)
