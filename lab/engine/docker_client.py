"""Connecting to a Docker engine: its two clients, the Docker CLI's context store and TLS
settings, the labels every object the lab makes carries, and the engine's errors in words."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from urllib.parse import urlparse

import docker
import docker.errors
import docker.tls
import requests.exceptions
from docker.utils import kwargs_from_env

from lab.core.errors import EngineError

LABEL = "org.torch-repro-lab.managed"
LABELS = {LABEL: "true"}
# Every container this process starts also carries its session, so that Ctrl-C during parallel
# runs can remove them on every engine (worker threads are blocked in the engine's API).
SESSION_LABEL = "org.torch-repro-lab.session"
SESSION = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"


def open_clients(url: str, *, name: str, tls=None, timeout: float = 300,
                 answer_within: float = 20) -> tuple[docker.DockerClient, docker.DockerClient]:
    """(client, stream client) of one engine address (unix://, tcp:// with `tls`, ssh:// through
    paramiko). An engine that does not answer within `answer_within` seconds is unreachable;
    requests of a connected engine may take `timeout`. Attached streams may stay quiet for longer
    than any request timeout: the second client, configured the same way but without one, reads them."""
    try:
        first = docker.DockerClient(base_url=url, version="auto", timeout=answer_within, tls=tls or False)
        first.ping()
        version = first.api.api_version
        first.close()
        client = docker.DockerClient(base_url=url, version=version, timeout=timeout, tls=tls or False)
        stream_client = docker.DockerClient(base_url=url, version=client.api.api_version, timeout=None,
                                            tls=tls or False)
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
        where = url if name == url else f"{name}, {url}"
        raise EngineError(
            f"the Docker engine does not answer ({where}: {short(exc)}).",
            hint="Start it (as root: `bin/setup-host`, or `systemctl start docker`), "
                 "check DOCKER_HOST or the Docker context, then see `lab doctor` and `lab engines`.") from None
    except Exception as exc:  # noqa: BLE001 - ssh:// raises paramiko's own errors (auth, host key)
        raise EngineError(f"the Docker engine {name} ({url}) cannot be reached: "
                          f"{type(exc).__name__}: {short(exc)}.",
                          hint="Check that `ssh` to that host works without a password prompt "
                               "and that its host key is known.") from None
    return client, stream_client


def current_address() -> tuple[str, str | None, object | None, str | None]:
    """(name, URL, TLS config, problem) of the engine the docker CLI would use: DOCKER_HOST, else
    DOCKER_CONTEXT, else the current Docker context (the local socket by default)."""
    host = os.environ.get("DOCKER_HOST")
    if host:
        return "default", host, env_tls(), None
    return context_address(os.environ.get("DOCKER_CONTEXT") or current_context_name())


def context_address(name: str) -> tuple[str, str | None, object | None, str | None]:
    """(name, URL, TLS config, problem) of the Docker context `name`."""
    found = docker_context(name)
    if found is None:
        return name, None, None, f"no Docker context named {name!r} (see `docker context ls`)"
    host, tls = found
    return name, host, tls if host.startswith("tcp://") else None, None


def client_on_this_host(client: docker.DockerClient) -> bool:
    """Whether the engine runs on this machine (its socket, or TCP to this host's loopback)."""
    url = urlparse(str(client.api.base_url))
    if url.scheme == "http+docker":
        return url.hostname in ("localhost", "localunixsocket")
    return url.hostname in ("127.0.0.1", "localhost", "::1")


def socket_on_this_host(url: str | None) -> bool:
    """Whether `url` is a unix socket present on this host (its engine's disk is this host's)."""
    if not url or not url.startswith("unix://"):
        return False
    return Path(urlparse(url).path or url[len("unix://"):]).exists()


def explanation(exc: docker.errors.APIError) -> str:
    """The engine's own words in an API error (without the HTTP status line), else its first line."""
    said = getattr(exc, "explanation", None)
    return said.strip()[:300] if isinstance(said, str) and said.strip() else short(exc)


def short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


# ----------------------------------------------------------------------------- Docker contexts



def docker_config_dir() -> Path:
    """The docker CLI's configuration folder: DOCKER_CONFIG, else ~/.docker."""
    return Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker")


def docker_context(name: str) -> tuple[str, object | None] | None:
    """(host URL, TLS config) of the Docker CLI context `name` (`docker context ls`), or None.

    Read from the CLI's context store (contexts/meta/<sha256 of the name>/meta.json and
    contexts/tls/<id>/docker/*.pem) as the docker CLI does: docker-py's own reader finds no store
    where the folder has no config.json, which `docker context create` does not write."""
    if name == "default":
        return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock", None
    ident = hashlib.sha256(name.encode()).hexdigest()
    store = docker_config_dir() / "contexts"
    try:
        meta = json.loads((store / "meta" / ident / "meta.json").read_text())
        endpoint = meta["Endpoints"]["docker"]
        host = str(endpoint.get("Host") or "unix:///var/run/docker.sock")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    tls_dir = store / "tls" / ident / "docker"
    pems = {p.stem: str(p) for p in tls_dir.glob("*.pem")} if tls_dir.is_dir() else {}
    if not pems:
        return host, None
    cert = (pems["cert"], pems["key"]) if "cert" in pems and "key" in pems else None
    verify = not endpoint.get("SkipTLSVerify", False)
    return host, docker.tls.TLSConfig(client_cert=cert, ca_cert=pems.get("ca"), verify=verify)


def current_context_name() -> str:
    """The Docker CLI's current context (config.json `currentContext`), `default` when none."""
    try:
        data = json.loads((docker_config_dir() / "config.json").read_text())
        return str(data.get("currentContext") or "default")
    except (OSError, ValueError, AttributeError):
        return "default"


def env_tls():
    """TLS settings from DOCKER_TLS_VERIFY / DOCKER_CERT_PATH, as the docker CLI reads them."""
    if not (os.environ.get("DOCKER_TLS_VERIFY") or os.environ.get("DOCKER_CERT_PATH")):
        return None
    try:
        return kwargs_from_env().get("tls")
    except Exception:  # noqa: BLE001 - bad cert paths show up when connecting
        return None
