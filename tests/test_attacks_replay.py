"""A stranger's bundle runs nothing of its own at build time and learns no secret: `lab replay`
against the real engine, with a planted index token in the host's pip settings.

The host's pip settings name an extra index that answers only with a planted token (Basic auth),
served on every interface of this host, so a build with the host's network, or with the engine's
default network (the bridge's gateway), would reach it. Then:

- a bundle whose scenario names a direct-URL requirement served by that server is refused before
  anything is built, and nothing fetched it;
- with --allow-source-builds its build still cannot reach this host: pip inside the build fails to
  fetch it, and the server saw no request from the build;
- a bundle's own Dockerfile (`--bundled-dockerfile`), whose RUN step is the attacker's code at build
  time, finds no credential (environment, build arguments, pip.conf) and no network, and the token is
  nowhere in `docker save` of the replayed image nor in the run folder.

The honest bundle is the attack tests' own (tests/test_attacks_bundle.py: amd64, torch 2.13.0+cpu from
the host's find-links, debian:bookworm), so the images are shared with them.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import docker
import pytest

from tests.conftest import last_json, run_lab
from tests.test_attacks_bundle import edit_scenario, honest, tamper  # noqa: F401  (honest: the fixture)
from tests.test_attacks_secrets import found_in_folder, found_in_stream

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1800)]

USER, TOKEN = "indexuser", f"PLANTEDREPLAYTOKEN{uuid.uuid4().hex[:8]}"
NEEDLES = [TOKEN, base64.b64encode(f"{USER}:{TOKEN}".encode()).decode()]
MARK = f"LEAKPROBE{uuid.uuid4().hex[:8]}"


class Server:
    """An index and a file server on every interface of this host, recording every request."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, str]] = []  # (client address, path, user agent)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                server.requests.append((self.client_address[0], self.path, self.headers.get("User-Agent", "")))
                if self.headers.get("Authorization") != f"Basic {NEEDLES[1]}":
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="planted"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_error(404)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("0.0.0.0", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def from_probe(self) -> list[tuple[str, str, str]]:
        """Requests of the leak probe's urllib (the host's own uv and pip may use the token: it is the user's)."""
        return [r for r in self.requests if r[2].startswith("Python-urllib")]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def planted():
    server = Server()
    env = {"PIP_EXTRA_INDEX_URL": f"http://{USER}:{TOKEN}@127.0.0.1:{server.port}/simple", "COLUMNS": "400"}
    yield server, env
    server.close()


def gateway() -> str:
    """The engine's bridge gateway: this host, as a container on the default network reaches it."""
    config = docker.from_env().networks.get("bridge").attrs["IPAM"]["Config"][0]
    return config.get("Gateway") or str(ipaddress.ip_network(config["Subnet"])[1])  # 20.10 may leave it out


def replay(bundle: Path, runs: Path, env: dict, *options: str):
    return run_lab("replay", str(bundle), "--out", str(runs), "--yes", *options, env=env)


def test_a_direct_url_requirement_is_refused_before_any_build(honest, planted, tmp_path):  # noqa: F811
    bundle, _ = honest
    server, env = planted
    url = f"http://127.0.0.1:{server.port}/evil-1.0.tar.gz"
    evil = tamper(bundle, tmp_path / "evil.tar.gz", edit_scenario(lambda d: d.update(pip=["numpy", f"evil @ {url}"])))
    proc = replay(evil, tmp_path / "runs", env)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and proc.stderr.count("error:") == 1
    paragraph = " ".join(proc.stderr[proc.stderr.index("error:"):].split())
    # the URL lies on the host and port of this host's secret index, so the lab names it redacted (issue 33)
    named = f"http://127.0.0.1:{server.port}/…"
    assert url not in paragraph and f"'evil @ {named}' is a direct URL" in paragraph and "field `pip[1]`" in paragraph
    assert "--allow-source-builds" in paragraph and "replay of" not in proc.stderr
    assert server.requests == []  # nothing fetched it, not even the host
    assert not (tmp_path / "runs").exists() or not [p for p in (tmp_path / "runs").rglob("*") if p.is_file()]

    # with the flag, shown in the summary, its build still cannot reach this host
    proc = replay(evil, tmp_path / "runs", env, "--allow-source-builds", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = " ".join(proc.stderr[:proc.stderr.index("--yes: building")].split())
    assert "source builds ALLOWED (--allow-source-builds)" in summary and f"evil @ {url} (a direct URL)" in summary
    result = last_json(proc.stdout)
    run_dir = Path(result["run_dir"])
    assert result["verdict"] == "error", result  # pip inside the build could not fetch it
    log = (run_dir / "build.log").read_text()
    assert (url in log or named in log) and "Connection refused" in log  # its own loopback, not the host's
    assert json.loads((run_dir / "replay.json").read_text())["source_builds_allowed"] is True
    assert "--allow-source-builds" in (run_dir / "report.md").read_text()
    assert server.requests == []  # the build reached neither 127.0.0.1 nor the gateway (uv fetched nothing)
    assert found_in_folder(run_dir, NEEDLES) == {}


def leak_probe(port: int, host: str) -> bytes:
    """A RUN step for the bundle's own Dockerfile: everything it can find, and whether it reaches this host."""
    script = f"""
import os, urllib.request
print("{MARK} env", sorted(os.environ.items()))
for f in ("/etc/lab/pip.conf", "/tmp/lab-pip.conf"):
    try:
        print("{MARK} file", f, open(f).read())
    except OSError as exc:
        print("{MARK} nofile", f, exc)
for url in ("http://127.0.0.1:{port}/simple/", "http://{host}:{port}/simple/"):
    try:
        urllib.request.build_opener(urllib.request.ProxyHandler({{}})).open(url, timeout=10)
        print("{MARK} REACHED", url)
    except urllib.error.HTTPError as exc:
        print("{MARK} REACHED", url, exc.code)
    except Exception as exc:
        print("{MARK} UNREACHABLE", url, exc)
"""
    encoded = base64.b64encode(script.encode()).decode()
    return f"RUN echo {encoded} | base64 -d | python3 > /lab-leak.txt 2>&1; cat /lab-leak.txt\n".encode()


def test_a_bundles_build_step_finds_no_credential_and_no_network(honest, planted, tmp_path):  # noqa: F811
    bundle, original = honest
    server, env = planted
    step = leak_probe(server.port, gateway())

    def edit(files: dict[str, bytes]) -> None:
        files["Dockerfile"] = files["Dockerfile"].replace(b"COPY repro/", step + b"COPY repro/")
    evil = tamper(bundle, tmp_path / "evil.tar.gz", edit)
    proc = replay(evil, tmp_path / "runs", env, "--bundled-dockerfile", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    tag = (result.get("image") or {}).get("tag")
    client = docker.from_env()
    try:
        assert result["replay"]["dockerfile_built"] == "bundled" and tag and tag != original["image"]["tag"]
        log = (Path(result["run_dir"]) / "build.log").read_text()
        # not the host's loopback (named redacted: the planted index's host and port are a secret URL's)
        assert f"{MARK} UNREACHABLE http://127.0.0.1:{server.port}/…" in log
        assert f"{MARK} UNREACHABLE http://{gateway()}:{server.port}/simple/" in log  # nor the host at all
        assert f"{MARK} REACHED" not in log and server.from_probe() == [], server.requests
        assert f"{MARK} nofile /tmp/lab-pip.conf" in log and "LAB_PIP_CONF_URL" not in log.split(f"{MARK} env")[1]
        # the token is nowhere: not in the image (every layer and its config), nor in the run folder
        assert found_in_stream(client.images.get(tag).save(named=True), NEEDLES) == set()
        assert found_in_stream([json.dumps(client.api.inspect_image(tag)).encode()], NEEDLES) == set()
        assert found_in_folder(Path(result["run_dir"]), NEEDLES) == {}
        leak = client.containers.run(tag, ["cat", "/lab-leak.txt"], remove=True, network_mode="none",
                                     labels={"org.torch-repro-lab.managed": "true"}).decode()
        assert MARK in leak and TOKEN not in leak and "127.0.0.1" not in leak.split(f"{MARK} file")[1].split(
            f"{MARK} UNREACHABLE")[0]  # the image's pip.conf names no index, let alone the planted one
    finally:
        if tag and tag != original["image"]["tag"]:
            client.images.remove(tag, noprune=False)  # this test's own image


def test_an_honest_replay_builds_offline_and_keeps_no_token(honest, planted, tmp_path):  # noqa: F811
    bundle, _ = honest
    server, env = planted
    proc = replay(bundle, tmp_path / "runs", env, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    assert result["verdict"] == "reproduced" and result["replay"]["same"] is True, result
    client = docker.from_env()
    tag = result["image"]["tag"]
    assert found_in_stream(client.images.get(tag).save(named=True), NEEDLES) == set()
    history = "\n".join(str(h.get("CreatedBy", "")) for h in client.images.get(tag).history())
    assert "LAB_PIP_CONF_URL=http" not in history and TOKEN not in history  # no one-shot URL was ever served
    assert found_in_folder(Path(result["run_dir"]), NEEDLES) == {}
