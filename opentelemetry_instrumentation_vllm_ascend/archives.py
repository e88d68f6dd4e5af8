"""Release archives (sdists, wheels) of vLLM and vllm-ascend from the package index pip is configured
with: found on the index's project page (PEP 691 JSON, or a PEP 503 HTML page), downloaded once into a
cache, checked against the index's sha256, then parsed (``source.SourceTree``), never imported or built.
``check --vllm VERSION``, the contract tests and the drift canary (``tox -e drift``) read them.

The index is pip's, resolved as pip resolves it (``PIP_INDEX_URL``, then the ``index-url`` of the
configuration files pip reads: global, user, site and ``PIP_CONFIG_FILE``; the ``[download]`` section
over ``[install]`` over ``[global]``), through pip's own configuration code; with nothing configured,
pip's own default. No index is named here. ``extra-index-url`` entries are searched after it.

Sdists rather than wheels: vLLM's sdist holds the same Python files (less the third-party code its build
vendors) at ~40 MB instead of a ~300 MB wheel. An interrupted transfer resumes with a Range request;
CI once lost a 336 MB wheel to six interrupted transfers in a row."""

from __future__ import annotations

import hashlib
import html.parser
import http.client
import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request

ATTEMPTS = 12
CHUNK = 1 << 20
#: Where archives are kept between runs (``OTEL_VLLM_ASCEND_SOURCE_CACHE``).
CACHE_ENV = "OTEL_VLLM_ASCEND_SOURCE_CACHE"


class NotOnIndex(LookupError):
    """The index has no such project, version or file (or cannot be read)."""


def cache_dir() -> str:
    return os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "otel-vllm-ascend-sources")


def normalize(project: str) -> str:
    """PEP 503's normalized project name."""
    return re.sub(r"[-_.]+", "-", project).lower()


# -- the index pip is configured with ----------------------------------------------------------------------------

#: The configuration sections whose ``index-url`` counts, highest precedence first (":env:" is PIP_INDEX_URL).
SECTIONS = (":env:", "download", "install", "global")


#: Run by this interpreter's pip, in a process of its own (importing pip's internals here would import the
#: standard library's distutils before setuptools can replace it, breaking a later ``import setuptools``):
#: prints the ``index-url`` / ``extra-index-url`` values set in each section, and pip's own default index.
_PIP_SCRIPT = """
import json
from pip._internal.configuration import Configuration
from pip._internal.models.index import PyPI
configuration = Configuration(isolated=False)
configuration.load()
values = {}
for section in %r:
    for key in ("index-url", "extra-index-url"):
        try:
            values[section + "." + key] = str(configuration.get_value(section + "." + key))
        except Exception:
            pass
print(json.dumps({"values": values, "default": PyPI.simple_url}))
"""


def pip_indexes() -> list[str]:
    """The index URLs pip is configured with, as pip reads its configuration (``PIP_INDEX_URL`` and the
    other ``PIP_*`` variables, then ``PIP_CONFIG_FILE``, the site, user and global files): ``index-url``
    first (pip's own default when none is set), then each ``extra-index-url``. Raises RuntimeError when
    pip cannot be run."""
    import subprocess
    import sys

    try:
        done = subprocess.run(
            [sys.executable, "-c", _PIP_SCRIPT % (SECTIONS,)], capture_output=True, text=True, timeout=120, check=True
        )
        answer = json.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        raise RuntimeError(f"cannot read pip's configuration with {sys.executable} -m pip: {detail}") from exc
    values = answer["values"]

    def first(key: str) -> str | None:
        return next((values[f"{section}.{key}"] for section in SECTIONS if values.get(f"{section}.{key}")), None)

    index = first("index-url") or answer["default"]
    extra = (first("extra-index-url") or "").split()
    return [index] + [url for url in extra if url != index]


# -- project pages -------------------------------------------------------------------------------------------------


def project_page(project: str, indexes: list[str] | None = None) -> dict:
    """The project's page on the first configured index that has it, as PEP 691 JSON
    (``files``: filename, url, hashes; ``versions`` where the index lists them)."""
    errors = []
    for index in indexes if indexes is not None else pip_indexes():
        url = f"{index.rstrip('/')}/{normalize(project)}/"
        try:
            return _read_page(url)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            errors.append(f"{url}: {exc}")
    raise NotOnIndex(f"{project} is not on the configured index ({'; '.join(errors) or 'no index'})")


def _read_page(url: str) -> dict:
    request = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"})

    def fetch():
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.read(), response.headers.get_content_type() if response.headers else "", response.url

    body, content_type, final_url = _retry(fetch)
    if "json" in content_type or body.lstrip().startswith(b"{"):
        page = json.loads(body)
    else:
        page = {"files": _html_files(body.decode("utf-8", "replace"))}
    for entry in page.get("files", ()):
        entry["url"] = urllib.parse.urljoin(final_url or url, entry["url"])
    return page


class _Anchors(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.files: list[dict] = []
        self._href: str | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self._href = dict(attrs).get("href")

    def handle_data(self, data):
        if self._href is not None and data.strip():
            url, _, fragment = self._href.partition("#")
            hashes = dict([fragment.split("=", 1)]) if "=" in fragment else {}
            self.files.append({"filename": data.strip(), "url": url, "hashes": hashes})
            self._href = None


def _html_files(text: str) -> list[dict]:
    parser = _Anchors()
    parser.feed(text)
    return parser.files


def _version_of(project: str, filename: str) -> str | None:
    """The version in an sdist's or a wheel's file name when it is ``project``'s, else None."""
    if filename.endswith(".whl"):
        parts = filename[:-4].split("-")
        name, version = (parts[0], parts[1]) if len(parts) >= 5 else (None, None)
    elif filename.endswith((".tar.gz", ".zip")):
        name, _, version = filename[: -7 if filename.endswith(".tar.gz") else -4].rpartition("-")
    else:
        return None
    return version if name and normalize(name) == normalize(project) else None


# -- archives ------------------------------------------------------------------------------------------------------


def release_archive(project: str, version: str, cache: str | None = None, indexes: list[str] | None = None) -> str:
    """Path of an archive of ``project`` ``version`` in the cache (downloaded first if absent): its sdist,
    else a pure-Python wheel, else any wheel (their ``.py`` files are the same)."""
    cache = cache or cache_dir()
    stem = re.sub(r"[-_.]+", "_", project)
    sdist = f"{stem}-{version}.tar.gz"
    for name in os.listdir(cache) if os.path.isdir(cache) else ():
        if name == sdist or (name.startswith(f"{stem}-{version}-") and name.endswith(".whl")):
            return os.path.join(cache, name)
    page = project_page(project, indexes)
    candidates = [e for e in page.get("files", ()) if _version_of(project, e["filename"]) == version]
    ranked = sorted(
        candidates,
        key=lambda e: (
            not e["filename"].endswith(".tar.gz"),
            not e["filename"].endswith("-py3-none-any.whl"),
            not e["filename"].endswith(".whl"),
        ),
    )
    if not ranked or not (ranked[0]["filename"].endswith((".tar.gz", ".whl"))):
        raise NotOnIndex(f"{project} {version}: no sdist or wheel on the configured index")
    return cached(project, ranked[0]["filename"], cache, indexes, page=page)


def cached(
    project: str, filename: str, cache: str | None = None, indexes: list[str] | None = None, page: dict | None = None
) -> str:
    """Path of ``filename`` (a file of ``project`` on the index) in the cache, downloaded first if absent."""
    cache = cache or cache_dir()
    path = os.path.join(cache, filename)
    if os.path.exists(path):
        return path
    os.makedirs(cache, exist_ok=True)
    page = page if page is not None else project_page(project, indexes)
    for entry in page.get("files", ()):
        if entry["filename"] == filename:
            sha256 = entry.get("hashes", {}).get("sha256")
            if not sha256:
                raise NotOnIndex(f"{filename}: the index gives no sha256")
            download(entry["url"], path, sha256)
            return path
    raise NotOnIndex(f"{filename} is not on the configured index")


def download(url: str, path: str, sha256: str) -> None:
    part = f"{path}.part.{os.getpid()}"
    try:
        for attempt in range(ATTEMPTS):
            have = os.path.getsize(part) if os.path.exists(part) else 0
            request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
            try:
                # 206: the rest of the file; 200: the server sent it all again.
                with (
                    urllib.request.urlopen(request, timeout=120) as response,
                    open(part, "ab" if getattr(response, "status", 200) == 206 else "wb") as out,
                ):
                    while chunk := response.read(CHUNK):
                        out.write(chunk)
                    if getattr(response, "length", None):  # http.client ends a cut-off body silently
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


def _transient(error: BaseException) -> bool:
    """Worth asking again: a reset, a timeout, a cut-off reply, a server error (not a 404, nor a refusal)."""
    if isinstance(error, urllib.error.HTTPError):
        return error.code >= 500
    if isinstance(error, urllib.error.URLError) and isinstance(error.reason, BaseException):
        return _transient(error.reason)
    return isinstance(error, (ConnectionResetError, ConnectionAbortedError, TimeoutError, http.client.HTTPException))


def _retry(fetch):
    for attempt in range(ATTEMPTS):
        try:
            return fetch()
        except (OSError, http.client.HTTPException) as error:
            if not _transient(error) or attempt == ATTEMPTS - 1:
                raise
        time.sleep(min(2**attempt, 30))
