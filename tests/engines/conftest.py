"""Real engines for the many-engines tests: a second dockerd of its own (socket, data root, exec
root, pid file and bridge, all removed afterwards) and an sshd on 127.0.0.1 that reaches the first
engine through an ssh:// address. Nothing here is a stand-in: the lab talks to real engines."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from lab.core.config import current


@dataclass
class Dockerd:
    tag: str
    url: str
    proc: subprocess.Popen
    root: Path
    exec_root: Path
    bridge: str
    log: Path

    def answers(self) -> bool:
        import docker
        try:
            return bool(docker.DockerClient(base_url=self.url, timeout=5).ping())
        except Exception:  # noqa: BLE001
            return False

    def stop(self) -> None:
        """SIGTERM (the engine stops its containers), as an engine that goes away does."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _free_subnet() -> str:
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    for n in range(200, 250):
        if f" 172.29.{n}." not in used:
            return f"172.29.{n}.1/24"
    raise RuntimeError("no free 172.29.x.0/24 subnet for the test engine's bridge")


def start_dockerd(tmp: Path) -> Dockerd:
    if os.geteuid() != 0 or shutil.which("dockerd") is None:
        pytest.fail("the many-engines tests start a second dockerd: they need root and dockerd (bin/setup)")
    tag = f"{os.getpid()}"
    root = Path(f"/var/lib/lab-test-{tag}")  # overlay2 needs a real filesystem, not the tmpfs of /tmp
    exec_root = Path(f"/run/lab-test-{tag}")
    bridge = f"labt{tag}"[:15]
    sock = Path(f"/run/lab-test-{tag}.sock")
    subprocess.run(["ip", "link", "add", "name", bridge, "type", "bridge"], check=True)
    subprocess.run(["ip", "addr", "add", _free_subnet(), "dev", bridge], check=True)
    subprocess.run(["ip", "link", "set", bridge, "up"], check=True)
    log = tmp / "dockerd.log"
    proc = subprocess.Popen(["dockerd", "--data-root", str(root / "data"), "--exec-root", str(exec_root),
                             "--pidfile", f"/run/lab-test-{tag}.pid", "-H", f"unix://{sock}",
                             "--bridge", bridge], stdout=log.open("w"), stderr=subprocess.STDOUT)
    engine = Dockerd(tag, f"unix://{sock}", proc, root, exec_root, bridge, log)
    deadline = time.monotonic() + 90
    while not engine.answers():
        if proc.poll() is not None or time.monotonic() > deadline:
            remove_dockerd(engine)
            pytest.fail(f"the second dockerd did not start: {log.read_text()[-2000:]}")
        time.sleep(1)
    return engine


def remove_dockerd(engine: Dockerd) -> None:
    engine.stop()
    # what a stopped engine can leave: its containerd, mounts under its roots, the bridge
    subprocess.run(["pkill", "-f", f"containerd.*{engine.exec_root}"], check=False)
    mounts = subprocess.run(["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True).stdout.split()
    for target in sorted((m for m in mounts if m.startswith((str(engine.root), str(engine.exec_root)))),
                         key=len, reverse=True):
        subprocess.run(["umount", "-l", target], check=False)
    shutil.rmtree(engine.root, ignore_errors=True)
    shutil.rmtree(engine.exec_root, ignore_errors=True)
    for leftover in (Path(f"/run/lab-test-{engine.tag}.sock"), Path(f"/run/lab-test-{engine.tag}.pid")):
        with contextlib.suppress(OSError):
            leftover.unlink()
    subprocess.run(["ip", "link", "delete", engine.bridge], check=False)


@dataclass
class Sshd:
    url: str
    home: Path
    proc: subprocess.Popen


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_sshd(tmp: Path) -> Sshd:
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    if not Path(sshd).exists():
        pytest.fail("the ssh:// engine test needs OpenSSH's server (bin/setup-host installs openssh-server)")
    keys = tmp / "keys"
    keys.mkdir()
    for name in ("host", "client"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / name)], check=True)
    (keys / "authorized_keys").write_text((keys / "client.pub").read_text())
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation folder
    port = _free_port()
    proc = subprocess.Popen([sshd, "-D", "-e", "-p", str(port), "-o", "ListenAddress=127.0.0.1",
                             "-h", str(keys / "host"), "-o", f"AuthorizedKeysFile={keys / 'authorized_keys'}",
                             "-o", "PermitRootLogin=prohibit-password", "-o", "PasswordAuthentication=no",
                             "-o", "StrictModes=no", "-o", "UsePAM=no", "-o", f"PidFile={tmp / 'sshd.pid'}"],
                            stdout=(tmp / "sshd.log").open("w"), stderr=subprocess.STDOUT)
    home = tmp / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(f"Host 127.0.0.1\n  User root\n  Port {port}\n"
                                          f"  IdentityFile {keys / 'client'}\n")
    host_key = " ".join((keys / "host.pub").read_text().split()[:2])
    (home / ".ssh" / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_key}\n")
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            break
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"sshd did not start: {(tmp / 'sshd.log').read_text()[-2000:]}")
        time.sleep(0.3)
    return Sshd(f"ssh://root@127.0.0.1:{port}", home, proc)


@dataclass
class Engines:
    second: Dockerd
    sshd: Sshd
    env: dict[str, str]  # for `lab`: the contexts `second`, `over-ssh` and `first`, and ssh's keys


@pytest.fixture(scope="package")
def engines(tmp_path_factory) -> Engines:
    tmp = tmp_path_factory.mktemp("engines")
    cache = str(current().cache_dir)  # the lab's usual cache: the site trees are shared, not rebuilt
    second = start_dockerd(tmp)
    try:
        sshd = start_sshd(tmp)
        config = tmp / "docker-config"
        config.mkdir()
        env = {"HOME": str(sshd.home), "DOCKER_CONFIG": str(config), "LAB_CACHE_DIR": cache,
               "XDG_CONFIG_HOME": os.environ.get("XDG_CONFIG_HOME", str(Path.home() / ".config")),
               "XDG_CACHE_HOME": os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))}
        env.pop("DOCKER_HOST", None)
        for name, host in (("second", second.url), ("over-ssh", sshd.url), ("first", "unix:///var/run/docker.sock")):
            subprocess.run(["docker", "context", "create", name, "--docker", f"host={host}"], check=True,
                           env={**os.environ, **env}, capture_output=True)
        yield Engines(second, sshd, env)
        sshd.proc.terminate()
        sshd.proc.wait(10)
    finally:
        remove_dockerd(second)
