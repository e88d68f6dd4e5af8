"""Source distributions (sdists) of vLLM and vllm-ascend for the contract tests: from the index pip is
configured with (``PIP_INDEX_URL`` / ``pip config``, as pip resolves it; the package's ``archives``
module, which ``check --vllm`` uses too), downloaded once into a cache (``OTEL_VLLM_ASCEND_SOURCE_CACHE``),
checked against the index's sha256, then parsed by the tests, never imported or built."""

import os
import re
import tarfile
import zipfile

from opentelemetry_instrumentation_vllm_ascend import archives

CACHE = archives.cache_dir()


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
