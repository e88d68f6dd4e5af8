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

import inspect
import logging
import re
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from .. import catalogue, environment
from ..hooks.patches import original_class
from ..kinds import ASYNC_GENERATOR, COROUTINE, COROUTINE_TIMER, SYNC, SYNC_TIMER
from ..targets import TARGETS, Target
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
from .differences import builtin_differences, phase_difference, plain, recorded_differences, user_differences
from .expressions import SPECIAL, ExpressionError, compile_expression
from .versions import vllm_ascend_version, vllm_version

logger = logging.getLogger(__name__)

LOADED, MAPPED, GATED, REJECTED = "loaded", "mapped", "gated", "rejected"

#: The ``type:`` of a metric: the declarative measure kinds (a ``histogram`` without ``expr`` is a timer
#: with the histogram's default buckets).
TYPES = (TIMER, HISTOGRAM, COUNTER, GAUGE)
ENTRY_KEYS = frozenset({"symbol", "handler", "metrics", "min_version", "max_version", "lock_patch", "need_locals"})
#: Keys of the incumbent's entries accepted with a fixed meaning (see ``_entry``).
ENTRY_COMPAT_KEYS = frozenset({"type", "enabled"})
METRIC_KEYS = frozenset({"name", "type", "expr", "buckets", "labels"})
#: Labels every series gets from the process / step: a user label may not take these names.
RESERVED_LABELS = frozenset({"dp", "role", "phase", "rank", "process", "le", "quantile"})
MAX_LABELS = 4
MAX_BUCKETS = 64
MAX_ENTRIES = 256
MAX_FILE_BYTES = 1 << 20
#: Default bounds of a ``timer`` (seconds: 1 µs … 5 min) and of a ``histogram`` without ``buckets``.
TIMER_BUCKETS = catalogue.FINE_SECONDS + (30.0, 60.0, 120.0, 300.0)
HISTOGRAM_BUCKETS = catalogue.TOKENS

_NAME = re.compile(r"^[A-Za-z_:][A-Za-z0-9_:\-]{0,127}$")
_LABEL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_QUALNAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_DUNDER_OK = frozenset({"__init__", "__call__"})


@dataclass
class Entry:
    file: str
    index: int  # 1-based position in its file (0: the file itself)
    symbol: str = ""
    status: str = REJECTED
    reason: str = ""
    #: ``targets.Measure`` per metric of the entry that is not a built-in one.
    measures: tuple[Measure, ...] = ()
    min_version: str | None = None
    max_version: str | None = None
    lock_patch: bool = False
    #: Something in the entry is ignored that its author may rely on: its log line is a warning.
    warning: bool = False
    #: What differs from ms-service-metric for this entry, each in words (type, buckets, labels, hook point,
    #: what is timed, opt-in state, phase).
    differences: tuple[str, ...] = ()

    @property
    def key(self) -> tuple:
        """What the entry installs: equal keys, the same hook (expressions compare by source; the
        measures carry their metrics' specs, buckets and labels included)."""
        return (self.symbol, self.measures)

    @property
    def where(self) -> str:
        return f"{self.file}" + (f" entry {self.index}" if self.index else "")

    @property
    def module(self) -> str:
        return self.symbol.split(":", 1)[0]

    @property
    def qualname(self) -> str:
        return self.symbol.split(":", 1)[1]

    def as_row(self) -> dict:
        return {
            "file": self.file,
            "entry": self.index,
            "symbol": self.symbol,
            "status": self.status,
            "reason": self.reason,
            "metrics": [catalogue.PREFIX + m.metric for m in self.measures],
            "differences": list(self.differences),
        }

    @property
    def verdict(self) -> str:
        """The status as ``check --config`` and the log say it: ``mapped with differences`` where any."""
        return self.status + (" with differences" if self.differences and self.status != REJECTED else "")


def _builtin_feeds() -> dict[str, set[str]]:
    """Catalogue seed -> the symbols whose built-in hooks feed it."""
    out: dict[str, set[str]] = {}
    for target in TARGETS:
        for seed in target.feeds:
            out.setdefault(seed, set()).add(target.symbol)
    return out


def _version(value, key: str) -> str:
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise ValueError(f"{key} must be a version string, not {type(value).__name__}")
    try:
        Version(str(value))
    except InvalidVersion:
        raise ValueError(f"{key} {value!r} is not a version") from None
    return str(value)


def _buckets(value) -> tuple:
    if not isinstance(value, list) or not value:
        raise ValueError("buckets must be a non-empty list of numbers")
    if len(value) > MAX_BUCKETS:
        raise ValueError(f"more than {MAX_BUCKETS} buckets")
    if any(
        isinstance(b, bool) or not isinstance(b, (int, float)) or b != b or b in (float("inf"), float("-inf"))
        for b in value
    ):
        raise ValueError("buckets must be finite numbers")
    if any(later <= earlier for earlier, later in zip(value, value[1:])):
        raise ValueError("buckets must be strictly increasing")
    return tuple(float(b) for b in value)


class _Rejected(Exception):
    pass


def _metric(raw, n: int, seen: dict, defined: dict) -> Measure:
    """The measure of the YAML metric ``raw`` (the entry's ``n``-th); ``seen``: the specs of user metrics
    of this load so far, ``defined``: those this process defined before (earlier loads)."""
    if not isinstance(raw, dict):
        raise _Rejected(f"metric {n} is not a mapping")
    unknown = sorted(set(map(str, raw)) - METRIC_KEYS)
    if unknown:
        raise _Rejected(f"metric {n}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(METRIC_KEYS))})")
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.match(name.strip()):
        raise _Rejected(f"metric {n}: name {name!r} is not a metric name ([A-Za-z_:][A-Za-z0-9_:-]*)")
    kind = raw.get("type", TIMER)
    if kind not in TYPES:
        raise _Rejected(f"metric {n} ({name}): type {kind!r} is not one of {', '.join(TYPES)}")
    seed = name.strip().replace("-", "_")
    if kind == COUNTER and seed.endswith("_total"):
        seed = seed[: -len("_total")]  # exposed with _total once, never doubled
    try:
        value = compile_expression(raw["expr"], None) if raw.get("expr") not in (None, "") else None
    except ExpressionError as exc:
        raise _Rejected(f"metric {n} ({name}): expr: {exc}") from None
    # OTEL_VLLM_ASCEND_HOOK_SEMANTICS=ms-service-metric: the incumbent's value rules (declarative._incumbent_reader;
    # a timer records the duration, its expr unused; a histogram or gauge without expr records 1).
    incumbent = environment.hook_semantics() == environment.INCUMBENT_SEMANTICS
    if incumbent and kind == TIMER:
        value = None
    if kind == GAUGE and value is None and seed not in catalogue.BY_SEED and not incumbent:  # a built-in is mapped
        raise _Rejected(f"metric {n} ({name}): a gauge needs expr")
    buckets = None
    if kind in (TIMER, HISTOGRAM):
        try:
            buckets = _buckets(raw["buckets"]) if raw.get("buckets") is not None else None
        except ValueError as exc:
            raise _Rejected(f"metric {n} ({name}): {exc}") from None
        buckets = buckets or (TIMER_BUCKETS if kind == TIMER else HISTOGRAM_BUCKETS)
    elif raw.get("buckets") is not None:
        raise _Rejected(f"metric {n} ({name}): buckets only apply to timer and histogram")
    labels = []
    raw_labels = raw.get("labels") or []
    if not isinstance(raw_labels, list) or len(raw_labels) > MAX_LABELS:
        raise _Rejected(f"metric {n} ({name}): labels must be a list of at most {MAX_LABELS} {{name, expr}}")
    for label in raw_labels:
        if not isinstance(label, dict) or set(label) - {"name", "expr"}:
            raise _Rejected(f"metric {n} ({name}): a label is a mapping with name and expr")
        lname = label.get("name")
        if not isinstance(lname, str) or not _LABEL.match(lname) or lname in RESERVED_LABELS:
            raise _Rejected(f"metric {n} ({name}): label name {lname!r} is not allowed")
        try:
            labels.append((lname, compile_expression(label.get("expr"), None)))
        except ExpressionError as exc:
            raise _Rejected(f"metric {n} ({name}): label {lname}: {exc}") from None
    if len({lname for lname, _ in labels}) != len(labels):
        raise _Rejected(f"metric {n} ({name}): a label name appears twice")
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
            raise _Rejected(
                f"metric {n} ({name}): {seed} is defined since start-up with another type, unit, buckets or "
                "labels, which cannot change while the server runs: rename the metric, or restart"
            )
        raise _Rejected(f"metric {n} ({name}): declared before with another type, unit, buckets or labels")
    # A histogram without expr records the duration: a timer measure, with a histogram's default buckets.
    measure_kind = TIMER if kind == HISTOGRAM and value is None and not incumbent else kind
    return Measure(seed, measure_kind, value, PHASE_STEP, tuple(labels), spec, incumbent)


OTEL_CONFIG_NAME = "OTEL_VLLM_ASCEND_CONFIG"


def _entry(raw, entry: Entry, seen: dict, defined: dict, feeds: dict, vllm, ascend) -> None:
    """Fill ``entry`` from the YAML item ``raw`` (status and reason); raises _Rejected."""

    if not isinstance(raw, dict):
        raise _Rejected(f"an entry must be a mapping, not {type(raw).__name__}")
    symbol = raw.get("symbol")
    if isinstance(symbol, str):
        entry.symbol = symbol.strip()
    keys = set(map(str, raw))
    unknown = sorted(keys - ENTRY_KEYS - ENTRY_COMPAT_KEYS)
    if unknown:
        raise _Rejected(f"unknown key {unknown[0]!r} (allowed: {', '.join(sorted(ENTRY_KEYS | ENTRY_COMPAT_KEYS))})")
    if not isinstance(symbol, str) or symbol.count(":") != 1:
        raise _Rejected(f"symbol {symbol!r} is not 'module:Class.method' or 'module:function'")
    module, qualname = entry.symbol.split(":")
    if not _MODULE.match(module) or not _QUALNAME.match(qualname):
        raise _Rejected(f"symbol {symbol!r} is not 'module:Class.method' or 'module:function'")
    if any(p.startswith("__") and p not in _DUNDER_OK for p in (*module.split("."), *qualname.split("."))):
        raise _Rejected(f"symbol {symbol!r}: dunder names other than __init__ / __call__ are not hooked")
    roots = environment.hook_module_roots()
    if module.split(".")[0] not in roots:
        raise _Rejected(
            f"symbol {symbol!r}: hook files hook the code of {', '.join(roots)} only (name another module root "
            f"in {environment.CONFIG_MODULES})"
        )
    if raw.get("type", "wrap") != "wrap":
        raise _Rejected(f"type {raw.get('type')!r}: only the incumbent's default 'wrap' is supported")
    if raw.get("need_locals") not in (None, False):
        raise _Rejected("need_locals: reading a function's local variables needs bytecode injection, never done here")
    lock = raw.get("lock_patch", False)
    if not isinstance(lock, bool):
        raise _Rejected(f"lock_patch must be true or false, not {lock!r}")
    entry.lock_patch = lock
    try:
        entry.min_version = _version(raw["min_version"], "min_version") if "min_version" in raw else None
        entry.max_version = _version(raw["max_version"], "max_version") if "max_version" in raw else None
    except ValueError as exc:
        raise _Rejected(str(exc)) from None
    if entry.min_version and entry.max_version and Version(entry.min_version) > Version(entry.max_version):
        raise _Rejected(f"min_version {entry.min_version} is above max_version {entry.max_version}")
    handler, metrics = raw.get("handler"), raw.get("metrics")
    version = ascend if module.split(".")[0] == "vllm_ascend" else vllm
    lock_note = "; lock_patch ignored (control gates every hook alike)" if lock else ""
    differences: list[str] = []
    row = _handler_row(handler) if handler is not None else None
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
                raise _Rejected(
                    f"handler {name} records the entry's metrics and the entry has none (ms-service-metric's hook "
                    "would fail to build): add metrics: [{name: <yours>, type: timer}], or drop the entry"
                )
            if row.fate == incumbent.SELECT:
                metrics = _selected(row, name, metrics)
            handler_note = f"handler {name}: {plain(row.here)}"
            differences += map(plain, row.differences)
    if row is not None and not metrics:
        entry.differences = tuple(dict.fromkeys(differences))
        if raw.get("enabled", True) is False:
            entry.status, entry.reason = GATED, "enabled: false" + lock_note
            return
        if not _within(version, entry.min_version, entry.max_version):
            entry.status, entry.reason = GATED, _outside(version, vllm, entry) + lock_note
            return
        entry.status, entry.reason = MAPPED, handler_note + lock_note
        return
    if not isinstance(metrics, list) or not metrics:
        raise _Rejected("an entry needs a non-empty metrics list (or a handler)")
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
            raise _Rejected(f"metric {n}: {measure.metric} appears twice in this entry")
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
    if not _within(version, entry.min_version, entry.max_version):
        entry.status, entry.reason = GATED, _outside(version, vllm, entry) + ignored
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


def _handler_row(handler) -> incumbent.Handler:
    """The incumbent table's row for ``handler:`` (wiring/incumbent.py); raises _Rejected for a name it does not
    know or a handler whose fate is rejected, saying what to write instead."""
    row = incumbent.find(handler) if isinstance(handler, str) else None
    if row is None:
        raise _Rejected(
            f"handler {handler!r} is not one of ms-service-metric's handlers (docs/configuration.md, Incumbent "
            "handlers; nothing named in a file is imported or run): write metrics: [{name: <yours>, type: timer}] "
            "(or counter, or histogram / gauge with expr) on the symbol instead"
        )
    if row.fate == incumbent.REJECTED:
        raise _Rejected(f"handler {handler.rsplit(':', 1)[1]}: {plain(row.here)}")
    return row


def _selected(row: incumbent.Handler, name: str, metrics) -> list:
    """The entry's metrics under a handler that records fixed values picked by name: each one it knows, as the
    built-in metric or a gauge with the handler's value as its expression; any other is rejected (the incumbent
    skips it silently)."""
    if not isinstance(metrics, list):
        raise _Rejected("metrics must be a list")
    values = dict(row.values)
    out = []
    for n, raw_metric in enumerate(metrics, 1):
        metric_name = raw_metric.get("name") if isinstance(raw_metric, dict) else None
        if metric_name not in values:
            raise _Rejected(
                f"metric {n} ({metric_name}): {name} records only {', '.join(values)} (ms-service-metric skips any "
                "other name): remove it, or give it an expr in an entry without handler"
            )
        expr = values[metric_name]  # the handler records a gauge whatever the entry's type says
        out.append({**raw_metric, "type": GAUGE, **({"expr": expr} if expr else {})})
    return out


def _within(version, min_version: str | None, max_version: str | None) -> bool:
    """Whether the installed ``version`` is within an entry's bounds, both inclusive (unknown: yes). A bound that is
    a pre-release is compared with the installed pre-release itself (``max_version: 0.13.0rc1`` keeps 0.13.0rc1);
    a final bound with the installed release (0.13.0rc1 counts as 0.13.0, as the target table counts it)."""
    if version is None:
        return True
    for bound, below in ((min_version, False), (max_version, True)):
        if bound is None:
            continue
        limit = Version(bound)
        installed = Version(version.public if limit.is_prerelease else version.base_version)
        if (installed > limit) if below else (installed < limit):
            return False
    return True


def _outside(version, vllm, entry: Entry) -> str:
    which = "vLLM" if version is vllm else "vllm-ascend"
    spec = ",".join(
        s for s in (entry.min_version and f">={entry.min_version}", entry.max_version and f"<={entry.max_version}") if s
    )
    return f"{which} {version} is outside {spec}"


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
            except _Rejected as exc:
                entry.status, entry.reason, entry.measures, entry.differences = REJECTED, str(exc), (), ()
            except Exception as exc:  # a defect of ours: the entry, not the host, pays
                entry.status, entry.reason = REJECTED, f"internal error: {type(exc).__name__}: {exc}"
            entries.append(_log(entry, log))
    return entries


def short(exc) -> str:
    """An exception's text on one line, at most 200 characters (what an entry's reason quotes)."""
    text = " ".join(str(exc).split())
    return text if len(text) <= 200 else text[:200] + "…"


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


# -- the hook: a declarative row ------------------------------------------------------------------
def parameters_of(function) -> tuple[str, ...]:
    """Names of ``function``'s parameters, in order (``self`` first for a method)."""
    try:
        return tuple(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return ()


def kind_of(function) -> str:
    """The wrapper kind of ``function`` itself: the original's, through wrappers of ours (a built-in
    hook on the same function: an async generator's wrapper is a plain function returning one)."""

    original = inspect.unwrap(function, stop=lambda f: not hasattr(f, "__otel_vllm_ascend_hook__"))
    if inspect.isasyncgenfunction(original):
        return ASYNC_GENERATOR
    if inspect.iscoroutinefunction(original):
        return COROUTINE
    return SYNC


def row_of(entry: Entry, function):
    """The declarative row of ``entry`` on ``function`` (what it names, found by ``function_of``): the
    timer wrapper kind of a sync function or a coroutine, the stream kind of an async generator, the
    function's parameters (after ``self`` for a method) as the row's ``params``. Raises ValueError
    when an expression reads a name the function does not have."""

    kind = {COROUTINE: COROUTINE_TIMER, ASYNC_GENERATOR: ASYNC_GENERATOR}.get(kind_of(function), SYNC_TIMER)
    parameters = parameters_of(function)
    params = parameters[1:] if "." in entry.qualname else parameters
    row = Target(entry.module, entry.qualname, kind, vllm="", params=params, measures=entry.measures)
    why = check_names(entry, argument_names(row))
    if why is not None:
        raise ValueError(why)
    return row


def check_names(entry: Entry, names: tuple[str, ...]) -> str | None:
    """Why the entry's expressions cannot run on a target whose arguments are ``names``, or None."""

    allowed = set(names) | set(SPECIAL)
    for m in entry.measures:
        for expression in expressions_of(m):
            unknown = [n for n in expression.names if n not in allowed]
            if unknown:
                return (
                    f"{m.metric}: expr {expression.source!r} reads {unknown[0]!r}, not a parameter of "
                    f"{entry.symbol} ({', '.join(names) or 'none'})"
                )
    return None


def function_of(module, entry: Entry):
    """(owner, attribute, function) that ``entry`` names in ``module``, on the original class (a name
    the module rebinds to a subclass is walked back to the definition, as for the built-in rows)."""

    if "." in entry.qualname:
        owner_name, attribute = entry.qualname.rsplit(".", 1)
        owner = original_class(module, owner_name)
    else:
        owner, attribute = module, entry.qualname
    function = getattr(owner, "__dict__", {}).get(attribute)
    if function is None:
        raise AttributeError(f"{entry.qualname} is not defined in {module.__name__}")
    return owner, attribute, function


def unresolved(entries: list[Entry]) -> list[Entry]:
    """For ``check --config`` where vLLM is not installed: loaded entries say that their symbol was not resolved."""
    for entry in entries:
        if entry.status == LOADED:
            entry.reason += " (not resolved: vLLM is not installed here)"
    return entries


def resolve_entries(entries: list[Entry]) -> list[Entry]:
    """For ``check --config``: import each loaded entry's module (never anything the file names
    besides it) and check the symbol exists and its expressions read only its parameters (a vllm_ascend symbol
    where vllm-ascend is not installed: not resolved, as every symbol where vLLM is not)."""
    import importlib
    import importlib.util

    for entry in entries:
        if entry.status != LOADED:
            continue
        if entry.module.split(".")[0] not in ("vllm", "vllm_ascend"):
            entry.reason += " (not resolved: check imports only vllm and vllm_ascend modules)"
            continue
        if entry.module.split(".")[0] == "vllm_ascend" and importlib.util.find_spec("vllm_ascend") is None:
            entry.reason += " (not resolved: vllm-ascend is not installed here)"
            continue
        try:
            module = importlib.import_module(entry.module)
            _, _, function = function_of(module, entry)
            if isinstance(function, (staticmethod, classmethod)):
                raise TypeError("static and class methods are not hooked")
            row_of(entry, function)
        except Exception as exc:
            entry.status, entry.reason = REJECTED, f"cannot hook: {type(exc).__name__}: {short(exc)}"
    return entries


def reject(entry: Entry, reason: str) -> None:
    """The installer could not hook ``entry``: it is rejected, with ``reason``, logged."""
    entry.status, entry.reason = REJECTED, reason
    _log(entry, True)
