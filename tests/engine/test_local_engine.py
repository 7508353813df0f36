"""The local engine's pure parts: the sandbox's command line, the script's environment, the paths of
an unconfined run, the torch match of `--python-env current`, the refusals and the routing. The real
runs are in tests/test_e2e_local.py and tests/test_attacks_local.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from lab.core.arch import Arch
from lab.core.records import LocalImage, RunLimits
from lab.engine.engines import EngineFacts, parse_spec
from lab.engine.local_engine import (
    ETC_FROM_HOST,
    ETC_MADE,
    RUN_UID,
    Confinement,
    ForeignArchError,
    LocalEngine,
    LocalOptions,
    NotConfinedError,
    _translate,
    etc_files,
    lab_ca_bundle,
    probe_bwrap,
    rlimits,
    sandbox_args,
    script_env,
    write_etc,
)
from lab.engine.routing import NoEngineError, routes
from lab.image.localenv import missing_system_packages, probe_python, torch_matches

IMAGE = LocalImage(python="/cache/venv/k/bin/python", binds=("/home/u/.pyenv/versions/3.11.7", "/cache/venv/k"),
                   path=("/cache/venv/k/bin",), lab_dir=Path("/runs/r"), env=(("VIRTUAL_ENV", "/cache/venv/k"),))


def _pairs(args: list[str], flag: str) -> list[tuple[str, str]]:
    return [(args[i + 1], args[i + 2]) for i, a in enumerate(args) if a == flag]


def test_the_sandbox_binds_the_system_read_only_and_only_out_writable():
    args = sandbox_args(tool="bwrap", image=IMAGE, out=Path("/stage/out"), limits=RunLimits(), as_root=True)
    assert ("/usr", "/usr") in _pairs(args, "--ro-bind")
    assert not any(dest == "/etc" for _, dest in _pairs(args, "--ro-bind"))  # a minimal /etc, not the host's
    assert _pairs(args, "--bind") == [("/stage/out", "/out")]  # the only writable bind
    ro = dict(_pairs(args, "--ro-bind"))
    assert ro["/runs/r/repro"] == "/lab/repro" and ro["/runs/r/tools"] == "/lab/tools"
    assert ro["/cache/venv/k"] == "/cache/venv/k" and ro["/home/u/.pyenv/versions/3.11.7"].startswith("/home/u")
    assert not any(src in ("/", "/home", "/root", "/var", "/run") for src, _ in _pairs(args, "--ro-bind"))
    assert "--unshare-net" in args and "--unshare-pid" in args and "--die-with-parent" in args
    assert args[args.index("--remount-ro") + 1] == "/"
    tmp = args.index("--tmpfs")
    assert args[tmp + 1] == "/tmp" and args[tmp - 2:tmp] == ["--perms", "1777"]
    shm = args.index("/dev/shm")  # a private one, writable, of Docker's default size
    assert args[shm - 5:shm] == ["--size", str(64 * 1024**2), "--perms", "1777", "--tmpfs"]
    # the folders above a bind are made searchable in the sandbox (the host's /home/u may be 0700)
    assert args[args.index("/home/u") - 3:args.index("/home/u") + 1] == ["--perms", "0755", "--dir", "/home/u"]
    # as root: setpriv drops to the run user inside, with nothing left
    tail = args[args.index("setpriv"):]
    assert tail[:5] == ["setpriv", "--reuid", str(RUN_UID), "--regid", str(RUN_UID)]
    assert "--no-new-privs" in tail and "--bounding-set=-all" in tail and tail[-1] == "--"


def test_the_folders_above_a_system_bind_are_searchable_too(monkeypatch):
    """A GPU host with /opt/nvidia (a system folder) and the Python in /opt/torch/.venv: /opt is made
    0755 before /opt/nvidia is bound, or bwrap makes it 0700 and the run user cannot reach the venv."""
    monkeypatch.setattr("lab.engine.local_engine.os.path.isdir", lambda p: p in ("/usr", "/etc", "/opt/nvidia"))
    image = replace(IMAGE, binds=("/opt/torch/.venv",))
    args = sandbox_args(tool="bwrap", image=image, out=Path("/o"), limits=RunLimits(), as_root=True)
    nvidia = args.index("/opt/nvidia")
    assert args[nvidia - 5:nvidia + 1] == ["--perms", "0755", "--dir", "/opt", "--ro-bind", "/opt/nvidia"]
    assert args.count("/opt") == 1  # made once
    venv = args.index("/opt/torch/.venv")
    assert args[venv - 5:venv] == ["--perms", "0755", "--dir", "/opt/torch", "--ro-bind"]


@pytest.mark.local
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bwrap (run bin/setup-host)")
def test_the_run_user_reaches_a_python_below_a_system_folders_parent(monkeypatch, tmp_path):
    """The same against the real bwrap: a 'system' folder and the interpreter's folder share a parent
    that only the sandbox makes; the unprivileged run user must be able to read below it."""
    top = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="lab-test-parents-"))
    try:
        (top / "opt" / "nvidia").mkdir(parents=True)
        (top / "opt" / "torch" / "venv").mkdir(parents=True)
        (top / "opt" / "torch" / "venv" / "marker").write_text("readable\n")
        for d in (top, top / "opt", top / "opt" / "torch"):
            d.chmod(0o755)
        monkeypatch.setattr("lab.engine.local_engine.SYSTEM_DIRS", ("/usr", str(top / "opt" / "nvidia")))
        for name in ("repro", "tools", "out"):
            (tmp_path / name).mkdir()
        image = replace(IMAGE, binds=(str(top / "opt" / "torch" / "venv"),), lab_dir=tmp_path)
        args = sandbox_args(tool=shutil.which("bwrap"), image=image, out=tmp_path / "out", limits=RunLimits(),
                            as_root=os.geteuid() == 0, cwd="/")
        proc = subprocess.run([*args, "cat", str(top / "opt" / "torch" / "venv" / "marker")], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0 and proc.stdout == "readable\n", proc.stderr
    finally:
        shutil.rmtree(top)


def test_the_sandbox_shows_a_minimal_etc(tmp_path):
    """The lab's own passwd, group, hosts and nsswitch.conf; of the host's /etc only ETC_FROM_HOST
    (and resolv.conf and hosts with network), never pip.conf, shadow or ssl/private."""
    made = write_etc(tmp_path / "etc")
    args = sandbox_args(tool="bwrap", image=IMAGE, out=Path("/o"), limits=RunLimits(), as_root=True, made_etc=made,
                        ca_bundle="/etc/ssl/certs/ca-certificates.crt")
    etc = {dest: src for src, dest in _pairs(args, "--ro-bind") if dest.startswith("/etc/")}
    assert args[args.index("/etc") - 3:args.index("/etc") + 1] == ["--perms", "0755", "--dir", "/etc"]
    for name in ETC_MADE:
        assert etc["/etc/" + name] == str(made / name)
    host = {d for d, s in etc.items() if s == d}
    assert host == {"/etc/" + n for n in ETC_FROM_HOST if os.path.exists("/etc/" + n)}
    assert {"/etc/ld.so.cache", "/etc/ssl/certs"} <= host or not os.path.exists("/etc/ld.so.cache")
    if os.path.isdir("/etc/alternatives"):  # Debian's cc and c++ go through it
        assert "/etc/alternatives" in host
    assert not {"/etc/pip.conf", "/etc/shadow", "/etc/ssl/private", "/etc/resolv.conf"} & set(etc)
    text = {name: (made / name).read_text() for name in ETC_MADE}
    assert text == etc_files() and f"lab:x:{RUN_UID}:{RUN_UID}:lab:/tmp:" in text["passwd"]
    assert "lab:x:10001:" in text["group"] and text["hosts"].startswith("127.0.0.1\tlocalhost")
    assert "files dns" in text["nsswitch.conf"] and "systemd" not in text["nsswitch.conf"]
    with_net = sandbox_args(tool="bwrap", image=IMAGE, out=Path("/o"), limits=RunLimits(network=True),
                            as_root=True, made_etc=made)
    net = {dest: src for src, dest in _pairs(with_net, "--ro-bind") if dest.startswith("/etc/")}
    for name in ("resolv.conf", "hosts"):
        if os.path.exists("/etc/" + name):
            assert net["/etc/" + name] == "/etc/" + name


def test_the_labs_ca_bundle_is_shown_only_from_etc(tmp_path, monkeypatch):
    real = {"/etc/pki/tls/certs/ca-bundle.crt", "/etc/lab-ca/corp.pem", "/etc/ssl/certs/x.pem"}
    monkeypatch.setattr("lab.engine.local_engine.os.path.exists", lambda p: p in real or p == "/etc/ssl/certs")
    monkeypatch.setattr("lab.engine.local_engine.os.path.isdir", lambda p: p == "/etc/ssl/certs")

    def binds(ca):
        args = sandbox_args(tool="bwrap", image=IMAGE, out=Path("/o"), limits=RunLimits(), as_root=True, ca_bundle=ca)
        return [dest for _, dest in _pairs(args, "--ro-bind") if dest.startswith("/etc/")]
    assert binds("/etc/lab-ca/corp.pem") == ["/etc/lab-ca/corp.pem", "/etc/ssl/certs"]
    assert binds("/etc/ssl/certs/x.pem") == ["/etc/ssl/certs"]          # inside a folder already shown
    assert binds("/etc/../etc/lab-ca/corp.pem") == ["/etc/ssl/certs"]   # never a path that climbs
    assert binds(None) == ["/etc/ssl/certs"]
    monkeypatch.undo()
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    assert lab_ca_bundle({"PIP_CERT": "", "SSL_CERT_FILE": str(ca), "REQUESTS_CA_BUNDLE": "/nowhere"}) == str(ca)
    assert lab_ca_bundle({"PIP_CERT": str(tmp_path / "absent.pem")}) is None and lab_ca_bundle({}) is None


def test_network_only_when_allowed_and_gpu_nodes_only_for_gpu_cases(monkeypatch):
    monkeypatch.setattr("lab.engine.local_engine.gpu_nodes", lambda: ["/dev/nvidia0", "/dev/nvidiactl"])
    args = sandbox_args(tool="bwrap", image=IMAGE, out=Path("/o"), limits=RunLimits(network=True), as_root=False)
    assert "--unshare-net" not in args
    assert not _pairs(args, "--dev-bind")
    assert args[-6:] == ["--unshare-user", "--uid", str(RUN_UID), "--gid", str(RUN_UID), "--"]
    gpu = replace(IMAGE, gpu=True)
    args = sandbox_args(tool="bwrap", image=gpu, out=Path("/o"), limits=RunLimits(), as_root=False)
    assert _pairs(args, "--dev-bind") == [("/dev/nvidia0", "/dev/nvidia0"), ("/dev/nvidiactl", "/dev/nvidiactl")]


def test_the_script_gets_an_images_environment_not_the_labs(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    env = script_env(IMAGE, {"OMP_NUM_THREADS": "2", "LD_DEBUG": "libs,files"})
    assert env["PATH"].startswith("/cache/venv/k/bin:") and env["HOME"] == "/tmp"
    assert env["VIRTUAL_ENV"] == "/cache/venv/k" and env["OMP_NUM_THREADS"] == "2"
    assert "AWS_SECRET_ACCESS_KEY" not in env


def test_an_unconfined_run_maps_the_image_paths_to_its_folders():
    out = Path("/stage/out")
    assert _translate("/out/ld/ld", IMAGE, out) == "/stage/out/ld/ld"
    assert _translate("/lab/tools/lab_run.py", IMAGE, out) == "/runs/r/tools/lab_run.py"
    assert _translate("/outside", IMAGE, out) == "/outside" and _translate("x.py", IMAGE, out) == "x.py"


def test_limits_the_address_space_only_for_cpu_cases_and_pids_only_when_confined():
    import resource
    cpu = dict(rlimits(RunLimits(), gpu=False, confined=True))
    assert cpu[resource.RLIMIT_CORE] == 0 and cpu[resource.RLIMIT_NPROC] == 4096
    assert cpu[resource.RLIMIT_AS] == 8 * 1024**3
    assert resource.RLIMIT_AS not in dict(rlimits(RunLimits(), gpu=True, confined=True))
    assert resource.RLIMIT_NPROC not in dict(rlimits(RunLimits(), gpu=False, confined=False))


def test_without_bwrap_it_refuses_unless_the_script_is_trusted():
    off = probe_bwrap("off")
    assert not off.confined and "LAB_BWRAP=off" in off.problem
    missing = probe_bwrap("/nonexistent/bwrap-for-tests")
    assert not missing.confined and "is not installed" in missing.problem
    with pytest.raises(NotConfinedError, match="cannot confine the script here") as err:
        LocalEngine(LocalOptions(bwrap="off"), confinement=off).check_confinement()
    assert "--trust-script" in err.value.hint
    trusted = LocalEngine(LocalOptions(bwrap="off", trust_script=True), confinement=off)
    assert trusted.check_confinement() is off
    assert off.words(network=False).startswith("not confined (--trust-script)")
    assert trusted.version == "unconfined"


def test_another_arch_is_refused_with_a_pointer_to_docker_engines():
    engine = LocalEngine(confinement=Confinement("bwrap", "0.8.0"))
    other = Arch.ARM64 if engine.arch == Arch.AMD64 else Arch.AMD64
    with pytest.raises(ForeignArchError, match="runs only this host's architecture") as err:
        engine.check_native(other, "case[x]")
    assert "Docker engine" in err.value.hint and "QEMU" in err.value.hint
    engine.check_native(engine.arch, "case[x]")


def test_local_is_an_engine_name_and_routing_sends_other_arches_elsewhere():
    spec = parse_spec("local", "--engine")
    assert (spec.kind, spec.url) == ("local", "local://")
    local = EngineFacts("local", "local://", "--engine", reachable=True, arch="amd64", cpus=2, memory=8 << 30,
                        gpu=False, emulates=(), local=True, kind="local")
    docker = EngineFacts("default", "unix:///x", "current", reachable=True, arch="amd64", cpus=2,
                         memory=8 << 30, gpu=False, emulates=("arm64",), local=True)
    with pytest.raises(NoEngineError, match="runs only this host's amd64, without emulation"):
        routes("arm64", False, [local])
    assert [r.engine for r in routes("arm64", False, [local, docker])] == ["default"]
    assert [r.engine for r in routes("amd64", False, [local, docker])] == ["local", "default"]
    assert local.as_json()["kind"] == "local"


def test_torch_of_the_current_interpreter_matches_as_pip_would():
    assert torch_matches("2.13.0+cpu", "2.13.0")
    assert torch_matches("2.13.0+cpu", "2.13.0+cpu")
    assert not torch_matches("2.13.0+cu128", "2.13.0+cpu")
    assert not torch_matches("2.12.0", "2.13.0")


def test_the_current_interpreters_torch_is_its_build_not_only_its_metadata(tmp_path):
    """PyPI's CUDA 13 wheel says `2.11.0` in its metadata and `2.11.0+cu130` in torch.__version__ (seen
    on the GPU host, issue 14): the probe reads torch/version.py, so `--torch 2.11.0+cu130`, the
    version a user copies from `torch.__version__`, matches the Python already there."""
    import subprocess
    import sys
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text("raise ImportError('the probe must not import torch')\n")
    (site / "torch" / "version.py").write_text("from typing import Optional\n\n__all__ = ['__version__']\n"
                                               "__version__ = '2.11.0+cu130'\ncuda: Optional[str] = '13.0'\n")
    (site / "torch-2.11.0.dist-info").mkdir()
    (site / "torch-2.11.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0\n")
    interp = probe_python(str(venv / "bin" / "python"))
    assert interp.dist("torch") == "2.11.0+cu130"
    assert torch_matches(interp.dist("torch"), "2.11.0+cu130") and torch_matches(interp.dist("torch"), "2.11.0")


def test_missing_system_packages_are_named():
    missing, note = missing_system_packages(["dpkg", "lab-absent-package-for-tests"])
    if note is not None:
        pytest.skip(note)
    assert missing == ["lab-absent-package-for-tests"]


def test_a_sandbox_or_python_that_does_not_start_is_the_engines_failure_not_a_verdict(tmp_path):
    from lab.core.errors import EngineError
    from lab.engine.local_engine import _check_started
    confined = Confinement("bwrap", "0.8.0", as_root=True)
    stderr = tmp_path / "stderr.txt"
    stderr.write_text("/usr/bin/env: '/cache/venv/k/bin/python': No such file or directory\n")
    with pytest.raises(EngineError, match="failed before the script ran"):
        _check_started(127, stderr, confined)
    stderr.write_text("bwrap: Can't find source path /x: No such file or directory\n")
    with pytest.raises(EngineError, match="Can't find source path"):
        _check_started(1, stderr, confined)
    stderr.write_text("Traceback (most recent call last):\nRuntimeError: the bug\n")
    _check_started(1, stderr, confined)  # the script's own failure: judged as usual
    _check_started(0, stderr, confined)


def test_the_recorded_gpu_run_reads_as_a_local_confined_reproduction():
    """tests/data/local-gpu: the CUDA seed run on an H200 with the Python already there (issue 14).
    The record still reads with today's schema, and says what a reader of the report relies on."""
    from lab.core.results import RunResult
    from tests.conftest import DATA
    folder = DATA / "local-gpu"
    result = RunResult.model_validate_json((folder / "result.json").read_text())
    assert result.verdict.value == "reproduced" and result.torch == "2.11.0+cu130"
    assert result.engine.kind == "local" and result.local.python_env == "current" and result.local.confined
    report = (folder / "report.md").read_text()
    assert "engine local (this host, no container: Ubuntu 24.04.3 LTS, glibc 2.39)" in report
    assert "does not know how to trace the builtin `torch._C._to_dlpack" in report
    assert "nvidia/cu13/lib/libcudart.so.13" in report and "libcuda.so.1" in report
    assert "GPU 0: NVIDIA H200" in (folder / "collect_env.txt").read_text()
