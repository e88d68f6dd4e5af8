"""Source distributions (sdists) of vLLM and vllm-ascend for the contract tests: found on the package
index (PEP 691 JSON), downloaded once into a cache, checked against the index's sha256, then parsed
by the tests, never imported or built.

Sdists, not wheels: vLLM's sdist holds the same Python files (less the third-party code its build
vendors) at ~40 MB instead of a ~300 MB wheel. An interrupted transfer resumes with a Range request;
CI once lost a 336 MB wheel to six interrupted transfers in a row."""

import hashlib
import http.client
import json
import os
import re
import time
import urllib.request
import zipfile

CACHE = os.environ.get(
    "OTEL_VLLM_ASCEND_SOURCE_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "otel-vllm-ascend-sources")
)
INDEX = os.environ.get("OTEL_VLLM_ASCEND_INDEX", "https://pypi.org/simple").rstrip("/")
ATTEMPTS = 12
CHUNK = 1 << 20


def sdist(project: str, version: str) -> str:
    """Path of ``project``'s sdist for ``version`` in the cache, downloaded first if absent."""
    return _cached(project, f"{re.sub(r'[-_.]+', '_', project)}-{version}.tar.gz")


def wheel(project: str, version: str) -> str:
    """Path of ``project``'s pure-Python wheel for ``version`` in the cache, downloaded first if absent."""
    return _cached(project, f"{re.sub(r'[-_.]+', '_', project)}-{version}-py3-none-any.whl")


#: The incumbent's release whose hook files the tests load (read as data from its wheel, never imported).
INCUMBENT = ("ms-service-metric", "26.0.0")
INCUMBENT_HOOK_FILES = ("default.yaml", "v1_metrics.yaml")


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


def _cached(project: str, filename: str) -> str:
    path = os.path.join(CACHE, filename)
    if os.path.exists(path):
        return path
    os.makedirs(CACHE, exist_ok=True)
    url, sha256 = _find(project, filename)
    _download(url, path, sha256)
    return path


def _find(project: str, filename: str) -> tuple[str, str]:
    request = urllib.request.Request(f"{INDEX}/{project}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    index = json.loads(_retry(lambda: urllib.request.urlopen(request, timeout=120).read()))
    for entry in index["files"]:
        if entry["filename"] == filename:
            return entry["url"], entry["hashes"]["sha256"]
    raise LookupError(f"{filename} is not on {INDEX}/{project}/")


def _download(url: str, path: str, sha256: str) -> None:
    part = f"{path}.part.{os.getpid()}"
    try:
        for attempt in range(ATTEMPTS):
            have = os.path.getsize(part) if os.path.exists(part) else 0
            request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
            try:
                # 206: the rest of the file; 200: the server sent it all again.
                with (
                    urllib.request.urlopen(request, timeout=120) as response,
                    open(part, "ab" if response.status == 206 else "wb") as out,
                ):
                    while chunk := response.read(CHUNK):
                        out.write(chunk)
                    if response.length:  # http.client ends a cut-off body silently
                        raise http.client.IncompleteRead(b"", response.length)
                break
            except (OSError, http.client.HTTPException) as error:  # interrupted reads, timeouts, resets
                if attempt == ATTEMPTS - 1:
                    raise RuntimeError(f"download of {url} failed {ATTEMPTS} times: {error}") from error
                time.sleep(min(2**attempt, 30))
        digest = hashlib.sha256()
        with open(part, "rb") as f:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
        if digest.hexdigest() != sha256:
            raise RuntimeError(f"{url}: sha256 {digest.hexdigest()} is not the index's {sha256}")
        os.replace(part, path)
    finally:
        if os.path.exists(part):
            os.remove(part)


def _retry(fetch):
    for attempt in range(ATTEMPTS):
        try:
            return fetch()
        except (OSError, http.client.HTTPException):
            if attempt == ATTEMPTS - 1:
                raise
            time.sleep(min(2**attempt, 30))
