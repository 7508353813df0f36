"""The attacker's side of a run, against the real engine: a repro script from a stranger tries to
touch the host. One test per attack; each asserts that nothing outside the run folder changed
(a canary folder next to it, snapshotted before and after), that the run folder holds no link,
fifo or device, and that the outcome says clearly what happened.

The scenarios share every layer but the script with tests/test_faults.py's (amd64, torch
the amd64 CPU torch of tests/cpu_torch.py, debian:bookworm), so once that image exists each run costs seconds.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import socket
import stat
import threading
import uuid
from pathlib import Path

import docker
import pytest

from tests.conftest import last_json, run_lab
from tests.cpu_torch import TORCH

HEADER = (f"{TORCH.header}base: debian:bookworm\nsystem_packages: [g++, python3-dev]\n"
          "pip: [numpy]\n")
pytestmark = pytest.mark.usefixtures("cpu_torch")  # every attack runs the cheap amd64 case (tests/cpu_torch.py)


def canary(tmp_path: Path) -> Path:
    """A folder outside the run folder, with what an attacker would aim at."""
    folder = tmp_path / "canary"
    (folder / ".ssh").mkdir(parents=True)
    (folder / ".ssh" / "authorized_keys").write_text("ssh-ed25519 AAAA the-owner\n")
    (folder / "secret.txt").write_text(f"host-secret-{uuid.uuid4().hex}\n")
    return folder


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under `root` (links not followed): its type, mode, size, mtime and content hash."""
    found: dict[str, tuple] = {".": _entry(root)}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            found[str(path.relative_to(root))] = _entry(path)
    return found


def _entry(path: Path) -> tuple:
    st = path.lstat()
    digest = hashlib.sha256(path.read_bytes()).hexdigest() if stat.S_ISREG(st.st_mode) else None
    return stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_size, st.st_mtime_ns, digest


def run_attack(tmp_path: Path, name: str, script: str, extra: str = "", *args: str,
               env: dict[str, str] | None = None, script_env: dict[str, str] | None = None) -> tuple[dict, Path]:
    """Run `script` as scenario `name` through the real CLI (`env`: the lab's own environment;
    `script_env`: the scenario's `env`, with CANARY, the canary folder's path, added), with the
    canary folder watched. Returns (result, run folder)."""
    folder = canary(tmp_path)
    scenario_dir = tmp_path / "scenario"
    scenario_dir.mkdir()
    (scenario_dir / f"{name}.py").write_text(script)
    (scenario_dir / f"{name}.yaml").write_text(
        f"name: {name}\n{HEADER}script: {name}.py\n"
        f"env: {json.dumps({'CANARY': str(folder), **(script_env or {})})}\n{extra}")
    before = snapshot(folder)
    proc = run_lab("run", str(scenario_dir / f"{name}.yaml"), "--out", str(tmp_path / "runs"), "--json", *args,
                   env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    result = last_json(proc.stdout)
    run_dir = Path(result["run_dir"])
    assert snapshot(folder) == before, "the canary folder outside the run folder changed"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["canary", "runs", "scenario"]
    # the run folder, and the runs folder's history index (lab.history), which records it
    lab_files = ("index.sqlite3", ".lab-key")  # the history index, the key of the run folders' markers
    assert sorted(p.name for p in (tmp_path / "runs").iterdir() if not p.name.startswith(lab_files)) == [name]
    assert list((tmp_path / "runs" / name).iterdir()) == [run_dir]
    for path in [run_dir, *run_dir.rglob("*")]:
        kind = stat.S_IFMT(path.lstat().st_mode)
        assert kind in (stat.S_IFREG, stat.S_IFDIR), f"{path} is not a plain file or folder"
        if kind == stat.S_IFREG:
            assert path.lstat().st_nlink == 1, f"{path} is a hard link"
    left = docker.from_env().containers.list(all=True, filters={"label": f"org.torch-repro-lab.case={result['case']}"})
    assert not left, [c.name for c in left]
    return result, run_dir


LINKS = """
import os
canary = os.environ["CANARY"]
for name in ("stdout.txt", "stderr.txt", "diagnostics.json", "report.md", "result.json"):
    os.symlink(canary + "/.ssh/authorized_keys", "/out/" + name)
if os.path.lexists("/out/ld/ld.1"):  # this process's loader log (it is pid 1): replaced by a link
    os.remove("/out/ld/ld.1")
os.symlink(canary + "/secret.txt", "/out/ld/ld.1")
os.symlink("/", "/out/ld/root")
with open("/out/ld/ld.7", "w") as fh:
    fh.write("7: calling init: /lib/x86_64-linux-gnu/libc.so.6\\n")
os.link("/out/ld/ld.7", "/out/ld/zz-hard")
os.mkfifo("/out/ld/ld.2")        # a reader that opened it would wait forever
os.mkfifo("/out/diag.fifo")
print("planted", flush=True)
"""


@pytest.mark.docker
@pytest.mark.timeout(1800)
def test_links_hardlinks_and_fifos_in_outputs_are_never_followed_or_made(tmp_path):
    """The same script runs twice: as the scenario (/out -> out/) and in the diagnose step
    (/out -> diagnose/, next to the lab's own stdout.txt and diagnostics.json)."""
    result, run_dir = run_attack(tmp_path, "attack-links", LINKS, "timeout: 300\nexpect:\n  stdout_contains: planted\n",
                                 "--diagnose")
    assert result["verdict"] == "reproduced", result
    skipped = {(s["path"], s["kind"]) for s in result["capture"]["out"]["skipped"]}
    assert {("stdout.txt", "symbolic link"), ("ld/ld.1", "symbolic link"), ("ld/root", "symbolic link"),
            ("ld/ld.2", "fifo"), ("diag.fifo", "fifo")} <= skipped, skipped
    # A hard link's first name comes as a plain file (a copy), the second as a link: not made.
    first, second = sorted(("ld/ld.7", "ld/zz-hard"), key=lambda p: (p, "hard link") in skipped)
    assert (second, "hard link") in skipped and (first, "hard link") not in skipped, skipped
    assert (run_dir / "out" / first).read_text().startswith("7: calling init")
    assert not (run_dir / "out" / second).exists()
    # The lab's own files are its own: written by the lab, not through the script's links.
    assert "planted" in (run_dir / "stdout.txt").read_text()
    assert "planted" in (run_dir / "diagnose" / "stdout.txt").read_text()
    assert json.loads((run_dir / "diagnose" / "diagnostics.json").read_text())
    assert json.loads((run_dir / "result.json").read_text())["verdict"] == "reproduced"
    report = (run_dir / "report.md").read_text()
    assert "not copied (the lab never creates links, fifos or devices)" in report
    assert "`stdout.txt` (symbolic link, to '" in report
    assert "`ld/ld.2` (fifo)" in report
    assert "diagnose run: diagnose/: " in report  # the diagnose step's /out: the same links, refused
    evidence = json.loads((run_dir / "evidence.json").read_text())
    assert evidence["processes"] >= 1  # the loader logs were read, the fifo was not opened


FLOOD = """
import sys
sys.stderr.write("E" * (3 << 20) + "\\nstderr-end\\n")
sys.stderr.flush()
print("START", flush=True)
line = "x" * 65535 + "\\n"
while True:
    sys.stdout.write(line)
"""


@pytest.mark.docker
@pytest.mark.timeout(1800)
def test_an_output_that_never_ends_is_cut_noted_and_the_run_gets_its_verdict(tmp_path):
    result, run_dir = run_attack(tmp_path, "attack-flood", FLOOD,
                                 "timeout: 20\nlimits: {logs: 1m}\nexpect:\n  exit_code: 0\n", "--no-diagnose")
    assert result["verdict"] == "timeout", result
    capture = result["capture"]
    assert capture["stdout"]["cut"] and capture["stdout"]["cap"] == 1 << 20
    assert capture["stdout"]["bytes"] > 2 << 20
    assert capture["stderr"]["cut"] and capture["stderr"]["bytes"] == (3 << 20) + len("\nstderr-end\n")
    stdout = (run_dir / "stdout.txt").read_bytes()
    stderr = (run_dir / "stderr.txt").read_bytes()
    assert stdout.startswith(b"START\n")
    for data, name in ((stdout, "stdout"), (stderr, "stderr")):
        assert len(data) < (2 << 20) + 1024  # the cap, the last MiB and the marker line
        assert f"[torch-repro-lab: {name} cut at 1 MiB;".encode() in data
    assert stderr.endswith(b"\nstderr-end\n")  # the end is kept: a final traceback would be judged
    # One process, one loader log: the lab's own size check of /out (an exec) leaves none.
    assert [p.name for p in (run_dir / "out" / "ld").iterdir()] == ["ld.1"]
    report = (run_dir / "report.md").read_text()
    assert "stdout was cut at 1 MiB" in report and "stderr was cut at 1 MiB" in report
    assert "Outputs cut or refused: stdout cut at 1 MiB; stderr cut at 1 MiB" in report


FORK_BOMB = """
import os, time
children = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(600)
            os._exit(0)
        children += 1
except OSError as exc:
    print(f"forked {children} then {type(exc).__name__}", flush=True)
while True:  # and every process keeps trying
    try:
        os.fork()
    except OSError:
        time.sleep(0.05)
"""


@pytest.mark.docker
@pytest.mark.timeout(1800)
def test_a_fork_bomb_stops_at_the_pids_limit_and_the_run_gets_its_verdict(tmp_path):
    result, run_dir = run_attack(tmp_path, "attack-forkbomb", FORK_BOMB,
                                 "timeout: 20\nlimits: {pids: 64}\nexpect:\n  exit_code: 0\n", "--no-diagnose")
    assert result["verdict"] == "timeout", result
    assert result["limits"].startswith("memory 8 GiB, pids 64")
    stdout = (run_dir / "stdout.txt").read_text()
    line = next(ln for ln in stdout.splitlines() if ln.startswith("forked "))
    children = int(line.split()[1])
    assert 0 < children < 64 and line.endswith("BlockingIOError"), line
    assert "- Confinement: memory 8 GiB, pids 64" in (run_dir / "report.md").read_text()


NETWORK = """
import os, socket
host, port = os.environ["ATTACK_HOST"], int(os.environ["ATTACK_PORT"])
try:
    socket.create_connection((host, port), timeout=5)
    print("connect: reached the host")
except OSError as exc:
    print(f"connect: {type(exc).__name__} errno={exc.errno}")
try:
    socket.getaddrinfo("pypi.org", 443)
    print("dns: resolved")
except OSError as exc:
    print(f"dns: {type(exc).__name__}")
print("interfaces", sorted(os.listdir("/sys/class/net")))
"""


class _Listener(threading.Thread):
    """A TCP server on every host address: it counts the connections that reach it."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_server(("0.0.0.0", 0))
        self.sock.settimeout(0.5)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
                self.accepted += 1
                conn.close()
            except OSError:
                continue

    def stop(self) -> None:
        self.done.set()
        self.join(5)
        self.sock.close()


@pytest.mark.docker
@pytest.mark.timeout(1800)
def test_the_script_cannot_reach_the_network(tmp_path):
    ipam = docker.from_env().networks.get("bridge").attrs["IPAM"]["Config"][0]
    bridge = ipam.get("Gateway") or str(ipaddress.ip_network(ipam["Subnet"])[1])  # the host, seen from a container
    listener = _Listener()
    listener.start()
    try:
        result, run_dir = run_attack(tmp_path, "attack-network", NETWORK,
                                     "timeout: 120\nexpect:\n  stdout_contains: 'connect: OSError'\n",
                                     "--no-diagnose",
                                     script_env={"ATTACK_HOST": bridge, "ATTACK_PORT": str(listener.port)})
    finally:
        listener.stop()
    stdout = (run_dir / "stdout.txt").read_text()
    assert result["verdict"] == "reproduced", stdout
    assert "connect: OSError errno=101" in stdout  # ENETUNREACH: no route at all
    assert "dns: gaierror" in stdout
    assert "interfaces ['lo']" in stdout
    assert listener.accepted == 0
    assert "no network" in result["limits"]


HOST_SECRETS = """
import os
canary = os.environ["CANARY"]
print("env", sorted(os.environ))
for path in (canary + "/secret.txt", canary + "/.ssh/authorized_keys", "/proc/1/environ"):
    try:
        data = open(path, "rb").read()
        print("read", path, data[:4000])
    except OSError as exc:
        print("cannot read", path, type(exc).__name__)
found = []
for top in ("/etc", "/root", "/home", "/tmp", "/run", "/var", "/lab", "/out", "/mnt", "/srv", "/media"):
    for folder, _, files in os.walk(top):
        for name in files:
            try:
                with open(os.path.join(folder, name), "rb") as fh:
                    blob = fh.read(1 << 20)
            except OSError:
                continue
            if b"host-" + b"secret-" in blob or b"lab-" + b"attack-" in blob:
                found.append(os.path.join(folder, name))
print("found", found)
print(open("/proc/1/environ", "rb").read().replace(b"\\0", b"\\n").decode(errors="replace"))
"""


@pytest.mark.docker
@pytest.mark.timeout(1800)
def test_the_hosts_environment_and_files_do_not_reach_the_script(tmp_path):
    secret = f"lab-attack-{uuid.uuid4().hex}"
    result, run_dir = run_attack(tmp_path, "attack-host-secrets", HOST_SECRETS,
                                 "timeout: 300\nexpect:\n  stdout_contains: 'found []'\n", "--no-diagnose",
                                 env={"LAB_ATTACK_SECRET": secret, "AWS_SECRET_ACCESS_KEY": secret})
    stdout = (run_dir / "stdout.txt").read_text()
    assert result["verdict"] == "reproduced", stdout
    assert "cannot read " + str(tmp_path / "canary" / "secret.txt") + " FileNotFoundError" in stdout
    assert "LAB_ATTACK_SECRET" not in stdout and "AWS_SECRET_ACCESS_KEY" not in stdout
    host_secret = (tmp_path / "canary" / "secret.txt").read_text().strip().encode()
    for path in run_dir.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert secret.encode() not in data and host_secret not in data, path


DOCKER_SOCKET = """
import os, socket
for path in ("/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock"):
    print("socket", path, os.path.exists(path))
print("DOCKER_HOST", os.environ.get("DOCKER_HOST"))
try:
    s = socket.socket(socket.AF_UNIX)
    s.connect("/var/run/docker.sock")
    print("docker api: connected")
except OSError as exc:
    print(f"docker api: {type(exc).__name__}")
"""


@pytest.mark.docker
@pytest.mark.timeout(1800)
def test_the_docker_socket_is_absent(tmp_path):
    result, run_dir = run_attack(tmp_path, "attack-docker-socket", DOCKER_SOCKET,
                                 "timeout: 120\nexpect:\n  stdout_contains: 'docker api: FileNotFoundError'\n",
                                 "--no-diagnose")
    stdout = (run_dir / "stdout.txt").read_text()
    assert result["verdict"] == "reproduced", stdout
    for path in ("/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock"):
        assert f"socket {path} False" in stdout
    assert "DOCKER_HOST None" in stdout


READ_ONLY = """
import os
print("ids", os.getuid(), os.geteuid(), os.getgid(), os.getegid(), os.getgroups())
status = open("/proc/self/status").read()
print(*[l for l in status.splitlines() if l.startswith(("CapEff", "CapPrm", "CapBnd", "NoNewPrivs"))], sep="\\n")
for path in ("/x", "/etc/x", "/usr/x", "/opt/venv/x", "/lab/repro/x", "/root/x", "/var/x", "/home/x",
             "/tmp/x", "/out/x", "/out/ld/x"):
    try:
        with open(path, "w") as fh:
            fh.write("1")
        print("write ok", path)
    except OSError as exc:
        print("write refused", path, type(exc).__name__, exc.errno)
try:
    os.setuid(0)
    print("setuid: became root")
except OSError as exc:
    print("setuid:", type(exc).__name__)
try:
    os.chmod("/lab/repro", 0o777)
    print("chmod: ok")
except OSError as exc:
    print("chmod:", type(exc).__name__)
print("done")
"""


@pytest.mark.docker
@pytest.mark.timeout(1800)
def test_the_script_is_not_root_and_writes_only_to_out_and_tmp(tmp_path):
    result, run_dir = run_attack(tmp_path, "attack-read-only", READ_ONLY,
                                 "timeout: 120\nexpect:\n  stdout_contains: done\n", "--no-diagnose")
    stdout = (run_dir / "stdout.txt").read_text()
    assert result["verdict"] == "reproduced", stdout
    assert "ids 10001 10001 10001 10001 [10001]" in stdout  # no root group either
    assert "CapEff:\t0000000000000000" in stdout and "CapPrm:\t0000000000000000" in stdout
    assert "NoNewPrivs:\t1" in stdout
    for path in ("/x", "/etc/x", "/usr/x", "/opt/venv/x", "/lab/repro/x", "/var/x", "/home/x"):
        assert f"write refused {path} OSError 30" in stdout, path  # EROFS: the root is read-only
    assert "write refused /root/x PermissionError 13" in stdout  # root's home is not even searchable
    for path in ("/tmp/x", "/out/x", "/out/ld/x"):
        assert f"write ok {path}" in stdout, path
    assert "setuid: PermissionError" in stdout and "chmod: ok" not in stdout
    assert (run_dir / "out" / "x").read_text() == "1"
    assert "a user other than root, a read-only root filesystem" in (run_dir / "report.md").read_text()


FILL_OUT = """
import os, time
chunk = os.urandom(1 << 20)
for i in range(40):
    with open(f"/out/fill-{i:02d}", "wb") as fh:
        fh.write(chunk)
print("filled", flush=True)
time.sleep(600)
"""


@pytest.mark.docker
@pytest.mark.timeout(1800)
def test_a_script_filling_out_is_stopped_and_its_copy_capped(tmp_path):
    result, run_dir = run_attack(tmp_path, "attack-fill-out", FILL_OUT,
                                 "timeout: 300\nlimits: {output: 16m}\nexpect:\n  exit_code: 0\n", "--no-diagnose")
    assert result["verdict"] == "error", result
    assert result["reason"] == "killed: /out grew past its cap (16 MiB)"
    assert result["killed"] == "/out grew past its cap (16 MiB); the lab stopped the container"
    copied = result["capture"]["out"]
    assert copied["bytes"] <= 16 << 20 and copied["files"] <= 16
    assert "would take the copy past its cap of 16 MiB" in copied["stopped"]
    assert sum(p.stat().st_size for p in (run_dir / "out").rglob("*") if p.is_file()) == copied["bytes"]
    report = (run_dir / "report.md").read_text()
    assert "the copy of /out stopped early" in report and "- Killed: /out grew past its cap (16 MiB)" in report
