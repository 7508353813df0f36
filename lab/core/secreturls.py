"""Which URLs are secrets, and the one redaction of a URL: what lab.core.config shows of its
settings and lab.core.scrub builds its text scrubbing on (kept apart so that the settings, which
scrub reads for the lab's Debian mirror, do not import scrub)."""

from __future__ import annotations

from urllib.parse import urlsplit

# Hosts whose URL paths name public things: a bare URL there (no user info, no query) is no secret.
PUBLIC_HOSTS = frozenset({"pypi.org", "files.pythonhosted.org", "download.pytorch.org", "deb.debian.org",
                          "security.debian.org", "github.com", "api.github.com"})
ELLIPSIS = "\u2026"


def _parts(url: str):
    """urlsplit, or None when `url` is not a remote URL (a local folder, a file:// URL, garbage)."""
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018  (raises on a bad port)
    except ValueError:
        return None
    if not parts.scheme or parts.scheme == "file" or not parts.hostname or "://" not in url:
        return None
    return parts


def is_secret_url(url: str) -> bool:
    """Whether `url` (an index, extra index, find-links URL or mirror) is a secret: every remote URL
    is, but a bare one (no user info, query or fragment) on a public host (PUBLIC_HOSTS). A local
    folder or a file:// URL is not a secret (it names nothing a stranger could use)."""
    parts = _parts(url)
    if parts is None:
        return False
    bare = not (parts.username or parts.password or parts.query or parts.fragment or "@" in parts.netloc)
    return not (bare and parts.hostname.lower() in PUBLIC_HOSTS)


def redact_url(url: str) -> str:
    """The one redaction of a URL: `https://user:tok@host:8443/TOKEN/simple?x=1` becomes
    `https://host:8443/…`. A URL that is not a secret (is_secret_url) is returned as it is."""
    if not is_secret_url(url):
        return url
    parts = _parts(url)
    port = f":{parts.port}" if parts.port else ""
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}{port}/{ELLIPSIS}"
