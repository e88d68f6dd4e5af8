"""Renders our families on ``/metrics`` with per-series text cached across scrapes.

prometheus_client formats every sample of every scrape from scratch: it sorts and escapes each label, checks
each name against the legacy character set and formats the value (about 20 µs a sample in the OpenMetrics
format Prometheus asks for, on the CI machine's kind). Our series' names and labels never change once they
exist, so in the process that serves ``/metrics`` (the API server, with :class:`~.files_reader.FilesCollector`
registered) the encoders vLLM's ``/metrics`` calls are wrapped: the wrapped encoder renders everything else as
before (our collector yields nothing for that call), then appends our families, each line its cached prefix
(name and labels) and the value. The prefixes and family headers are produced by that same encoder, once per
series and format, from a one-sample family: what it would have written, byte for byte (a test compares both).

The wrapped encoders: ``prometheus_client.exposition.generate_latest`` (text) and
``prometheus_client.openmetrics.exposition.generate_latest`` (OpenMetrics), which ``make_asgi_app`` picks by the
Accept header, the package-level ``prometheus_client.generate_latest``, and the copy
``prometheus_fastapi_instrumentator`` imported (vLLM's own ``/metrics`` route), once that module is imported.
Anything unexpected — another registry, a failure while rendering ours — falls back to the original encoder
with our collector in it, as without this module.

A bucket's exemplar (``FilesCollector.families``) is written after its value as the encoder writes it (from a
one-sample family with that exemplar, cached per encoder and exemplar): by the OpenMetrics encoder; an encoder that
writes no exemplars (the text format's) is found out once and then never asked again, so its output is what it
would be without exemplars.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

logger = logging.getLogger(__name__)

#: (module, attribute) of the encoders wrapped.
ENCODERS = (
    ("prometheus_client.exposition", "generate_latest"),
    ("prometheus_client.openmetrics.exposition", "generate_latest"),
    ("prometheus_client", "generate_latest"),
    ("prometheus_fastapi_instrumentator.instrumentation", "generate_latest"),
)
_EOF = b"# EOF\n"
_PROBE = 0.0
_PROBE_TEXT = " 0.0\n"


class _One:
    """A registry of the given families (what an encoder needs: ``collect()``)."""

    __slots__ = ("metrics",)

    def __init__(self, metrics) -> None:
        self.metrics = metrics

    def collect(self):
        return self.metrics


class _Bound:
    """An encoder called with further arguments (``escaping=``, ``version=``), keyed as a partial is."""

    __slots__ = ("func", "args", "keywords")

    def __init__(self, func: Callable, args: tuple, keywords: dict) -> None:
        self.func, self.args, self.keywords = func, args, keywords

    def __call__(self, registry):
        return self.func(registry, *self.args, **self.keywords)


class Renderer:
    """Our families through one encoder, with each family's header and each series' line prefix cached per
    encoder (an encoder is a function, or a ``functools.partial`` of one: keyed by function and arguments)."""

    def __init__(self, collector) -> None:
        self.collector = collector
        self._headers: dict[tuple, str] = {}
        self._prefixes: dict[tuple, str] = {}
        #: Per encoder: whether it writes exemplars (found out at the first exemplar it is given).
        self._writes_exemplars: dict[tuple, bool] = {}
        #: Per encoder: {(sample, labels, exemplar): text after the value}, of its previous render.
        self._exemplar_texts: dict[tuple, dict] = {}

    @staticmethod
    def _key(encoder) -> tuple:
        func = getattr(encoder, "func", encoder)
        args = getattr(encoder, "args", ())
        keywords = getattr(encoder, "keywords", None) or {}
        return (func, args, tuple(sorted(keywords.items())))

    def render(self, encoder) -> str:
        from prometheus_client.utils import floatToGoString

        key = self._key(encoder)
        headers, prefixes = self._headers, self._prefixes
        out: list[str] = []
        append = out.append
        writes_exemplars = self._writes_exemplars.get(key)
        texts = self._exemplar_texts.get(key, {})
        used: dict = {}
        for name, typ, help_text, rows in self.collector.families():
            header = headers.get((key, name, typ, help_text))
            if header is None:
                header = self._header(encoder, key, name, typ, help_text)
            append(header)
            for sample, labels, value, exemplar in rows:
                prefix = prefixes.get((key, name, sample, labels))
                if prefix is None:
                    prefix = self._prefix(encoder, key, name, typ, help_text, sample, labels)
                append(prefix)
                append(floatToGoString(value))
                if exemplar is not None and writes_exemplars is not False:
                    cached = (sample, labels, tuple(exemplar.labels.items()), exemplar.value, exemplar.timestamp)
                    text = texts.get(cached)
                    if text is None:
                        text = self._exemplar(encoder, key, name, typ, help_text, sample, labels, prefix, exemplar)
                        writes_exemplars = self._writes_exemplars[key] = bool(text)
                    used[cached] = text
                    append(text)
                append("\n")
        if writes_exemplars:
            self._exemplar_texts[key] = used  # exemplars replaced since are forgotten
        return "".join(out)

    def _exemplar(self, encoder, key, name, typ, help_text, sample, labels, prefix, exemplar) -> str:
        """What ``encoder`` writes after the value of ``sample`` with ``exemplar`` ("" when it writes none)."""
        header = self._headers[(key, name, typ, help_text)]
        text = self._encode(encoder, name, typ, help_text, sample, labels, exemplar)
        line = text[len(header) :]
        start = prefix + _PROBE_TEXT[1:-1]
        if not text.startswith(header) or not line.startswith(start) or not line.endswith("\n"):
            raise ValueError(f"unexpected rendering of {sample} with an exemplar: {line!r}")
        rest = line[len(start) : -1]
        if "\n" in rest:
            raise ValueError(f"unexpected rendering of {sample} with an exemplar: {line!r}")
        return rest

    def _encode(self, encoder, name, typ, help_text, sample=None, labels=(), exemplar=None) -> str:
        from prometheus_client.metrics_core import Metric
        from prometheus_client.samples import Sample

        metric = Metric(name, help_text, typ)
        if sample is not None:
            metric.samples.append(Sample(sample, dict(labels), _PROBE, None, exemplar))
        text = encoder(_One([metric]))
        if text.endswith(_EOF):
            text = text[: -len(_EOF)]
        return text.decode("utf-8")

    def _header(self, encoder, key, name, typ, help_text) -> str:
        header = self._encode(encoder, name, typ, help_text)
        self._headers[(key, name, typ, help_text)] = header
        return header

    def _prefix(self, encoder, key, name, typ, help_text, sample, labels) -> str:
        header = self._headers[(key, name, typ, help_text)]
        text = self._encode(encoder, name, typ, help_text, sample, labels)
        line = text[len(header) :]
        if not text.startswith(header) or not line.endswith(_PROBE_TEXT) or line.count("\n") != 1:
            raise ValueError(f"unexpected rendering of {sample}: {line!r}")
        prefix = line[: -len(_PROBE_TEXT) + 1]  # keeps the space before the value
        self._prefixes[(key, name, sample, labels)] = prefix
        return prefix


class FastExposition:
    """The wrapped encoders of this process; ``remove()`` puts the originals back."""

    def __init__(self, collector, registry) -> None:
        self.collector = collector
        self.registry = registry
        self.renderer = Renderer(collector)
        self._originals: list[tuple[Any, str, Callable]] = []
        self._failed = False
        self._active = True

    def install(self) -> None:
        """Wrap each encoder now if its module is imported, else when it is (vLLM imports
        prometheus_fastapi_instrumentator after instrument())."""
        import wrapt

        for module_name, attribute in ENCODERS:
            wrapt.register_post_import_hook(partial(self._imported, attribute), module_name)

    def _imported(self, attribute: str, module) -> None:
        if self._active:
            self._wrap(module, attribute)

    def _wrap(self, module, attribute: str) -> None:
        original = getattr(module, attribute, None)
        if original is None or getattr(original, "_otel_vllm_ascend_exposition", None) is self:
            return
        setattr(module, attribute, self.wrap(original))
        self._originals.append((module, attribute, original))

    def wrap(self, original: Callable) -> Callable:
        def generate_latest(registry=None, *args, **kwargs):
            if registry is None:
                registry = self.registry
            if not self._active or self._failed or registry is not self.registry:
                return original(registry, *args, **kwargs)
            encoder = _Bound(original, args, kwargs) if args or kwargs else original
            skip = self.collector.skip
            skip.active = True
            skip.called = False
            try:
                head = original(registry, *args, **kwargs)
            finally:
                skip.active = False
            if not skip.called:  # our collector is not (or no longer) registered: nothing of ours to add
                return head
            try:
                ours = self.renderer.render(encoder).encode("utf-8")
            except Exception:
                self._failed = True
                logger.warning(
                    "opentelemetry-instrumentation-vllm-ascend: cannot render our /metrics families with cached "
                    "lines; prometheus_client formats them from now on",
                    exc_info=True,
                )
                return original(registry, *args, **kwargs)
            if head.endswith(_EOF):
                return head[: -len(_EOF)] + ours + _EOF
            return head + ours

        generate_latest._otel_vllm_ascend_exposition = self  # type: ignore[attr-defined]
        generate_latest.__wrapped__ = original  # type: ignore[attr-defined]
        return generate_latest

    def remove(self) -> None:
        """Put the originals back; a copy another module took of a wrapper meanwhile (``from prometheus_client
        import generate_latest``) calls straight through from now on."""
        self._active = False
        for module, attribute, original in reversed(self._originals):
            current = getattr(module, attribute, None)
            if getattr(current, "_otel_vllm_ascend_exposition", None) is self:
                setattr(module, attribute, original)
        self._originals.clear()
