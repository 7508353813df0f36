"""Real end-to-end runs: the `lab` CLI, the real Docker engine, real torch wheels. No mocks.

Cold, these build the arm64 and amd64 bases (bootstrapped from Debian's archive when no
registry answers) and install torch inside the images; warm, they reuse the cached images.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import docker
import pytest

from tests.conftest import DATA, ROOT, last_json, run_lab
from tests.cpu_torch import TORCH

pytestmark = [pytest.mark.docker, pytest.mark.timeout(3600)]


def lab_run(*args: str, out: Path) -> tuple[dict, object]:
    proc = run_lab("run", *args, "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return last_json(proc.stdout), proc


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.mark.arm64
def test_libgomp_aarch64_reproduces_with_both_libgomps_in_one_pid(shared_runs):
    # the session's run of it: test_e2e_bundle bundles and replays this same run folder
    result = shared_runs.run("libgomp-aarch64")
    assert result["verdict"] == "reproduced", result
    assert result["arch"] == "arm64" and result["emulated"] is True and result["torch"] == "2.5.1"
    dups = [d for d in result["evidence"]["duplicate_runtimes"] if d["family"] == "libgomp"]
    assert dups, result["evidence"]
    paths = dups[0]["paths"]
    assert any(re.search(r"/torch\.libs/libgomp-[0-9a-f]+\.so[.0-9]*$", p) for p in paths), paths
    assert any(p.endswith("/libgomp.so.1") and "torch" not in p for p in paths), paths

    assert any(s.startswith("two GNU OpenMP runtimes in pid") for s in result["summary"]), result["summary"]
    run_dir = Path(result["run_dir"])
    for name in ("scenario.yaml", "Dockerfile", "repro/libgomp_aarch64.py", "stdout.txt", "stderr.txt",
                 "evidence.json", "collect_env.txt", "result.json", "report.md", "build.log"):
        assert (run_dir / name).is_file(), name
    assert list((run_dir / "out" / "ld").glob("ld.*")), "no loader logs"
    assert "PyTorch version: 2.5.1" in (run_dir / "collect_env.txt").read_text()
    report = (run_dir / "report.md").read_text()
    assert "two GNU OpenMP runtimes in pid" in report
    assert "the Inductor kernel" in report and "libtorch_cpu.so" in report
    assert "Emulated: yes" in report and "<details>" in report
    assert json.loads((run_dir / "result.json").read_text()) == result


def in_the_arm64_image(shared_runs, script: str) -> str:
    """What `sh -c script` prints, run as root with no network in libgomp-aarch64's image (the
    session's run of it, made now if no test made it yet)."""
    result = shared_runs.run("libgomp-aarch64")
    return docker.from_env().containers.run(result["image"]["tag"], ["sh", "-c", script], platform="linux/arm64",
                                            user="root", network_disabled=True, remove=True).decode()


@pytest.mark.arm64
def test_the_arm64_base_has_the_ca_store_debians_own_tool_makes(shared_runs):
    """The bootstrap updated ca-certificates on the host (lab.image.cacerts), not under QEMU:
    in the image, Debian's update-ca-certificates, run again from scratch, finds nothing to change,
    and no diversion of it is left. The packages' data was decompressed natively (lab.image.
    nativeunpack), and the config scripts' `grep -F` ran natively too: dpkg-deb and grep are the packages'
    own again (`dpkg --verify`), and no busybox is left. So are rm (dpkg's `rm -rf --`) and perl (the
    scripts' Perl ran on the host's perl, lab.image.nativeperl): perl is perl-base's, with its hard
    link, and neither the host's perl nor its modules are left."""
    listing = ("find /etc/ssl/certs -printf '%y %p %l\\n' | sort; sha256sum /etc/ssl/certs/ca-certificates.crt")
    script = (f"{listing}; echo ---; dpkg-divert --list; dpkg --verify dpkg grep coreutils perl-base; "
              "ls /var/lib/torch-repro-lab-bootstrap /var/lib/torch-repro-lab-perl /usr/lib/x86_64-linux-gnu 2>&1; "
              "stat -c 'links=%h' /usr/bin/perl; perl -MPOSIX -e 'print floor(2.5), qq(\\n)'; echo ---; "
              f"update-ca-certificates --fresh >/dev/null; {listing}")
    out = in_the_arm64_image(shared_runs, script)
    made, diversions, again = out.split("---\n")
    assert made == again
    links = [line.split(" ", 2)[1:] for line in made.splitlines() if line.startswith("l ")]
    mozilla = "/usr/share/ca-certificates/mozilla/"
    assert len([t for p, t in links if p.endswith(".pem") and t.startswith(mozilla)]) > 100
    assert len([t for p, t in links if p.endswith(".0") and t.endswith(".pem")]) > 100
    assert "update-ca-certificates" not in diversions
    assert "lab-native" not in diversions and "dpkg-deb" not in diversions  # dpkg --verify names a changed file
    assert "/bin/grep" not in diversions
    assert "/bin/rm" not in diversions and "/usr/bin/perl" not in diversions
    assert diversions.count("No such file or directory") == 3  # ls of busybox's and the host perl's folders
    assert "links=2\n2\n" in diversions  # /usr/bin/perl and /usr/bin/perl5.36.0, and the image's perl runs


BYTE_CODE_CHECK = """
import glob, os, py_compile
same, other = 0, []
for pyc in glob.glob("/usr/lib/python3.11/**/__pycache__/*.cpython-311.pyc", recursive=True):
    src = os.path.join(os.path.dirname(os.path.dirname(pyc)), os.path.basename(pyc).split(".")[0] + ".py")
    if os.path.isfile(src):
        py_compile.compile(src, "/tmp/again.pyc", doraise=True)
        if open("/tmp/again.pyc", "rb").read() == open(pyc, "rb").read():
            same += 1
        else:
            other.append(pyc)
print(same, other)
"""


@pytest.mark.arm64
def test_the_arm64_base_has_the_byte_code_its_own_python_writes(shared_runs):
    """The bootstrap's byte-compilation ran on the host's Python (lab.image.nativepython): in the
    image, the arm64 Python compiles every module of its standard library again to the same bytes,
    py_compile.py included (its stand-in stood at that path meanwhile); py_compile.py is the
    package's own (`dpkg --verify`), and no diversion, stand-in or host Python is left."""
    script = (f"python3 -E -S -c '{BYTE_CODE_CHECK}'; echo ---; dpkg-divert --list; "
              "dpkg --verify libpython3.11-minimal; ls /var/lib/torch-repro-lab-python 2>&1; "
              "grep -c torch-repro-lab /usr/lib/python3.11/py_compile.py; true")
    out = in_the_arm64_image(shared_runs, script)
    checked, left = out.split("---\n")
    same, other = checked.split(" ", 1)
    assert int(same) > 500 and other.strip() == "[]", checked
    assert "py_compile" not in left and "lab-native" not in left, left
    assert "No such file or directory" in left and left.strip().endswith("0"), left


@pytest.mark.arm64
def test_dlpack_cpu_reproduces_with_the_dynamo_message(shared_runs):
    # the session's run, which test_e2e_bundle also bundles and replays; --no-diagnose: the second
    # emulated run of the diagnose step asserts nothing here (test_graph_break_explain runs that step)
    result = shared_runs.run("dlpack-cpu", "--no-diagnose")
    assert result["verdict"] == "reproduced", result
    exc = result["evidence"]["exception"]
    assert exc["type"].endswith("Unsupported")
    assert "does not know how to trace the builtin `torch._C._to_dlpack" in exc["message"]


@pytest.mark.usefixtures("cpu_torch")
def test_amd64_control_with_the_local_cpu_wheel_is_not_reproduced(runs):
    """The amd64 CPU torch this machine offers (tests/cpu_torch.py: here torch 2.13.0+cpu from the host's
    find-links folder); x86-64 loads one libgomp."""
    result, _ = lab_run("libgomp-amd64", *TORCH.args, out=runs)
    assert result["verdict"] == "not_reproduced", result
    assert result["emulated"] is False and result["torch"] == TORCH.version
    assert result["evidence"]["duplicate_runtimes"] == []
    run_dir = Path(result["run_dir"])
    assert f"torch=={TORCH.version}" in (run_dir / "pip-freeze.txt").read_text()
    evidence = json.loads((run_dir / "evidence.json").read_text())
    assert evidence["processes"] >= 1 and evidence["exit_code"] == 0


@pytest.mark.usefixtures("cpu_torch")
def test_a_local_engine_mounts_the_torch_tree_read_only_and_the_image_holds_no_copy(runs):
    """Issue 34: on a Docker engine on this host, the case image has no torch layer; torch imports from
    the cached tree, mounted read-only, so the script can neither add nor delete a file there, the run
    still gets its verdict, and the cache entry is intact afterwards. Shares the amd64 control's base
    and tree; removes the case image it made."""
    from lab.image.crossinstall import load_site
    from lab.image.hostpip import discover
    from lab.image.render import plan_build
    from lab.image.resolve import resolve
    from lab.scenario.lookup import load_scenario

    result, _ = lab_run(str(DATA / "e2e" / "readonly_tree.yaml"), *TORCH.args, out=runs)
    client = docker.from_env()
    tag = result["image"]["tag"]
    try:
        assert result["verdict"] == "reproduced", result  # write refused, delete refused, exit 0
        assert result["image"]["site_mounted"] is True
        run_dir = Path(result["run_dir"])
        stdout = (run_dir / "stdout.txt").read_text()
        torch_dir = "/opt/venv/lib/python3.11/site-packages/torch"
        assert f"torch {TORCH.version} from {torch_dir}" in stdout
        mount = re.search(rf"^mount {re.escape(torch_dir)} (\S+)$", stdout, re.M)
        assert mount and "ro" in mount.group(1).split(","), stdout  # its own read-only mount
        assert "The venv's packages: the host's cross-installed tree, mounted read-only" in \
            (run_dir / "report.md").read_text()
        assert f"torch=={TORCH.version}" in (run_dir / "pip-freeze.txt").read_text()
        assert result["torch_build"]["version"] == TORCH.version  # read from the mounted tree
        # the image: no layer with the venv's packages, no torch in its filesystem, base-sized
        image = client.images.get(tag)
        history = image.history()
        assert not [h for h in history if "venv's packages" in (h.get("CreatedBy") or "")]
        base = client.images.get(result["base"]["ref"])
        assert image.attrs["Size"] - base.attrs["Size"] < 100 * 1024**2, history  # torch alone is ~900 MB
        probe = client.containers.create(tag, ["true"])
        try:
            with pytest.raises(docker.errors.NotFound):
                probe.get_archive(torch_dir)
        finally:
            probe.remove(force=True)
        # the cache entry: as it was made (size and file count), nothing planted, nothing deleted
        case = resolve(load_scenario(str(DATA / "e2e" / "readonly_tree.yaml"), []), torch=TORCH.version,
                       arch="amd64")
        site = plan_build(case, discover()).site
        assert site is not None and site.root is not None and site.cached
        assert load_site(site.root, site.target) is not None
        torch_tree = next(site.root.glob("lib/python3.11/site-packages/torch"))
        assert (torch_tree / "version.py").is_file() and not (torch_tree / "planted.py").exists()
        assert not client.containers.list(all=True, filters={"ancestor": tag})
    finally:
        with contextlib.suppress(docker.errors.APIError):
            client.images.remove(tag)


@pytest.mark.usefixtures("cpu_torch")
def test_a_hanging_script_times_out_and_leaves_no_container(runs):
    result, _ = lab_run(str(DATA / "e2e" / "sleeper.yaml"), *TORCH.args, out=runs)
    assert result["verdict"] == "timeout", result
    run_dir = Path(result["run_dir"])
    assert "started" in (run_dir / "stdout.txt").read_text()  # what it printed before the kill is kept
    report = (run_dir / "report.md").read_text()
    assert "killed after" in report and "Not collected: the run timed out" in report
    assert not (run_dir / "diagnose").exists()
    client = docker.from_env()
    left = client.containers.list(all=True, filters={"label": "org.torch-repro-lab.case"})
    assert not [c for c in left if "sleeper" in c.labels.get("org.torch-repro-lab.case", "")]


def test_gpu_scenario_on_an_engine_without_gpus_stops_before_the_build_with_the_engines_answer(tmp_path):
    """The CUDA seed on this engine (no GPU, no NVIDIA Container Toolkit): `lab run`, a matrix and a
    bisection each stop before anything is built, with one paragraph that names the engine, carries
    its own refusal of the device request, the fix, and the CPU variant."""
    from lab.engine import gpu
    from lab.engine.docker_engine import Engine
    engine = Engine.connect()
    if gpu.check(engine, make_image=True).ok:
        pytest.skip("this engine gives containers the GPUs: the GPU scenario would really run")
    for args in (["run", "dlpack-cuda"], ["run", "dlpack-cuda", "--torch", "2.9.0,2.8.0"],
                 ["bisect", "dlpack-cuda", "--from", "2.8.0", "--to", "2.9.0"]):
        proc = run_lab(*args, "--out", str(tmp_path / "runs"))
        assert proc.returncode != 0, proc.stderr
        paragraph = " ".join(proc.stderr.split())
        assert "could not select device driver" in paragraph, paragraph  # the engine's own words
        assert engine.name in paragraph and str(engine.url) in paragraph, paragraph
        assert "nvidia-ctk runtime configure --runtime=docker" in paragraph and "restart dockerd" in paragraph
        assert "--engine local" in paragraph and "lab run dlpack-cpu" in paragraph
        assert "Traceback" not in proc.stderr
        assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("build.log"))
        assert "building" not in proc.stderr.lower() and "bootstrap" not in proc.stderr.lower()


@pytest.mark.usefixtures("cpu_torch")
def test_ctrl_c_during_a_run_removes_the_container_and_marks_the_folder(tmp_path):
    client = docker.from_env()
    proc = subprocess.Popen([sys.executable, "-m", "lab", "run", str(DATA / "e2e" / "sleeper.yaml"), *TORCH.args,
                             "--out", str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 1800  # cold, the image may still have to be built
    while time.monotonic() < deadline and proc.poll() is None:
        running = client.containers.list(filters={"label": "org.torch-repro-lab.case"})
        if any("sleeper" in c.labels["org.torch-repro-lab.case"] for c in running):
            break
        time.sleep(1)
    time.sleep(2)
    os.kill(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr
    left = client.containers.list(all=True, filters={"label": "org.torch-repro-lab.managed=true"})
    assert not [c for c in left if "sleeper" in c.labels.get("org.torch-repro-lab.case", "")]
    (result_file,) = tmp_path.glob("sleeper/*/result.json")
    result = json.loads(result_file.read_text())
    assert result["status"] == "interrupted" and result["verdict"] is None


def test_compose_runs_the_lab_in_a_container_against_the_host_engine():
    if shutil.which("docker-compose") is None:
        pytest.fail("docker-compose is missing: bin/setup-host installs it")
    proc = subprocess.run(["bash", "bin/compose-lab", "doctor", "--json"], cwd=ROOT, capture_output=True,
                          text=True, timeout=1800)
    checks = {c["name"]: c for c in last_json(proc.stdout)["checks"]}
    assert checks["Docker engine"]["status"] == "ok", proc.stderr[-2000:]
    assert checks["arm64 emulation"]["status"] in ("ok", "warn")
    assert checks["CA bundle"]["status"] == "ok"


@pytest.mark.usefixtures("cpu_torch")
def test_dlpack_cpu_ablation_names_the_dynamo_layer(runs):
    """The bug is in Dynamo, so it fails already under `eager`; one image serves every rung.
    The cheap amd64 torch (2.13.0+cpu here) fails in Dynamo on the same builtin, so the ladder runs
    natively (about 30 s warm for the four rungs, where four emulated rungs of 2.9.0 took 143 s); the
    scenario as shipped (arm64, 2.9.0) has its own run in test_dlpack_cpu_reproduces_with_the_dynamo_message."""
    proc = run_lab("run", "dlpack-cpu", *TORCH.args, "--ablate", "--out", str(runs), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json(proc.stdout)
    assert result["layer"] == "dynamo", result
    assert "fails under `eager`: a TorchDynamo issue" in result["conclusion"]
    verdicts = {(s["backend"], s["mode"]): s["verdict"] for s in result["ablation"]}
    assert verdicts == {("eager", None): "reproduced", ("aot_eager", None): "reproduced",
                        ("inductor", None): "reproduced", ("inductor", "max-autotune"): "reproduced"}
    folder = Path(result["run_dir"])
    assert "TorchDynamo" in (folder / "ablation.md").read_text()
    rungs = [json.loads((Path(s["run_dir"]) / "result.json").read_text()) for s in result["ablation"]]
    assert len({r["image"]["id"] for r in rungs}) == 1
    for rung in rungs:  # each rung for the page's reason: Dynamo refusing the dlpack builtin
        assert "does not know how to trace the builtin `torch._C._to_dlpack" in rung["evidence"]["exception"]["message"]


@pytest.mark.usefixtures("cpu_torch")
def test_the_hook_overrides_a_hard_coded_backend(runs):
    result, _ = lab_run(str(DATA / "e2e" / "hooked.yaml"), *TORCH.args, "--backend", "eager", "--no-diagnose",
                        out=runs)
    assert result["verdict"] == "reproduced", result
    result, _ = lab_run(str(DATA / "e2e" / "hooked.yaml"), *TORCH.args, "--no-diagnose", out=runs)
    # without the hook the hard-coded backend raises: a failure, but not the scenario's outcome
    assert result["verdict"] == "failed_differently", result
    assert "not_a_backend" in result["evidence"]["exception"]["message"]


@pytest.mark.arm64
def test_graph_break_explain_reports_two_breaks_with_their_reasons(runs):
    result, _ = lab_run("graph-break-explain", "--compile-debug", out=runs)
    assert result["verdict"] == "reproduced", result
    assert result["graph_breaks"] == 2
    run_dir = Path(result["run_dir"])
    diag = json.loads((run_dir / "diagnose" / "diagnostics.json").read_text())
    (fn,) = [f for f in diag["explain"]["functions"] if f["name"] == "toy_example"]
    assert fn["graph_break_count"] == 2 and fn["graph_count"] == 3
    first, second = fn["breaks"]
    assert "print" in first["reason"] and first["source"] == 'print("woo")'
    assert second["source"] == "if b.sum() < 0:"
    report = (run_dir / "report.md").read_text()
    assert "2 graph breaks in toy_example (3 graphs)" in report
    assert list((run_dir / "diagnose" / "trace").glob("*.log")), "TORCH_TRACE wrote nothing"
    assert [p for p in (run_dir / "diagnose" / "compile_debug").rglob("*") if p.is_file()]
    assert report.index("## Describe the bug") < report.index("## Error logs") < report.index("## Versions")
