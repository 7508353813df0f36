"""lab.core.http, the one HTTP client, against a local server (tests/localhttp.py): the environment's
proxies (and NO_PROXY), credentials in the URL sent and never shown, the body cap, no ~/.netrc."""

from __future__ import annotations

import base64
import contextlib
import time

import pytest

from lab.core import http
from tests.localhttp import QuietHandler, serving, without_proxies


class Handler(QuietHandler):
    seen: list[tuple[str, str | None]] = []

    def do_GET(self):  # noqa: N802 - http.server's name
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client stopped reading
            self._answer()

    def _answer(self):
        type(self).seen.append((self.path, self.headers.get("Authorization")))
        if self.path.endswith("/slow"):
            time.sleep(1)
        if self.path.endswith("/missing"):
            self.send(404, "text/plain", b"no")
            return
        self.send(200, "text/plain", b"x" * 1000)


@pytest.fixture
def server(monkeypatch, tmp_path):
    without_proxies(monkeypatch, tmp_path)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    Handler.seen = []
    with serving(Handler) as url:
        yield url


def test_a_get_with_the_lab_s_user_agent_and_a_cap_on_the_body(server):
    got = http.get(f"{server}/page", timeout=5, max_bytes=100)
    assert got.status == 200 and got.body == b"x" * 100 and got.content_type == "text/plain"
    assert len(http.get(f"{server}/page", timeout=5).body) == 1000


def test_the_environment_s_proxy_is_used_unless_no_proxy_names_the_host(server, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", server)  # the local server answers as the proxy: it sees the whole URL
    http.get("http://index.invalid/simple/torch/", timeout=5)
    assert Handler.seen[-1][0] == "http://index.invalid/simple/torch/"
    monkeypatch.setenv("NO_PROXY", "index.invalid")
    with pytest.raises(http.HttpUnreachableError):
        http.get("http://index.invalid/simple/torch/", timeout=5)
    # proxies named by the caller (lab.image.hostpip's) win over none, and NO_PROXY holds for them too
    monkeypatch.delenv("HTTP_PROXY")
    monkeypatch.delenv("NO_PROXY")
    http.get("http://other.invalid/x", timeout=5, proxies=http.proxy_map((("HTTP_PROXY", server),)))
    assert Handler.seen[-1][0] == "http://other.invalid/x"


def test_credentials_are_sent_as_basic_auth_and_never_shown(server, monkeypatch, tmp_path):
    (tmp_path / ".netrc").write_text("machine 127.0.0.1 login netrc password fromnetrc\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    http.get(server.replace("http://", "http://me:s3cret@") + "/page", timeout=5)
    assert Handler.seen[-1][1] == "Basic " + base64.b64encode(b"me:s3cret").decode()
    http.get(f"{server}/page", timeout=5)
    assert Handler.seen[-1][1] is None  # ~/.netrc is not read
    with pytest.raises(http.HttpStatusError) as info:
        http.get(server.replace("http://", "http://me:s3cret@") + "/tok3nABCDEF123/missing", timeout=5)
    assert info.value.status == 404 and "s3cret" not in str(info.value) and "tok3n" not in str(info.value)
    assert str(info.value).endswith("/… answered HTTP 404 Not Found.")
    assert http.get(f"{server}/missing", timeout=5, ok=(404,)).status == 404


def test_timeout_and_refusal_in_words(server):
    with pytest.raises(http.HttpUnreachableError) as info:
        http.get(f"{server}/slow", timeout=0.2)
    assert info.value.timed_out and "did not answer within 0.2 s" in str(info.value)
    with pytest.raises(http.HttpUnreachableError) as info:
        http.get("http://127.0.0.1:9/secret/path", timeout=2)
    assert not info.value.timed_out and "Connection refused" in info.value.reason
    assert "secret" not in str(info.value)
