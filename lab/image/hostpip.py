"""The host's pip settings and CA bundle, carried into image builds.

Behind a TLS-intercepting proxy (corporate, or this lab's CI) pip inside a build
fails with CERTIFICATE_VERIFY_FAILED unless it trusts the same CA bundle as the
host. Local wheel sources (find-links folders, ``file://`` simple indexes) do not
exist inside the build, so the wheels they hold for the requested projects are
copied into the build context instead.
"""

from __future__ import annotations

import hashlib
import html.parser
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

from packaging.requirements import Requirement
from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from lab.core import pipconf
from lab.core.scrub import is_secret_url, strip_url_credentials

CA_ENV_VARS = ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
PROXY_ENV_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")


@dataclass(frozen=True, slots=True)
class HostPip:
    """What the host's pip would use: indexes, local wheel sources and the CA bundle."""

    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    trusted_hosts: tuple[str, ...] = ()
    ca_bundle: Path | None = None
    proxies: tuple[tuple[str, str], ...] = ()

    @property
    def remote_indexes(self) -> tuple[str, ...]:
        return tuple(u for u in self.extra_index_urls if not is_host_folder(u))

    @property
    def local_sources(self) -> tuple[str, ...]:
        """find-links folders and file:// indexes: they must travel as files."""
        urls = [u for u in self.find_links if is_host_folder(u)]
        urls += [u for u in self.extra_index_urls if is_host_folder(u)]
        if self.index_url and is_host_folder(self.index_url):
            urls.append(self.index_url)
        return tuple(urls)

    @property
    def remote_urls(self) -> tuple[str, ...]:
        """Every remote index, extra index and find-links URL (local folders are not)."""
        urls = [self.index_url or "", *self.extra_index_urls, *self.find_links]
        return tuple(u for u in urls if u and not is_host_folder(u))

    @property
    def has_credentials(self) -> bool:
        """Whether a remote index or find-links URL is a secret (lab.core.scrub.is_secret_url: any
        URL but a bare one on a public host such as pypi.org): then a build gets the indexes only
        through the one-shot pip.conf (lab.buildsecret), never through its context."""
        return any(is_secret_url(u) for u in self.remote_urls)

    def pip_conf(self, ca_path: str | None, wheel_dir: str, *, credentials: bool = False) -> str:
        """The pip.conf for inside the image: the CA, the image's wheel folder and only the remote
        URLs that are not secrets (a bare public index such as PyPI's or PyTorch's); with
        `credentials`, for the copy a build fetches and deletes in its pip step, every URL as it is.
        A secret URL is dropped whole, not redacted: a URL without its token names nothing pip could
        use, and the image needs no index at run time."""
        def keep(urls) -> list[str]:
            return [u for u in urls if credentials or not is_secret_url(u)]

        lines = ["[global]"]
        dropped = [u for u in self.remote_urls if u not in keep(self.remote_urls)]
        if dropped:  # their identity only, so that another index still makes another image
            ident = hashlib.sha256("\n".join(sorted(strip_url_credentials(u) for u in dropped)).encode())
            lines.append(f"# {len(dropped)} index URL(s) of the host are secrets and are not written here "
                         f"(sha256:{ident.hexdigest()[:16]}); the lab's build got them through a one-shot URL")
        if ca_path:
            lines.append(f"cert = {ca_path}")
        if self.index_url and not is_host_folder(self.index_url) and keep([self.index_url]):
            lines.append(f"index-url = {self.index_url}")
        if keep(self.remote_indexes):
            lines.append("extra-index-url = " + " ".join(keep(self.remote_indexes)))
        remote_links = keep(u for u in self.find_links if not is_host_folder(u))
        lines.append("find-links = " + " ".join([wheel_dir, *remote_links]))
        if self.trusted_hosts:
            lines.append("trusted-host = " + " ".join(self.trusted_hosts))
        return "\n".join(lines) + "\n"

    def index_settings(self) -> dict[str, object]:
        """What decides which distributions an install can see (for cache keys): not the CA or proxies."""
        return {"index_url": self.index_url, "extra_index_urls": list(self.extra_index_urls),
                "find_links": list(self.find_links), "trusted_hosts": list(self.trusted_hosts)}

    def uv_args(self) -> list[str]:
        """The same sources for `uv pip`, explicitly. uv would stop at the first index that has a
        project; `unsafe-best-match` looks at every index, as pip does."""
        args = ["--index-strategy", "unsafe-best-match"]
        if self.index_url:
            args += ["--index-url", self.index_url]
        for url in self.extra_index_urls:
            args += ["--extra-index-url", url]
        for link in self.find_links:
            args += ["--find-links", link]
        for host in self.trusted_hosts:
            args += ["--allow-insecure-host", host]
        return args

    def uv_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """`env` without uv's own settings (the lab passes everything as flags), plus the CA bundle
        and the proxies."""
        out = {k: v for k, v in env.items() if not k.startswith("UV_")}
        if self.ca_bundle:
            out["SSL_CERT_FILE"] = str(self.ca_bundle)
        out.update(dict(self.proxies))
        return out


def is_host_folder(url: str) -> bool:
    """A find-links folder or a file:// index: it exists on this host only."""
    scheme = urlparse(url).scheme
    return scheme in ("", "file")


def to_path(url: str) -> Path:
    parsed = urlparse(url)
    return Path(unquote(parsed.path)) if parsed.scheme == "file" else Path(url)


def discover(env: Mapping[str, str] | None = None) -> HostPip:
    """Read pip.conf files and PIP_* variables the way pip does (variables win)."""
    env = os.environ if env is None else env
    conf = pipconf.read_config(pipconf.config_files(env))

    def setting(name: str) -> str | None:
        return env.get("PIP_" + name.upper().replace("-", "_")) or conf.get(name)

    ca = next((env[v] for v in CA_ENV_VARS if env.get(v)), None) or conf.get("cert")
    ca_path = Path(ca) if ca and Path(ca).is_file() else None
    return HostPip(
        index_url=setting("index-url"),
        extra_index_urls=pipconf.split(setting("extra-index-url")),
        find_links=pipconf.split(setting("find-links")),
        trusted_hosts=pipconf.split(setting("trusted-host")),
        ca_bundle=ca_path,
        proxies=tuple((k, env[k]) for k in PROXY_ENV_VARS if env.get(k)),
    )


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs.extend(v for k, v in attrs if k == "href" and v)


def _candidates(source: str, project: str) -> list[Path]:
    """Wheel files a local source offers for `project` (a find-links folder or a file:// index)."""
    root = to_path(source)
    if not root.is_dir():
        return []
    page = root / project / "index.html"
    if page.is_file():  # PEP 503 simple index on disk
        parser = _Links()
        parser.feed(page.read_text(encoding="utf-8", errors="replace"))
        base = page.as_uri()
        return [to_path(urljoin(base, h.split("#", 1)[0])) for h in parser.hrefs]
    return sorted(p for p in root.iterdir() if p.suffix == ".whl")


def local_wheels(host: HostPip, requirements: Iterable[str], tags: frozenset[Tag]) -> list[Path]:
    """For each requirement, the newest wheel in the host's local sources that fits `tags`.

    Only top-level requirements are looked up: their dependencies come from the
    (remote) indexes, like any other pip install.
    """
    chosen: list[Path] = []
    for text in requirements:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        best: tuple[object, Path] | None = None
        for source in host.local_sources:
            for path in _candidates(source, name):
                try:
                    wname, version, _, wtags = parse_wheel_filename(path.name)
                except InvalidWheelFilename:
                    continue
                if wname != name or not path.is_file() or not (wtags & tags):
                    continue
                if not req.specifier.contains(version, prereleases=True):
                    continue
                if best is None or version > best[0]:
                    best = (version, path)
        if best is not None:
            chosen.append(best[1])
    return chosen
