"""Fetch an issue page: a GitHub issue URL (REST API, GITHUB_TOKEN when set), the API's JSON saved to
a file, or the issue's Markdown or HTML saved to a file. The result is one `IssuePage`: the page as
Markdown text (description, then comments), with its title, URL and date when known."""

from __future__ import annotations

import html
import html.parser
import json
import os
import re
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from lab.core import http
from lab.core.errors import LabError
from lab.core.scrub import redact_url

__all__ = ["IssueError", "IssueFetchError", "IssuePage", "fetch_issue", "page_from_api", "page_from_text"]

API_BASE = "https://api.github.com"
TIMEOUT_S = 30.0
MAX_PAGE_BYTES = 4 << 20
MAX_COMMENTS = 100
_ISSUE_URL = re.compile(r"https?://github\.com/([\w.-]+)/([\w.-]+)/(?:issues|pull)/(\d+)/?(?:[#?].*)?")
_DATE = re.compile(r"\b(20\d\d-[01]\d-[0-3]\d)(?!\d)")


class IssueError(LabError):
    """The page cannot be used: no such file, not an issue, no code block to run."""


class IssueFetchError(LabError):
    """The issue could not be fetched (network, HTTP error, rate limit)."""


@dataclass(frozen=True)
class IssuePage:
    """An issue as Markdown: `text` holds the description then each comment, as the page shows them."""

    text: str
    source: str
    url: str | None = None
    title: str | None = None
    number: int | None = None
    created: date | None = None
    state: str | None = None

    @property
    def lines(self) -> list[str]:
        return self.text.splitlines()


def fetch_issue(source: str, *, token: str | None = None, api_base: str | None = None,
                timeout: float = TIMEOUT_S) -> IssuePage:
    """`source` is an issue URL, or a file: API JSON (.json), HTML (.html/.htm) or Markdown (anything else)."""
    match = _ISSUE_URL.fullmatch(source.strip())
    if match:
        owner, repo, number = match.groups()
        base = (api_base or os.environ.get("LAB_GITHUB_API") or API_BASE).rstrip("/")
        token = token if token is not None else os.environ.get("GITHUB_TOKEN")
        issue = _get_json(f"{base}/repos/{owner}/{repo}/issues/{number}", token, timeout)
        comments = []
        if isinstance(issue, dict) and issue.get("comments"):
            got = _get_json(f"{base}/repos/{owner}/{repo}/issues/{number}/comments?per_page={MAX_COMMENTS}",
                            token, timeout)
            comments = got if isinstance(got, list) else []
        return page_from_api(issue, comments, source=source)
    if source.startswith(("http://", "https://")):
        raise IssueError(f"{source!r} is not a GitHub issue URL.",
                         hint="Give https://github.com/OWNER/REPO/issues/N, or save the page to a file and "
                              "pass its path.")
    path = Path(source).expanduser()
    if not path.is_file():
        raise IssueError(f"{source}: no such file.", hint="Give an issue URL, or the path of the page saved as "
                         "Markdown, HTML or the GitHub API's JSON.")
    data = path.read_bytes()[:MAX_PAGE_BYTES]
    text = data.decode("utf-8", errors="replace").removeprefix("\ufeff")
    suffix = path.suffix.lower()
    if suffix == ".json":
        try:
            loaded = json.loads(text)
        except ValueError as e:
            raise IssueError(f"{source}: not JSON ({e}).", hint="Save the API's answer as it came.") from None
        if isinstance(loaded, dict) and "issue" in loaded:
            return page_from_api(loaded["issue"], loaded.get("comments") or [], source=source)
        return page_from_api(loaded, [], source=source)
    if suffix in (".html", ".htm") or text.lstrip()[:15].lower().startswith(("<!doctype", "<html")):
        return page_from_text(html_to_markdown(text), source=source)
    return page_from_text(text, source=source)


def page_from_api(issue, comments, *, source: str) -> IssuePage:
    """An issue object of the GitHub REST API (and its comments) as one page."""
    if not isinstance(issue, dict) or "title" not in issue:
        raise IssueError(f"{source}: not a GitHub issue object (no `title`).")
    parts = [f"# {issue.get('title', '')}", "", _api_meta(issue, "description"), issue.get("body") or ""]
    for c in comments[:MAX_COMMENTS]:
        if isinstance(c, dict):
            parts += ["", _api_meta(c, "comment"), c.get("body") or ""]
    created = _parse_date(str(issue.get("created_at") or ""))
    return IssuePage(text="\n".join(parts).replace("\r\n", "\n"), source=source, url=issue.get("html_url"),
                     title=str(issue.get("title") or "").strip() or None, number=issue.get("number"),
                     created=created, state=issue.get("state"))


def _api_meta(item: dict, kind: str) -> str:
    user = (item.get("user") or {}).get("login", "?") if isinstance(item.get("user"), dict) else "?"
    return f"{user} · {kind} · {str(item.get('created_at') or '')[:10]}"


_FRONT = re.compile(r"\A---\n(.*?)\n---\n", re.S)


def page_from_text(text: str, *, source: str) -> IssuePage:
    """A page saved as Markdown: an optional front matter (url, title, created_at, state), the first
    `# ` heading as title, the first ISO date as the issue's date, an issue URL or `issue #N` line."""
    text = re.sub(r"<!--.*?-->", "", text.replace("\r\n", "\n"))  # not rendered on the page either
    meta: dict[str, str] = {}
    front = _FRONT.match(text)
    if front:
        for line in front.group(1).splitlines():
            key, sep, value = line.partition(":")
            if sep:
                meta[key.strip().lower()] = value.strip().strip('"')
    title = meta.get("title") or next((ln[2:].strip() for ln in text.splitlines() if ln.startswith("# ")), None)
    url = meta.get("url") or meta.get("source")
    if not url:
        found = _ISSUE_URL.search(text)
        url = found.group(0) if found else None
    number = None
    if url and (m := _ISSUE_URL.match(url)):
        number = int(m.group(3))
    elif m2 := re.search(r"\bissue #(\d+)", text[:400]):
        number = int(m2.group(1))
    created = _parse_date(meta.get("created_at") or meta.get("created") or "")
    if created is None:
        body = text[front.end():] if front else text
        first = _DATE.search(body)
        created = _parse_date(first.group(1)) if first else None
    state = meta.get("state") or (m3.group(1) if (m3 := re.search(r"· (open|closed|merged) ·", text[:400])) else None)
    return IssuePage(text=text, source=source, url=url, title=title, number=number, created=created, state=state)


def _parse_date(text: str) -> date | None:
    m = _DATE.search(text)
    if not m:
        return None
    try:
        return date.fromisoformat(m.group(1))
    except ValueError:
        return None


def _get_json(url: str, token: str | None, timeout: float):
    """One GET of GitHub's REST API through lab.core.http (the system's trust store, the
    environment's proxies), the body read up to MAX_PAGE_BYTES."""
    headers = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        body = http.get(url, timeout=timeout, headers=headers, max_bytes=MAX_PAGE_BYTES).body
    except http.HttpStatusError as e:
        hint = None
        if e.status in (401, 403, 429):
            hint = ("GitHub refused the request (rate limit or token): set GITHUB_TOKEN, or save the page "
                    "(or the API's JSON) to a file and pass its path.")
        elif e.status == 404:
            hint = "Check the URL; a private repository needs GITHUB_TOKEN."
        raise IssueFetchError(str(e), hint=hint) from None
    except http.HttpUnreachableError as e:
        reason = f"no answer within {timeout:g} s" if e.timed_out else e.reason
        raise IssueFetchError(f"could not reach {e.url}: {reason}.",
                              hint="Save the page (or the API's JSON) to a file and pass its path.") from None
    try:
        return json.loads(body.decode("utf-8", errors="replace"))
    except ValueError:
        raise IssueFetchError(f"{redact_url(url)} did not answer JSON.") from None


# ----------------------------------------------------------------------------- HTML

class _HtmlText(html.parser.HTMLParser):
    """HTML to Markdown-ish text: <pre> blocks become fenced code blocks, headings `#` lines; scripts,
    styles and navigation are dropped."""

    _SKIP = {"script", "style", "nav", "header", "footer", "svg", "template"}
    _BLOCK = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "details", "summary",
              "table", "ul", "ol", "blockquote", "relative-time"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.skip = 0
        self.pre = 0

    def handle_starttag(self, tag, attrs):
        if tag in self._SKIP:
            self.skip += 1
        elif tag == "pre":
            self.pre += 1
            self.out.append("\n```\n")
        elif tag in self._BLOCK:
            self.out.append("\n")
            if tag in ("h1", "h2", "h3"):
                self.out.append("#" * int(tag[1]) + " ")
        if tag == "relative-time":
            stamp = dict(attrs).get("datetime")
            if stamp:
                self.out.append(f" {stamp[:10]} ")

    def handle_endtag(self, tag):
        if tag in self._SKIP:
            self.skip = max(0, self.skip - 1)
        elif tag == "pre":
            self.pre = max(0, self.pre - 1)
            self.out.append("\n```\n")
        elif tag in self._BLOCK:
            self.out.append("\n")

    def handle_data(self, data):
        if not self.skip:
            self.out.append(data)


def html_to_markdown(text: str) -> str:
    parser = _HtmlText()
    parser.feed(text)
    parser.close()
    joined = html.unescape("".join(parser.out))
    return re.sub(r"\n{3,}", "\n\n", joined)
