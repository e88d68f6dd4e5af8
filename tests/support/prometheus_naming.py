"""How the OpenTelemetry Collector's ``prometheusremotewrite`` exporter names the Prometheus series of an OTLP
metric, re-implemented rule for rule from the Go source, for tests/unit/test_deploy.py to check that what the
collector config (deploy/otel-collector/) writes into Prometheus carries the names /metrics shows, which the
dashboards and rules query.

Sources (read for this file; the Go code is not copied, its rules are):

- otelcol-contrib v0.131.0 and later: pkg/translator/prometheusremotewrite builds each metric's base name with
  ``otlptranslator.MetricNamer{WithMetricSuffixes: settings.AddMetricSuffixes, Namespace: settings.Namespace}``
  (open-telemetry/opentelemetry-collector-contrib PR #39827, "Migrate to github.com/prometheus/otlptranslator",
  merged 2025-07-17; UTF8Allowed is left false). ``add_metric_suffixes`` defaults to true, and where the newer
  ``translation_strategy`` exists its default, UnderscoreEscapingWithSuffixes, is the same translation.
- github.com/prometheus/otlptranslator v1.0.0 (commit 57de713e8b6c626d888cefba633272dece33a352):
  metric_namer.go: the unit maps (lines 34-80), ``buildCompliantMetricName`` (158-206),
  ``isValidCompliantMetricChar`` (209-214: letters, digits and ':'), ``normalizeName`` (225-265),
  ``addUnitTokens`` (273-298); unit_namer.go ``buildUnitSuffixes`` (94-120) and ``cleanUpUnit`` (123-129);
  strconv.go ``collapseMultipleUnderscores``.
- Histograms: the converter appends ``_sum``, ``_count`` and ``_bucket`` (with ``le``) to the base name
  (pkg/translator/prometheusremotewrite helper.go, ``baseName+sumStr`` etc.).
- otelcol-contrib v0.130 and earlier named metrics with its own pkg/translator/prometheus/normalize_name.go,
  whose ``normalizeName`` splits the name on every rune that is not a letter or a digit, so colons were dropped
  (``legacy_contrib_name`` below, for the docs' statement that those releases do not match).
"""

from __future__ import annotations

import re

MONOTONIC_COUNTER = "monotonic_counter"  # OTLP Sum, monotonic
NON_MONOTONIC_COUNTER = "non_monotonic_counter"  # OTLP Sum, not monotonic
GAUGE = "gauge"
HISTOGRAM = "histogram"

#: otlptranslator metric_namer.go unitMap.
UNIT_MAP = {
    "d": "days",
    "h": "hours",
    "min": "minutes",
    "s": "seconds",
    "ms": "milliseconds",
    "us": "microseconds",
    "ns": "nanoseconds",
    "By": "bytes",
    "KiBy": "kibibytes",
    "MiBy": "mebibytes",
    "GiBy": "gibibytes",
    "TiBy": "tibibytes",
    "KBy": "kilobytes",
    "MBy": "megabytes",
    "GBy": "gigabytes",
    "TBy": "terabytes",
    "m": "meters",
    "V": "volts",
    "A": "amperes",
    "J": "joules",
    "W": "watts",
    "g": "grams",
    "Cel": "celsius",
    "Hz": "hertz",
    "1": "",
    "%": "percent",
}
#: otlptranslator metric_namer.go perUnitMap.
PER_UNIT_MAP = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "mo": "month", "y": "year"}


def _fields(s: str, is_separator) -> list[str]:
    """Go's strings.FieldsFunc: the runs of runes between separators, empty runs dropped."""
    out, current = [], []
    for ch in s:
        if is_separator(ch):
            if current:
                out.append("".join(current))
                current = []
        else:
            current.append(ch)
    if current:
        out.append("".join(current))
    return out


def _valid(ch: str) -> bool:
    """isValidCompliantMetricChar: a-z, A-Z, 0-9 and ':'."""
    return ("a" <= ch <= "z") or ("A" <= ch <= "Z") or ("0" <= ch <= "9") or ch == ":"


def _clean_up_unit(unit: str) -> str:
    """cleanUpUnit: invalid runes to '_', runs of '_' collapsed, one leading '_' trimmed."""
    mapped = "".join(ch if _valid(ch) else "_" for ch in unit)
    collapsed = re.sub(r"_+", "_", mapped)
    return collapsed[1:] if collapsed.startswith("_") else collapsed


def _unit_suffixes(unit: str) -> tuple[str, str]:
    """buildUnitSuffixes: (main, per) from ``main/per``; a part with '{' or '}' is left out."""
    main = per = ""
    tokens = unit.split("/", 1)
    main_otel = tokens[0].strip()
    if main_otel and not any(c in main_otel for c in "{}"):
        main = UNIT_MAP.get(main_otel, main_otel)
    if len(tokens) > 1 and tokens[1] != "":
        per_otel = tokens[1].strip()
        if per_otel and not any(c in per_otel for c in "{}"):
            per = PER_UNIT_MAP.get(per_otel, per_otel)
        if per:
            per = "per_" + per
    return main, per


def _add_unit_tokens(tokens: list[str], main: str, per: str) -> list[str]:
    if main in tokens:
        main = ""
    if per == "per_":
        per = ""
    else:
        per = per.removesuffix("_")
        if per in tokens:
            per = ""
    if per:
        main = main.removesuffix("_")
    if main:
        tokens = [*tokens, main]
    if per:
        tokens = [*tokens, per]
    return tokens


def _normalize_name(name: str, unit: str, kind: str, namespace: str = "") -> str:
    tokens = _fields(name, lambda ch: not _valid(ch))
    main, per = _unit_suffixes(unit)
    tokens = _add_unit_tokens(tokens, _clean_up_unit(main), _clean_up_unit(per))
    if kind == MONOTONIC_COUNTER:
        tokens = [t for t in tokens if t != "total"] + ["total"]
    if unit == "1" and kind == GAUGE:
        tokens = [t for t in tokens if t != "ratio"] + ["ratio"]
    if namespace:
        tokens = [namespace, *tokens]
    normalized = "_".join(tokens)
    if normalized and normalized[0].isdigit():
        normalized = "_" + normalized
    return normalized


def metric_name(name: str, unit: str, kind: str, with_suffixes: bool = True, namespace: str = "") -> str:
    """MetricNamer.Build with UTF8Allowed false (buildCompliantMetricName); raises where Go returns an error."""
    if with_suffixes:
        out = _normalize_name(name, unit, kind, namespace)
    else:
        out = "_".join(_fields(name, lambda ch: not _valid(ch) and ch != "_"))
        if namespace:
            out = "_".join(_fields(namespace, lambda ch: not _valid(ch) and ch != "_")) + "_" + out
        elif out and out[0].isdigit():
            out = "_" + out
    if not out or (out != name and set(out) == {"_"}):
        raise ValueError(f"normalization for metric {name!r} resulted in an invalid name {out!r}")
    return out


def series_names(name: str, unit: str, kind: str) -> tuple[str, ...]:
    """The sample names the exporter writes for one OTLP metric (default translation)."""
    base = metric_name(name, unit, kind)
    if kind == HISTOGRAM:
        return (base + "_bucket", base + "_sum", base + "_count")
    return (base,)


def legacy_contrib_name(name: str, unit: str, kind: str) -> str:
    """otelcol-contrib <= v0.130 (pkg/translator/prometheus normalize_name.go ``normalizeName``): the name split
    on every rune that is not a letter or a digit (colons too), then the same unit and type suffixes."""
    tokens = _fields(name, lambda ch: not ch.isalnum())
    main, per = _unit_suffixes(unit)
    main = "_".join(_fields(main, lambda ch: not ch.isalnum()))
    if main and main not in tokens:
        tokens.append(main)
    per = per.removeprefix("per_")
    per = "_".join(_fields(per, lambda ch: not ch.isalnum()))
    if per and per not in tokens:
        tokens += ["per", per]
    if kind == MONOTONIC_COUNTER:
        tokens = [t for t in tokens if t != "total"] + ["total"]
    if unit == "1" and kind == GAUGE:
        tokens = [t for t in tokens if t != "ratio"] + ["ratio"]
    return "_".join(tokens)
