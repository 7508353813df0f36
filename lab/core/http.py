"""The lab's one HTTP client, on `requests`: GitHub's REST API (lab.issue.fetch) and package indexes
(lab.image.releases, and through it the era lookups of lab.image.era).

One `get` for both: a timeout on every request, the certificate check its caller chooses (a CA
bundle's path, the system's trust store, or none for pip's `--trusted-host`), credentials in a URL's
user info sent as Basic auth and never shown, proxies from the environment (HTTP(S)_PROXY, honouring
NO_PROXY) or the ones the caller names, and a cap on the body read. Nothing else of the environment
is read: no ~/.netrc, no REQUESTS_CA_BUNDLE (a session with `trust_env` off). No request is retried:
neither caller retried before, and a bisection reads each index page once a day (the cache).

Every URL in what this module raises goes through the one redaction, lab.core.scrub.redact_url (and
the reason's text through redact_urls), so an index whose address holds a token is named
`scheme://host/…`. The errors are not LabErrors: each caller turns them into its own error type with
its own hint.
"""

from __future__ import annotations

import base64
import socket
import ssl
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlparse, urlunparse

import requests
import urllib3
from requests.utils import get_environ_proxies, should_bypass_proxies

from lab.core.scrub import redact_url, redact_urls

__all__ = ["USER_AGENT", "HttpError", "HttpStatusError", "HttpUnreachableError", "Response", "get", "proxy_map",
           "split_credentials", "system_trust"]

USER_AGENT = "torch-repro-lab"
_CHUNK = 64 * 1024


@dataclass(frozen=True)
class Response:
    status: int
    content_type: str
    body: bytes


class HttpError(Exception):
    """A request that gave no usable answer; `url` is already redacted."""

    def __init__(self, url: str, message: str) -> None:
        super().__init__(message)
        self.url = url


class HttpStatusError(HttpError):
    """The server answered with an HTTP error (4xx, 5xx)."""

    def __init__(self, url: str, status: int, reason: str) -> None:
        super().__init__(url, f"{url} answered HTTP {status} {reason}.")
        self.status, self.reason = status, reason


class HttpUnreachableError(HttpError):
    """No answer: refused, unresolved, TLS failure, or none within the timeout (`timed_out`)."""

    def __init__(self, url: str, reason: str, timed_out: bool, timeout: float) -> None:
        super().__init__(url, f"{url} did not answer within {timeout:g} s." if timed_out
                         else f"could not reach {url}: {reason}.")
        self.reason, self.timed_out = reason, timed_out


def system_trust() -> str | bool:
    """The system's trust store as `verify` takes it (OpenSSL's default paths, which honour
    SSL_CERT_FILE and SSL_CERT_DIR, as urllib did), not certifi's bundle that requests brings."""
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.capath):
        if candidate:
            return candidate
    return True


def get(url: str, *, timeout: float, headers: Mapping[str, str] | None = None, verify: str | bool | None = None,
        proxies: Mapping[str, str] | None = None, max_bytes: int | None = None,
        ok: tuple[int, ...] = ()) -> Response:
    """GET `url`. `verify`: a CA bundle's path, False (no check), or None for the system's trust store.
    `proxies`: {"http": ..., "https": ...}, or None for the environment's. An HTTP error status
    raises HttpStatusError unless it is in `ok` (then it is returned, with its body)."""
    bare, auth = split_credentials(url)
    shown = redact_url(url)
    sent = {"User-Agent": USER_AGENT, **(headers or {})}
    if auth:
        sent["Authorization"] = "Basic " + base64.b64encode(auth.encode()).decode()
    with requests.Session() as session, warnings.catch_warnings():
        session.trust_env = False  # no ~/.netrc, no REQUESTS_CA_BUNDLE: only what is passed here
        if verify is False:  # pip's --trusted-host: the caller asked for no check, so no warning either
            warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
        try:
            with session.get(bare, headers=sent, timeout=timeout, stream=True, allow_redirects=True,
                             verify=system_trust() if verify is None else verify,
                             proxies=_proxies(bare, proxies)) as response:
                if response.status_code >= 400 and response.status_code not in ok:
                    raise HttpStatusError(shown, response.status_code, response.reason or "")
                body = _read(response, max_bytes)
                return Response(response.status_code, response.headers.get("Content-Type", ""), body)
        except requests.RequestException as exc:
            raise HttpUnreachableError(shown, _reason(exc, url), _timed_out(exc), timeout) from None
        except OSError as exc:  # a CA bundle that cannot be read, among others
            raise HttpUnreachableError(shown, redact_urls(str(exc), [url]), False, timeout) from None


def _read(response: requests.Response, max_bytes: int | None) -> bytes:
    if max_bytes is None:
        return response.content
    out = bytearray()
    for chunk in response.iter_content(_CHUNK):
        out += chunk
        if len(out) >= max_bytes:
            break
    return bytes(out[:max_bytes])


def _proxies(url: str, given: Mapping[str, str] | None) -> dict[str, str]:
    """The proxies for `url`: none where NO_PROXY says so, else the given ones or the environment's."""
    if given is None:
        return dict(get_environ_proxies(url))
    return {} if should_bypass_proxies(url, no_proxy=None) else dict(given)


def proxy_map(pairs: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """{"http": ..., "https": ...} from (VARIABLE, value) pairs such as lab.image.hostpip's proxies."""
    out: dict[str, str] = {}
    for key, value in pairs:
        scheme = key.lower().removesuffix("_proxy")
        if scheme in ("http", "https"):
            out.setdefault(scheme, value)
    return out


def split_credentials(url: str) -> tuple[str, str | None]:
    """`url` without its user info, and that user info as `user:password` (None without one)."""
    parts = urlparse(url)
    if not parts.username:
        return url, None
    netloc = parts.hostname or ""
    if ":" in netloc:
        netloc = f"[{netloc}]"
    if parts.port:
        netloc += f":{parts.port}"
    auth = unquote(parts.username) + ":" + unquote(parts.password or "")
    return urlunparse(parts._replace(netloc=netloc)), auth


def _chain(exc: BaseException):
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        stack += [a for a in getattr(e, "args", ()) if isinstance(a, BaseException)]
        for attr in ("reason", "__cause__", "__context__"):
            nxt = getattr(e, attr, None)
            if isinstance(nxt, BaseException):
                stack.append(nxt)


def _timed_out(exc: BaseException) -> bool:
    # not urllib3's TimeoutError as a whole: its NewConnectionError (a refused connection) is one
    return isinstance(exc, requests.Timeout) or any(
        isinstance(e, (urllib3.exceptions.ReadTimeoutError, urllib3.exceptions.ConnectTimeoutError, socket.timeout))
        and not isinstance(e, urllib3.exceptions.NewConnectionError) for e in _chain(exc))


def _reason(exc: BaseException, url: str) -> str:
    """The root cause in a few words (`[SSL: CERTIFICATE_VERIFY_FAILED] ...`, `[Errno 111] Connection
    refused`), not requests' wrapper text, which repeats the URL's path; redacted all the same."""
    chain = list(_chain(exc))
    root = next((e for e in chain if isinstance(e, ssl.SSLError)
                 or (isinstance(e, OSError) and getattr(e, "errno", None) is not None)), None)
    if root is None:
        root = next((e for e in chain if not isinstance(e, (requests.RequestException,
                                                              urllib3.exceptions.HTTPError))), exc)
    return redact_urls(str(root), [url])
