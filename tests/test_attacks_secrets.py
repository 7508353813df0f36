"""The attacker's suite, secrets: nothing of the host's credentials lands in an image, its history,
a run folder or a bundle, while the build still gets to use them. Against the real engine.

The host's pip settings name an extra index on 127.0.0.1 that answers only with a planted token
(Basic auth) and serves a package as an sdist only, so that the cross-install on the host (uv,
`--no-build`) leaves it to pip inside the image: the build must use the credentials. The proxy
variables name a real forwarding proxy on 127.0.0.1 that requires a planted password, and a
`*_TOKEN` variable holds a third planted value. Then every layer and the config of the image
(`docker save`), `docker history --no-trunc`, the run folder and its bundle are searched for all
three, raw and base64-encoded as in an Authorization header.
"""

from __future__ import annotations

import base64
import io
import json
import select
import socket
import subprocess
import tarfile
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from socketserver import StreamRequestHandler, ThreadingTCPServer

import docker
import pytest

from tests.conftest import last_json, run_lab
from tests.cpu_torch import TORCH

INDEX_USER, INDEX_TOKEN = "indexuser", f"PLANTEDTOKEN{uuid.uuid4().hex[:8]}"
PROXY_USER, PROXY_PASSWORD = "proxyuser", f"PROXYSECRET{uuid.uuid4().hex[:8]}"
ENV_TOKEN = f"PLANTEDENVTOKEN{uuid.uuid4().hex[:8]}"
PROJECT = "lab-planted-probe"
MESSAGE = "the planted probe is installed"


def basic(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


NEEDLES = [INDEX_TOKEN, PROXY_PASSWORD, ENV_TOKEN, basic(INDEX_USER, INDEX_TOKEN), basic(PROXY_USER, PROXY_PASSWORD)]


# --- an sdist that only pip can install: an in-tree build backend, nothing to download -----------

BACKEND = '''
import base64, hashlib, os, zipfile

NAME, VERSION = "lab_planted_probe", "1.0"
MODULE = 'MESSAGE = "@MESSAGE@"\\n'
DIST = f"{NAME}-{VERSION}.dist-info"


def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    files = {f"{NAME}.py": MODULE.encode(),
             f"{DIST}/METADATA": f"Metadata-Version: 2.1\\nName: lab-planted-probe\\nVersion: {VERSION}\\n".encode(),
             f"{DIST}/WHEEL": b"Wheel-Version: 1.0\\nGenerator: lab-test\\nRoot-Is-Purelib: true\\n"
                              b"Tag: py3-none-any\\n"}
    record = [_record_line(p, d) for p, d in files.items()] + [f"{DIST}/RECORD,,"]
    name = f"{NAME}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as whl:
        for path, data in files.items():
            whl.writestr(path, data)
        whl.writestr(f"{DIST}/RECORD", "\\n".join(record) + "\\n")
    return name
'''.replace("@MESSAGE@", MESSAGE)

PYPROJECT = '''[build-system]
requires = []
build-backend = "backend"
backend-path = ["."]
'''


def make_sdist() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, text in (("pyproject.toml", PYPROJECT), ("backend.py", BACKEND),
                           ("PKG-INFO", "Metadata-Version: 2.1\nName: lab-planted-probe\nVersion: 1.0\n")):
            data = text.encode()
            info = tarfile.TarInfo(f"lab_planted_probe-1.0/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


class Index:
    """A PEP 503 index on 127.0.0.1 that answers only with the planted credentials."""

    def __init__(self) -> None:
        sdist = make_sdist()
        file = "lab_planted_probe-1.0.tar.gz"
        pages = {f"/simple/{PROJECT}/": f'<a href="/files/{file}">{file}</a>\n'.encode(), f"/files/{file}": sdist}
        self.requests: list[tuple[str, bool, str]] = []  # (path, authorised, user agent)
        index = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                authorised = self.headers.get("Authorization") == f"Basic {basic(INDEX_USER, INDEX_TOKEN)}"
                index.requests.append((self.path, authorised, self.headers.get("User-Agent", "")))
                if not authorised:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="planted"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = pages.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/html" if self.path.endswith("/") else "application/gzip")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Proxy:
    """A forwarding proxy on 127.0.0.1 (CONNECT and absolute-URI requests) that answers 407 unless
    the request carries the planted password."""

    def __init__(self) -> None:
        self.authorised = 0
        self.refused = 0
        proxy = self

        class Handler(StreamRequestHandler):
            def handle(self) -> None:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = self.connection.recv(65536)
                    if not chunk:
                        return
                    head += chunk
                header, rest = head.split(b"\r\n\r\n", 1)
                lines = header.decode("latin-1").split("\r\n")
                method, target, version = lines[0].split(" ", 2)
                fields = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
                if fields.get("proxy-authorization") != f"Basic {basic(PROXY_USER, PROXY_PASSWORD)}":
                    proxy.refused += 1
                    self.connection.sendall(b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                                            b"Proxy-Authenticate: Basic realm=\"planted\"\r\nContent-Length: 0\r\n\r\n")
                    return
                proxy.authorised += 1
                if method == "CONNECT":
                    host, _, port = target.rpartition(":")
                    upstream = socket.create_connection((host, int(port)), timeout=30)
                    self.connection.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    first = rest
                else:
                    url = urllib.parse.urlparse(target)
                    upstream = socket.create_connection((url.hostname, url.port or 80), timeout=30)
                    kept = [ln for ln in lines[1:] if not ln.lower().startswith("proxy-")]
                    path = url.path + (f"?{url.query}" if url.query else "")
                    first = ("\r\n".join([f"{method} {path or '/'} {version}", *kept]) + "\r\n\r\n").encode() + rest
                try:
                    if first:
                        upstream.sendall(first)
                    _relay(self.connection, upstream)
                finally:
                    upstream.close()

        ThreadingTCPServer.allow_reuse_address = True
        self.server = ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _relay(a: socket.socket, b: socket.socket) -> None:
    sockets = [a, b]
    while True:
        ready, _, broken = select.select(sockets, [], sockets, 120)
        if broken or not ready:
            return
        for s in ready:
            data = s.recv(65536)
            if not data:
                return
            (b if s is a else a).sendall(data)


# --- searching ---------------------------------------------------------------------------------

def found_in_stream(chunks, needles: list[str]) -> set[str]:
    """The needles that occur in a byte stream (chunked; an occurrence across chunks counts)."""
    encoded = [n.encode() for n in needles]
    keep = max(len(n) for n in encoded)
    found: set[str] = set()
    tail = b""
    for chunk in chunks:
        window = tail + chunk
        found |= {n for n, e in zip(needles, encoded, strict=True) if e in window}
        tail = window[-keep:]
    return found


def found_in_folder(folder: Path, needles: list[str]) -> dict[str, set[str]]:
    hits = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink():
            found = found_in_stream([path.read_bytes()], needles)
            if found:
                hits[str(path.relative_to(folder))] = found
    return hits


def found_in_bundle(bundle: Path, needles: list[str]) -> dict[str, set[str]]:
    hits = {}
    with tarfile.open(bundle, "r:gz") as tar:
        for member in tar:
            fh = tar.extractfile(member) if member.isfile() else None
            data = (fh.read() if fh else b"") + member.name.encode()
            found = found_in_stream([data], needles)
            if found:
                hits[member.name] = found
    return hits


# --- the attack --------------------------------------------------------------------------------

@pytest.fixture
def planted(tmp_path):
    index, proxy = Index(), Proxy()
    proxy_url = f"http://{PROXY_USER}:{PROXY_PASSWORD}@127.0.0.1:{proxy.port}"
    env = {
        "PIP_EXTRA_INDEX_URL": " ".join([*TORCH.env.get("PIP_EXTRA_INDEX_URL", "").split(),  # the CPU torch's
                                         f"http://{INDEX_USER}:{INDEX_TOKEN}@127.0.0.1:{index.port}/simple"]),
        "HTTP_PROXY": proxy_url, "HTTPS_PROXY": proxy_url, "http_proxy": proxy_url, "https_proxy": proxy_url,
        "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
        "MY_SERVICE_TOKEN": ENV_TOKEN,
    }
    yield index, proxy, env
    index.close()
    proxy.close()


def planted_scenario(folder: Path) -> Path:
    (folder / "probe.py").write_text("import lab_planted_probe\nprint(lab_planted_probe.MESSAGE)\n")
    path = folder / "planted.yaml"
    path.write_text(f'name: planted-secrets\n{TORCH.header}base: debian:bookworm\n'
                    f"system_packages: [g++, python3-dev]\npip: [{PROJECT}]\nscript: probe.py\ntimeout: 300\n"
                    f'expect: {{stdout_contains: "{MESSAGE}", exit_code: 0}}\n')
    return path


@pytest.mark.docker
@pytest.mark.timeout(1800)
@pytest.mark.usefixtures("cpu_torch")
def test_planted_credentials_reach_the_build_and_nothing_keeps_them(planted, tmp_path):
    index, proxy, env = planted
    proc = run_lab("run", str(planted_scenario(tmp_path)), "--out", str(tmp_path / "runs"), "--json",
                   "--no-diagnose", env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = last_json(proc.stdout)
    run_dir = Path(result["run_dir"])
    tag = (result.get("image") or {}).get("tag")
    client = docker.from_env()
    try:
        assert result["verdict"] == "reproduced", (result, (run_dir / "build.log").read_text()[-4000:])
        # The credentials reached the build: pip in the image fetched the sdist with them ...
        pip_downloads = [r for r in index.requests if r[0].startswith("/files/") and r[1] and r[2].startswith("pip/")]
        assert pip_downloads, index.requests
        # ... and the proxy's password reached whatever used the proxy.
        assert proxy.authorised > 0

        # Nowhere in the image: every layer tar and the config, as `docker save` writes them.
        assert found_in_stream(client.images.get(tag).save(named=True), NEEDLES) == set()
        config = json.dumps(client.api.inspect_image(tag))
        assert found_in_stream([config.encode()], NEEDLES) == set()
        # Nor in its history, where the dead one-shot URL is the only trace of the pip.conf.
        history = subprocess.run(["docker", "history", "--no-trunc", tag], capture_output=True, text=True,
                                 check=True).stdout
        assert found_in_stream([history.encode()], NEEDLES) == set()
        urls = [w.split("=", 1)[1] for w in history.split() if w.startswith("LAB_PIP_CONF_URL=http")]
        assert len(urls) == 1 and urls[0].startswith("http://127.0.0.1:")
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            urllib.request.build_opener(urllib.request.ProxyHandler({})).open(urls[0], timeout=10)
        # The image's pip.conf names the index, without its credentials.
        conf = client.containers.run(tag, ["cat", "/etc/lab/pip.conf"], remove=True, network_mode="none",
                                     labels={"org.torch-repro-lab.managed": "true"}).decode()
        assert f"http://127.0.0.1:{index.port}/simple" in conf and INDEX_USER not in conf

        # Nowhere in the run folder, nor in its bundle.
        assert found_in_folder(run_dir, NEEDLES) == {}
        assert f"http://127.0.0.1:{index.port}/simple" in (run_dir / "lab" / "pip.conf").read_text()
        made = run_lab("bundle", str(run_dir), "-o", str(tmp_path / "planted.tar.gz"), env=env)
        assert made.returncode == 0, made.stderr
        assert found_in_bundle(tmp_path / "planted.tar.gz", NEEDLES) == {}
    finally:
        if tag:
            client.images.remove(tag, force=True)
