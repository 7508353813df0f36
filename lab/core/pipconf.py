"""The host's pip settings as pip reads them: its config files, then PIP_* variables (which win).

Two readers need them: lab.image.hostpip, which carries the indexes into builds, and lab.core.scrub,
which treats every configured index, extra index and find-links URL as a secret and redacts it
wherever it could land (an image, a run folder, a bundle, the lab's own output).
"""

from __future__ import annotations

import configparser
import os
import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path

# The settings that name where packages come from: each holds URLs (or local folders).
URL_SETTINGS = ("index-url", "extra-index-url", "find-links")


def config_files(env: Mapping[str, str]) -> list[Path]:
    """pip's own lookup order: site-wide, then user; later files override earlier ones."""
    home = Path(env.get("HOME", "~")).expanduser()
    xdg = Path(env.get("XDG_CONFIG_HOME", str(home / ".config")))
    files = [Path("/etc/xdg/pip/pip.conf"), Path("/etc/pip.conf"),
             home / ".pip" / "pip.conf", xdg / "pip" / "pip.conf"]
    if env.get("VIRTUAL_ENV"):
        files.append(Path(env["VIRTUAL_ENV"]) / "pip.conf")
    if env.get("PIP_CONFIG_FILE"):
        files.append(Path(env["PIP_CONFIG_FILE"]))
    return files


def read_config(files: Iterable[Path]) -> dict[str, str]:
    """The [global] and [install] settings of the files, later files winning."""
    settings: dict[str, str] = {}
    for path in files:
        parser = configparser.RawConfigParser()
        try:
            parser.read(path, encoding="utf-8")
        except (OSError, configparser.Error, UnicodeDecodeError):
            continue
        for section in ("global", "install"):
            if parser.has_section(section):
                settings.update({k.replace("_", "-"): v for k, v in parser.items(section)})
    return settings


def split(value: str | None) -> tuple[str, ...]:
    """A setting that holds several values, split as pip does (whitespace, shell quoting)."""
    if not value:
        return ()
    try:
        return tuple(shlex.split(value))
    except ValueError:  # an unbalanced quote: pip would fail on it; split on whitespace
        return tuple(value.split())


def settings(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every setting of the config files, overridden by its PIP_* variable."""
    env = os.environ if env is None else env
    found = read_config(config_files(env))
    for name in {*found, *URL_SETTINGS, "trusted-host", "cert"}:
        value = env.get("PIP_" + name.upper().replace("-", "_"))
        if value:
            found[name] = value
    return found


def configured_urls(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Every index, extra index and find-links value pip would use (URLs and local folders)."""
    found = settings(env)
    return tuple(u for name in URL_SETTINGS for u in split(found.get(name)))
