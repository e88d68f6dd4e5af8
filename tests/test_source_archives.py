"""The contract tests' downloader against a local index whose file server drops the first transfer
half-way: the download resumes with a Range request and the file is whole; a wrong hash is refused."""

import hashlib
import http.server
import json
import os
import threading

import pytest
import source_archives

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
                body = json.dumps(
                    {"files": [{"filename": "demo-1.0.tar.gz", "url": url, "hashes": {"sha256": sha256}}]}
                ).encode()
                self.send_response(200)
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
        monkeypatch.setattr(source_archives, "INDEX", f"http://127.0.0.1:{server.server_port}/simple")
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
