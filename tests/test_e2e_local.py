"""The local engine for real, through the `lab` CLI, on this host: uv venvs, bubblewrap (bin/setup-host
installs it), the in-image runner, verdicts, a bisection.

The small native CPU case is the amd64 CPU torch tests/cpu_torch.py finds (here '2.13.0+cpu' for
cp311 x86_64 from the host's find-links folder: 190 MB, no CUDA wheels), the same as the Docker
attack tests'. The bisection is compile-py311 across 2.0.0,
2.0.1 and 2.1.0 (PyPI's CUDA builds: their wheels come once into uv's cache, then each probe's venv
takes seconds).
"""

from __future__ import annotations

import json
import platform
import shutil
import socket
import threading
from pathlib import Path

import pytest

from tests.conftest import last_json, run_lab
from tests.cpu_torch import TORCH

pytestmark = [pytest.mark.local, pytest.mark.timeout(3600)]

needs_amd64 = pytest.mark.skipif(platform.machine() != "x86_64", reason="the small CPU case is an x86_64 wheel")
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bwrap (run bin/setup-host)")

HEADER = (f"{TORCH.header}base: debian:bookworm\nsystem_packages: [g++, python3-dev]\n"
          "pip: [numpy]\n")


def scenario(tmp_path: Path, name: str, script: str, extra: str = "", header: str = HEADER) -> Path:
    folder = tmp_path / "scenario"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.py").write_text(script)
    path = folder / f"{name}.yaml"
    path.write_text(f"name: {name}\n{header}script: {name}.py\n{extra}")
    return path


def lab_local(tmp_path: Path, path: Path, *args: str, env: dict | None = None):
    return run_lab("run", str(path), "--engine", "local", "--out", str(tmp_path / "runs"), "--json",
                   "--no-diagnose", *args, env=env)


CONFINED = """
import os, socket, sys, torch
print("torch", torch.__version__, "ids", os.getuid(), os.getgid(), flush=True)
canary = os.environ["CANARY"]
for path in (canary + "/written.txt", "/x", "/etc/x", "/usr/x", sys.prefix + "/x", "/lab/repro/x", "/root/x",
             "/home/x", "/var/x", "/tmp/x", "/out/x"):
    try:
        with open(path, "w") as fh:
            fh.write("1")
        print("write ok", path)
    except OSError as exc:
        print("write refused", path, type(exc).__name__, exc.errno)
print("canary visible", os.path.exists(canary))
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
for sock in ("/var/run/docker.sock", "/run/docker.sock"):
    print("socket", sock, os.path.exists(sock))
try:  # what Inductor's compile workers need, as in a container: a /dev/shm, and setuptools in the venv
    import multiprocessing
    multiprocessing.Lock()
    print("semaphore ok")
except OSError as exc:
    print(f"semaphore: {type(exc).__name__} {exc}")
try:
    import setuptools
    print("setuptools", setuptools.__version__)
except ImportError as exc:
    print(f"setuptools: {exc}")
print("done")
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


def _host_address() -> str:
    """An address of this host other than loopback (the sandbox has only its own lo)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this picks the outgoing interface
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


@needs_amd64
@needs_bwrap
@pytest.mark.usefixtures("cpu_torch")
def test_a_confined_run_writes_only_its_out_folder_and_reaches_no_network(tmp_path):
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "secret.txt").write_text("host-secret\n")
    listener = _Listener()
    listener.start()
    env = {"CANARY": str(canary), "ATTACK_HOST": _host_address(), "ATTACK_PORT": str(listener.port)}
    path = scenario(tmp_path, "local-confined", CONFINED,
                    f"env: {json.dumps(env)}\ntimeout: 600\nexpect:\n  stdout_contains: done\n")
    try:
        proc = lab_local(tmp_path, path)
    finally:
        listener.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    run_dir = Path(result["run_dir"])
    stdout = (run_dir / "stdout.txt").read_text()
    assert result["verdict"] == "reproduced", stdout
    assert f"torch {TORCH.version} ids 10001 10001" in stdout
    # nothing outside the run's /out is writable: the host's folders are read-only or absent
    assert f"write refused {canary}/written.txt" in stdout and not (canary / "written.txt").exists()
    assert "canary visible False" in stdout  # the host's /tmp is not the sandbox's
    for where in ("/x", "/etc/x", "/usr/x", "/lab/repro/x", "/root/x"):
        assert f"write refused {where} OSError 30" in stdout, where  # EROFS
    for where in ("/home/x", "/var/x"):  # not even there: the host's /home and /var are not in the sandbox
        assert f"write refused {where} FileNotFoundError 2" in stdout, where
    assert "write refused " + result["local"]["environment"] + "/x OSError 30" in stdout  # the venv
    assert "write ok /tmp/x" in stdout and "write ok /out/x" in stdout
    assert (run_dir / "out" / "x").read_text() == "1"
    # no network: no route to the host, no DNS, and the listener saw nothing
    assert "connect: OSError errno=101" in stdout and "dns: gaierror" in stdout
    assert listener.accepted == 0
    assert "socket /var/run/docker.sock False" in stdout and "socket /run/docker.sock False" in stdout
    assert "semaphore ok" in stdout and "\nsetuptools " in stdout  # as in a container (Inductor needs both)
    # the records say where it ran
    assert result["engine"]["kind"] == "local" and result["engine"]["name"] == "local"
    assert result["engine"]["version"].startswith("bubblewrap ")
    local = result["local"]
    assert local["confined"] and local["python_env"] == "venv" and "no network" in local["confinement"]
    assert local["libc"].startswith("glibc ") and local["os"]
    assert local["system_packages"].startswith("from the host, not the scenario's base image debian:bookworm")
    assert result["emulated"] is False and result["base"] is None
    report = (run_dir / "report.md").read_text()
    assert "- Engine: local (this host, no container; bubblewrap" in report
    assert "- Host: " in report and "- System packages: from the host" in report
    assert "--engine local" in report  # the rerun command
    page = (run_dir / "report.html").read_text()
    assert "local (this host, no container; bubblewrap" in page and "System packages" in page
    assert json.loads((run_dir / "result.json").read_text())["local"]["confined"] is True
    assert (run_dir / "pip-freeze.txt").read_text().count(f"torch=={TORCH.version}") == 1
    assert f"PyTorch version: {TORCH.version}" in (run_dir / "collect_env.txt").read_text()
    assert list((run_dir / "out" / "ld").iterdir()), "LD_DEBUG wrote the loader logs into /out/ld"


@needs_amd64
@pytest.mark.usefixtures("cpu_torch")
def test_the_current_interpreter_runs_when_its_torch_matches_and_says_why_not_otherwise(tmp_path):
    path = scenario(tmp_path, "local-current", "import sys, torch\nprint('torch', torch.__version__, sys.executable)\n",
                    f"timeout: 300\nexpect:\n  stdout_contains: 'torch {TORCH.version}'\n")
    # a Python that has the CPU torch: the venv the lab made for this case
    first = lab_local(tmp_path, path, "--trust-script")
    assert first.returncode == 0, first.stderr[-3000:]
    venv = last_json(first.stdout)["local"]["environment"]
    python = f"{venv}/bin/python"

    proc = lab_local(tmp_path, path, "--python-env", "current", env={"LAB_LOCAL_PYTHON": python})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    assert result["verdict"] == "reproduced", result["reason"]
    assert result["local"]["python_env"] == "current" and result["local"]["environment"] == python
    assert python in (Path(result["run_dir"]) / "stdout.txt").read_text()
    assert "--python-env current" in (Path(result["run_dir"]) / "report.md").read_text()

    wanted = "2.12.0" if not TORCH.version.startswith("2.12.") else "2.11.0"
    other = lab_local(tmp_path, path, "--python-env", "current", "--torch", wanted,
                      env={"LAB_LOCAL_PYTHON": python})
    assert other.returncode != 0
    text = " ".join(other.stderr.split())
    assert f"has torch {TORCH.version}" in text and f"wants torch {wanted}" in text, text
    assert f"--torch {TORCH.version}" in text  # how to run what is there
    assert "Traceback" not in other.stderr

    none = lab_local(tmp_path, path, "--python-env", "current")  # the lab's own Python: no torch
    assert none.returncode != 0 and "has no torch installed" in " ".join(none.stderr.split()), none.stderr[-2000:]


@needs_amd64
@pytest.mark.usefixtures("cpu_torch")
def test_a_missing_system_package_is_named_and_never_installed(tmp_path):
    header = HEADER.replace("[g++, python3-dev]", "[g++, lab-absent-package]")
    path = scenario(tmp_path, "local-missing", "print('never runs')\n", "expect:\n  exit_code: 0\n", header)
    proc = lab_local(tmp_path, path)
    assert proc.returncode != 0
    text = " ".join(proc.stderr.split())
    assert "needs system packages that this host does not have: lab-absent-package" in text
    assert "never installs any" in text and "apt-get install lab-absent-package" in text
    assert "Traceback" not in proc.stderr
    folder = tmp_path / "runs" / "local-missing"
    assert not folder.exists() or not any(folder.iterdir())  # refused before anything was made


@needs_amd64
@pytest.mark.usefixtures("cpu_torch")
def test_without_bwrap_it_runs_only_a_trusted_script_and_says_not_confined(tmp_path):
    script = "import os\nprint('uid', os.getuid(), 'out', os.path.isdir('/out'))\n"
    path = scenario(tmp_path, "local-unconfined", script, "timeout: 300\nexpect:\n  stdout_contains: uid\n")
    refused = lab_local(tmp_path, path, env={"LAB_BWRAP": "off"})
    assert refused.returncode != 0
    assert "cannot confine the script here" in refused.stderr and "--trust-script" in refused.stderr
    proc = lab_local(tmp_path, path, "--trust-script", env={"LAB_BWRAP": "off"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    assert result["verdict"] == "reproduced" and result["local"]["confined"] is False
    assert result["engine"]["version"] == "unconfined"
    assert "not confined" in (Path(result["run_dir"]) / "report.md").read_text()
    assert "NOT CONFINED" in proc.stderr


def test_another_arch_is_refused_with_a_pointer_to_docker_engines(tmp_path):
    arch = "arm64" if platform.machine() == "x86_64" else "amd64"
    path = scenario(tmp_path, "local-foreign", "print(1)\n", "expect:\n  exit_code: 0\n",
                    HEADER.replace("arch: amd64", f"arch: {arch}").replace(TORCH.version, "2.5.1"))
    proc = lab_local(tmp_path, path)
    assert proc.returncode != 0
    text = " ".join(proc.stderr.split())
    assert "runs only this host's" in text and "without emulation" in text, text
    assert "Docker" in text


def test_lab_engines_lists_local():
    proc = run_lab("engines", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    local = [e for e in last_json(proc.stdout)["engines"] if e["name"] == "local"]
    assert local and local[0]["kind"] == "local" and local[0]["emulates"] == []
    assert local[0]["arch"] in ("amd64", "arm64") and local[0]["confinement"]


@needs_amd64
@needs_bwrap
def test_a_bisection_on_the_local_engine_across_three_releases(tmp_path, frees_its_cuda_build):
    runs = tmp_path / "runs"
    proc = run_lab("bisect", "compile-py311", "--from", "2.0.0", "--to", "2.1.0", "--engine", "local",
                   "--out", str(runs), "--json", "--no-blame")  # blame: test_e2e_blame
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    assert result["status"] == "found", result
    assert (result["last_old"], result["first_new"]) == ("2.0.1", "2.1.0")
    steps = {s["torch"]: s["verdict"] for s in result["steps"]}
    assert steps == {"2.0.0": "reproduced", "2.1.0": "not_reproduced", "2.0.1": "reproduced"}
    assert {s["engine"] for s in result["steps"]} == {"local"}
    assert "--engine local" in result["resume"]
    probe = json.loads((Path(result["folder"]) / "torch2.0.1" / "result.json").read_text())
    assert probe["engine"]["kind"] == "local" and probe["local"]["confined"]
    assert "Python 3.11+ not yet supported for torch.compile" in (
        Path(result["folder"]) / "torch2.0.1" / "stderr.txt").read_text()


def _stand_in_torch(folder: Path, version: str) -> None:
    """A wheel named torch, pure Python, whose only content is its version: a release list whose
    verdicts the scenario's `expect` alone decides (the boundary is hidden in `expect`). Fixed zip
    dates, so the same version always has the same bytes."""
    import base64
    import hashlib
    import zipfile
    info = f"torch-{version}.dist-info"
    files = {"torch/__init__.py": f'__version__ = "{version}"\n'.encode(),
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n".encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},"
                     f"{len(d)}\n" for p, d in files.items()) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(folder / f"torch-{version}-py3-none-any.whl", "w") as z:
        for name, data in [*files.items(), (f"{info}/RECORD", record.encode())]:
            z.writestr(zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0)), data)


@needs_bwrap
def test_a_bisection_after_an_edit_of_expect_runs_its_probes_again_and_finds_the_new_boundary(tmp_path):
    """Issue 33, item 4: a probe is reused only when its content key matches. Three stand-in torch
    releases (0.0.1, 0.0.2, 0.1.0) from a find-links folder; the script prints the version, and
    `expect` decides which releases reproduce. The first bisection finds 0.0.2 -> 0.1.0; after `expect`
    is edited, the same command must run every probe again (and say why) and find 0.0.1 -> 0.0.2,
    where the old probes would have given the old boundary. The printed resume command then reuses
    every probe of the second bisection."""
    import shlex
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for version in ("0.0.1", "0.0.2", "0.1.0"):
        _stand_in_torch(wheels, version)
    arch = "arm64" if platform.machine() in ("aarch64", "arm64") else "amd64"
    header = f"torch: '0.0.1'\narch: {arch}\nbase: debian:bookworm\n"
    path = scenario(tmp_path, "stand-in", "import torch\nprint('torch', torch.__version__)\n",
                    "expect:\n  stdout_contains: 'torch 0.0.'\n", header=header)
    env = {"PIP_FIND_LINKS": str(wheels)}
    args = ["bisect", str(path), "--from", "0.0.1", "--to", "0.1.0", "--engine", "local", "--out",
            str(tmp_path / "runs"), "--json"]
    first = run_lab(*args, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    result = last_json(first.stdout)
    assert (result["status"], result["last_old"], result["first_new"]) == ("found", "0.0.2", "0.1.0"), result
    probe = json.loads((Path(result["folder"]) / "torch0.0.2" / "result.json").read_text())
    assert len(probe["content_key"]) == 64 and set(probe["content_parts"]) >= {"expect", "script", "vars"}

    path.write_text(path.read_text().replace("'torch 0.0.'", "'torch 0.0.1'"))
    second = run_lab(*args, env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    result = last_json(second.stdout)
    assert (result["status"], result["last_old"], result["first_new"]) == ("found", "0.0.1", "0.0.2"), result
    assert {s["torch"]: s["verdict"] for s in result["steps"]} == {
        "0.0.1": "reproduced", "0.1.0": "not_reproduced", "0.0.2": "not_reproduced"}
    for version in ("0.0.1", "0.0.2", "0.1.0"):
        assert f"probe {version} runs again: the scenario changed since (expect)" in second.stderr
    assert "(from an earlier run)" not in second.stderr

    resumed = run_lab(*shlex.split(result["resume"])[1:], "--json", env=env)  # the command it printed
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.stderr.count("(from an earlier run)") == 3 and "runs again" not in resumed.stderr
    assert last_json(resumed.stdout)["first_new"] == "0.0.2"


@needs_bwrap
def test_a_bisection_after_a_matrix_takes_its_verdicts_and_collects_env_only_at_the_boundary(tmp_path):
    """Issue 34, items 3 and 4: a matrix runs the two ends (0.0.1 and 0.1.0 of four stand-in releases);
    the bisection over them takes those verdicts (it says from which folders), runs only the releases
    between, and finds the boundary a bisection without them finds (0.0.3 -> 0.1.0). Its probe 0.0.2,
    not the boundary, has no collect_env.txt; its probe 0.0.3, at the boundary, has one."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for version in ("0.0.1", "0.0.2", "0.0.3", "0.1.0"):
        _stand_in_torch(wheels, version)
    arch = "arm64" if platform.machine() in ("aarch64", "arm64") else "amd64"
    path = scenario(tmp_path, "stand-in-reuse", "import torch\nprint('torch', torch.__version__)\n",
                    "expect:\n  stdout_contains: 'torch 0.0.'\n",
                    header=f"torch: '0.0.1'\narch: {arch}\nbase: debian:bookworm\n")
    env = {"PIP_FIND_LINKS": str(wheels)}
    runs = tmp_path / "runs"
    matrix = run_lab("run", str(path), "--torch", "0.0.1,0.1.0", "--engine", "local", "--out", str(runs),
                     "--json", "--no-diagnose", env=env)
    assert matrix.returncode == 0, matrix.stderr[-3000:]
    cells = {c["torch"]: c for c in last_json(matrix.stdout)["cells"]}
    assert {v: c["verdict"] for v, c in cells.items()} == {"0.0.1": "reproduced", "0.1.0": "not_reproduced"}

    proc = run_lab("bisect", str(path), "--from", "0.0.1", "--to", "0.1.0", "--engine", "local", "--out",
                   str(runs), "--json", "--no-blame", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    assert (result["status"], result["last_old"], result["first_new"]) == ("found", "0.0.3", "0.1.0"), result
    steps = {s["torch"]: s for s in result["steps"]}
    assert {v: s["verdict"] for v, s in steps.items()} == {
        "0.0.1": "reproduced", "0.1.0": "not_reproduced", "0.0.2": "reproduced", "0.0.3": "reproduced"}
    for version in ("0.0.1", "0.1.0"):  # the matrix's cells, not run again
        assert steps[version]["reused_from"] == cells[version]["runs"][0]["run_dir"]
        assert not (Path(result["folder"]) / f"torch{version}").exists()
        assert f"torch {version}: {steps[version]['verdict']}, taken from {steps[version]['reused_from']}" in \
            " ".join(result["notes"])
    assert steps["0.0.2"]["reused_from"] is None and steps["0.0.3"]["reused_from"] is None
    folder = Path(result["folder"])
    assert not (folder / "torch0.0.2" / "collect_env.txt").exists()  # not the boundary
    assert (folder / "torch0.0.3" / "collect_env.txt").is_file(), (result["notes"], proc.stderr[-3000:])  # boundary
    assert str(steps["0.0.1"]["reused_from"]) in (folder / "bisect.md").read_text()


@needs_bwrap
def test_two_slots_start_each_probe_when_one_is_free_and_stop_the_one_no_longer_needed(tmp_path):
    """Issue 34: with two slots (`--jobs 2`) a slot takes its next probe as soon as it is free. Five
    stand-in releases; 0.0.1 and 0.0.2 reproduce. The scripts' sleeps set who finishes first: 0.0.1
    (at once) frees its slot while 0.1.0 runs (8 s), so 0.0.3 starts in the middle (40 s); then 0.0.2,
    then 0.0.4, whose script would sleep 10 minutes. 0.0.3's answer closes the search at 0.0.2 ->
    0.0.3, so 0.0.4 must be stopped, not waited for: it leaves no step and no folder, only a note."""
    versions = ("0.0.1", "0.0.2", "0.0.3", "0.0.4", "0.1.0")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for version in versions:
        _stand_in_torch(wheels, version)
    arch = "arm64" if platform.machine() in ("aarch64", "arm64") else "amd64"
    script = ("import time, torch\nv = torch.__version__\n"
              "time.sleep({'0.1.0': 8, '0.0.3': 40, '0.0.4': 600}.get(v, 0))\n"
              "print('old' if v in ('0.0.1', '0.0.2') else 'new', v)\n")
    path = scenario(tmp_path, "stand-in-slots", script, "expect:\n  stdout_contains: 'old'\n",
                    header=f"torch: '0.0.1'\narch: {arch}\nbase: debian:bookworm\n")
    proc = run_lab("bisect", str(path), "--from", "0.0.1", "--to", "0.1.0", "--engine", "local", "--jobs", "2",
                   "--out", str(tmp_path / "runs"), "--json", "--no-blame", env={"PIP_FIND_LINKS": str(wheels)},
                   timeout=480)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    assert (result["status"], result["last_old"], result["first_new"]) == ("found", "0.0.2", "0.0.3"), result
    assert result["eager"] and result["width"] == 2
    assert {s["torch"]: s["verdict"] for s in result["steps"]} == {
        "0.0.1": "reproduced", "0.1.0": "not_reproduced", "0.0.3": "not_reproduced", "0.0.2": "reproduced"}
    assert "0.0.4 was stopped before it answered: the other probes' answers made it unnecessary" in result["notes"]
    assert not (Path(result["folder"]) / "torch0.0.4").exists()
    assert "torch 0.0.4: stopped, the other probes' answers made it unnecessary" in proc.stderr
    assert "each started as soon as a slot was free" in proc.stderr

has_gpu = Path("/dev/nvidiactl").exists() or Path("/dev/nvidia0").exists()


def test_dlpack_cuda_without_a_gpu_stops_and_names_the_cpu_variant(tmp_path):
    if has_gpu:
        pytest.skip("this host has an NVIDIA GPU: test_dlpack_cuda_on_a_gpu_host runs instead")
    proc = run_lab("run", "dlpack-cuda", "--engine", "local", "--python-env", "current", "--out",
                   str(tmp_path / "runs"), "--json")
    assert proc.returncode != 0
    text = " ".join(proc.stderr.split())
    assert "needs a GPU" in text and "dlpack-cpu" in text, text
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(not has_gpu, reason="needs an NVIDIA GPU (/dev/nvidiactl) and a Python with CUDA torch "
                                        "(LAB_LOCAL_PYTHON)")
def test_dlpack_cuda_on_a_gpu_host(tmp_path):
    """Issue 14's seed run: on a host with an NVIDIA GPU, the CUDA scenario with the Python already there.
    Its torch decides the case (`--torch` is that torch): the run reproduces the Dynamo error, or shows
    that this torch no longer has it; either way the loader evidence names the CUDA libraries loaded.
    Save its run folder's report.md, result.json and out/ld/ under tests/data/local-gpu/ (see the
    README's Without Docker)."""
    import subprocess
    import sys
    python = __import__("os").environ.get("LAB_LOCAL_PYTHON", sys.executable)
    torch = subprocess.run([python, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                           text=True).stdout.strip()
    assert torch, f"{python} has no torch: set LAB_LOCAL_PYTHON to a Python with CUDA torch"
    proc = run_lab("run", "dlpack-cuda", "--engine", "local", "--python-env", "current", "--torch", torch,
                   "--out", str(tmp_path / "runs"), "--json", "--no-diagnose")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    assert result["verdict"] in ("reproduced", "not_reproduced"), result["reason"]
    assert result["local"]["python_env"] == "current"
    loaded = "\n".join(p.read_text(errors="replace") for p in (Path(result["run_dir"]) / "out" / "ld").iterdir())
    assert "libcudart" in loaded or "libcuda.so" in loaded, "no CUDA library in the loader logs"
