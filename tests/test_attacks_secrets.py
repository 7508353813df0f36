"""The attacker's suite, secrets: nothing of the host's credentials lands in an image, its history,
a run folder, a bundle, the history database or the lab's own output, while the build still gets to
use them. Against the real engine.

The host's pip settings name three package sources on 127.0.0.1, each with a planted token in one of
the three places a URL can carry one (issue 33): an extra index that answers only with Basic auth
(`http://user:TOKEN@host/simple`), an extra index whose path is the token (`http://host/TOKEN/simple`,
as Artifactory and Gemfury have it) and a find-links page whose query is the token
(`http://host/links/?token=TOKEN`). Each serves a package as an sdist only, so that the
cross-install on the host (uv, `--no-build`) leaves it to pip inside the image: the build must use
all three URLs. The Debian mirror setting names a mirror with a token in its user info and its path.
The proxy variables name a real forwarding proxy on 127.0.0.1 that requires a planted password, and
a `*_TOKEN` variable holds one more planted value. Then every layer and the config of the image
(`docker save`), `docker history --no-trunc`, the runs folder (the run folder, the history database
index.sqlite3), the bundle and everything `lab` printed are searched for all of them, raw and
base64-encoded as in an Authorization header.
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
PATH_TOKEN = f"PLANTEDPATH7{uuid.uuid4().hex[:12]}"     # a letter and a digit, as real tokens have
QUERY_TOKEN = f"PLANTEDQUERY{uuid.uuid4().hex[:8]}"
MIRROR_USER, MIRROR_TOKEN = "mirroruser", f"PLANTEDMIRROR{uuid.uuid4().hex[:8]}"
MIRROR_PATH = f"PLANTEDMIRRORPATH7{uuid.uuid4().hex[:8]}"
PROXY_USER, PROXY_PASSWORD = "proxyuser", f"PROXYSECRET{uuid.uuid4().hex[:8]}"
ENV_TOKEN = f"PLANTEDENVTOKEN{uuid.uuid4().hex[:8]}"
PROJECT = "lab-planted-probe"        # from the index with the token in its user info
PATH_PROJECT = "lab-planted-path"    # from the index with the token in its path
QUERY_PROJECT = "lab-planted-query"  # from the find-links page with the token in its query
MESSAGE = "the planted probes are installed"


def basic(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


NEEDLES = [INDEX_TOKEN, PATH_TOKEN, QUERY_TOKEN, MIRROR_TOKEN, MIRROR_PATH, PROXY_PASSWORD, ENV_TOKEN,
           basic(INDEX_USER, INDEX_TOKEN), basic(MIRROR_USER, MIRROR_TOKEN), basic(PROXY_USER, PROXY_PASSWORD)]


# --- an sdist that only pip can install: an in-tree build backend, nothing to download -----------

BACKEND = '''
import base64, hashlib, os, zipfile

NAME, VERSION = "@NAME@", "1.0"
MODULE = 'MESSAGE = "@MESSAGE@"\\n'
DIST = f"{NAME}-{VERSION}.dist-info"


def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    files = {f"{NAME}.py": MODULE.encode(),
             f"{DIST}/METADATA": f"Metadata-Version: 2.1\\nName: @PROJECT@\\nVersion: {VERSION}\\n".encode(),
             f"{DIST}/WHEEL": b"Wheel-Version: 1.0\\nGenerator: lab-test\\nRoot-Is-Purelib: true\\n"
                              b"Tag: py3-none-any\\n"}
    record = [_record_line(p, d) for p, d in files.items()] + [f"{DIST}/RECORD,,"]
    name = f"{NAME}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as whl:
        for path, data in files.items():
            whl.writestr(path, data)
        whl.writestr(f"{DIST}/RECORD", "\\n".join(record) + "\\n")
    return name
'''

PYPROJECT = '''[build-system]
requires = []
build-backend = "backend"
backend-path = ["."]
'''


def sdist_name(project: str) -> str:
    return f"{project.replace('-', '_')}-1.0.tar.gz"


def make_sdist(project: str = PROJECT) -> bytes:
    module = project.replace("-", "_")
    backend = BACKEND.replace("@NAME@", module).replace("@PROJECT@", project).replace("@MESSAGE@", MESSAGE)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, text in (("pyproject.toml", PYPROJECT), ("backend.py", backend),
                           ("PKG-INFO", f"Metadata-Version: 2.1\nName: {project}\nVersion: 1.0\n")):
            data = text.encode()
            info = tarfile.TarInfo(f"{module}-1.0/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


class Index:
    """A package source on 127.0.0.1 that serves one sdist-only project and answers only when the
    request carries its planted token: in Basic auth (`userinfo`), as the first path segment
    (`path`), or in the query (`query`, a find-links page whose links carry the token too)."""

    def __init__(self, how: str = "userinfo", project: str = PROJECT) -> None:
        sdist, file = make_sdist(project), sdist_name(project)
        self.how = how
        if how == "userinfo":
            pages = {f"/simple/{project}/": f'<a href="/files/{file}">{file}</a>\n'.encode(), f"/files/{file}": sdist}
        elif how == "path":
            pages = {f"/{PATH_TOKEN}/simple/{project}/": f'<a href="/{PATH_TOKEN}/files/{file}">{file}</a>\n'.encode(),
                     f"/{PATH_TOKEN}/files/{file}": sdist}
        else:
            pages = {"/links/": f'<a href="/files/{file}?token={QUERY_TOKEN}">{file}</a>\n'.encode(),
                     f"/files/{file}": sdist}
        self.requests: list[tuple[str, bool, str]] = []  # (path, authorised, user agent)
        index = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                url = urllib.parse.urlsplit(self.path)
                if how == "userinfo":
                    authorised = self.headers.get("Authorization") == f"Basic {basic(INDEX_USER, INDEX_TOKEN)}"
                elif how == "path":
                    authorised = url.path.startswith(f"/{PATH_TOKEN}/")
                else:
                    authorised = urllib.parse.parse_qs(url.query).get("token") == [QUERY_TOKEN]
                index.requests.append((url.path, authorised, self.headers.get("User-Agent", "")))
                if not authorised:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="planted"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = pages.get(url.path)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/html" if url.path.endswith("/") else "application/gzip")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        """The URL the host's pip settings name, token included."""
        return {"userinfo": f"http://{INDEX_USER}:{INDEX_TOKEN}@127.0.0.1:{self.port}/simple",
                "path": f"http://127.0.0.1:{self.port}/{PATH_TOKEN}/simple",
                "query": f"http://127.0.0.1:{self.port}/links/?token={QUERY_TOKEN}"}[self.how]

    def pip_downloaded(self) -> bool:
        """Whether pip (inside the build) fetched the sdist with the token."""
        return any(p.endswith(".tar.gz") and ok and agent.startswith("pip/") for p, ok, agent in self.requests)

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
    from lab.image.hostpip import discover
    host = discover()  # the host's own sources stay (torch comes from them); the planted ones are added
    indexes = {how: Index(how, project) for how, project in
               (("userinfo", PROJECT), ("path", PATH_PROJECT), ("query", QUERY_PROJECT))}
    proxy = Proxy()
    proxy_url = f"http://{PROXY_USER}:{PROXY_PASSWORD}@127.0.0.1:{proxy.port}"
    env = {
        "PIP_EXTRA_INDEX_URL": " ".join([*host.extra_index_urls, *TORCH.env.get("PIP_EXTRA_INDEX_URL", "").split(),
                                         indexes["userinfo"].url, indexes["path"].url]),
        "PIP_FIND_LINKS": " ".join([*host.find_links, indexes["query"].url]),
        # a mirror with a token in its user info and its path; the base is made beforehand with the
        # default mirror, so this one is only named, never read (a bootstrap from it would fail)
        "LAB_DEBIAN_MIRROR": f"http://{MIRROR_USER}:{MIRROR_TOKEN}@127.0.0.1:9/{MIRROR_PATH}/debian",
        "HTTP_PROXY": proxy_url, "HTTPS_PROXY": proxy_url, "http_proxy": proxy_url, "https_proxy": proxy_url,
        "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
        "MY_SERVICE_TOKEN": ENV_TOKEN,
    }
    yield indexes, proxy, env
    for index in indexes.values():
        index.close()
    proxy.close()


def planted_scenario(folder: Path) -> Path:
    (folder / "probe.py").write_text("import lab_planted_probe, lab_planted_path, lab_planted_query\n"
                                     "print(lab_planted_probe.MESSAGE)\n")
    path = folder / "planted.yaml"
    path.write_text(f'name: planted-secrets\n{TORCH.header}base: debian:bookworm\n'
                    f"system_packages: [g++, python3-dev]\npip: [{PROJECT}, {PATH_PROJECT}, {QUERY_PROJECT}]\n"
                    f"script: probe.py\ntimeout: 300\n"
                    f'expect: {{stdout_contains: "{MESSAGE}", exit_code: 0}}\n')
    return path


@pytest.mark.docker
@pytest.mark.timeout(1800)
@pytest.mark.usefixtures("cpu_torch")
def test_planted_credentials_reach_the_build_and_nothing_keeps_them(planted, tmp_path):
    indexes, proxy, env = planted
    # the base, from the default mirror (the planted one does not serve Debian)
    base = run_lab("build-base", "debian:bookworm", "--arch", "amd64", "--packages", "g++,python3-dev")
    assert base.returncode == 0, base.stderr[-4000:]
    runs = tmp_path / "runs"
    proc = run_lab("run", str(planted_scenario(tmp_path)), "--out", str(runs), "--json", "--no-diagnose", "-v",
                   env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = last_json(proc.stdout)
    run_dir = Path(result["run_dir"])
    tag = (result.get("image") or {}).get("tag")
    client = docker.from_env()
    try:
        assert result["verdict"] == "reproduced", (result, (run_dir / "build.log").read_text()[-4000:])
        # Every planted URL reached the build: pip in the image fetched each sdist with its token ...
        for how, index in indexes.items():
            assert index.pip_downloaded(), (how, index.requests)
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
        # The image's pip.conf names none of the planted sources: a whole URL is a secret.
        conf = client.containers.run(tag, ["cat", "/etc/lab/pip.conf"], remove=True, network_mode="none",
                                     labels={"org.torch-repro-lab.managed": "true"}).decode()
        assert not any(f"127.0.0.1:{index.port}" in conf for index in indexes.values()), conf
        assert "3 index URL(s) of the host are secrets" in conf

        # Nowhere in the runs folder: the run folder, the history database, the bundles log ...
        assert run_lab("runs", "--json", "--out", str(runs), env=env).returncode == 0
        assert (runs / "index.sqlite3").is_file()
        assert found_in_folder(runs, NEEDLES) == {}
        assert f"http://127.0.0.1:{indexes['path'].port}/…" in (run_dir / "build.log").read_text()
        assert "http://127.0.0.1:9/…" in (run_dir / "scenario.yaml").read_text()  # the mirror, named redacted
        # ... nor in its bundle, nor in anything the lab printed (with -v, every build line).
        made = run_lab("bundle", str(run_dir), "-o", str(tmp_path / "planted.tar.gz"), env=env)
        assert made.returncode == 0, made.stderr
        assert found_in_bundle(tmp_path / "planted.tar.gz", NEEDLES) == {}
        comment = run_lab("comment", str(run_dir), env=env)
        assert comment.returncode == 0, comment.stderr
        printed = [proc.stdout, proc.stderr, made.stdout, made.stderr, comment.stdout, comment.stderr]
        assert found_in_stream([t.encode() for t in printed], NEEDLES) == set()
        # The comment and the bundle's report.md, meant for an upstream issue, name no path of the
        # user's either: the scenario by its file's name, the run folder relative to the runs folder.
        with tarfile.open(tmp_path / "planted.tar.gz", "r:gz") as tar:
            report = next(tar.extractfile(m).read().decode() for m in tar if m.name.endswith("/report.md")
                          or m.name == "report.md")
        for text in (comment.stdout, report):
            assert str(tmp_path) not in text and "lab run planted.yaml" in text
        assert f"127.0.0.1:{indexes['path'].port}/…" in proc.stderr  # pip's "Looking in indexes", redacted
    finally:
        if tag:
            client.images.remove(tag, force=True)
