"""The Slurm engine for real (`--engine slurm:lab`): jobs on the one-node cluster bin/setup-slurm starts
on this host, each array task running its case with the local engine on the node.

The cases are the cheapest real ones: stand-in torch releases (pure-Python wheels whose only content is
their version, from a find-links folder, as in tests/test_e2e_local.py), so a probe costs a uv venv of
one small wheel, and `expect` alone decides the boundary.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import LAB, ROOT, last_json, run_lab
from tests.test_e2e_local import _stand_in_torch, needs_bwrap

pytestmark = [pytest.mark.slurm, pytest.mark.local, pytest.mark.timeout(900), needs_bwrap]

ARCH = "arm64" if platform.machine() in ("aarch64", "arm64") else "amd64"


@pytest.fixture(autouse=True)
def _local_engine_on_the_nodes(monkeypatch):
    """The stand-in releases run on the nodes' local engine; this host's node also has a Docker engine,
    which `auto` would pick (test_a_node_with_docker_runs_the_case_on_it says so)."""
    monkeypatch.setenv("LAB_SLURM_NODE_ENGINE", "local")
ENGINE = "slurm:lab"


def stand_ins(tmp_path: Path, name: str, versions: tuple[str, ...], script: str) -> tuple[Path, dict]:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for version in versions:
        _stand_in_torch(wheels, version)
    folder = tmp_path / "scenario"
    folder.mkdir()
    (folder / f"{name}.py").write_text(script)
    path = folder / f"{name}.yaml"
    path.write_text(f"name: {name}\ntorch: '{versions[0]}'\narch: {ARCH}\nbase: debian:bookworm\nscript: {name}.py\n"
                    "expect:\n  stdout_contains: 'torch 0.0.'\n")
    return path, {"PIP_FIND_LINKS": str(wheels)}


PRINT = "import torch\nprint('torch', torch.__version__)\n"


def arrays(runs: Path) -> list[tuple[str, int]]:
    """The arrays the lab submitted into this runs folder: (job id, tasks), in order."""
    found = []
    for folder in sorted((runs / ".slurm").iterdir()):
        logs = sorted(folder.glob("slurm-*_*.out"))
        jobs = {p.name.split("-", 1)[1].split("_")[0] for p in logs}
        assert len(jobs) == 1, logs
        found.append((jobs.pop(), len(logs)))
    return found


def queued(name: str) -> list[str]:
    """`squeue` of this test's jobs (by name), pending or running."""
    out = subprocess.run(["squeue", "-h", "-r", "-n", f"lab-{name}", "-o", "%i %T"], capture_output=True,
                         text=True, timeout=20, check=True).stdout
    return out.split("\n") if out.strip() else []


def wait_for(what, seconds: float = 120):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError("waited in vain")


def cancel_the_task_running(runs: Path, version: str) -> str:
    """`scancel` of the one array task whose log shows the script of torch `version` running; its id."""
    running = wait_for(lambda: [log.stem.split("-", 1)[1] for log in runs.glob(".slurm/*/slurm-*.out")
                                if "running python" in (text := log.read_text()) and f"torch=={version}" in text])
    subprocess.run(["scancel", running[0]], check=True, timeout=20)
    return running[0]


def test_a_bisection_through_slurm_finds_the_boundary_of_the_local_engine_one_array_per_round(tmp_path):
    path, env = stand_ins(tmp_path, "slurm-bisect", ("0.0.1", "0.0.2", "0.0.3", "0.1.0"), PRINT)
    args = ["bisect", str(path), "--from", "0.0.1", "--to", "0.1.0", "--jobs", "2", "--no-blame", "--json"]
    local = run_lab(*args, "--engine", "local", "--out", str(tmp_path / "local"), env=env)
    assert local.returncode == 0, local.stderr[-3000:]
    runs = tmp_path / "slurm"
    slurm = run_lab(*args, "--engine", ENGINE, "--out", str(runs), env=env)
    assert slurm.returncode == 0, slurm.stderr[-3000:]
    a, b = last_json(local.stdout), last_json(slurm.stdout)
    assert (b["status"], b["last_old"], b["first_new"]) == ("found", "0.0.3", "0.1.0") == (
        a["status"], a["last_old"], a["first_new"])
    assert {s["torch"]: s["verdict"] for s in b["steps"]} == {s["torch"]: s["verdict"] for s in a["steps"]}
    assert "--engine slurm:lab" in b["resume"]
    # each k-ary round was one job array, one task per probe
    submitted = arrays(runs)
    assert len(submitted) == b["rounds"] == 2 and [n for _, n in submitted] == [2, 2]
    for job, _ in submitted:
        assert f"Slurm job {job}_0" in slurm.stderr and f"Slurm job {job}_1: COMPLETED" in slurm.stderr
    for step in b["steps"]:  # every probe wrote its run folder on the shared runs folder, as a local run does
        result = json.loads((Path(step["run_dir"]) / "result.json").read_text())
        assert result["engine"]["kind"] == "local" and result["local"]["confined"]
    assert not queued("slurm-bisect")


def test_a_matrix_through_slurm_is_one_array_and_a_cell_lost_to_slurm_is_its_error(tmp_path):
    """All cells in one array; the task of 0.0.3, which sleeps, is cancelled with scancel (as someone
    else, a node failure or a preemption would end it): that cell is an infrastructure `error` with
    Slurm's reason, never a verdict, and the other cells go on to theirs."""
    name = "slurm-matrix"
    script = PRINT + "import time\nif torch.__version__ == '0.0.3':\n    time.sleep(600)\n"
    path, env = stand_ins(tmp_path, name, ("0.0.1", "0.0.2", "0.0.3", "0.1.0"), script)
    runs = tmp_path / "runs"
    proc = subprocess.Popen([*LAB, "run", str(path), "--torch", "0.0.1,0.0.2,0.0.3,0.1.0", "--engine", ENGINE,
                             "--out", str(runs), "--no-diagnose", "--json"], cwd=ROOT, env={**os.environ, **env},
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        task = cancel_the_task_running(runs, "0.0.3")
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    cells = {c["torch"]: c for c in last_json(stdout)["cells"]}
    assert {v: c["verdict"] for v, c in cells.items()} == {
        "0.0.1": "reproduced", "0.0.2": "reproduced", "0.0.3": "error", "0.1.0": "not_reproduced"}
    [lost] = cells["0.0.3"]["runs"]
    assert f"Slurm job {task} ended CANCELLED" in lost["reason"] and "not a verdict" in lost["reason"]
    assert lost["run_dir"].endswith(f"slurm-{task}.out") and cells["0.0.3"]["runnable"] == 0
    assert [n for _, n in arrays(runs)] == [4]
    assert queued(name) == []
    assert not sandboxes_of(name)


def test_ctrl_c_of_a_bisection_cancels_its_jobs_and_leaves_none_in_squeue(tmp_path):
    name = "slurm-cancel"
    path, env = stand_ins(tmp_path, name, ("0.0.1", "0.0.2", "0.1.0"), PRINT + "import time\ntime.sleep(600)\n")
    proc = subprocess.Popen([*LAB, "bisect", str(path), "--from", "0.0.1", "--to", "0.1.0", "--jobs", "2",
                             "--engine", ENGINE, "--out", str(tmp_path / "runs"), "--no-blame"],
                            cwd=ROOT, env={**os.environ, **env}, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: any("RUNNING" in line for line in queued(name)))
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "resume with:" in stderr, stderr[-2000:]
    assert queued(name) == []
    assert not sandboxes_of(name)


def test_a_task_killed_on_its_node_is_a_skip_never_a_verdict(tmp_path):
    """scancel of the running task (as an admin or a node failure would end it): that probe is an
    infrastructure error, so it is skipped, and the bisection says so instead of taking it as a side."""
    name = "slurm-killed"
    script = PRINT + "import time\nif torch.__version__ == '0.0.2':\n    time.sleep(600)\n"
    path, env = stand_ins(tmp_path, name, ("0.0.1", "0.0.2", "0.1.0"), script)
    proc = subprocess.Popen([*LAB, "bisect", str(path), "--from", "0.0.1", "--to", "0.1.0", "--jobs", "2",
                             "--engine", ENGINE, "--out", str(tmp_path / "runs"), "--no-blame", "--json"],
                            cwd=ROOT, env={**os.environ, **env}, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # the ends run first (one array of two); the middle release, 0.0.2, is the one that sleeps
        cancel_the_task_running(tmp_path / "runs", "0.0.2")
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    result = last_json(stdout)
    middle = next(s for s in result["steps"] if s["torch"] == "0.0.2")
    assert (middle["verdict"], middle["outcome"]) == ("error", "skip"), middle
    assert "CANCELLED" in middle["reason"] and "not a verdict" in middle["reason"]
    assert result["status"] != "found" or result["first_new"] != "0.0.2"
    assert queued(name) == []
    assert not sandboxes_of(name)


def sandboxes_of(name: str, wait_s: float = 60.0) -> list[str]:
    """The scenario's scripts still running on this host once its jobs have ended, after Slurm had
    time to stop them: a cancelled step's processes get SIGTERM, then SIGKILL KillWait (5 s,
    bin/setup-slurm) later, which a loaded slurmd delivers seconds after the job reads CANCELLED
    (one CI run found the sandbox 1 s after). Only what outlives `wait_s` is left behind."""
    deadline = time.monotonic() + wait_s
    while True:
        time.sleep(1)
        found = subprocess.run(["pgrep", "-f", f"python {name}.py"], capture_output=True, text=True).stdout.split()
        if not found or time.monotonic() > deadline:
            return found


def test_a_case_goes_to_the_partition_whose_nodes_declare_its_arch(tmp_path):
    """Two slurmd on this host (bin/setup-slurm): node vm-2, in partition lab-arm64, declares the feature
    arm64. An arm64 case given both partitions goes there, and its task runs on vm-2, whose local engine
    then finds the host's real arch (it never emulates) and says so: no verdict, and the reason named."""
    path, env = stand_ins(tmp_path, "slurm-route", ("0.0.1",), PRINT)
    path.write_text(path.read_text().replace(f"arch: {ARCH}", "arch: [amd64, arm64]"))
    runs = tmp_path / "runs"
    proc = run_lab("run", str(path), "--arch", "arm64", "--engine", "slurm:lab", "--engine", "slurm:lab-arm64",
                   "--out", str(runs), "--no-diagnose", "--json", env=env)
    assert "submitted to partition lab-arm64" in proc.stderr, proc.stderr[-3000:]
    [(job, _)] = arrays(runs)
    shown = subprocess.run(["scontrol", "show", "job", job, "-o"], capture_output=True, text=True, timeout=20)
    node = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip() + "-2"
    assert "Partition=lab-arm64" in shown.stdout and f"NodeList={node} " in shown.stdout
    if ARCH == "amd64":  # the node is this x86-64 host in truth
        assert proc.returncode != 0 and "the local engine runs only this host's architecture" in proc.stderr


def test_a_requeued_task_is_followed_to_its_verdict(tmp_path):
    """`scontrol requeue` (what a preemption with requeue does): the task starts again from the top and
    the lab waits for that second start, says so, and takes its verdict."""
    name = "slurm-requeue"
    path, env = stand_ins(tmp_path, name, ("0.0.1",), PRINT + "import time\ntime.sleep(4)\n")
    runs = tmp_path / "runs"
    proc = subprocess.Popen([*LAB, "run", str(path), "--engine", ENGINE, "--out", str(runs), "--no-diagnose",
                             "--json"], cwd=ROOT, env={**os.environ, **env}, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        [task] = wait_for(lambda: [log.stem.split("-", 1)[1] for log in runs.glob(".slurm/*/slurm-*.out")
                                   if "running python" in log.read_text()])
        subprocess.run(["scontrol", "requeue", task], check=True, timeout=20)
        # Slurm holds a requeued job back until the first start's credential expires (bin/setup-slurm:
        # cred_expire=10 s); forcing it to start sooner fails it ("Job credential revoked")
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    assert last_json(stdout)["verdict"] == "reproduced"
    assert f"Slurm job {task}: RUNNING" in stderr and "(requeued 1x)" in stderr, stderr[-3000:]


COMPILE_FAILURE = """import os
import torch
print('torch', torch.__version__)


class LoweringException(Exception):
    pass


LoweringException.__module__ = 'torch._inductor.exc'
if os.environ.get('LAB_BACKEND', 'inductor') == 'inductor':
    raise LoweringException('a lowering failed')
"""


def test_localization_at_a_slurm_boundary_is_one_job_on_its_partition(tmp_path):
    """`lab localize --engine slurm:lab` (what a bisection through Slurm runs at its boundary): the
    ablation and the bisector run as one Slurm job on the partition, the node's engine doing every step,
    and localize.json is written on the shared runs folder (the node's local engine has no image, so
    compiler_bisector is not run there, and the result says why)."""
    name = "slurm-localize"
    path, env = stand_ins(tmp_path, name, ("0.0.1",), COMPILE_FAILURE)
    path.write_text(path.read_text().replace("stdout_contains: 'torch 0.0.'", "traceback_contains: LoweringException"))
    runs = tmp_path / "runs"
    proc = run_lab("localize", str(path), "--torch", "0.0.1", "--engine", ENGINE, "--out", str(runs), "--json",
                   env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    assert result["layer"] == "inductor" and "compiler_bisector was not run" in result["bisector"]["words"]
    [(job, tasks)] = arrays(runs)
    assert tasks == 1
    shown = subprocess.run(["scontrol", "show", "job", job, "-o"], capture_output=True, text=True, timeout=20)
    assert "Partition=lab " in shown.stdout
    [log] = runs.glob(f".slurm/*/slurm-{job}_0.out")
    assert "backend ablation of torch 0.0.1" in log.read_text()  # the node ran it, not this host
    ablation = Path(result["ablation_dir"])
    assert ablation.is_relative_to(runs) and (ablation / "ablation.md").is_file()
    [folder] = runs.glob(f"{name}/*-localize")  # what the node wrote, on the shared runs folder
    assert json.loads((folder / "localize.json").read_text()) == result and (folder / "localize.md").is_file()
    assert not queued(name)


def test_a_batch_triage_is_one_array_each_task_a_lab_triage_on_its_node(tmp_path):
    """`lab triage --engine slurm:lab` of several pages: one `sbatch --array`, task i runs `lab triage
    PAGE_i` on its node and writes that issue's folder; the summary is the same as a local batch's
    (two pages that give no scenario: bad input each, named, and the batch's exit 2)."""
    corpus = ROOT / "tests" / "data" / "issues"
    pages = [str(corpus / "108747.md"), str(corpus / "121288.md")]
    runs = tmp_path / "runs"
    proc = run_lab("triage", *pages, "--engine", ENGINE, "--out", str(runs), "-o", str(tmp_path / "sc"), "--json")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "as one Slurm job array on partition lab" in proc.stderr
    data = last_json(proc.stdout)
    assert [(r["source"], r["status"]) for r in data["issues"]] == [(p, "bad_input") for p in pages]
    assert "has no code block" in data["issues"][0]["error"]
    (work,) = (runs / ".slurm").glob("triage-*")
    jobs = {p.name.split("-", 1)[1].split("_")[0] for p in work.glob("slurm-*_*.out")}
    assert len(jobs) == 1 and sorted(p.name for p in work.glob("exit-*")) == ["exit-0", "exit-1"]
    assert not queued("triage")


OTHER = "amd64" if ARCH == "arm64" else "arm64"


def remove_image(result: dict) -> None:
    """The test's own case image (a stand-in torch over the shared base, which stays)."""
    tag = (result.get("image") or {}).get("tag")
    if tag:
        subprocess.run(["docker", "rmi", tag], capture_output=True, timeout=60)


@pytest.mark.docker
@pytest.mark.arm64
def test_a_case_of_the_other_arch_runs_emulated_on_a_partition_whose_nodes_run_docker(tmp_path, monkeypatch,
                                                                                       request):
    """LAB_SLURM_NODE_ENGINE=docker: partition lab (amd64 nodes) also takes arm64 cases, emulated. The
    cheapest arm64 case (a stand-in torch, one print on the arm64 base: the image and base are shared
    with earlier runs of it) goes there as a Slurm task, the node's Docker engine runs it under QEMU, and
    its verdict, result and report are the Docker engine's, marked emulated (measured on the 2-core
    test host, busy: 2 min cold, 1 min warm; the run itself is 6-8 s of it)."""
    monkeypatch.setenv("LAB_SLURM_NODE_ENGINE", "docker")
    machine = {"arm64": "aarch64", "amd64": "x86_64"}[OTHER]
    path, env = stand_ins(tmp_path, "slurm-emulated", ("0.0.1",),
                          "import platform\nimport torch\nprint('torch', torch.__version__, platform.machine())\n")
    # the system packages of every other emulated case of the suite: their Debian base (made by
    # test_doctor's build-base) serves this one too, where a base of its own is a bootstrap under QEMU
    # (190 s in CI once the blame tests no longer made the plain one)
    path.write_text(path.read_text().replace(f"arch: {ARCH}", f"arch: {OTHER}")
                    .replace("base: debian:bookworm\n", "base: debian:bookworm\nsystem_packages: [g++, python3-dev]\n")
                    .replace("'torch 0.0.'", f"'torch 0.0.1 {machine}'"))
    runs = tmp_path / "runs"
    proc = run_lab("run", str(path), "--engine", ENGINE, "--out", str(runs), "--no-diagnose", "--json", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "(emulated with QEMU)" in proc.stderr and "submitted to partition lab " in proc.stderr
    result = last_json(proc.stdout)
    request.addfinalizer(lambda: remove_image(result))
    assert (result["verdict"], result["arch"], result["emulated"]) == ("reproduced", OTHER, True), result["reason"]
    assert result["engine"]["kind"] == "docker" and result["image"]["tag"] and result["local"] is None
    [(job, _)] = arrays(runs)
    shown = subprocess.run(["scontrol", "show", "job", job, "-o"], capture_output=True, text=True, timeout=20)
    node = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    assert "Partition=lab " in shown.stdout and f"NodeList={node} " in shown.stdout
    report = (Path(result["run_dir"]) / "report.md").read_text()
    assert f"on linux/{OTHER}, emulated with QEMU" in report and "- Emulated: yes" in report


@pytest.mark.docker
def test_a_node_with_docker_runs_the_case_on_it(tmp_path, monkeypatch, request):
    """A node that has a Docker engine runs its task as the Docker engine does (LAB_SLURM_NODE_ENGINE:
    `auto` picks it where it answers, as on this host's node): the case gets its verdict in a container,
    recorded as the Docker engine's. The case is the cheapest one, a stand-in torch of this host's arch
    (the machine's CPU torch running libgomp-amd64 took 256 s of this file's 347 s on the busy test host)."""
    monkeypatch.setenv("LAB_SLURM_NODE_ENGINE", "auto")
    path, env = stand_ins(tmp_path, "slurm-docker-node", ("0.0.1",), PRINT)
    runs = tmp_path / "runs"
    proc = run_lab("run", str(path), "--engine", ENGINE, "--out", str(runs), "--no-diagnose", "--json", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    request.addfinalizer(lambda: remove_image(result))
    assert (result["verdict"], result["arch"], result["emulated"]) == ("reproduced", ARCH, False), result["reason"]
    assert result["engine"]["kind"] == "docker" and result["image"]["tag"] and result["local"] is None
    assert "Slurm job" in proc.stderr and len(arrays(runs)) == 1
    assert (Path(result["run_dir"]) / "report.md").is_file()
