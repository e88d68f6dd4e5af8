"""Source distributions (sdists) of vLLM and vllm-ascend for the contract tests: from the index pip is
configured with (``PIP_INDEX_URL`` / ``pip config``, as pip resolves it; the package's ``archives``
module, which ``check --vllm`` uses too), downloaded once into a cache (``OTEL_VLLM_ASCEND_SOURCE_CACHE``),
checked against the index's sha256, then parsed by the tests, never built. ``importable`` /
``importable_ascend`` unpack a release's pure-Python package for the tests that run its real code in a
subprocess."""

import os
import re
import tarfile
import tempfile
import zipfile

from opentelemetry_instrumentation_vllm_ascend import archives

CACHE = archives.cache_dir()


def newest_release(project: str, indexes: list[str] | None = None, prereleases: bool = False) -> str:
    """The newest release of ``project`` on the configured index (``archives.project_page``) that has an sdist or a wheel there (a release
    whose files are all yanked does not count): the newest final one, or with ``prereleases`` the newest
    including release candidates, alphas and betas (vllm-ascend publishes release candidates for months before a
    final: what Ascend users run). Development releases never count. The drift canary's (tests/support/drift.py) default."""
    from packaging.version import InvalidVersion, Version

    page = archives.project_page(project, indexes)
    with_files: set[str] = set()
    for entry in page.get("files", ()):
        if entry.get("yanked"):
            continue
        version = archives._version_of(project, entry["filename"])
        if version:
            with_files.add(version)
    best: tuple[Version, str] | None = None
    for text in with_files:
        try:
            parsed = Version(text)
        except InvalidVersion:
            continue
        if parsed.is_devrelease or (parsed.is_prerelease and not prereleases):
            continue
        if best is None or parsed > best[0]:
            best = (parsed, text)
    if best is None:
        kind = "release" if prereleases else "final release"
        raise archives.NotOnIndex(f"no {kind} of {project} on the configured index")
    return best[1]


def sdist(project: str, version: str) -> str:
    """Path of ``project``'s sdist for ``version`` in the cache, downloaded first if absent."""
    return archives.cached(project, f"{re.sub(r'[-_.]+', '_', project)}-{version}.tar.gz", CACHE)


def wheel(project: str, version: str) -> str:
    """Path of ``project``'s pure-Python wheel for ``version`` in the cache, downloaded first if absent."""
    return archives.cached(project, f"{re.sub(r'[-_.]+', '_', project)}-{version}-py3-none-any.whl", CACHE)


def release(project: str, version: str) -> str:
    """Path of an archive (sdist, else a wheel) of ``project`` ``version``: the drift canary's newest releases."""
    return archives.release_archive(project, version, CACHE)


#: The incumbent's release whose hook files the tests load (read as data from its wheel, never imported).
INCUMBENT = ("ms-service-metric", "26.0.0")
INCUMBENT_HOOK_FILES = ("default.yaml", "v1_metrics.yaml")


def incumbent_sglang_file(directory: str) -> str:
    """The incumbent's SGLang example hook file, copied out of its wheel into ``directory``: its path."""
    target = os.path.join(directory, "sglang-default.yaml")
    with zipfile.ZipFile(wheel(*INCUMBENT)) as archive, open(target, "wb") as f:
        f.write(archive.read("ms_service_metric/adapters/sglang/config/default.yaml"))
    return target


def incumbent_hook_files(directory: str) -> list[str]:
    """The incumbent's own vLLM hook files, copied out of its wheel into ``directory``: their paths."""
    out = []
    with zipfile.ZipFile(wheel(*INCUMBENT)) as archive:
        for name in INCUMBENT_HOOK_FILES:
            target = os.path.join(directory, name)
            with open(target, "wb") as f:
                f.write(archive.read(f"ms_service_metric/adapters/vllm/config/{name}"))
            out.append(target)
    return out


#: The vllm-ascend release that ships the incumbent in-tree: its ``ms_service_metric.providers`` entry point
#: (``vllm-ascend = vllm_ascend.observability:get_metric_provider``) hands ms-service-metric every YAML file of
#: ``vllm_ascend/observability/config/`` (read as data from the sdist, never imported).
ASCEND_PROVIDER = ("vllm-ascend", "0.30.0rc2")
ASCEND_PROVIDER_DIR = "vllm_ascend/observability/config/"


def ascend_provider_sources() -> dict[str, bytes]:
    """From vllm-ascend's sdist of ``ASCEND_PROVIDER``: ``setup.py``, every file of ``vllm_ascend/observability/``
    (the in-tree incumbent: provider, handlers, config) and every other ``vllm_ascend/**.py`` (the modules its hook
    files name), by path inside the sdist's top folder."""
    project, version = ASCEND_PROVIDER
    top = f"vllm_ascend-{version}/"
    out = {}
    with tarfile.open(sdist(project, version)) as archive:
        for member in archive:
            name = member.name[len(top) :] if member.name.startswith(top) else ""
            wanted = (
                name == "setup.py"
                or name.startswith("vllm_ascend/observability/")
                or (name.startswith("vllm_ascend/") and name.endswith(".py"))
            )
            if member.isfile() and wanted:
                out[name] = archive.extractfile(member).read()
    return out


def ascend_provider_hook_files(directory: str, sources: dict[str, bytes] | None = None) -> list[str]:
    """vllm-ascend's own hook files for ms-service-metric (the provider's config directory, sorted as its
    ``get_metric_provider`` globs them), copied out of its sdist (or ``sources``, ``ascend_provider_sources()``'s)
    into ``directory``: their paths."""
    out = []
    for name, data in sorted((sources or ascend_provider_sources()).items()):
        if name.startswith(ASCEND_PROVIDER_DIR) and name.endswith(".yaml"):
            target = os.path.join(directory, os.path.basename(name))
            with open(target, "wb") as f:
                f.write(data)
            out.append(target)
    return out


def _unpack_importable(project: str, version: str, package: str, files: dict[str, str]) -> str:
    """``package/`` of ``project`` ``version``'s sdist, plus ``files`` (path within the directory: text) and a
    dist-info naming the release, unpacked once into ``CACHE/importable/<package>-<version>``: that directory."""
    target = os.path.join(CACHE, "importable", f"{package}-{version}")
    if os.path.isdir(os.path.join(target, package)):
        return target
    archive = sdist(project, version)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    work = tempfile.mkdtemp(dir=os.path.dirname(target))
    top = f"{re.sub(r'[-_.]+', '_', project)}-{version}/"
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(top + package + "/") and (m.isfile() or m.isdir())]
        for m in members:
            m.name = m.name[len(top) :]
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # (Python 3.10.12+ / 3.11.4+)
        tar.extractall(work, members=members, **safe)
    for path, text in files.items():
        os.makedirs(os.path.dirname(os.path.join(work, path)), exist_ok=True)
        with open(os.path.join(work, path), "w") as f:
            f.write(text)
    try:
        os.rename(work, target)
    except OSError:  # another run unpacked it first
        pass
    return target


def importable(version: str) -> str:
    """A directory holding ``vllm/`` of vLLM ``version``'s sdist and a ``vllm-<version>+cpu`` dist-info (so
    ``importlib.metadata.version("vllm")`` reads it first, and vLLM's platform detection takes the CPU)."""
    info = f"vllm-{version}+cpu.dist-info/METADATA"
    return _unpack_importable(
        "vllm", version, "vllm", {info: f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n"}
    )


def importable_ascend(version: str) -> str:
    """A directory holding ``vllm_ascend/`` of vllm-ascend ``version``'s sdist, with the ``_build_info.py`` its
    build writes (``setup.py``'s ``gen_build_info`` for ``SOC_VERSION=ascend910b1``: device type A2; absent from
    the sdist) and a dist-info naming the release (beside ``importable``'s ``vllm/``)."""
    return _unpack_importable(
        "vllm-ascend",
        version,
        "vllm_ascend",
        {
            "vllm_ascend/_build_info.py": "# Auto-generated file\n__device_type__ = 'A2'\n",
            f"vllm_ascend-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: vllm-ascend\nVersion: {version}\n",
        },
    )


#: The incumbent's runtime dependencies that the test env lacks (its wheel's METADATA ``Requires-Dist``: pyyaml,
#: prometheus-client, posix_ipc on Linux, bytecode; and ``jsonschema``, imported but undeclared): installed beside it
#: in its own directory; pyyaml, prometheus-client and jsonschema are the env's own (vLLM's), never a second copy.
INCUMBENT_RUNTIME = ("posix_ipc", "bytecode")


def incumbent_site() -> str:
    """A directory holding ms-service-metric ``INCUMBENT`` and ``INCUMBENT_RUNTIME`` (``pip install --no-deps
    --target``, once, under the source cache), for a server that gets it first on ``PYTHONPATH``: its dist-info
    carries the ``vllm.general_plugins`` entry point, so vLLM loads it in every process of that server only (never
    installed into the test env, where it would load into every server)."""
    import subprocess
    import sys

    project, version = INCUMBENT
    target = os.path.join(CACHE, f"incumbent-site-{version}")
    if os.path.isdir(target):  # renamed into place whole
        return target
    os.makedirs(CACHE, exist_ok=True)
    work = tempfile.mkdtemp(dir=CACHE, prefix=".incumbent-site-")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            work,
            f"{project}=={version}",
            *INCUMBENT_RUNTIME,
        ],
        check=True,
        timeout=600,
    )
    try:
        os.rename(work, target)
    except OSError:  # another run installed it first
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return target
