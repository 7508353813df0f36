"""`lab doctor`'s QEMU check: the version parsed from real QEMU output, the warning below 10,
and, on this host, the version that really runs aarch64 programs and containers."""

from __future__ import annotations

import base64
import json
import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from lab import doctor
from lab.doctor import AARCH64_PROBE, BINFMT, QEMU_FIX, REREGISTER, parse_qemu_version, qemu_check, qemu_verdict
from lab.image import nativeperl, nativepython, nativeunpack

from .conftest import DATA, ROOT, run_lab

QEMU = DATA / "qemu"
OLD = (QEMU / "qemu-aarch64-static-7.2.22-bookworm.version.txt").read_text()
NEW = (QEMU / "qemu-aarch64-10.0.2-bookworm-backports.version.txt").read_text()
REFUSED = (QEMU / "aarch64-binfmt-P-10.0.2.version.txt").read_text()
INTERP = "/usr/libexec/qemu-binfmt/aarch64-binfmt-P"


@pytest.mark.parametrize(("name", "version"), [
    ("qemu-aarch64-static-7.2.22-bookworm.version.txt", (7, 2, 22)),
    ("qemu-aarch64-10.0.2-bookworm-backports.version.txt", (10, 0, 2)),
    ("kernel-probe-7.2.22.txt", (7, 2, 22)),
    ("kernel-probe-10.0.2.txt", (10, 0, 2)),
    ("container-env-10.0.2.txt", (10, 0, 2)),
    ("aarch64-binfmt-P-7.2.22.version.txt", None),
    ("aarch64-binfmt-P-10.0.2.version.txt", None),
])
def test_parses_the_version_qemu_prints(name, version):
    assert parse_qemu_version((QEMU / name).read_text()) == version


def test_parses_no_version_from_nothing_or_other_programs():
    assert parse_qemu_version("") is None
    assert parse_qemu_version("Python 3.11.2\n") is None
    assert parse_qemu_version("bash: ./aarch64-probe: cannot execute binary file: Exec format error") is None


def test_qemu_10_registered_with_f_is_ok_and_carries_its_version():
    check = qemu_check(INTERP, "PF", NEW, NEW)
    assert check.status == "ok" and check.version == "10.0.2"
    assert check.detail == f"QEMU 10.0.2 at {INTERP} (flags PF)"
    assert check.fix is None


def test_qemu_7_warns_with_the_fix():
    check = qemu_check(INTERP, "PF", OLD, OLD)
    assert check.status == "warn" and check.version == "7.2.22"
    assert "QEMU 7.2.22" in check.detail
    assert check.fix == QEMU_FIX
    assert check.fix.startswith("aarch64 torch >= 2.13 segfaults at import under QEMU < 10: run bin/setup-host, "
                                "or apt-get install -t bookworm-backports qemu-user-static")


def test_an_upgrade_the_kernel_has_not_seen_warns_to_register_again():
    """The package holds QEMU 10, but the F-flag handler still runs the 7.2 binary it opened."""
    check = qemu_check(INTERP, "PF", NEW, OLD)
    assert check.status == "warn" and check.version == "7.2.22"
    assert "still runs QEMU 7.2.22" in check.detail and "now QEMU 10.0.2" in check.detail
    assert REREGISTER in check.fix


def test_the_version_the_kernel_runs_wins_over_the_path():
    assert qemu_check(INTERP, "PF", OLD, NEW).version == "10.0.2"


def test_the_path_version_serves_when_the_kernel_probe_says_nothing():
    check = qemu_check(INTERP, "PF", NEW, "")
    assert check.status == "ok" and check.version == "10.0.2"


def test_the_binfmt_p_name_alone_gives_an_unknown_version_warning():
    check = qemu_check(INTERP, "PF", REFUSED, "")
    assert check.status == "warn" and check.version is None
    assert "unknown version" in check.detail and "has to be run using kernel binfmt-misc" in check.detail
    assert check.fix == QEMU_FIX


def test_qemu_10_without_the_f_flag_warns():
    check = qemu_check(INTERP, "P", NEW, NEW)
    assert check.status == "warn" and check.version == "10.0.2"
    assert "without the F flag" in check.detail and REREGISTER in check.fix


def test_inside_a_container_flags_are_unknown_and_not_held_against_it():
    check = qemu_verdict((10, 0, 2), None, "runs the engine's arm64 containers", None)
    assert check.status == "ok" and check.version == "10.0.2"
    assert qemu_verdict((7, 2, 22), None, "runs the engine's arm64 containers", None).fix == QEMU_FIX


def test_the_probe_program_is_the_one_bin_setup_host_runs():
    line = next(ln for ln in (ROOT / "bin/setup-host").read_text().splitlines()
                if ln.startswith("AARCH64_PROBE_B64="))
    assert base64.b64decode(line.split("=", 1)[1]) == AARCH64_PROBE
    # an aarch64 ELF executable: the bytes binfmt_misc's qemu-aarch64 magic and mask match
    magic = bytes.fromhex("7f454c460201010000000000000000000200b700")
    mask = bytes.fromhex("ffffffffffffff00fffffffffffffffffeffffff")
    assert bytes(b & m for b, m in zip(AARCH64_PROBE[:20], mask, strict=True)) == magic


def test_bin_setup_host_parses_versions_as_lab_doctor_does():
    """setup-host's sed and doctor's regex agree on the real outputs."""
    script = (ROOT / "bin/setup-host").read_text()
    sed = re.search(r"qemu_version_of\(\) \{ (sed .*?) \| head -n1; \}", script).group(1)
    for name in ("qemu-aarch64-static-7.2.22-bookworm.version.txt", "kernel-probe-10.0.2.txt",
                 "aarch64-binfmt-P-10.0.2.version.txt"):
        text = (QEMU / name).read_text()
        out = subprocess.run(["bash", "-c", sed], input=text, capture_output=True, text=True, check=True)
        parsed = parse_qemu_version(text)
        assert out.stdout.strip() == (".".join(map(str, parsed)) if parsed else "")


# --- this host, for real: bin/setup installs QEMU >= 10 (README, Quick start) -----------------

def _emulated_host() -> bool:
    return platform.machine() in ("x86_64", "AMD64") and (BINFMT / "status").exists()


@pytest.mark.docker
@pytest.mark.arm64
def test_doctor_reports_qemu_10_or_newer_on_this_x86_64_host():
    proc = run_lab("doctor", "--json", timeout=300)
    checks = {c["name"]: c for c in json.loads(proc.stdout.strip().splitlines()[-1])["checks"]}
    emulation = checks["arm64 emulation"]
    assert checks["Docker engine"]["version"]
    if not _emulated_host():
        pytest.skip(f"{platform.machine()} host, or no binfmt_misc here: no QEMU handler to check")
    assert emulation["status"] == "ok", emulation
    assert emulation["version"] and int(emulation["version"].split(".")[0]) >= 10, emulation


@pytest.mark.docker
@pytest.mark.arm64
def test_arm64_containers_run_under_qemu_10_or_newer(tmp_path):
    """What a case's container gets: the F-flag handler seen through the engine (as `lab doctor`
    in the lab's own container checks it)."""
    from lab.core.arch import Arch
    from lab.doctor import _binfmt_through_engine
    from lab.engine.docker_engine import Engine
    engine = Engine.connect()
    if engine.arch is Arch.ARM64:
        pytest.skip("native arm64 engine: no emulation")
    # the base the arm64 e2e scenarios use (their system packages included), so it is made once
    proc = run_lab("build-base", "debian:bookworm", "--arch", "arm64", "--packages", "g++,python3-dev",
                   timeout=1800)
    assert proc.returncode == 0, proc.stderr[-2000:]
    check = _binfmt_through_engine(engine)
    assert check.status == "ok", check
    assert int(check.version.split(".")[0]) >= 10, check


def test_low_free_disk_warns_with_the_cache_prune_fix(tmp_path, monkeypatch):
    import shutil as real_shutil
    from collections import namedtuple

    from lab import doctor
    usage = namedtuple("usage", "total used free")
    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    monkeypatch.setattr(doctor.shutil, "disk_usage", lambda p: usage(100 * 2**30, 88 * 2**30, 12 * 2**30))
    check = doctor._disk(tmp_path)
    assert check.status == "warn" and "low: 12.0 GiB free" in check.detail and "lab cache prune" in check.fix
    monkeypatch.setattr(doctor.shutil, "disk_usage", lambda p: usage(100 * 2**30, 97 * 2**30, 3 * 2**30))
    assert doctor._disk(tmp_path).status == "fail"
    monkeypatch.setattr(doctor.shutil, "disk_usage", real_shutil.disk_usage)
    (tmp_path / "cache" / "last-count.json").write_text('{"at": 1, "total": 3221225472, "cap": 10737418240}')
    monkeypatch.setenv("LAB_CACHE_CAP", "10GiB")
    assert "held 3.0 GiB at its last count, and its cap is 10.0 GiB" in doctor._disk(tmp_path).detail
    # the cap in effect now, not the one a process with its own setting (the test suite's) counted with
    (tmp_path / "cache" / "last-count.json").write_text('{"at": 1, "total": 3221225472, "cap": 1099511627776000}')
    assert "held 3.0 GiB at its last count, and its cap is 10.0 GiB" in doctor._disk(tmp_path).detail


def test_the_bootstrap_check_says_what_an_emulated_bootstrap_runs_natively(monkeypatch):
    """What `lab doctor` says follows the host: busybox-static and a Debian python3.X."""
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(nativeunpack, "static_busybox", lambda: Path("/usr/bin/busybox"))
    monkeypatch.setattr(nativepython, "host_pythons", lambda: [Path("/usr/bin/python3.11")])
    monkeypatch.setattr(nativeperl, "host_perl", lambda: Path("/usr/bin/perl"))
    said = doctor._bootstrap().detail
    assert "grep -F natively (static busybox)" in said and "host's python3.11" in said and "host's perl" in said
    monkeypatch.setattr(nativeunpack, "static_busybox", lambda: None)
    monkeypatch.setattr(nativepython, "host_pythons", lambda: [])
    monkeypatch.setattr(nativeperl, "host_perl", lambda: None)
    said = doctor._bootstrap().detail
    assert "install busybox-static" in said and "python3" not in said and "perl" not in said
