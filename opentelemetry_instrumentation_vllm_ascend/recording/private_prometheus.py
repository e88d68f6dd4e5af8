"""prometheus_client's private names that the package uses: this is the only module that names them
(tests/unit/test_private_names.py keeps it so). Each function uses the private shape where the installed
prometheus_client has it, else a public way that keeps every value true, with one log line naming the shape
that is gone.

- ``CollectorRegistry._names_to_collectors``: the names another collector of a registry exports, so that ours
  with the same prefix are served apart (files_reader.Sharing). Without it: the registry's public
  ``restricted_registry`` asked for the names we are about to serve; a family of the other writer's that has no
  sample yet is then not seen (its ``# HELP`` may appear beside ours until its first sample).
"""

from __future__ import annotations

from .. import environment

#: The private attribute name read here (a test renames it to show the fallback).
_NAMES = "_names_to_collectors"
_SUFFIXES = ("", "_bucket", "_count", "_sum", "_total", "_created", "_gcount", "_gsum")


def registered_names(registry, ours) -> set:
    """Names of ``registry``'s collectors (family and sample names) among ``ours`` (family names we serve) and
    their sample names; where the private map is there, every name with any of ``ours``' prefixes is in it too."""
    names = getattr(registry, _NAMES, None)
    if isinstance(names, dict):
        return set(names)
    environment.warn_once(
        ("private shape", _NAMES),
        "opentelemetry-instrumentation-vllm-ascend: this prometheus_client has no %s; another exporter's "
        "families beside ours are found by their samples (public restricted_registry)",
        "CollectorRegistry." + _NAMES,
    )
    wanted = {name + suffix for name in ours for suffix in _SUFFIXES}
    try:
        return {metric.name for metric in registry.restricted_registry(sorted(wanted)).collect()}
    except Exception:  # never break the host: served under our own names
        return set()
