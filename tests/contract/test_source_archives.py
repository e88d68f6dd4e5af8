"""The contract tests' downloader (the package's ``archives``) against a local index on 127.0.0.1 whose file
server drops the first transfer half-way: the download resumes with a Range request and the file is whole; a
wrong hash is refused. The index is the one pip is configured with: ``PIP_INDEX_URL``, else the ``index-url``
of a pip configuration file (``PIP_CONFIG_FILE``, the user's ``pip.conf``), as pip itself reads them."""

import hashlib
import http.server
import json
import os
import re
import subprocess
import sys
import threading

import pytest

from opentelemetry_instrumentation_vllm_ascend import archives
from tests.support import source_archives

PAYLOAD = bytes(range(256)) * 4096  # 1 MiB


def serve(sha256: str):
    requests = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            requests.append((self.path, self.headers.get("Range")))
            if self.path == "/simple/demo/":
                url = f"http://127.0.0.1:{self.server.server_port}/files/demo-1.0.tar.gz"
                files = [{"filename": "demo-1.0.tar.gz", "url": url, "hashes": {"sha256": sha256}}]
                # Newer releases for newest_release: a pre-release, and one whose only file was yanked.
                for name, yanked in (("demo-1.1rc1.tar.gz", False), ("demo-1.2.tar.gz", True)):
                    files.append({"filename": name, "url": url, "hashes": {"sha256": sha256}, "yanked": yanked})
                body = json.dumps({"meta": {"api-version": "1.1"}, "files": files}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            elif self.headers.get("Range"):
                start = int(self.headers["Range"].split("=")[1].rstrip("-"))
                self.send_response(206)
                self.send_header("Content-Length", str(len(PAYLOAD) - start))
                self.end_headers()
                self.wfile.write(PAYLOAD[start:])
            else:  # the first transfer breaks off after 300 kB
                self.send_response(200)
                self.send_header("Content-Length", str(len(PAYLOAD)))
                self.end_headers()
                self.wfile.write(PAYLOAD[:300_000])
                self.close_connection = True

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, requests


@pytest.fixture
def index(tmp_path, monkeypatch):
    def start(sha256):
        server, requests = serve(sha256)
        monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{server.server_port}/simple")
        monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
        monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no other index from this machine's pip.conf
        monkeypatch.setattr(source_archives, "CACHE", str(tmp_path))
        started.append(server)
        return requests

    started = []
    yield start
    for server in started:
        server.shutdown()


def test_an_interrupted_transfer_resumes_and_the_file_is_whole(index, tmp_path):
    requests = index(hashlib.sha256(PAYLOAD).hexdigest())
    path = source_archives.sdist("demo", "1.0")
    with open(path, "rb") as f:
        assert f.read() == PAYLOAD
    assert requests == [
        ("/simple/demo/", None),
        ("/files/demo-1.0.tar.gz", None),
        ("/files/demo-1.0.tar.gz", "bytes=300000-"),
    ]
    assert os.listdir(tmp_path) == ["demo-1.0.tar.gz"]
    assert source_archives.sdist("demo", "1.0") == path  # cached: no further request
    assert len(requests) == 3


def test_a_file_whose_hash_differs_from_the_index_is_refused(index, tmp_path):
    index("0" * 64)
    with pytest.raises(RuntimeError, match="sha256"):
        source_archives.sdist("demo", "1.0")
    assert os.listdir(tmp_path) == []


def _isolated_pip(monkeypatch, tmp_path):
    """pip reads no configuration of this machine: no PIP_* index variables, a home of its own."""
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    (home / ".config" / "pip").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_CONFIG_DIRS", str(tmp_path / "etc-xdg"))  # pip's global files: none there
    return home


def test_pip_index_url_is_the_index(index, tmp_path):
    requests = index(hashlib.sha256(PAYLOAD).hexdigest())
    assert archives.pip_indexes()[0] == os.environ["PIP_INDEX_URL"]
    assert source_archives.sdist("demo", "1.0")
    assert requests[0] == ("/simple/demo/", None)


def test_the_index_url_of_a_pip_conf_is_the_index(index, tmp_path, monkeypatch):
    """A user's pip.conf (found as pip finds it, through XDG_CONFIG_HOME), then PIP_CONFIG_FILE's file over
    it, then PIP_INDEX_URL over both; ``[download]`` over ``[global]``."""
    requests = index(hashlib.sha256(PAYLOAD).hexdigest())
    url = os.environ["PIP_INDEX_URL"]
    home = _isolated_pip(monkeypatch, tmp_path)
    if sys.platform != "linux":
        pytest.skip("pip's user configuration path is checked here on Linux")
    (home / ".config" / "pip" / "pip.conf").write_text(f"[global]\nindex-url = {url}\n")
    assert archives.pip_indexes() == [url]
    assert source_archives.sdist("demo", "1.0")
    assert requests[0] == ("/simple/demo/", None)
    other = tmp_path / "pip.conf"
    other.write_text("[global]\nindex-url = http://127.0.0.1:9/global\n[download]\nindex-url = http://127.0.0.1:9/dl\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(other))
    assert archives.pip_indexes() == ["http://127.0.0.1:9/dl"]
    monkeypatch.setenv("PIP_INDEX_URL", url)
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "http://127.0.0.1:9/extra")
    assert archives.pip_indexes() == [url, "http://127.0.0.1:9/extra"]


def test_with_nothing_configured_the_index_is_pips_own_default(tmp_path, monkeypatch):
    """The fallback comes from pip, never from a host written in the project."""
    _isolated_pip(monkeypatch, tmp_path)
    ask = "from pip._internal.models.index import PyPI; print(PyPI.simple_url)"  # pip's, in a process of its own
    default = subprocess.run([sys.executable, "-c", ask], capture_output=True, text=True, check=True).stdout.strip()
    assert archives.pip_indexes() == [default]


def test_no_package_index_host_is_written_in_the_projects_code():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    found = []
    for directory in ("opentelemetry_instrumentation_vllm_ascend", "tests", "benchmarks"):
        for dirpath, _, names in os.walk(os.path.join(root, directory)):
            for name in names:
                if name.endswith((".py", ".ini", ".toml", ".cfg")):
                    with open(os.path.join(dirpath, name), encoding="utf-8", errors="replace") as f:
                        text = f.read()
                    if re.search(r"pypi\.org|pythonhosted\.org", text):
                        found.append(os.path.relpath(os.path.join(dirpath, name), root))
    for name in ("tox.ini", "pyproject.toml"):
        with open(os.path.join(root, name)) as f:
            if re.search(r"pypi\.org|pythonhosted\.org", f.read()):
                found.append(name)
    assert found == []


def test_the_newest_release_is_the_newest_final_one_with_a_file(index):
    index(hashlib.sha256(PAYLOAD).hexdigest())
    assert source_archives.newest_release("demo") == "1.0"  # 1.1rc1: a pre-release; 1.2: yanked
    assert source_archives.newest_release("demo", prereleases=True) == "1.1rc1"  # 1.2's only file is yanked
    assert archives.release_archive("demo", "1.0", source_archives.CACHE).endswith("demo-1.0.tar.gz")


def _pages(pages: dict[str, list[tuple[str, bool]]]):
    """An index on 127.0.0.1 serving PEP 691 project pages: project -> [(filename, yanked)]."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            project = self.path.strip("/").split("/")[-1]
            if project not in pages:
                self.send_error(404)
                return
            url = f"http://127.0.0.1:{self.server.server_port}/files/"
            files = [
                {"filename": name, "url": url + name, "hashes": {"sha256": "0" * 64}, "yanked": yanked}
                for name, yanked in pages[project]
            ]
            body = json.dumps({"meta": {"api-version": "1.1"}, "files": files}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_the_drift_canary_checks_the_newest_releases_candidates_included_and_names_what_is_missing(
    tmp_path, monkeypatch, capsys
):
    """``tox -e drift`` takes the newest vLLM and vllm-ascend on the index, release candidates included (a dev
    release and a release whose files are all yanked do not count), pairs vllm-ascend with the vLLM of its number,
    hands both to the contract tests, and a failing check names the symbols its report says are missing."""
    from tests.support import drift

    server = _pages(
        {
            "vllm": [
                ("vllm-0.34.0.tar.gz", False),
                ("vllm-0.35.0rc1.tar.gz", False),
                ("vllm-0.36.0.dev1.tar.gz", False),
            ],
            "vllm-ascend": [
                ("vllm_ascend-0.30.0rc2.tar.gz", False),
                ("vllm_ascend-0.31.0rc1-py3-none-any.whl", False),
                ("vllm_ascend-0.32.0rc1.tar.gz", True),
            ],
        }
    )
    try:
        monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{server.server_port}/simple")
        monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
        monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
        calls, runs = [], []
        real_run = subprocess.run  # (pip's configuration is read through it: only the canary's commands are faked)

        def call(command, env=None, cwd=None):
            calls.append((command, env))
            return 1 if "--vllm-ascend" in command else 0  # the vllm-ascend check fails, the rest passes

        def run(command, **kwargs):
            if "opentelemetry_instrumentation_vllm_ascend" not in command:
                return real_run(command, **kwargs)
            runs.append(command)
            report = {"missing": [{"symbol": "vllm_ascend.core.x:X.schedule"}, {"symbol": "vllm.y:Y.step"}]}
            return subprocess.CompletedProcess(command, 1, stdout=json.dumps(report), stderr="")

        monkeypatch.setattr(drift.subprocess, "call", call)
        monkeypatch.setattr(drift.subprocess, "run", run)
        assert drift.main([]) == 1
    finally:
        server.shutdown()
    out = capsys.readouterr().out
    assert [c[0][3:] for c in calls[:2]] == [["check", "--vllm", "0.35.0rc1"], ["check", "--vllm-ascend", "0.31.0rc1"]]
    env = calls[2][1]
    assert env["OTEL_VLLM_ASCEND_DRIFT_VLLM"] == "0.35.0rc1"
    assert env["OTEL_VLLM_ASCEND_DRIFT_VLLM_ASCEND"] == "0.31.0rc1:0.31.0"
    assert runs == [[*calls[1][0], "--json"]]  # only the failing check is asked which symbols are missing
    assert "drift canary: check --vllm 0.35.0rc1: ok" in out
    assert (
        "drift canary: check --vllm-ascend 0.31.0rc1: FAILED (exit 1): missing vllm_ascend.core.x:X.schedule, "
        "vllm.y:Y.step"
    ) in out
    assert "drift canary: contract tests: ok" in out
