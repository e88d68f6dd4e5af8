"""The SDK Views of the catalogue (``recording/pipeline.py``'s, and a user's MeterProvider's through
``instrument()``): each instrument renamed to its catalogue name, its buckets and its labels fixed."""

from __future__ import annotations

from .. import catalogue, targets


def views(specs=None, buckets: bool = True):
    """SDK Views of ``specs`` (default: ``catalogue.defined()``): rename each instrument to its catalogue name,
    fix its buckets (``buckets=False``: a histogram with buckets gets the reader's aggregation, the catalogue's
    buckets where that is explicit), and keep only the catalogue's labels (bounded cardinality whatever a handler
    passes)."""
    from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

    result = []
    for spec in catalogue.defined() if specs is None else specs:
        aggregation = None
        if spec.kind == catalogue.HISTOGRAM and (buckets or not spec.buckets):
            aggregation = ExplicitBucketHistogramAggregation(list(spec.buckets or ()), record_min_max=True)
        kwargs = {"aggregation": aggregation} if aggregation is not None else {}
        result.append(
            View(
                instrument_name=spec.instrument_name,
                meter_name=catalogue.SCOPE_NAME,
                name=spec.exposed_name,
                description=spec.description,
                attribute_keys=set(targets.all_labels(spec)),
                **kwargs,
            )
        )
    return result
