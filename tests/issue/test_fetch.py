"""Fetching an issue through the GitHub REST API, against a local HTTP server that serves saved API
JSON (never the internet); saved JSON, Markdown and HTML files."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from lab.issue.fetch import IssueError, IssueFetchError, fetch_issue
from lab.issue.infer import infer

ISSUE = {"number": 147282, "title": "assert fails to trigger inside torch.compile", "state": "closed",
         "html_url": "https://github.com/pytorch/pytorch/issues/147282", "created_at": "2025-02-16T10:00:00Z",
         "user": {"login": "ad8e"}, "comments": 1,
         "body": "### 🐛 Describe the bug\n\n```\nimport torch\n@torch.compile\ndef func():\n"
                 "\ta = torch.tensor([1.0, -2.0])\n\ttest = torch.all(a > 0)\n\tprint(test)\n"
                 "\tassert test, \"should throw\"\n\tprint(\"should not run\")\n\n\nfunc()\n```\n\n"
                 "Output:\n```\ntensor(False)\nshould not run\n```\n\n### Versions\n\n```\n"
                 "PyTorch version: 2.5.1\nOS: Ubuntu 22.04.5 LTS (x86_64)\n```\n"}
COMMENTS = [{"user": {"login": "someone"}, "created_at": "2025-02-17T00:00:00Z", "body": "Confirmed on main."}]


class _Api(BaseHTTPRequestHandler):
    seen: list = []

    def do_GET(self):  # noqa: N802 - http.server's name
        type(self).seen.append((self.path, self.headers.get("Authorization")))
        if self.path == "/repos/pytorch/pytorch/issues/147282":
            body, code = ISSUE, 200
        elif self.path.startswith("/repos/pytorch/pytorch/issues/147282/comments"):
            body, code = COMMENTS, 200
        elif self.path.startswith("/repos/pytorch/pytorch/issues/403"):
            body, code = {"message": "API rate limit exceeded"}, 403
        else:
            body, code = {"message": "Not Found"}, 404
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture()
def api():
    _Api.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_url_is_fetched_through_the_api_with_the_token(api, monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", "t0ken")
    page = fetch_issue("https://github.com/pytorch/pytorch/issues/147282", api_base=api)
    assert page.title == ISSUE["title"] and page.number == 147282 and page.state == "closed"
    assert str(page.created) == "2025-02-16" and "Confirmed on main." in page.text
    assert all(auth == "Bearer t0ken" for _, auth in _Api.seen) and len(_Api.seen) == 2
    inf = infer(page)
    assert inf.torch == "2.5.1" and inf.expect == {"stdout_contains_normalized": "should not run"}


def test_without_token_no_authorization_header(api, monkeypatch):
    monkeypatch.delenv("GITHUB_TOKEN", raising=False)
    fetch_issue("https://github.com/pytorch/pytorch/issues/147282", api_base=api)
    assert _Api.seen and all(auth is None for _, auth in _Api.seen)


def test_http_errors_say_what_to_do(api):
    with pytest.raises(IssueFetchError) as e:
        fetch_issue("https://github.com/pytorch/pytorch/issues/403", api_base=api)
    assert "403" in str(e.value) and "GITHUB_TOKEN" in str(e.value)
    with pytest.raises(IssueFetchError) as e:
        fetch_issue("https://github.com/pytorch/pytorch/issues/1", api_base=api)
    assert "404" in str(e.value)


def test_unreachable_api(monkeypatch):
    with pytest.raises(IssueFetchError) as e:
        fetch_issue("https://github.com/pytorch/pytorch/issues/1", api_base="http://127.0.0.1:9", timeout=2)
    assert "save the page" in str(e.value).lower()


def test_saved_api_json_with_comments(tmp_path: Path):
    path = tmp_path / "issue.json"
    path.write_text(json.dumps({"issue": ISSUE, "comments": COMMENTS}))
    page = fetch_issue(str(path))
    assert page.url == ISSUE["html_url"] and "Confirmed on main." in page.text


def test_saved_html(tmp_path: Path):
    path = tmp_path / "issue.html"
    path.write_text("<!doctype html><html><head><script>x()</script></head><body><h1>Bad sum on arm</h1>"
                    "<relative-time datetime=\"2023-05-25T01:02:03Z\"></relative-time>"
                    "<p>on ARM64 machine,</p><pre><code>import torch\nprint(torch.ones(3).sum())  # got tensor(2.)\n"
                    "</code></pre><p>PyTorch version: 2.3.1</p></body></html>")
    page = fetch_issue(str(path))
    assert page.title == "Bad sum on arm" and str(page.created) == "2023-05-25"
    inf = infer(page)
    assert inf.torch == "2.3.1" and inf.arch.value == "arm64"
    assert inf.expect == {"stdout_contains_normalized": "tensor(2.)"}


def test_not_an_issue_url_or_file():
    with pytest.raises(IssueError):
        fetch_issue("https://example.com/x")
    with pytest.raises(IssueError):
        fetch_issue("/nonexistent/page.md")
