"""Faults, against the real engine: an unreachable daemon, a failed build, an OOM kill, Ctrl-C
during a build, two runs of one case at once, and the confinement of the repro container.

The amd64 scenarios here share every layer but the script with scenarios/libgomp-amd64.yaml,
so once that image exists they cost seconds; their torch is the amd64 CPU build tests/cpu_torch.py
finds.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import docker
import pytest

from tests.conftest import DATA, ROOT, last_json, run_lab
from tests.cpu_torch import TORCH

E2E = DATA / "e2e"

def _containers_of(scenario: str, marker: str) -> dict[str, str]:
    """id -> name of every container, running or not, that one test's run could leave behind: its
    case's (a container carries its image's labels, the scenario's name among them) and its build's
    intermediate ones (their command holds `marker`, a word only this test's Dockerfile has). Scoped
    so, the test needs no engine to itself: bin/test's other lane runs its own cases meanwhile."""
    client = docker.from_env()
    found = {c.id: c.name for c in client.containers.list(
        all=True, filters={"label": f"org.torch-repro-lab.scenario={scenario}"})}
    for c in client.containers.list(all=True):
        cmd = (c.attrs.get("Config") or {}).get("Cmd") or []
        if marker in " ".join(cmd if isinstance(cmd, list) else [str(cmd)]):
            found[c.id] = c.name
    return found


@pytest.mark.usefixtures("cpu_torch")
def test_unreachable_daemon_gives_one_paragraph_and_doctors_advice(tmp_path):
    proc = run_lab("run", str(E2E / "sleeper.yaml"), *TORCH.args, "--out", str(tmp_path),
                   env={"DOCKER_HOST": f"unix://{tmp_path}/no-such-docker.sock"})
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "does not answer" in proc.stderr and "lab doctor" in proc.stderr
    assert proc.stderr.count("error:") == 1


@pytest.mark.docker
@pytest.mark.timeout(1800)
@pytest.mark.usefixtures("cpu_torch")
def test_a_failed_build_is_an_error_verdict_with_the_build_log(tmp_path):
    before = _containers_of("buildfail", "lab-no-such-debian-package")
    proc = run_lab("run", str(E2E / "buildfail.yaml"), *TORCH.args, "--out", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    assert result["verdict"] == "error"
    assert "build failed" in result["reason"]
    run_dir = Path(result["run_dir"])
    log = (run_dir / "build.log").read_text()
    assert "lab-no-such-debian-package" in log
    assert "build failed" in (run_dir / "report.md").read_text()
    # neither a container of the case nor the failed step's own is left
    left = _containers_of("buildfail", "lab-no-such-debian-package")
    assert left.keys() <= before.keys(), left


@pytest.mark.docker
@pytest.mark.timeout(1800)
@pytest.mark.usefixtures("cpu_torch")
def test_an_oom_kill_is_evidence_with_the_limit(tmp_path):
    proc = run_lab("run", str(E2E / "oom.yaml"), *TORCH.args, "--out", str(tmp_path), "--json", "--no-diagnose")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    assert result["verdict"] == "error", result
    assert result["reason"] == "killed: out of memory (limit 256 MiB)"
    assert result["killed"] == "out of memory (limit 256 MiB)"
    assert result["exit_code"] == 137
    run_dir = Path(result["run_dir"])
    assert "starting" in (run_dir / "stdout.txt").read_text()  # what it printed before the kill is kept
    report = (run_dir / "report.md").read_text()
    assert "the container was killed: out of memory (limit 256 MiB)" in report
    assert "- Killed: out of memory (limit 256 MiB)" in report
    assert "memory 256 MiB" in report
    assert "killed: out of memory (limit 256 MiB)" in proc.stderr  # what the user sees


def _slow_templates(tmp_path: Path) -> tuple[Path, str]:
    """The lab's templates with one slow build step added (LAB_TEMPLATES_DIR is a lab feature), and
    the word only that step's command holds."""
    folder = tmp_path / "templates"
    shutil.copytree(ROOT / "dockerfiles", folder)
    template = folder / "debian.Dockerfile.j2"
    text = template.read_text()
    marker = "FROM ${BASE}\n"
    assert marker in text
    word = f"lab-slow-step-{uuid.uuid4().hex[:8]}"
    template.write_text(text.replace(marker, marker + f"RUN echo {word} && sleep 600\n", 1))
    return folder, word


class _Reader(threading.Thread):
    def __init__(self, stream) -> None:
        super().__init__(daemon=True)
        self.stream, self.text = stream, ""

    def run(self) -> None:
        for line in self.stream:
            self.text += line


@pytest.mark.docker
@pytest.mark.timeout(1800)
@pytest.mark.usefixtures("cpu_torch")
def test_ctrl_c_during_a_build_leaves_no_container_and_marks_the_folder(tmp_path):
    templates, marker = _slow_templates(tmp_path)
    before = _containers_of("sleeper", marker)
    env = {**os.environ, "LAB_TEMPLATES_DIR": str(templates)}
    proc = subprocess.Popen([sys.executable, "-m", "lab", "run", str(E2E / "sleeper.yaml"), *TORCH.args, "--out",
                             str(tmp_path / "runs")], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    reader = _Reader(proc.stderr)
    reader.start()
    deadline = time.monotonic() + 1500  # cold, the base and apt layers come first
    while time.monotonic() < deadline and proc.poll() is None and "lab-slow-step" not in reader.text:
        time.sleep(0.5)
    assert "lab-slow-step" in reader.text, reader.text[-3000:]
    time.sleep(3)  # the build's RUN container is up
    os.kill(proc.pid, signal.SIGINT)
    proc.wait(timeout=120)
    reader.join(timeout=10)
    assert proc.returncode == 130, reader.text[-3000:]
    assert "Traceback" not in reader.text
    # No container of the case is left, and the engine also stops the build's own intermediate
    # container (the slow step's) once the client is gone.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        left = {i: n for i, n in _containers_of("sleeper", marker).items() if i not in before}
        if not left:
            break
        time.sleep(2)
    assert not left, left
    (result_file,) = (tmp_path / "runs").glob("sleeper/*/result.json")
    result = json.loads(result_file.read_text())
    assert result["status"] == "interrupted" and result["verdict"] is None


@pytest.mark.docker
@pytest.mark.timeout(2400)
@pytest.mark.usefixtures("cpu_torch")
def test_two_runs_of_one_case_at_once_both_complete(tmp_path):
    """A fresh script (so both processes build the same new image at once), one runs folder."""
    token = uuid.uuid4().hex
    (tmp_path / "twice.py").write_text(f'print("hello {token}")\n')
    (tmp_path / "twice.yaml").write_text(
        f"name: twice\n{TORCH.header}base: debian:bookworm\n"
        "system_packages: [g++, python3-dev]\npip: [numpy]\nscript: twice.py\ntimeout: 300\n"
        f"expect:\n  stdout_contains: 'hello {token}'\n")
    cache = tmp_path / "cache"  # a fresh lab cache: both processes fill it at the same time
    env = {**os.environ, "LAB_CACHE_DIR": str(cache)}
    command = [sys.executable, "-m", "lab", "run", str(tmp_path / "twice.yaml"), "--out", str(tmp_path / "runs"),
               "--json", "--no-diagnose"]
    procs = [subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=2000) for p in procs]
    results = []
    for p, (stdout, stderr) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, stderr[-3000:]
        results.append(last_json(stdout))
    assert [r["verdict"] for r in results] == ["reproduced", "reproduced"], results
    folders = {r["run_dir"] for r in results}
    assert len(folders) == 2
    for r in results:
        run_dir = Path(r["run_dir"])
        assert f"hello {token}" in (run_dir / "stdout.txt").read_text()
        assert json.loads((run_dir / "result.json").read_text())["run_dir"] == r["run_dir"]
    assert results[0]["image"]["tag"] == results[1]["image"]["tag"]
    # Nothing half-written is left in the cache, and a third run reuses everything.
    from lab.image.crossinstall import unfinished
    assert not unfinished(cache / "site")
    entries = [p for p in (cache / "site").iterdir() if p.is_dir()]
    assert len(entries) == 1, entries  # one cross-installed site, made once
    third = run_lab("run", str(tmp_path / "twice.yaml"), "--out", str(tmp_path / "runs"), "--json",
                    "--no-diagnose", env={"LAB_CACHE_DIR": str(cache)})
    assert third.returncode == 0, third.stderr[-3000:]
    again = last_json(third.stdout)
    assert again["verdict"] == "reproduced" and again["image"]["cached"] is True
    assert again["image"]["tag"] == results[0]["image"]["tag"]


CONFINED = """
import os, socket, sys
status = open("/proc/self/status").read()
caps = [l for l in status.splitlines() if l.startswith(("CapEff", "NoNewPrivs"))]
print(*caps, sep="\\n")
print("cgroup-pids", open("/sys/fs/cgroup/pids/pids.max").read().strip()
      if os.path.exists("/sys/fs/cgroup/pids/pids.max") else open("/sys/fs/cgroup/pids.max").read().strip())
print("docker-sock", os.path.exists("/var/run/docker.sock"))
try:
    socket.create_connection(("pypi.org", 443), timeout=5)
    print("network yes")
except OSError as e:
    print("network no")
# /proc/self/mountinfo: id parent major:minor root mountpoint options ... - fstype source superoptions
info = [l.split() for l in open("/proc/self/mountinfo")]
fields = {l[4]: (l[3], l[5], l[l.index("-") + 1]) for l in info}
mounts = [m for m, (root, opts, fstype) in fields.items() if fstype not in ("proc", "tmpfs", "devpts", "sysfs",
          "cgroup", "mqueue", "overlay", "cgroup2") and not m.startswith(("/proc", "/sys", "/dev", "/etc/"))]
print("mounts", sorted(m for m in mounts if not m.startswith("/opt/venv/")))
venv = [m for m in mounts if m.startswith("/opt/venv/")]
print("venv-mounts", len(venv))
print("venv-mounts-writable", sorted(m for m in venv if "ro" not in fields[m][1].split(",")))
print("out-root", fields["/out"][0])
print("root-options", fields["/"][1])
print("tmp", fields["/tmp"][2], fields["/tmp"][1])
print("uid", os.getuid())
"""


@pytest.mark.docker
@pytest.mark.timeout(1800)
@pytest.mark.usefixtures("cpu_torch")
def test_the_script_runs_confined(tmp_path):
    (tmp_path / "confined.py").write_text(CONFINED)
    (tmp_path / "confined.yaml").write_text(
        f"name: confined\n{TORCH.header}base: debian:bookworm\n"
        "system_packages: [g++, python3-dev]\npip: [numpy]\nscript: confined.py\ntimeout: 300\n"
        "limits: {pids: 321}\nexpect:\n  stdout_contains: 'network no'\n")
    proc = run_lab("run", str(tmp_path / "confined.yaml"), "--out", str(tmp_path / "runs"), "--json",
                   "--no-diagnose")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    stdout = (Path(result["run_dir"]) / "stdout.txt").read_text()
    assert result["verdict"] == "reproduced", stdout
    assert "CapEff:\t0000000000000000" in stdout
    assert "NoNewPrivs:\t1" in stdout
    assert "cgroup-pids 321" in stdout
    assert "docker-sock False" in stdout
    assert "mounts ['/out']" in stdout, stdout  # and /tmp, a tmpfs; besides them only the venv's tree:
    # on a Docker engine on this host the cached torch tree is mounted read-only at the venv's paths
    mounted = int(next(ln for ln in stdout.splitlines() if ln.startswith("venv-mounts ")).split()[1])
    assert (mounted > 0) is result["image"]["site_mounted"] is True, stdout
    assert "venv-mounts-writable []" in stdout, stdout
    # /out is a Docker volume (the engine's own folder), not a bind mount of a host folder.
    out_root = next(ln for ln in stdout.splitlines() if ln.startswith("out-root ")).split()[1]
    assert "/volumes/" in out_root and out_root.endswith("/_data"), out_root
    assert str(tmp_path) not in stdout
    root_options = next(ln for ln in stdout.splitlines() if ln.startswith("root-options ")).split()[1]
    assert root_options.split(",")[0] == "ro", root_options
    tmp = next(ln for ln in stdout.splitlines() if ln.startswith("tmp ")).split()
    assert tmp[1] == "tmpfs" and "noexec" not in tmp[2].split(",") and "nosuid" in tmp[2].split(","), tmp
    assert "uid 10001" in stdout


def test_a_scenario_that_asks_for_network_needs_allow_network(tmp_path):
    (tmp_path / "s.py").write_text("")
    (tmp_path / "net.yaml").write_text(
        "name: net\ntorch: '2.13.0+cpu'\narch: amd64\nbase: debian:bookworm\nscript: s.py\nnetwork: true\n"
        "expect:\n  exit_code: 0\n")
    proc = run_lab("run", str(tmp_path / "net.yaml"), "--out", str(tmp_path / "runs"))
    assert proc.returncode == 2, proc.stderr
    assert "--allow-network" in proc.stderr and "net.yaml" in proc.stderr
    assert "Traceback" not in proc.stderr
