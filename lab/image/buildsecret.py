"""Credentials for an image build that no layer, history entry or run folder keeps.

Docker 20.10's classic builder has no build secrets (`RUN --mount=type=secret` needs BuildKit),
a COPY'd file stays in its layer even when a later step deletes it, and a build argument used by a
RUN step shows in `docker history`. So when the host's pip settings carry credentials, the lab
serves the full pip.conf once, from a server on the host's loopback (a random port and an
unguessable path), for the duration of one build. The build runs with the host's network, and the
template's pip step fetches the file to /tmp, uses it and deletes it in the same step. The URL is
in the image's history; it answers once, and stops with the build.
"""

from __future__ import annotations

import hmac
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOOPBACK = "127.0.0.1"


@dataclass
class OneShot:
    """A file served once at `url`; `fetches` counts the requests that got it (0 or 1)."""

    url: str
    fetches: int = 0
    refused: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def take(self, path: str, nonce: str) -> bool:
        """Whether this request for `path` gets the file: the right path, the first time."""
        with self._lock:
            if self.fetches == 0 and hmac.compare_digest(path, "/" + nonce):
                self.fetches += 1
                return True
            self.refused += 1
            return False


@contextmanager
def serve_once(data: bytes) -> Iterator[OneShot]:
    """Serve `data` once at http://127.0.0.1:<random port>/<random path> while the block runs."""
    nonce = secrets.token_urlsafe(32)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if not shot.take(self.path, nonce):
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass  # nothing of a request goes to the terminal or a log

    server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
    server.daemon_threads = True
    shot = OneShot(f"http://{LOOPBACK}:{server.server_address[1]}/{nonce}")
    thread = threading.Thread(target=server.serve_forever, name="lab-pip-conf", daemon=True)
    thread.start()
    try:
        yield shot
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
