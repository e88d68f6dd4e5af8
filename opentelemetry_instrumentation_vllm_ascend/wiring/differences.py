"""A hook-file entry (wiring/userfile.py) against ms-service-metric: the incumbent table's row for its ``handler:``
and the metrics such a handler records (``handler_row``, ``selected``), and what a loaded or mapped entry records
differently (``Entry.differences``, in its log line and in ``check --config``): type, buckets, expr, labels, hook
point, what is timed, opt-in state, phase."""

from __future__ import annotations

from .. import catalogue, environment
from ..targets import TARGETS, all_labels
from . import incumbent
from .declarative import COUNTER, GAUGE, HISTOGRAM, PHASE_ALL, PHASE_ENGINE_STEP, PHASE_STEP, TIMER, Measure
from .entries import Rejected


def plain(text: str) -> str:
    """Docs text (markdown code spans) as a log line says it."""
    return text.replace("`", "")


def handler_row(handler) -> incumbent.Handler:
    """The incumbent table's row for ``handler:`` (wiring/incumbent.py); raises Rejected for a name it does not
    know or a handler whose fate is rejected, saying what to write instead."""
    row = incumbent.find(handler) if isinstance(handler, str) else None
    if row is None:
        raise Rejected(
            f"handler {handler!r} is not one of ms-service-metric's handlers (docs/configuration.md, Incumbent "
            "handlers; nothing named in a file is imported or run): write metrics: [{name: <yours>, type: timer}] "
            "(or counter, or histogram / gauge with expr) on the symbol instead"
        )
    if row.fate == incumbent.REJECTED:
        raise Rejected(f"handler {handler.rsplit(':', 1)[1]}: {plain(row.here)}")
    return row


def selected(row: incumbent.Handler, name: str, metrics) -> list:
    """The entry's metrics under a handler that records fixed values picked by name: each one it knows, as the
    built-in metric or a gauge with the handler's value as its expression; any other is rejected (the incumbent
    skips it silently)."""
    if not isinstance(metrics, list):
        raise Rejected("metrics must be a list")
    values = dict(row.values)
    out = []
    for n, raw_metric in enumerate(metrics, 1):
        metric_name = raw_metric.get("name") if isinstance(raw_metric, dict) else None
        if metric_name not in values:
            raise Rejected(
                f"metric {n} ({metric_name}): {name} records only {', '.join(values)} (ms-service-metric skips any "
                "other name): remove it, or give it an expr in an entry without handler"
            )
        expr = values[metric_name]  # the handler records a gauge whatever the entry's type says
        out.append({**raw_metric, "type": GAUGE, **({"expr": expr} if expr else {})})
    return out


def user_differences(raw: dict, measure: Measure) -> list[str]:
    """How a hook file's own metric records differently from ms-service-metric's recording of the same entry
    (its builtin.default_handler). None under OTEL_VLLM_ASCEND_HOOK_SEMANTICS=ms-service-metric, which records as
    the incumbent does (``Measure.incumbent``)."""
    out: list[str] = []
    if measure.incumbent:
        return out
    if raw.get("type") == HISTOGRAM and measure.value is None:
        out.append(
            f"{measure.metric}: a histogram without expr records the call's duration here; ms-service-metric "
            "records 1 per call"
        )
    if measure.value is not None:
        out.append(
            f"{measure.metric}: where expr fails or is not a number the sample is skipped here (counted in "
            f"{catalogue.PREFIX}hook_errors_total); ms-service-metric records 1"
        )
        if measure.kind == COUNTER:
            out.append(
                f"{measure.metric}: an expr value of 0 adds nothing here and a negative one is skipped; "
                "ms-service-metric adds 1 for any value <= 0"
            )
    return out


#: The phase label a built-in declarative measure carries, in words (targets.MEASURE_PHASES).
_OUR_PHASE = (
    (PHASE_ALL, 'phase="all"'),
    (PHASE_STEP, plain(incumbent.STEP_PHASE)),
    (PHASE_ENGINE_STEP, "the phase of the step scheduled during the call (idle where none was)"),
)


def phase_difference(seed: str, row: incumbent.Handler, handler: str) -> list[str]:
    """How the ``phase`` label of built-in ``seed`` differs from the one the incumbent's ``handler`` (its function
    name) gives it."""
    phases = {m.phase for target in TARGETS for m in target.measures if m.metric == seed}
    ours = dict(_OUR_PHASE).get(phases.pop()) if len(phases) == 1 else None
    theirs = plain(row.phase)
    if ours is None or theirs == ours:
        return []
    return [f"{seed}: phase: ms-service-metric's {handler} labels it with {theirs}; here {ours}"]


def _opt_in(seed: str) -> list[str]:
    if environment.opt_in_off(seed):
        return [f"{seed} is opt-in and off: name it in {environment.ENABLED_METRICS} to record it"]
    return []


def _hook_point(seed: str, symbol: str, feeds: dict) -> list[str]:
    by = sorted(feeds.get(seed, ()))
    if not by or symbol in by:
        return []
    shown = ", ".join(by[:3]) + (f" (+{len(by) - 3} more)" if len(by) > 3 else "")
    return [f"{seed}: hook point: recorded at {shown}, not at {symbol}"]


def recorded_differences(seeds, symbol: str, feeds: dict) -> list[str]:
    """What differs for the built-in metrics an incumbent handler records (hook point, timing, opt-in)."""
    out: list[str] = []
    points = [d for seed in seeds for d in _hook_point(seed, symbol, feeds)]
    if len(points) > 2:
        shown = ", ".join(sorted({s for seed in seeds for s in feeds.get(seed, ())})[:3])
        out.append(f"hook point: these metrics are recorded at {shown}…, not at {symbol}")
    else:
        out += points
    for seed in seeds:
        timed = incumbent.timed_differently(seed)
        if timed:
            out.append(f"{seed}: what is timed: {timed}")
        out += _opt_in(seed)
    return out


def builtin_differences(raw: dict, seed: str, symbol: str, feeds: dict) -> list[str]:
    """What differs between a hook file's metric named like a built-in one and the built-in that records it:
    type, buckets, expr, labels, hook point, what is timed, opt-in state."""
    spec = catalogue.BY_SEED[seed]
    out: list[str] = []
    kind = raw.get("type", TIMER)
    declared = {TIMER: catalogue.HISTOGRAM, HISTOGRAM: catalogue.HISTOGRAM, COUNTER: catalogue.COUNTER}.get(
        kind, catalogue.GAUGE
    )
    if declared != spec.kind or (kind == TIMER and spec.unit != "s"):
        lost = " (no _bucket/_sum/_count series)" if declared == catalogue.HISTOGRAM else ""
        out.append(f"{seed}: type: declared {kind}, recorded as the built-in {spec.kind} of {spec.unit}{lost}")
    if raw.get("buckets") is not None:
        named = next((n for n, b in catalogue.BUCKET_SETS.items() if tuple(b) == tuple(spec.buckets or ())), None)
        theirs = f"the built-in's {named} buckets" if named else "the built-in's buckets"
        out.append(f"{seed}: buckets: yours ({len(raw['buckets'])} bounds) are not used; {theirs} apply")
    if raw.get("expr") not in (None, ""):
        first = spec.description.split(". ")[0].rstrip(".")
        out.append(f"{seed}: expr {raw['expr']!r} is not used; the built-in records: {first}")
    if raw.get("labels"):
        names = ", ".join(str(label.get("name")) for label in raw["labels"] if isinstance(label, dict))
        out.append(f"{seed}: labels {names} are not added; the built-in's labels are " + ", ".join(all_labels(spec)))
    out += _hook_point(seed, symbol, feeds)
    timed = incumbent.timed_differently(seed)
    if timed:
        out.append(f"{seed}: what is timed: {timed}")
    out += _opt_in(seed)
    return out
