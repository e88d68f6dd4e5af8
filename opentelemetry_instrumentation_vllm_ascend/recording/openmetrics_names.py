"""Keeps every metric name as it is in prometheus_client's OpenMetrics format (vLLM's ``vllm:…`` and ours).

prometheus_client 0.23 and later take an ``escaping`` scheme (``underscores`` unless the scraper's Accept header
asks for another) and escape the ``# HELP`` / ``# TYPE`` / ``# UNIT`` name by the metric-name rules, where ``:`` is
legal, but each *sample* name by the label-name rules, where it is not (prometheus/client_python issue 1177):
``# TYPE vllm:x counter`` over ``vllm_x_total 1.0``. A strict parser then reads a ``vllm:x`` counter without
samples beside an untyped ``vllm_x_total`` family, and Prometheus 2 (whose Accept header asks for OpenMetrics
first) stores every ``vllm:`` series renamed.

The fix: the module attribute ``prometheus_client.openmetrics.exposition.generate_latest`` (which
``choose_encoder`` — ``make_asgi_app``'s and ``start_http_server``'s — looks up at each call) is wrapped so that
every name is escaped once, by the metric-name rules (prometheus_client's own public ``escape_metric_name`` /
``escape_label_name``, as the Prometheus escaping schemes define them: ``:`` is legal in a metric name), each
sample's name being its escaped family name and its suffix (``_total``, ``_bucket``…), and the encoder then writes
the names as given (``escaping="allow-utf-8"``, which leaves a name legal in the legacy character set untouched).
With ``underscores`` (Prometheus 2's and the default) and ``values`` a legal name is its own escape, so a family
whose names are all legal (every name of vLLM's and ours) is handed to the encoder as it is: the per-scrape cost is
a set lookup per sample, and the encoder's per-character escaping of every sample name is skipped. Only a family
with a name that changes (one outside the legacy set, or any with a ``_`` under ``dots``, which doubles it) is
copied with its escaped names. ``allow-utf-8`` (Prometheus 3's) is passed through.

prometheus_client below 0.23 (no ``escaping`` parameter) writes names as given: nothing is wrapped there. No
private name of prometheus_client is used. If the escape functions are missing, or escaping fails, the encoder
is prometheus_client's own from then on (one log line): names renamed as before, values untouched.
"""

from __future__ import annotations

import copy
import inspect
import logging
import re
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

MODULE = "prometheus_client.openmetrics.exposition"
ATTRIBUTE = "generate_latest"
_MARK = "_otel_vllm_ascend_names"


class _Failed(Exception):
    """Escaping a family's names failed (not a collector's own error, which goes on as without us)."""


class _Escaped:
    """``registry``'s families with every name escaped under ``escaping`` (see the module docstring)."""

    __slots__ = ("registry", "escaping", "names")

    def __init__(self, registry, escaping: str, names: _Names) -> None:
        self.registry, self.escaping, self.names = registry, escaping, names

    def collect(self):
        escaping, names = self.escaping, self.names
        kept, labels_kept = names.kept(escaping)
        for metric in self.registry.collect():
            try:
                family = metric.name
                same = family in kept or names.learn(escaping, family)
                if same:
                    for sample in metric.samples:
                        name = sample.name
                        if not (
                            (name in kept or _suffixed(name, family) or names.learn(escaping, name))
                            and (labels_kept.issuperset(sample.labels) or names.learn_labels(escaping, sample.labels))
                        ):
                            same = False
                            break
                if not same:
                    metric = names.escaped(metric, escaping)
            except Exception as exc:
                raise _Failed(metric) from exc
            yield metric


_LEGAL_REST = re.compile(r"[a-zA-Z0-9_:]*")


def _suffixed(name: str, family: str) -> bool:
    """Whether the sample name ``name`` is ``family`` and a suffix of legal characters (``_total``, ``_bucket``…):
    written as the escaped family name and that suffix, so that family and samples keep one name."""
    return name.startswith(family) and _LEGAL_REST.fullmatch(name, len(family)) is not None


class _Names:
    """The names known to be their own escape, per scheme, and the escaping of the others."""

    #: More distinct names than any server has: past it the caches start over (a collector making up names).
    LIMIT = 100_000

    def __init__(self, escape_metric_name: Callable, escape_label_name: Callable) -> None:
        self.escape_metric_name = escape_metric_name
        self.escape_label_name = escape_label_name
        self._kept: dict[str, tuple[set, set]] = {}

    def kept(self, escaping: str) -> tuple[set, set]:
        """(metric and sample names, label names) known to be their own escape under ``escaping``."""
        found = self._kept.get(escaping)
        if found is None or len(found[0]) + len(found[1]) > self.LIMIT:
            found = self._kept[escaping] = (set(), set())
        return found

    def learn(self, escaping: str, name: str) -> bool:
        """Whether the metric or sample name ``name`` is its own escape (remembered when it is)."""
        if self.escape_metric_name(name, escaping) != name:
            return False
        self.kept(escaping)[0].add(name)
        return True

    def learn_labels(self, escaping: str, labels) -> bool:
        """Whether every label name of ``labels`` is its own escape (remembered when it is)."""
        kept = self.kept(escaping)[1]
        for key in labels:
            if self.escape_label_name(key, escaping) != key:
                return False
            kept.add(key)
        return True

    def escaped(self, metric, escaping: str):
        """A copy of ``metric`` with its name and its samples' label names escaped, and each sample's name the
        escaped family name and its suffix (or the escaped sample name, for one not of that shape)."""
        name, label = self.escape_metric_name, self.escape_label_name
        family = metric.name
        escaped_family = name(family, escaping)
        out = copy.copy(metric)
        out.name = escaped_family
        out.samples = [
            s._replace(
                name=escaped_family + s.name[len(family) :] if _suffixed(s.name, family) else name(s.name, escaping),
                labels={label(k, escaping): v for k, v in s.labels.items()},
            )
            for s in metric.samples
        ]
        return out


class KeptNames:
    """The wrapped OpenMetrics encoder of this process; ``remove()`` puts the original back."""

    def __init__(self) -> None:
        self._module: Any = None
        self._original: Callable | None = None
        self._active = True
        self._failed = False
        #: The escaping of the wrapped encoder's names (None until one is wrapped).
        self.names: _Names | None = None

    def install(self) -> None:
        """Wrap the encoder now if its module is imported, else when it is."""
        import wrapt

        wrapt.register_post_import_hook(self._imported, MODULE)

    def _imported(self, module) -> None:
        if self._module is not None or not self._active:
            return
        original = getattr(module, ATTRIBUTE, None)
        if original is None or getattr(original, _MARK, None) is not None:
            return
        wrapper = self.wrap(original, module)
        if wrapper is not original:
            setattr(module, ATTRIBUTE, wrapper)
            self._module, self._original = module, original

    def wrap(self, original: Callable, module) -> Callable:
        """``original`` with names kept; ``original`` itself where it takes no ``escaping`` (< 0.23: nothing to
        fix) or the escape functions are missing (one log line)."""
        try:
            parameters = inspect.signature(original).parameters
        except (TypeError, ValueError):
            return original
        if "escaping" not in parameters:
            return original
        escape_metric_name = getattr(module, "escape_metric_name", None)
        escape_label_name = getattr(module, "escape_label_name", None)
        allow_utf8 = getattr(module, "ALLOWUTF8", None)
        default = parameters["escaping"].default
        if not (callable(escape_metric_name) and callable(escape_label_name) and isinstance(allow_utf8, str)):
            logger.warning(
                "opentelemetry-instrumentation-vllm-ascend: prometheus_client's OpenMetrics encoder has no "
                "escape_metric_name/escape_label_name/ALLOWUTF8: its sample names of vllm: metrics keep its escaping"
            )
            return original
        names = self.names = _Names(escape_metric_name, escape_label_name)

        def generate_latest(registry, escaping=default, *args, **kwargs):
            if escaping == allow_utf8 or self._failed or not self._active:
                return original(registry, escaping, *args, **kwargs)
            try:
                return original(_Escaped(registry, escaping, names), allow_utf8, *args, **kwargs)
            except _Failed:
                self._failed = True
                logger.warning(
                    "opentelemetry-instrumentation-vllm-ascend: cannot keep metric names in the OpenMetrics format; "
                    "prometheus_client escapes them from now on",
                    exc_info=True,
                )
                return original(registry, escaping, *args, **kwargs)

        setattr(generate_latest, _MARK, self)
        generate_latest.__wrapped__ = original  # type: ignore[attr-defined]
        generate_latest.__doc__ = original.__doc__
        return generate_latest

    def remove(self) -> None:
        """Put the original back (where the wrapper is still in place); a later import wraps nothing."""
        self._active = False
        module, original = self._module, self._original
        if module is not None and getattr(getattr(module, ATTRIBUTE, None), _MARK, None) is self:
            setattr(module, ATTRIBUTE, original)
        self._module = self._original = None
