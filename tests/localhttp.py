"""A test HTTP server on 127.0.0.1 (the network reaches nothing else), and the environment without the
host's proxies, shared by the tests that speak to a fake package index."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy")


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing (pytest's output stays clean) and answers with `send`."""

    def log_message(self, *args):
        pass

    def send(self, code: int, ctype: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """`http://127.0.0.1:PORT` of a threaded server of `handler`, shut down afterwards."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def without_proxies(monkeypatch, tmp_path) -> None:
    """No proxy variable of the host, and a lab cache of the test's own."""
    for var in PROXY_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path / "labcache"))
