"""The attacker tests of tests/test_attacks_run.py, against the local engine's bubblewrap sandbox
(`--engine local`): the same scripts from a stranger, the same canary folder outside the run folder
(snapshotted before and after), the same checks that the run folder holds no link, fifo or device.
Where the sandbox differs from a container, the assertions say how: the host's /home, /var and /run
are absent rather than read-only, the run user has no supplementary group, and the limits come from
rlimits and the lab's own watch of /out, not from cgroups.

The case is the attack tests' own (amd64, the CPU torch of tests/cpu_torch.py: here '2.13.0+cpu'
from the host's find-links folder): its venv is made once, then each run costs seconds.
"""

from __future__ import annotations

import json
import platform
import shutil
import socket
import stat
import uuid
from pathlib import Path

import pytest

from lab.engine import local_engine
from tests.conftest import last_json, run_lab
from tests.test_attacks_run import (
    DOCKER_SOCKET,
    FILL_OUT,
    FLOOD,
    FORK_BOMB,
    HEADER,
    HOST_SECRETS,
    LINKS,
    NETWORK,
    READ_ONLY,
    _Listener,
    canary,
    snapshot,
)

pytestmark = [pytest.mark.local, pytest.mark.timeout(1800), pytest.mark.usefixtures("cpu_torch"),
              pytest.mark.skipif(platform.machine() != "x86_64", reason="the case is an x86_64 wheel"),
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bwrap (run bin/setup-host)")]


def run_attack(tmp_path: Path, name: str, script: str, extra: str = "", *args: str,
               env: dict[str, str] | None = None, script_env: dict[str, str] | None = None) -> tuple[dict, Path]:
    """tests/test_attacks_run.run_attack, on the local engine, confined by bubblewrap."""
    folder = canary(tmp_path)
    scenario_dir = tmp_path / "scenario"
    scenario_dir.mkdir()
    (scenario_dir / f"{name}.py").write_text(script)
    (scenario_dir / f"{name}.yaml").write_text(
        f"name: {name}\n{HEADER}script: {name}.py\n"
        f"env: {json.dumps({'CANARY': str(folder), **(script_env or {})})}\n{extra}")
    before = snapshot(folder)
    proc = run_lab("run", str(scenario_dir / f"{name}.yaml"), "--engine", "local", "--out", str(tmp_path / "runs"),
                   "--json", *args, env={"LAB_BWRAP": "bwrap", **(env or {})})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    result = last_json(proc.stdout)
    assert result["local"]["confined"], result["local"]
    run_dir = Path(result["run_dir"])
    assert snapshot(folder) == before, "the canary folder outside the run folder changed"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["canary", "runs", "scenario"]
    lab_files = ("index.sqlite3", ".lab-key")  # the history index, the key of the run folders' markers
    assert sorted(p.name for p in (tmp_path / "runs").iterdir() if not p.name.startswith(lab_files)) == [name]
    assert list((tmp_path / "runs" / name).iterdir()) == [run_dir]
    for path in [run_dir, *run_dir.rglob("*")]:
        kind = stat.S_IFMT(path.lstat().st_mode)
        assert kind in (stat.S_IFREG, stat.S_IFDIR), f"{path} is not a plain file or folder"
        if kind == stat.S_IFREG:
            assert path.lstat().st_nlink == 1, f"{path} is a hard link"
    assert not survivors(name), "a process of the run outlived it"
    return result, run_dir


def survivors(name: str) -> list[int]:
    """Processes of this host still running the scenario's script (the sandbox's pid namespace ends with
    its pid 1, so there must be none)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"{name}.py".encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_links_hardlinks_and_fifos_in_outputs_are_never_followed_or_made(tmp_path):
    result, run_dir = run_attack(tmp_path, "attack-links", LINKS, "timeout: 300\nexpect:\n  stdout_contains: planted\n",
                                 "--diagnose")
    assert result["verdict"] == "reproduced", result
    skipped = {(s["path"], s["kind"]) for s in result["capture"]["out"]["skipped"]}
    assert {("stdout.txt", "symbolic link"), ("ld/ld.1", "symbolic link"), ("ld/root", "symbolic link"),
            ("ld/ld.2", "fifo"), ("diag.fifo", "fifo")} <= skipped, skipped
    first, second = sorted(("ld/ld.7", "ld/zz-hard"), key=lambda p: (p, "hard link") in skipped)
    assert (second, "hard link") in skipped and (first, "hard link") not in skipped, skipped
    assert (run_dir / "out" / first).read_text().startswith("7: calling init")
    assert not (run_dir / "out" / second).exists()
    assert "planted" in (run_dir / "stdout.txt").read_text()
    assert "planted" in (run_dir / "diagnose" / "stdout.txt").read_text()
    assert json.loads((run_dir / "diagnose" / "diagnostics.json").read_text())
    report = (run_dir / "report.md").read_text()
    assert "not copied (the lab never creates links, fifos or devices)" in report
    assert "`ld/ld.2` (fifo)" in report


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
        assert len(data) < (2 << 20) + 1024
        assert f"[torch-repro-lab: {name} cut at 1 MiB;".encode() in data
    assert stderr.endswith(b"\nstderr-end\n")
    # One process, one loader log, as in a container: the script is pid 1 of its namespace.
    assert [p.name for p in (run_dir / "out" / "ld").iterdir()] == ["ld.1"]
    assert "the sandbox was stopped and its partial logs kept" in result["killed"]


def test_a_fork_bomb_stops_at_the_pids_limit_and_the_run_gets_its_verdict(tmp_path):
    result, run_dir = run_attack(tmp_path, "attack-forkbomb", FORK_BOMB,
                                 "timeout: 20\nlimits: {pids: 64}\nexpect:\n  exit_code: 0\n", "--no-diagnose")
    assert result["verdict"] == "timeout", result
    assert result["limits"].startswith("memory 8 GiB, pids 64")
    stdout = (run_dir / "stdout.txt").read_text()
    line = next(ln for ln in stdout.splitlines() if ln.startswith("forked "))
    children = int(line.split()[1])
    assert 0 < children < 64 and line.endswith("BlockingIOError"), line


def test_the_script_cannot_reach_the_network(tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # picks the host's outgoing address; sends nothing
        host = s.getsockname()[0]
    listener = _Listener()
    listener.start()
    try:
        result, run_dir = run_attack(tmp_path, "attack-network", NETWORK,
                                     "timeout: 120\nexpect:\n  stdout_contains: 'connect: OSError'\n",
                                     "--no-diagnose",
                                     script_env={"ATTACK_HOST": host, "ATTACK_PORT": str(listener.port)})
    finally:
        listener.stop()
    stdout = (run_dir / "stdout.txt").read_text()
    assert result["verdict"] == "reproduced", stdout
    assert "connect: OSError errno=101" in stdout  # ENETUNREACH: only a loopback of its own
    assert "dns: gaierror" in stdout
    assert listener.accepted == 0
    assert "no network" in result["limits"] and "no network" in result["local"]["confinement"]


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


def test_the_docker_socket_is_absent(tmp_path):
    result, run_dir = run_attack(tmp_path, "attack-docker-socket", DOCKER_SOCKET,
                                 "timeout: 120\nexpect:\n  stdout_contains: 'docker api: FileNotFoundError'\n",
                                 "--no-diagnose", env={"DOCKER_HOST": "unix:///var/run/docker.sock"})
    stdout = (run_dir / "stdout.txt").read_text()
    assert result["verdict"] == "reproduced", stdout
    for path in ("/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock"):
        assert f"socket {path} False" in stdout
    assert "DOCKER_HOST None" in stdout


def test_the_script_is_not_root_and_writes_only_to_out_and_tmp(tmp_path):
    result, run_dir = run_attack(tmp_path, "attack-read-only", READ_ONLY,
                                 "timeout: 120\nexpect:\n  stdout_contains: done\n", "--no-diagnose")
    stdout = (run_dir / "stdout.txt").read_text()
    assert result["verdict"] == "reproduced", stdout
    assert "ids 10001 10001 10001 10001 []" in stdout  # no root group, no group at all
    assert "CapEff:\t0000000000000000" in stdout and "CapPrm:\t0000000000000000" in stdout
    assert "NoNewPrivs:\t1" in stdout
    for path in ("/x", "/etc/x", "/usr/x", "/lab/repro/x"):
        assert f"write refused {path} OSError 30" in stdout, path  # EROFS: the root is read-only
    for path in ("/opt/venv/x", "/root/x", "/var/x", "/home/x"):  # read-only or not there at all
        assert f"write refused {path} " in stdout, path
    for path in ("/tmp/x", "/out/x", "/out/ld/x"):
        assert f"write ok {path}" in stdout, path
    assert "setuid: PermissionError" in stdout and "chmod: ok" not in stdout
    assert (run_dir / "out" / "x").read_text() == "1"
    assert "- Confinement: bubblewrap" in (run_dir / "report.md").read_text()


def test_a_script_filling_out_is_stopped_and_its_copy_capped(tmp_path):
    result, run_dir = run_attack(tmp_path, "attack-fill-out", FILL_OUT,
                                 "timeout: 300\nlimits: {output: 16m}\nexpect:\n  exit_code: 0\n", "--no-diagnose")
    assert result["verdict"] == "error", result
    assert result["reason"] == "killed: /out grew past its cap (16 MiB)"
    assert result["killed"] == "/out grew past its cap (16 MiB); the lab stopped the sandbox"
    copied = result["capture"]["out"]
    assert copied["bytes"] <= 16 << 20 and copied["files"] <= 16
    assert "would take the copy past its cap of 16 MiB" in copied["stopped"]
    assert sum(p.stat().st_size for p in (run_dir / "out").rglob("*") if p.is_file()) == copied["bytes"]


ETC_VIEW = """
import json, os, pwd, grp, shutil, socket, ssl, subprocess
token = (os.environ["TOKEN_HEAD"] + os.environ["TOKEN_TAIL"]).encode()  # never whole in the run's records
for path in (os.environ["SECRET_FILE"], "/etc/pip.conf", "/etc/shadow", "/etc/ssl/private", "/etc/hostname"):
    try:
        with open(path, "rb") as fh:
            print("read", path, fh.read()[:200])
    except OSError as exc:
        print("cannot read", path, type(exc).__name__)
print("etc", json.dumps(sorted(os.listdir("/etc"))))
found = []
for folder, _, files in os.walk("/etc"):
    for name in files:
        try:
            with open(os.path.join(folder, name), "rb") as fh:
                if token in fh.read(1 << 22):
                    found.append(os.path.join(folder, name))
        except OSError:
            continue
print("found", found)
print("user", pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name, pwd.getpwuid(0).pw_name)
print("localhost", socket.gethostbyname("localhost"))
print("ca", ssl.create_default_context().cert_store_stats()["x509_ca"] > 0)
for cc in ("c++", "cc", "g++"):
    version = subprocess.run([cc, "--version"], capture_output=True, text=True)
    print("compiler", cc, os.path.realpath(shutil.which(cc)), version.returncode)
import torch
torch.manual_seed(0)
f = torch.compile(lambda x: (x.sin() + x.cos()) * 2, backend="inductor")
x = torch.randn(64)
# float32 tolerance: Inductor's vectorized sin/cos differ from eager's by a few ulps (up to 4.8e-07 seen),
# which allclose's default atol=1e-08 calls a mismatch near a zero of sin+cos (11 random inputs of 300)
print("inductor", bool(torch.allclose(f(x), (x.sin() + x.cos()) * 2, atol=1e-5)))
print("done")
"""


def test_the_script_sees_a_minimal_etc_and_no_host_file_planted_there(tmp_path):
    """A token planted in host files under /etc (a new file, and /etc/pip.conf where there is none) is not
    readable by the script; what it sees of /etc is the lab's list; torch.compile with Inductor (g++
    through the host's alternatives, the loader cache, Python.h) still works in that /etc."""
    token = f"lab-attack-etc-{uuid.uuid4().hex}"
    secret = Path(f"/etc/lab-test-secret-{uuid.uuid4().hex}")
    pip_conf = Path("/etc/pip.conf")
    planted = [secret] + ([] if pip_conf.exists() or pip_conf.is_symlink() else [pip_conf])
    try:
        secret.write_text(f"{token}\n")
        if pip_conf in planted:
            pip_conf.write_text(f"[global]\nindex-url = https://user:{token}@example.invalid/simple\n")
        result, run_dir = run_attack(tmp_path, "attack-etc", ETC_VIEW,
                                     "timeout: 600\nexpect:\n  stdout_contains: done\n", "--no-diagnose",
                                     script_env={"TOKEN_HEAD": token[:20], "TOKEN_TAIL": token[20:],
                                                 "SECRET_FILE": str(secret)})
    finally:
        for path in planted:
            path.unlink(missing_ok=True)
    stdout = (run_dir / "stdout.txt").read_text()
    assert result["verdict"] == "reproduced", stdout + (run_dir / "stderr.txt").read_text()[-3000:]
    for path in (secret, "/etc/pip.conf", "/etc/shadow", "/etc/ssl/private", "/etc/hostname"):
        assert f"cannot read {path} FileNotFoundError" in stdout, path
    assert "found []" in stdout
    seen = set(json.loads(stdout.split("etc ", 1)[1].splitlines()[0]))
    allowed = {n.split("/")[0] for n in (*local_engine.ETC_FROM_HOST, *local_engine.ETC_MADE)}
    assert seen <= allowed and {"passwd", "group", "hosts", "nsswitch.conf"} <= seen, seen
    assert {"ld.so.cache", "ssl"} <= seen and ("alternatives" in seen) == Path("/etc/alternatives").is_dir()
    assert "user lab lab root" in stdout and "localhost 127.0.0.1" in stdout and "ca True" in stdout
    for cc in ("c++", "cc", "g++"):
        assert f"compiler {cc} " in stdout and stdout.split(f"compiler {cc} ")[1].split("\n")[0].endswith(" 0")
    assert "inductor True" in stdout
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert token.encode() not in path.read_bytes(), path
