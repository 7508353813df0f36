"""Candidate releases for a bisection: the versions of a project that have a wheel for the case.

The host's pip decides where releases come from, so this reads every source it
would use: the index (PyPI by default), the extra indexes, and find-links
(folders, `file://` simple indexes, or remote pages). Remote indexes are read
through the JSON simple API (PEP 691), falling back to the HTML one (PEP 503),
with the host's CA bundle and a timeout. Yanked files do not count. A version
is a candidate when at least one of its wheels fits the case's tags and
Python; the version string is kept as published (`2.13.0+cpu`).

The file list of each remote page is cached as JSON in the lab's cache folder
for a day (`refresh=True` reads it again).
"""

from __future__ import annotations

import contextlib
import hashlib
import html.parser
import json
import os
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from lab.core import cache, http
from lab.core.arch import Arch
from lab.core.errors import LabError
from lab.core.scrub import redact_url
from lab.image.hostpip import HostPip, is_host_folder, to_path
from lab.image.resolve import wheel_tags

DEFAULT_INDEX = "https://pypi.org/simple"
MAX_AGE_S = 24 * 3600
TIMEOUT_S = 30.0
ACCEPT = ("application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, "
          "text/html;q=0.01")
_CACHE_FORMAT = 2  # 2: with each file's upload time


class ReleaseError(LabError):
    """A requested release is not a candidate, or the range is empty or reversed."""


class IndexUnreachableError(LabError):
    """A package index could not be read (network, TLS, HTTP error or a malformed page)."""


@dataclass(frozen=True, slots=True)
class IndexFile:
    """One file an index offers: its name, whether it is yanked, and its Requires-Python."""

    filename: str
    yanked: bool = False
    requires_python: str | None = None
    upload_time: str | None = None   # PEP 700 `upload-time` (JSON API only), ISO 8601


# -- public API -------------------------------------------------------------------------------------

def describe(python: str, arch: Arch | str) -> str:
    """What a candidate needs, in words: `aarch64 cp311 wheel`."""
    major, minor = python.split(".")[:2]
    return f"{Arch.parse(arch).uname} cp{major}{minor} wheel"


def candidates(project: str = "torch", *, host: HostPip | None = None, python: str = "3.11",
               arch: Arch | str = "arm64", tags: frozenset[Tag] | None = None, include_pre: bool = False,
               cache_dir: Path | None = None, refresh: bool = False, timeout: float = TIMEOUT_S,
               max_age_s: float = MAX_AGE_S) -> list[str]:
    """Versions of `project` (oldest first) with at least one unyanked wheel that fits `tags`.

    `tags` defaults to those of `python` on `arch`. Every source of `host` is read
    (the index, PyPI when none is set, extra indexes, find-links). Raises
    IndexUnreachableError when a remote source cannot be read.
    """
    host = host or HostPip()
    tags = tags if tags is not None else wheel_tags(python, arch)
    folder = Path(cache_dir) if cache_dir is not None else cache.cache_dir("index")
    name = canonicalize_name(project)
    found: dict[Version, str] = {}
    for kind, url in sources(host):
        files = _files(kind, url, name, host=host, folder=folder, refresh=refresh, timeout=timeout,
                       max_age_s=max_age_s)
        for published, version in _fitting(files, name, tags, python):
            if include_pre or not version.is_prerelease:
                found.setdefault(version, published)
    return [found[v] for v in sorted(found)]


def upload_time(project: str, version: str, *, host: HostPip | None = None, python: str = "3.11",
                arch: Arch | str = "arm64", cache_dir: Path | None = None, refresh: bool = False,
                timeout: float = TIMEOUT_S, max_age_s: float = MAX_AGE_S) -> str | None:
    """When `version` of `project` was published: the earliest PEP 700 `upload-time` of its wheels
    that fit `python` on `arch` (any of its files when none fits), across the host's remote
    indexes. A local build (`2.13.0+cpu` from a find-links folder) has no upload time of its own:
    its public version's is used. None when no index says (HTML-only indexes, folders)."""
    host = host or HostPip()
    tags = wheel_tags(python, arch)
    folder = Path(cache_dir) if cache_dir is not None else cache.cache_dir("index")
    name = canonicalize_name(project)
    try:
        wanted = Version(version)
    except InvalidVersion:
        return None
    fitting: list[str] = []
    other: list[str] = []
    for public in (False, True):
        for kind, url in sources(host):
            if is_host_folder(url):
                continue
            files = _files(kind, url, name, host=host, folder=folder, refresh=refresh, timeout=timeout,
                           max_age_s=max_age_s)
            for f in files:
                if not f.upload_time or f.yanked:
                    continue
                try:
                    wname, v, _, wtags = parse_wheel_filename(f.filename)
                except (InvalidWheelFilename, InvalidVersion):
                    continue
                if wname != name or (v.public != wanted.public if public else v != wanted):
                    continue
                (fitting if wtags & tags else other).append(f.upload_time)
        if fitting or other:
            break
    found = fitting or other
    return min(found, key=_iso_key) if found else None


def _iso_key(text: str) -> str:
    return text.replace("Z", "+00:00")


def between(versions: Sequence[str], old: str, new: str, *, what: str = "compatible wheel") -> list[str]:
    """The candidates from `old` to `new`, both included, oldest first.

    `old` and `new` match a candidate exactly, or by public version when the
    index only has one local build of it (`2.13.0` finds `2.13.0+cpu`).
    `what` names the wheel in errors (see `describe`).
    """
    ordered = sorted(versions, key=Version)
    if not ordered:
        raise ReleaseError(f"no release on the index has a {what}.",
                           hint="Check --arch and the scenario's base image (its Python), or the host's "
                                "pip settings (index-url, extra-index-url, find-links).")
    i, j = _locate(ordered, old, what, "--from"), _locate(ordered, new, what, "--to")
    if i >= j:
        raise ReleaseError(f"--from {old} is not older than --to {new}.",
                           hint="Give the older release as --from and the newer one as --to "
                                "(the direction of the change does not matter).")
    return ordered[i:j + 1]


def sources(host: HostPip) -> list[tuple[str, str]]:
    """Where the host's pip looks, as (`index` | `links`, url): the index, extra indexes, find-links."""
    found = [("index", host.index_url or DEFAULT_INDEX)]
    found += [("index", u) for u in host.extra_index_urls]
    found += [("links", u) for u in host.find_links]
    return list(dict.fromkeys(found))


# -- choosing versions ------------------------------------------------------------------------------

def _fitting(files: Iterable[IndexFile], name: str, tags: frozenset[Tag], python: str):
    for f in files:
        if f.yanked or not f.filename.endswith(".whl"):
            continue
        try:
            wname, version, _, wtags = parse_wheel_filename(f.filename)
        except (InvalidWheelFilename, InvalidVersion):
            continue
        if wname != name or not (wtags & tags) or not _python_ok(f.requires_python, python):
            continue
        yield f.filename.split("-")[1], version


def _python_ok(requires: str | None, python: str) -> bool:
    if not requires:
        return True
    try:
        return SpecifierSet(requires).contains(python, prereleases=True)
    except InvalidSpecifier:
        return True  # pip ignores a malformed Requires-Python too


def _locate(ordered: list[str], wanted: str, what: str, option: str) -> int:
    try:
        target = Version(wanted)
    except InvalidVersion:
        raise ReleaseError(f"{option} {wanted!r} is not a version number.") from None
    exact = [i for i, v in enumerate(ordered) if Version(v) == target]
    if exact:
        return exact[0]
    if not target.local:
        local = [i for i, v in enumerate(ordered) if Version(v).public == target.public]
        if len(local) == 1:
            return local[0]
        if local:
            raise ReleaseError(f"{option} {wanted} matches several builds: "
                               f"{', '.join(ordered[i] for i in local)}.", hint="Name one of them.")
    below = [v for v in ordered if Version(v) < target][-1:]
    above = [v for v in ordered if Version(v) > target][:1]
    raise ReleaseError(f"{wanted} has no {what} on the index; nearest: {', '.join(below + above)}.",
                       hint="Choose one of the candidates (`--pre` includes pre-releases).")


# -- reading sources --------------------------------------------------------------------------------

def _files(kind: str, url: str, name: str, *, host: HostPip, folder: Path, refresh: bool, timeout: float,
           max_age_s: float) -> list[IndexFile]:
    if is_host_folder(url):
        return _local_files(kind, to_path(url), name)
    page = page_url(url, name) if kind == "index" else url
    path = folder / f"{name}-{hashlib.sha256(page.encode()).hexdigest()[:20]}.json"
    if not refresh and (cached := _read_cache(path, page, max_age_s)) is not None:
        return cached
    files = _remote_files(page, host, timeout)
    if kind == "links":
        files = [f for f in files if _project_of(f.filename) == name]
    _write_cache(path, page, files)
    return files


def _local_files(kind: str, root: Path, name: str) -> list[IndexFile]:
    if kind == "index" or (root / name / "index.html").is_file():
        page = root / name / "index.html"
        if not page.is_file():
            return []
        return _parse_html(page.read_text(encoding="utf-8", errors="replace"))
    if root.is_file():  # a find-links HTML page on disk
        files = _parse_html(root.read_text(encoding="utf-8", errors="replace"))
    elif root.is_dir():
        files = [IndexFile(p.name) for p in sorted(root.iterdir()) if p.is_file()]
    else:
        return []
    return [f for f in files if _project_of(f.filename) == name]


def _project_of(filename: str) -> str | None:
    try:
        return parse_wheel_filename(filename)[0]
    except (InvalidWheelFilename, InvalidVersion):
        return None


def _remote_files(url: str, host: HostPip, timeout: float) -> list[IndexFile]:
    got = _get(url, host, timeout)
    if got is None:
        return []  # 404: this index does not have the project, as pip treats it
    content_type, body = got
    try:
        if "json" in content_type:
            return _parse_json(json.loads(body))
        return _parse_html(body.decode("utf-8", errors="replace"))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise IndexUnreachableError(f"{redact_url(url)} returned a page that is not a simple index ({exc}).") \
            from None


# Why a small parser and not pypi-simple or unearth: the lab needs only the file names of one
# project (PEP 691 JSON, PEP 503 HTML, a find-links folder, file:// indexes), with the host's CA
# bundle, trusted hosts and proxies applied the way pip applies them, and a day's cache. Versions
# and wheel tags are `packaging`'s (parse_wheel_filename, Version). The two page parsers below
# are about 40 lines; a client library would bring its own HTTP stack and settings to reconcile.
def _parse_json(data: dict) -> list[IndexFile]:
    """PEP 691: `files[]` with `filename`, `yanked` (false, true or a reason), `requires-python`."""
    out = []
    for f in data["files"]:
        yanked = f.get("yanked", False)
        out.append(IndexFile(unquote(f["filename"]), yanked is True or isinstance(yanked, str),
                             f.get("requires-python") or None, f.get("upload-time") or None))
    return out


class _Anchors(html.parser.HTMLParser):
    """PEP 503: each `<a href>` is a file; `data-yanked` marks it yanked, `data-requires-python` limits it."""

    def __init__(self) -> None:
        super().__init__()
        self.files: list[IndexFile] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag != "a":
            return
        a = dict(attrs)
        href = a.get("href")
        if not href:
            return
        filename = unquote(urlparse(href).path.rsplit("/", 1)[-1])
        if filename:
            self.files.append(IndexFile(filename, "data-yanked" in a, a.get("data-requires-python") or None))


def _parse_html(text: str) -> list[IndexFile]:
    parser = _Anchors()
    parser.feed(text)
    parser.close()
    return parser.files


def _get(url: str, host: HostPip, timeout: float) -> tuple[str, bytes] | None:
    """GET through lab.core.http with the host's CA bundle (none checked on a trusted host, as
    pip's --trusted-host), proxies and credentials; None on 404/410."""
    hostname = urlparse(url).hostname or ""
    verify: str | bool | None = False if hostname in host.trusted_hosts else (
        str(host.ca_bundle) if host.ca_bundle else None)
    try:
        got = http.get(url, timeout=timeout, headers={"Accept": ACCEPT}, verify=verify, ok=(404, 410),
                       proxies=http.proxy_map(host.proxies) if host.proxies else None)
    except http.HttpStatusError as exc:
        raise IndexUnreachableError(str(exc)) from None
    except http.HttpUnreachableError as exc:
        if exc.timed_out:
            raise IndexUnreachableError(str(exc)) from None
        hint = None
        if "CERTIFICATE_VERIFY_FAILED" in exc.reason:
            hint = ("Behind a TLS-intercepting proxy, point PIP_CERT (or `cert` in pip.conf) at its CA bundle"
                    + (f"; now {host.ca_bundle}." if host.ca_bundle else "."))
        elif host.ca_bundle and not host.ca_bundle.is_file():
            raise IndexUnreachableError(f"the CA bundle {host.ca_bundle} could not be loaded: {exc.reason}.") from None
        raise IndexUnreachableError(f"could not read {exc.url}: {exc.reason}.", hint=hint) from None
    if got.status in (404, 410):
        return None
    return got.content_type, got.body


def _cache_id(page: str) -> str:
    """What a cache file records of the page it holds: the redacted URL and a digest of the whole,
    so a secret URL is never written in the clear and two indexes on one host stay apart."""
    return f"{redact_url(page)} sha256:{hashlib.sha256(page.encode()).hexdigest()[:32]}"


# -- cache ------------------------------------------------------------------------------------------

def _read_cache(path: Path, page: str, max_age_s: float) -> list[IndexFile] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != _CACHE_FORMAT or data.get("url") != _cache_id(page):
            return None
        age = time.time() - float(data["fetched_at"])
        if not 0 <= age < max_age_s:
            return None
        return [IndexFile(f["filename"], bool(f["yanked"]), f.get("requires_python"), f.get("upload_time"))
                for f in data["files"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cache(path: Path, page: str, files: list[IndexFile]) -> None:
    data = {"format": _CACHE_FORMAT, "url": _cache_id(page), "fetched_at": time.time(),
            "files": [{"filename": f.filename, "yanked": f.yanked, "requires_python": f.requires_python,
                       "upload_time": f.upload_time}
                      for f in files if f.filename.endswith(".whl")]}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=0, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def page_url(index_url: str, project: str) -> str:
    """The simple-API page of `project` on an index (`<index>/<name>/`)."""
    return urljoin(index_url.rstrip("/") + "/", canonicalize_name(project) + "/")
