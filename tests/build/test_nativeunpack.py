"""lab.build.nativeunpack: during an emulated bootstrap, dpkg-deb's --fsys-tarfile decompresses
data.tar.xz with the host's static busybox, and gives dpkg the stream dpkg-deb gives.

The stand-in is run here on the host, with its paths pointed at the host's busybox and dpkg-deb
(the CI machines are Debian; bin/setup-host installs busybox-static). The bootstrap that uses it,
and the base it leaves, are in tests/test_e2e.py."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lab.build import nativeunpack

BUSYBOX = nativeunpack.static_busybox()
pytestmark = pytest.mark.skipif(BUSYBOX is None or shutil.which("dpkg-deb") is None,
                                reason="needs the host's busybox-static (bin/setup-host) and dpkg-deb")


@pytest.fixture
def stand_in(tmp_path: Path) -> Path:
    script = tmp_path / "dpkg-deb"
    script.write_text(nativeunpack.STAND_IN.replace(nativeunpack.BUSYBOX, str(BUSYBOX))
                      .replace(nativeunpack.DIVERTED, shutil.which("dpkg-deb")))
    script.chmod(0o755)
    return script


def package(tmp_path: Path, compression: str) -> Path:
    tree = tmp_path / f"pkg-{compression}"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN/control").write_text("Package: lab-test\nVersion: 1.0\nArchitecture: all\n"
                                         "Maintainer: lab <lab@example.org>\nDescription: test\n")
    (tree / "usr/share/lab-test").mkdir(parents=True)
    (tree / "usr/share/lab-test/data").write_bytes(bytes(range(256)) * 4000)
    (tree / "usr/share/lab-test/link").symlink_to("data")
    deb = tmp_path / f"lab-test-{compression}.deb"
    subprocess.run(["dpkg-deb", f"-Z{compression}", "--root-owner-group", "-b", str(tree), str(deb)],
                   check=True, capture_output=True)
    return deb


def out(*cmd) -> tuple[int, str]:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True)
    return proc.returncode, hashlib.sha256(proc.stdout).hexdigest()


@pytest.mark.parametrize("compression", ["xz", "gzip", "none"])
def test_dpkg_gets_the_tar_stream_dpkg_deb_gives(tmp_path, stand_in, compression):
    deb = package(tmp_path, compression)
    assert out(stand_in, "--fsys-tarfile", deb) == out("dpkg-deb", "--fsys-tarfile", deb)
    assert out(stand_in, "--fsys-tarfile", deb)[0] == 0


def test_every_other_call_is_dpkg_deb_itself(tmp_path, stand_in):
    deb = package(tmp_path, "xz")
    assert subprocess.run([stand_in, "-f", deb, "Version"], capture_output=True, text=True).stdout == "1.0\n"
    control = tmp_path / "control"
    subprocess.run([stand_in, "--control", deb, control], check=True)
    assert "Package: lab-test" in (control / "control").read_text()


def test_a_damaged_package_fails_as_with_dpkg_deb(tmp_path, stand_in):
    deb = package(tmp_path, "xz")
    whole = deb.read_bytes()
    cut = tmp_path / "cut.deb"
    cut.write_bytes(whole[:len(whole) - 2000])  # the end of data.tar.xz is missing
    assert out(stand_in, "--fsys-tarfile", cut)[0] != 0
    assert out(stand_in, "--fsys-tarfile", tmp_path / "absent.deb")[0] != 0


def test_only_a_statically_linked_busybox_serves(tmp_path):
    assert nativeunpack.is_static(BUSYBOX)
    assert not nativeunpack.is_static(Path(sys.executable).resolve())  # has an ELF interpreter
    (tmp_path / "script").write_text("#!/bin/sh\n")
    assert not nativeunpack.is_static(tmp_path / "script")
    assert not nativeunpack.is_static(tmp_path / "absent")


def test_divert_and_restore_leave_the_tree_as_it_was(tmp_path):
    (tmp_path / "usr/bin").mkdir(parents=True)
    (tmp_path / "usr/bin/dpkg-deb").write_text("the image's dpkg-deb\n")
    (tmp_path / "var/lib/dpkg").mkdir(parents=True)
    said = nativeunpack.divert(tmp_path, BUSYBOX)
    assert said.startswith("xz: ")
    assert (tmp_path / nativeunpack.BUSYBOX.lstrip("/")).read_bytes() == BUSYBOX.read_bytes()
    assert (tmp_path / "usr/bin/dpkg-deb").read_text() == nativeunpack.STAND_IN
    assert nativeunpack.restore(tmp_path).startswith("xz: ")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == \
        ["usr", "usr/bin", "usr/bin/dpkg-deb", "var", "var/lib", "var/lib/dpkg"]
    assert (tmp_path / "usr/bin/dpkg-deb").read_text() == "the image's dpkg-deb\n"
