"""Keep secrets and the user's home path out of anything the lab hands to someone else (bundles).

Hand-written on purpose: secret scanners (detect-secrets, trufflehog) find credentials by their
shape (entropy, vendor prefixes) and report them; the lab must instead blank the values of the
variables the run actually had, keep every line so a reader sees what was set, and be exact
about names like KEYBOARD or TOKENIZERS_PARALLELISM. Those rules are a few regular expressions,
each tested on its own (tests/core/test_scrub.py).

The rules, each a function of its own:

- `is_secret_name`: an environment variable whose name says it holds a secret: it contains TOKEN,
  KEY, SECRET, PASSWORD, PASSWD, PASSPHRASE, CREDENTIAL or `_AUTH` (or starts with AUTH), in any
  case.  Whole `_`-separated words that only look like one are not secrets: KEYBOARD, KEYMAP,
  KEYRING (PIP_KEYRING_PROVIDER names a mechanism, its value "subprocess" must not be blanked out
  of every log), TOKENIZER(S) (TOKENIZERS_PARALLELISM) and AUTHOR(S) (GIT_AUTHOR_NAME).  A word
  that merely contains one of them still counts: KEYRING_PASSWORD and HTTP_AUTHORIZATION are secret.
- `scrub_env`: drops secret-named variables from a mapping and strips URL credentials from the rest.
- `strip_url_credentials`: `https://user:pass@host/x` and `https://token@host/x` become
  `https://host/x`, wherever a URL appears in a text.
- `is_secret_url`, `redact_url`: a whole index or mirror URL is a secret (a token can sit in its
  user info, its path, as Artifactory and Gemfury put it, or its query): `redact_url` keeps its
  scheme and host only, `https://host/…`. A bare URL (no user info, no query) on a public host whose
  paths name public things (PyPI, PyTorch's download server, Debian's, GitHub) is not a secret.
- `secret_urls`, `redact_urls`: the URLs configured on this host (pip's index, extra indexes and
  find-links, lab.core.pipconf; the Debian mirror, lab.core.config) that are secrets, and a text with
  every URL on one of their hosts redacted (pip prints `http://user:****@host/TOKEN/simple/x/`),
  their user info and query values and their token-like path segments masked wherever they appear.
- `home_to_tilde`: the user's home folder, as a path prefix, becomes `~`.
- `scrub_text`: all of the above on a text file's contents (`redact_secrets`: all but the home), plus:
  * the values of secret-named variables of the given environment are replaced by `***` wherever
    they appear literally, when at least 6 characters long (shorter ones would blank out common
    words);
  * assignments to secret-named variables keep the name and lose the value: `GH_TOKEN=abc` becomes
    `GH_TOKEN=***`, a YAML line `  HF_TOKEN: abc` becomes `  HF_TOKEN: "***"` (quoted, since a
    bare `*` starts a YAML alias), a JSON pair `"API_KEY": "abc"` becomes `"API_KEY": "***"`,
    and an `Authorization:` header line loses its credentials.  The line stays, so a reader still
    sees that the variable was set.  Only upper-case names count here: a lower-case `key=len` is
    program text (a repro script), not an environment variable.  A YAML block scalar
    (`TOKEN: |`) keeps its following lines; its value is caught only when it is in the environment.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from urllib.parse import parse_qsl, unquote

from lab.core import pipconf
from lab.core.config import load
from lab.core.errors import LabError
from lab.core.secreturls import ELLIPSIS, PUBLIC_HOSTS, _parts, is_secret_url, redact_url  # noqa: F401 - (re-exported)

__all__ = [
    "MIN_SECRET_VALUE_LEN",
    "MASK",
    "home_to_tilde",
    "is_secret_name",
    "is_secret_url",
    "redact_secrets",
    "redact_url",
    "redact_urls",
    "scrub_env",
    "scrub_text",
    "secret_urls",
    "secret_values",
    "strip_url_credentials",
]

MASK = "***"
MIN_SECRET_VALUE_LEN = 6

_SECRET_PARTS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "_AUTH")
_HARMLESS_WORDS = frozenset({"KEYBOARD", "KEYMAP", "KEYRING", "TOKENIZER", "TOKENIZERS", "AUTHOR", "AUTHORS"})

# A URL's user information: what follows `scheme://` up to the last `@` before the host ends.
_URL_USERINFO = re.compile(r"(?<=://)[^\s/?#@'\"<>`\\]*(?:@[^\s/?#@'\"<>`\\]*)*@")
_ENV_NAME = r"[A-Z_][A-Z0-9_]*"
# NAME=value, as in env dumps, `-e NAME=value`, `export NAME=value`, Dockerfile `ENV NAME=value`.
_ASSIGN = re.compile(rf"(?<![\w$.-])({_ENV_NAME})=(\"[^\"\n]*\"|'[^'\n]*'|[^\s'\"]+)")
# "NAME": "value" or 'NAME': 'value' (JSON, Python reprs).
_QUOTED_PAIR = re.compile(rf"([\"'])({_ENV_NAME})\1(\s*:\s*)([\"'])((?:\\.|(?!\4)[^\\\n])*)\4")
# A YAML mapping line:   NAME: value
_YAML_LINE = re.compile(rf"^([ \t]*(?:-[ \t]+)?)({_ENV_NAME})([ \t]*:[ \t]+)(\S[^\n]*)$", re.MULTILINE)
_AUTH_HEADER = re.compile(r"^([ \t]*(?:proxy-)?authorization[ \t]*:[ \t]*)(\S[^\n]*)$",
                          re.MULTILINE | re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    """True when an environment variable's name says it holds a token, key, password or credential."""
    words = [w for w in name.upper().split("_") if w not in _HARMLESS_WORDS]
    folded = "_" + "_".join(words)
    return any(part in folded for part in _SECRET_PARTS)


def secret_values(env: Mapping[str, str]) -> list[str]:
    """The values of env's secret-named variables long enough to replace safely, longest first."""
    values = {v for k, v in env.items() if is_secret_name(k) and isinstance(v, str)
              and len(v) >= MIN_SECRET_VALUE_LEN}
    return sorted(values, key=lambda v: (-len(v), v))


def scrub_env(mapping: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """(kept, dropped names): secret-named variables dropped, URL credentials stripped from the rest."""
    kept: dict[str, str] = {}
    dropped: list[str] = []
    for name, value in mapping.items():
        if is_secret_name(name):
            dropped.append(name)
        else:
            kept[name] = strip_url_credentials(value)
    return kept, sorted(dropped)


def strip_url_credentials(text: str) -> str:
    """Remove `user:pass@` / `token@` from every URL in the text; the rest of each URL stays."""
    if "://" not in text:
        return text
    return _URL_USERINFO.sub("", text)


_URL_END = r"[^\s'\"<>`\\]*"  # the rest of a URL: up to a space, a quote, an angle bracket, a backtick


def _literals(url: str) -> set[str]:
    """The pieces of a secret URL that can hold a token, to mask wherever they appear outside a URL
    (a file name made of a URL, a log line that cut it): its user name and password, its query's
    values, and its path segments that look like tokens (8 characters or more, letters and digits)."""
    parts = _parts(url)
    if parts is None:
        return set()
    found = {parts.username or "", parts.password or "", parts.query}
    found |= {v for _, v in parse_qsl(parts.query, keep_blank_values=True)}
    found |= {seg for seg in parts.path.split("/")
              if len(seg) >= 8 and re.search(r"[A-Za-z]", seg) and re.search(r"\d", seg)}
    found |= {unquote(v) for v in found}
    return {v for v in found if len(v) >= MIN_SECRET_VALUE_LEN}


def _host_pattern(url: str) -> re.Pattern[str] | None:
    """Every URL on the same host and port as `url`, with or without user info, any path."""
    parts = _parts(url)
    if parts is None:
        return None
    host = re.escape(parts.hostname)
    if ":" in parts.hostname:
        host = r"\[" + host + r"\]"
    default = {"http": "80", "https": "443"}.get(parts.scheme.lower())
    if parts.port and str(parts.port) != default:
        port = rf":{parts.port}(?!\d)"
    else:
        port = rf"(?::{default}(?!\d))?(?!:\d)" if default else r"(?!:\d)"
    return re.compile(rf"\b([A-Za-z][A-Za-z0-9+.-]*)://(?:[^\s/?#'\"<>`\\]*@)?{host}{port}(?![\w.-]){_URL_END}",
                      re.IGNORECASE)


def secret_urls(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The secret URLs configured on this host: pip's index, extra indexes and find-links (config
    files and PIP_* variables of `env`, default os.environ) and the lab's Debian mirror."""
    env = os.environ if env is None else env
    urls = list(pipconf.configured_urls(env))
    urls += _mirror(env)
    return tuple(dict.fromkeys(u for u in urls if is_secret_url(u)))


def _mirror(env: Mapping[str, str]) -> list[str]:
    try:
        return [load(env=env).debian_mirror]
    except (LabError, OSError, ValueError):  # a bad setting: the command that reads it says so
        return []


def redact_urls(text: str, urls: Iterable[str] | None = None) -> str:
    """`text` with every URL on the host of a secret URL (`urls`, default secret_urls()) redacted
    to `scheme://host/…`, and the secret pieces of those URLs masked wherever else they appear."""
    urls = secret_urls() if urls is None else tuple(u for u in urls if is_secret_url(u))
    if not urls or not text:
        return text
    for url in urls:
        pattern = _host_pattern(url)
        if pattern is not None:
            text = pattern.sub(_redact_match, text)
    literals = sorted({v for u in urls for v in _literals(u)}, key=lambda v: (-len(v), v))
    return _mask_values(text, literals)


def _redact_match(match: re.Match[str]) -> str:
    url = match.group(0)
    tail = re.search(r"[,.;:!?)\]}]*$", url).group(0)  # a sentence's punctuation after the URL stays
    parts = _parts(url)
    if parts is None:
        return f"{match.group(1)}://{ELLIPSIS}{tail}"
    port = f":{parts.port}" if parts.port else ""
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}{port}/{ELLIPSIS}{tail}"


def _homes(candidates: Iterable[str | Path | None]) -> list[str]:
    """Absolute, non-root home paths (and their real paths), longest first."""
    found: set[str] = set()
    for candidate in candidates:
        if not candidate:
            continue
        for path in (str(candidate), os.path.realpath(candidate)):
            path = path.rstrip("/")
            if len(path) >= 2 and path.startswith("/"):
                found.add(path)
    return sorted(found, key=lambda p: (-len(p), p))


def _default_homes(env: Mapping[str, str]) -> list[str | Path | None]:
    try:
        user_home: Path | None = Path.home()
    except (KeyError, RuntimeError):  # no passwd entry and no $HOME
        user_home = None
    return [user_home, env.get("HOME")]


def _replace_homes(text: str, homes: list[str]) -> str:
    for path in homes:
        if path not in text:
            continue
        pattern = re.compile(r"(?:(?<![\w.~/$-])|(?<=://))" + re.escape(path) + r"(?![\w.-])")
        text = pattern.sub("~", text)
    return text


def home_to_tilde(text: str, home: str | Path | None = None) -> str:
    """Replace the user's home folder (`home`, else Path.home() and $HOME) by `~` where it starts a path.

    `/home/ana/x` becomes `~/x`; `/home/anabel`, `/srv/home/ana` and `/home/ana.bak` stay as they are.
    """
    return _replace_homes(text, _homes([home] if home is not None else _default_homes(os.environ)))


def _mask_assignment(match: re.Match[str]) -> str:
    name = match.group(1)
    return f"{name}={MASK}" if is_secret_name(name) else match.group(0)


def _mask_quoted_pair(match: re.Match[str]) -> str:
    quote, name, colon, vquote = match.group(1, 2, 3, 4)
    if not is_secret_name(name):
        return match.group(0)
    return f"{quote}{name}{quote}{colon}{vquote}{MASK}{vquote}"


def _mask_yaml_line(match: re.Match[str]) -> str:
    indent, name, colon, value = match.group(1, 2, 3, 4)
    if not is_secret_name(name) or value.startswith(("|", ">", "#")):
        return match.group(0)
    return f'{indent}{name}{colon}"{MASK}"'


def _mask_values(text: str, values: list[str]) -> str:
    # Each replacement shortens the text (values are longer than the mask), so this ends.
    while any(value in text for value in values):
        for value in values:
            text = text.replace(value, MASK)
    return text


def redact_secrets(text: str, env: Mapping[str, str] | None = None, urls: Iterable[str] = ()) -> str:
    """The rules of `scrub_text` but the home folder's: secret values of `env` (default os.environ),
    the configured secret URLs and `urls` (the indexes a build used), secret-named assignments,
    Authorization headers and URL credentials. For the lab's own records in a run folder
    (build.log) and its own output, which keep their paths."""
    env = os.environ if env is None else env
    urls = tuple(dict.fromkeys([*secret_urls(env), *(u for u in urls if is_secret_url(u))]))
    return _scrub(text, secret_values(env), [], urls)


def scrub_text(text: str, env: Mapping[str, str] | None = None, *, home: str | Path | None = None) -> str:
    """Apply every rule of this module to a text file's contents (see the module docstring).

    `env` defaults to os.environ; `home` to Path.home() and env's HOME.
    """
    env = os.environ if env is None else env
    homes = _homes([home] if home is not None else _default_homes(env))
    urls = secret_urls(env) + (secret_urls() if env is not os.environ else ())
    return _scrub(text, secret_values(env), homes, urls)


def _scrub(text: str, values: list[str], homes: list[str], urls: tuple[str, ...] = ()) -> str:
    text = redact_urls(text, urls)
    text = _mask_values(text, values)
    text = _ASSIGN.sub(_mask_assignment, text)
    text = _QUOTED_PAIR.sub(_mask_quoted_pair, text)
    text = _YAML_LINE.sub(_mask_yaml_line, text)
    text = _AUTH_HEADER.sub(lambda m: f"{m.group(1)}{MASK}", text)
    text = strip_url_credentials(text)
    text = _replace_homes(text, homes)
    # The rules above remove text, which could join two pieces into a secret again: mask once more.
    return _mask_values(text, values)
