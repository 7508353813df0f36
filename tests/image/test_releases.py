"""lab.releases: candidate releases from simple indexes (PEP 691 JSON, PEP 503 HTML, local folders)."""

from __future__ import annotations

import base64
import json
import re
import shutil
import ssl
import subprocess
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from lab.core.errors import LabError
from lab.image import releases
from lab.image.hostpip import HostPip
from lab.image.releases import (
    IndexUnreachableError,
    ReleaseError,
    between,
    candidates,
    describe,
    sources,
)
from tests.localhttp import QuietHandler, serving, without_proxies

DATA = Path(__file__).resolve().parents[1] / "data" / "index"
JSON_PAGE = (DATA / "pypi-torch.json").read_bytes()
HTML_PAGE = (DATA / "pypi-torch.html").read_bytes()
LOCAL_INDEX = DATA / "local" / "simple"
JSON_TYPE = "application/vnd.pypi.simple.v1+json"

ARM_311 = ["2.4.1", "2.5.1", "2.10.0", "2.11.0"]  # 2.5.0: no aarch64 wheel; 2.6.0: yanked; rc: pre-release


class Handler(QuietHandler):
    hits: list[tuple[str, str]] = []

    def do_GET(self):
        Handler.hits.append((self.path, self.headers.get("Accept", "")))
        if self.path == "/json/simple/torch/" and JSON_TYPE in self.headers.get("Accept", ""):
            self.send(200, JSON_TYPE, JSON_PAGE)
        elif self.path == "/html/simple/torch/":
            self.send(200, "text/html; charset=utf-8", HTML_PAGE)
        elif self.path == "/links/":
            page = (b'<a href="/f/torch-2.7.0-cp311-cp311-manylinux_2_28_aarch64.whl">t</a>'
                    b'<a href="/f/numpy-2.0.0-cp311-cp311-manylinux_2_28_aarch64.whl">n</a>')
            self.send(200, "text/html", page)
        elif self.path == "/broken/simple/torch/":
            self.send(500, "text/plain", b"boom")
        elif self.path == "/garbage/simple/torch/":
            self.send(200, JSON_TYPE, b"{not json")
        elif self.path == "/slow/simple/torch/":
            time.sleep(1.5)
            self.send(200, JSON_TYPE, JSON_PAGE)
        elif self.path == "/auth/simple/torch/":
            if self.headers.get("Authorization") == "Basic " + base64.b64encode(b"me:s3cret").decode():
                self.send(200, JSON_TYPE, JSON_PAGE)
            else:
                self.send(401, "text/plain", b"who are you")
        else:
            self.send(404, "text/plain", b"not found")


@pytest.fixture(scope="module")
def server():
    with serving(Handler) as url:
        yield url


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    without_proxies(monkeypatch, tmp_path)
    Handler.hits.clear()


def cands(index: str, tmp_path: Path, **kw) -> list[str]:
    host = kw.pop("host", None) or HostPip(index_url=index)
    kw.setdefault("cache_dir", tmp_path / "cache")
    return candidates("torch", host=host, **kw)


# -- remote indexes -------------------------------------------------------------------------------

def test_json_api_aarch64_cp311(server, tmp_path):
    assert cands(f"{server}/json/simple", tmp_path, python="3.11", arch="arm64") == ARM_311
    path, accept = Handler.hits[0]
    assert path == "/json/simple/torch/" and accept.startswith(JSON_TYPE)


def test_tags_python_and_arch_choose_wheels(server, tmp_path):
    index = f"{server}/json/simple"
    assert cands(index, tmp_path, python="3.10", arch="aarch64") == \
        ["2.4.1", "2.5.1", "2.6.0", "2.10.0", "2.11.0"]  # only the cp311 wheel of 2.6.0 is yanked
    assert cands(index, tmp_path, python="3.11", arch="amd64") == \
        ["2.4.1", "2.5.0", "2.5.1", "2.6.0", "2.10.0", "2.11.0"]
    assert cands(index, tmp_path, python="3.12", arch="arm64") == []
    assert cands(index, tmp_path, python="3.11", arch="arm64", include_pre=True) == [*ARM_311[:2], *ARM_311[2:],
                                                                                   "2.12.0rc1"]


def test_explicit_tags_win(server, tmp_path):
    from packaging.tags import Tag
    tags = frozenset({Tag("cp311", "none", "macosx_11_0_arm64")})
    assert cands(f"{server}/json/simple", tmp_path, tags=tags) == ["2.4.1", "2.5.0", "2.5.1", "2.6.0", "2.10.0"]


def test_html_fallback_gives_the_same_answer(server, tmp_path):
    assert cands(f"{server}/html/simple", tmp_path) == ARM_311


def test_json_and_html_pages_list_the_same_files():
    from_json = {(f.filename, f.yanked) for f in releases._parse_json(json.loads(JSON_PAGE))}
    from_html = {(f.filename, f.yanked) for f in releases._parse_html(HTML_PAGE.decode())}
    assert from_json - from_html == {("torch-2.12.0rc1-cp311-cp311-manylinux_2_28_aarch64.whl", False)}
    assert from_html <= from_json
    html_rp = {f.requires_python for f in releases._parse_html(HTML_PAGE.decode())}
    assert html_rp == {">=3.10", ">=3.8.0", ">=3.9.0"}  # &gt; unescaped


def test_missing_project_on_an_extra_index_is_no_candidates(server, tmp_path):
    host = HostPip(index_url=f"{server}/json/simple", extra_index_urls=(f"{server}/nothing/simple",))
    assert cands("", tmp_path, host=host) == ARM_311


def test_http_error_names_the_index_by_its_host_only(server, tmp_path):
    # issue 33: a whole index URL is a secret (a token can sit in its path), so the page is named redacted
    with pytest.raises(IndexUnreachableError, match=re.escape(f"{server}/… answered HTTP 500")) as info:
        cands(f"{server}/broken/simple", tmp_path)
    assert isinstance(info.value, LabError) and "broken" not in str(info.value)


def test_malformed_page_is_an_error(server, tmp_path):
    with pytest.raises(IndexUnreachableError, match="not a simple index"):
        cands(f"{server}/garbage/simple", tmp_path)


def test_timeout(server, tmp_path):
    with pytest.raises(IndexUnreachableError, match="did not answer within 0.2 s"):
        cands(f"{server}/slow/simple", tmp_path, timeout=0.2)


def test_unreachable_host(tmp_path):
    with pytest.raises(IndexUnreachableError, match="could not read http://127.0.0.1:9/…"):
        cands("http://127.0.0.1:9/simple", tmp_path, timeout=2)


def test_credentials_in_the_url_are_sent_and_never_shown(server, tmp_path):
    host = server.replace("http://", "http://me:s3cret@")
    assert cands(f"{host}/auth/simple", tmp_path) == ARM_311
    wrong = server.replace("http://", "http://me:wrong@")
    with pytest.raises(IndexUnreachableError) as info:
        cands(f"{wrong}/auth/simple", tmp_path)
    assert "wrong" not in str(info.value) and "me:" not in str(info.value) and "127.0.0.1" in str(info.value)
    assert all("s3cret" not in p.read_text() for p in (tmp_path / "cache").iterdir())


# -- local sources and merging --------------------------------------------------------------------

def wheel_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "wheels"
    folder.mkdir()
    for name in ("torch-2.7.0-cp311-cp311-manylinux_2_28_aarch64.whl",
                 "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
                 "numpy-2.0.0-cp311-cp311-manylinux_2_28_aarch64.whl", "notes.txt"):
        (folder / name).write_bytes(b"")
    return folder


def test_merges_index_local_index_and_find_links(server, tmp_path):
    host = HostPip(index_url=f"{server}/json/simple", extra_index_urls=(LOCAL_INDEX.as_uri(),),
                   find_links=(str(wheel_folder(tmp_path)), f"{server}/links/"))
    arm = cands("", tmp_path, host=host, arch="arm64")
    # 2.9.0 from the file:// index, 2.7.0 from find-links; 2.3.0 needs Python 3.12, 2.9.1 is yanked
    assert arm == ["2.4.1", "2.5.1", "2.7.0", "2.9.0", "2.10.0", "2.11.0"]
    amd = cands("", tmp_path, host=host, arch="amd64")
    assert amd[-1] == "2.13.0+cpu"  # a local build counts as itself, spelled as published
    assert "2.13.0" not in amd


def test_local_index_alone_needs_no_network(tmp_path):
    assert cands(str(LOCAL_INDEX), tmp_path, arch="arm64") == ["2.5.1", "2.9.0"]
    assert cands(LOCAL_INDEX.as_uri(), tmp_path, arch="amd64") == ["2.13.0+cpu"]
    assert cands(str(tmp_path / "absent"), tmp_path) == []


def test_remote_find_links_page_is_filtered_by_project(server, tmp_path):
    host = HostPip(index_url=str(tmp_path / "empty"), find_links=(f"{server}/links/",))
    assert cands("", tmp_path, host=host) == ["2.7.0"]


def test_sources_follow_the_hosts_pip():
    assert sources(HostPip()) == [("index", "https://pypi.org/simple")]
    host = HostPip(index_url="https://mirror/simple", extra_index_urls=("file:///opt/pypi/simple",),
                   find_links=("/opt/wheels",))
    assert sources(host) == [("index", "https://mirror/simple"), ("index", "file:///opt/pypi/simple"),
                             ("links", "/opt/wheels")]


# -- cache ------------------------------------------------------------------------------------------

def test_cache_is_reused_for_a_day_unless_refreshed(server, tmp_path):
    index = f"{server}/json/simple"
    assert cands(index, tmp_path) == ARM_311
    assert cands(index, tmp_path, arch="amd64")[0] == "2.4.1"  # the cached file list serves other tags too
    assert len(Handler.hits) == 1
    [cached] = (tmp_path / "cache").iterdir()
    data = json.loads(cached.read_text())
    assert data["url"].startswith(f"{server}/… sha256:") and "json" not in data["url"]
    assert abs(data["fetched_at"] - time.time()) < 60
    assert all(f["filename"].endswith(".whl") for f in data["files"])

    cands(index, tmp_path, refresh=True)
    assert len(Handler.hits) == 2
    data["fetched_at"] -= 25 * 3600
    cached.write_text(json.dumps(data))
    assert cands(index, tmp_path) == ARM_311
    assert len(Handler.hits) == 3
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [cached.name]  # written in place, no temp left


def test_corrupt_cache_is_read_again(server, tmp_path):
    index = f"{server}/json/simple"
    cands(index, tmp_path)
    [cached] = (tmp_path / "cache").iterdir()
    cached.write_text("{")
    assert cands(index, tmp_path) == ARM_311
    assert len(Handler.hits) == 2


def test_default_cache_dir_honours_lab_cache_dir(server, tmp_path):
    candidates("torch", host=HostPip(index_url=f"{server}/json/simple"))
    assert len(list((tmp_path / "labcache" / "index").glob("torch-*.json"))) == 1


# -- TLS ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    if not shutil.which("openssl"):
        pytest.skip("openssl is needed to make a test certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                    "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{httpd.server_port}", cert
    httpd.shutdown()
    httpd.server_close()


def test_https_trusts_the_hosts_ca_bundle(tls_server, tmp_path):
    url, cert = tls_server
    host = HostPip(index_url=f"{url}/json/simple", ca_bundle=cert)
    assert cands("", tmp_path, host=host) == ARM_311


def test_https_without_the_ca_says_how_to_fix_it(tls_server, tmp_path):
    url, _ = tls_server
    with pytest.raises(IndexUnreachableError, match="CERTIFICATE_VERIFY_FAILED") as info:
        cands(f"{url}/json/simple", tmp_path, refresh=True)
    assert "PIP_CERT" in str(info.value)


def test_trusted_host_skips_verification(tls_server, tmp_path):
    url, _ = tls_server
    host = HostPip(index_url=f"{url}/json/simple", trusted_hosts=("127.0.0.1",))
    assert cands("", tmp_path, host=host, refresh=True) == ARM_311


# -- between ----------------------------------------------------------------------------------------

VERSIONS = ["2.4.1", "2.5.1", "2.6.0", "2.10.0", "2.11.0", "2.13.0+cpu"]


def test_between_is_inclusive_and_ordered():
    assert between(VERSIONS, "2.5.1", "2.11.0") == ["2.5.1", "2.6.0", "2.10.0", "2.11.0"]
    assert between(list(reversed(VERSIONS)), "2.4.1", "2.5.1") == ["2.4.1", "2.5.1"]


def test_between_names_the_nearest_candidates():
    what = describe("3.11", "arm64")
    assert what == "aarch64 cp311 wheel"
    with pytest.raises(ReleaseError) as info:
        between(VERSIONS, "2.5.0", "2.11.0", what=what)
    assert str(info.value).startswith("2.5.0 has no aarch64 cp311 wheel on the index; nearest: 2.4.1, 2.5.1.")
    with pytest.raises(ReleaseError, match="2.99.0 has no compatible wheel on the index; nearest: 2.13.0"):
        between(VERSIONS, "2.4.1", "2.99.0")
    with pytest.raises(ReleaseError, match=r"1.0 has .*nearest: 2.4.1\."):
        between(VERSIONS, "1.0", "2.4.1")


def test_between_errors():
    with pytest.raises(ReleaseError, match="not older than"):
        between(VERSIONS, "2.11.0", "2.5.1")
    with pytest.raises(ReleaseError, match="not older than"):
        between(VERSIONS, "2.5.1", "2.5.1")
    with pytest.raises(ReleaseError, match="not a version number"):
        between(VERSIONS, "latest", "2.5.1")
    with pytest.raises(ReleaseError, match="no release on the index has a aarch64 cp311 wheel"):
        between([], "2.5.1", "2.6.0", what="aarch64 cp311 wheel")


def test_between_finds_a_local_build_by_its_public_version():
    assert between(VERSIONS, "2.11.0", "2.13.0") == ["2.11.0", "2.13.0+cpu"]
    with pytest.raises(ReleaseError, match="several builds: 2.13.0\\+cpu, 2.13.0\\+cu126"):
        between([*VERSIONS, "2.13.0+cu126"], "2.11.0", "2.13.0")


def test_wheel_tags_cover_legacy_manylinux_names():
    from packaging.tags import Tag
    amd = releases.wheel_tags("3.11", "amd64")
    assert Tag("cp311", "cp311", "manylinux1_x86_64") in amd  # x86_64 torch <= 2.6.0 on PyPI
    assert Tag("cp311", "cp311", "manylinux_2_28_x86_64") in amd
    arm = releases.wheel_tags("3.11", "arm64")
    assert Tag("cp311", "cp311", "manylinux2014_aarch64") in arm
    assert not any(t.platform.endswith("x86_64") for t in arm)
