"""lab.image.nativeunpack: during an emulated bootstrap, what dpkg asks of dpkg-split and dpkg-deb
for each package is answered by the host's static busybox, as the tools themselves answer it.

The stand-ins are run here on the host, with their paths pointed at the host's busybox and tools
(the CI machines are Debian; bin/setup-host installs busybox-static). The bootstrap that uses them,
and the base it leaves, are in tests/test_e2e.py."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lab.image import nativeunpack

BUSYBOX = nativeunpack.static_busybox()
pytestmark = pytest.mark.skipif(BUSYBOX is None or shutil.which("dpkg-deb") is None,
                                reason="needs the host's busybox-static (bin/setup-host) and dpkg-deb")


def stand_in(tmp_path: Path, tool: str, passes_to: str | None = None) -> Path:
    """The stand-in for `tool`, run by the host's busybox; what it passes on goes to `passes_to`
    (a shell script's text: a fake that says it was called), else to the host's own tool."""
    real = shutil.which(Path(tool).name)
    if passes_to is not None:
        real = tmp_path / f"fake-{Path(tool).name}"
        real.write_text(passes_to)
        real.chmod(0o755)
    script = tmp_path / Path(tool).name
    script.write_text(nativeunpack.STAND_INS[tool].replace(nativeunpack.BUSYBOX, str(BUSYBOX))
                      .replace(tool + ".lab-native", str(real)))
    script.chmod(0o755)
    return script


@pytest.fixture
def dpkg_deb(tmp_path: Path) -> Path:
    return stand_in(tmp_path, nativeunpack.DPKG_DEB)


def package(tmp_path: Path, compression: str) -> Path:
    tree = tmp_path / f"pkg-{compression}"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN/control").write_text("Package: lab-test\nVersion: 1.0\nArchitecture: all\n"
                                         "Maintainer: lab <lab@example.org>\nDescription: test\n")
    (tree / "DEBIAN/postinst").write_text("#!/bin/sh\nexit 0\n")
    (tree / "DEBIAN/postinst").chmod(0o755)
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
def test_dpkg_gets_the_tar_stream_dpkg_deb_gives(tmp_path, dpkg_deb, compression):
    deb = package(tmp_path, compression)
    assert out(dpkg_deb, "--fsys-tarfile", deb) == out("dpkg-deb", "--fsys-tarfile", deb)
    assert out(dpkg_deb, "--fsys-tarfile", deb)[0] == 0


@pytest.mark.parametrize("compression", ["xz", "gzip"])
def test_dpkg_gets_the_control_files_dpkg_deb_gives(tmp_path, dpkg_deb, compression):
    deb = package(tmp_path, compression)
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    subprocess.run([dpkg_deb, "--control", deb, ours], check=True)
    subprocess.run(["dpkg-deb", "--control", deb, theirs], check=True)

    def files(folder: Path) -> list:
        return [(p.name, p.read_bytes(), p.stat().st_mode, p.stat().st_uid, p.stat().st_mtime)
                for p in sorted(folder.iterdir())]
    assert files(ours) == files(theirs) and [f[0] for f in files(ours)] == ["control", "postinst"]


def test_a_whole_package_is_not_part_of_a_split_one(tmp_path):
    """dpkg-split itself is replaced by a fake that says it was called: a part of a split package
    (and any other call) is passed on to it, and the host's queue of parts is not touched."""
    script = stand_in(tmp_path, nativeunpack.DPKG_SPLIT, passes_to="#!/bin/sh\necho passed on\nexit 7\n")
    deb = package(tmp_path, "xz")
    assert subprocess.run([script, "-Qao", tmp_path / "part", deb]).returncode == 1
    assert subprocess.run(["dpkg-split", "-Qao", tmp_path / "part", deb]).returncode == 1  # what it says
    (tmp_path / "pkg-xz/usr/share/lab-test/data").write_bytes(os.urandom(300_000))
    big = tmp_path / "big.deb"
    subprocess.run(["dpkg-deb", "-b", tmp_path / "pkg-xz", big], check=True, capture_output=True)
    subprocess.run(["dpkg-split", "-S", "100", "-s", big, tmp_path / "part"], check=True, capture_output=True)
    for call in (["-Qao", tmp_path / "whole", tmp_path / "part.1of3.deb"], ["--info", deb]):
        done = subprocess.run([script, *call], capture_output=True, text=True)
        assert (done.returncode, done.stdout) == (7, "passed on\n")


def test_every_other_call_is_dpkg_deb_itself(tmp_path, dpkg_deb):
    deb = package(tmp_path, "xz")
    assert subprocess.run([dpkg_deb, "-f", deb, "Version"], capture_output=True, text=True).stdout == "1.0\n"


def test_a_damaged_package_fails_as_with_dpkg_deb(tmp_path, dpkg_deb):
    deb = package(tmp_path, "xz")
    whole = deb.read_bytes()
    cut = tmp_path / "cut.deb"
    cut.write_bytes(whole[:len(whole) - 2000])  # the end of data.tar.xz is missing
    assert out(dpkg_deb, "--fsys-tarfile", cut)[0] != 0
    assert out(dpkg_deb, "--fsys-tarfile", tmp_path / "absent.deb")[0] != 0


NETLOCK = "mozilla/NetLock_Arany_=Class_Gold=_F\u0151tan\u00fas\u00edtv\u00e1ny.crt"
NAMES = f"mozilla/ACCVRAIZ1.crt\n{NETLOCK}\n!mozilla/Old.crt\n"


@pytest.mark.parametrize("call", [
    ["-F", "-q", "-x", "mozilla/ACCVRAIZ1.crt"],  # ca-certificates' config script, per certificate
    ["-F", "-q", "-x", "mozilla/ACCVRAIZ1"],      # a part of a line is not the whole line
    ["-Fqx", NETLOCK], ["-F", "mozilla/"], ["-Fv", "Old"], ["-F", "-x", "!mozilla/Old.crt"], ["-F", "."],
    ["-F", "-q", "-s", "x", "absent"], ["-F", ""], ["-F", "-x", ""], ["-F", "nothing\nACCVRAIZ1"],
    ["-F", "-q", "ACCV", "-"],
])
def test_a_fixed_string_grep_answers_as_gnu_grep(tmp_path, call):
    """Exit code and output the same as GNU grep's, on the names as ca-certificates lists them."""
    script = stand_in(tmp_path, nativeunpack.GREP)
    gnu, ours = (subprocess.run([tool, *call], input=NAMES.encode(), capture_output=True, cwd=tmp_path)
                 for tool in ("grep", script))
    assert (ours.returncode, ours.stdout) == (gnu.returncode, gnu.stdout)


@pytest.mark.parametrize("call", [["-q", "^mozilla"], ["-E", "-q", "a|b"], ["-i", "-F", "x"], ["--fixed-strings", "x"],
                                  ["-F", "-e", "x"], ["-Fqx", "a", "-r"]])
def test_any_other_grep_is_the_image_s_own(tmp_path, call):
    """A regular expression, or an option beyond -F -q -s -v -x, anywhere in the call: the image's grep."""
    script = stand_in(tmp_path, nativeunpack.GREP, passes_to="#!/bin/sh\necho passed on \"$@\"\n")
    done = subprocess.run([script, *call], input="", capture_output=True, text=True)
    assert done.stdout == "passed on " + " ".join(call) + "\n"


def test_dpkg_s_rm_of_its_control_folder_removes_it_as_gnu_rm(tmp_path):
    """`rm -rf -- /var/lib/dpkg/tmp.ci`, as dpkg runs it: a tree with an unreadable folder in it,
    and a path that is not there (exit 0 for both, as GNU rm)."""
    script = stand_in(tmp_path, nativeunpack.RM, passes_to="#!/bin/sh\necho passed on \"$@\"\nexit 9\n")
    tree = tmp_path / "tmp.ci"
    (tree / "a/b").mkdir(parents=True)
    (tree / "a/b/postinst").write_text("x")
    (tree / "link").symlink_to(tmp_path / "keep")
    (tmp_path / "keep").write_text("the link's target stays")
    (tree / "a/b").chmod(0o000)
    done = subprocess.run([script, "-rf", "--", tree], capture_output=True, text=True)
    assert (done.returncode, done.stdout, tree.exists()) == (0, "", False)
    assert (tmp_path / "keep").read_text() == "the link's target stays"
    gone = tmp_path / "absent"
    assert [subprocess.run([tool, "-rf", "--", gone]).returncode for tool in (script, "rm")] == [0, 0]


@pytest.mark.parametrize("call", [["-rf", "--", "/"], ["-rf", "--", "//"], ["-rf", "--", "/tmp/."],
                                  ["-rf", "--", "/tmp/x/.."], ["-rf", "--", "/tmp/x/"], ["-rf", "--", "/tmp//x"],
                                  ["-rf", "--", "relative"], ["-rf", "--", "/tmp/a/../b"], ["-rf", "/tmp/x"],
                                  ["-f", "--", "/tmp/x"], ["-rf", "--", "/tmp/x", "/tmp/y"], ["-rfv", "--", "/tmp/x"]])
def test_any_other_rm_is_the_image_s_own(tmp_path, call):
    """/ and what GNU rm refuses (a last part . or ..) or reads another way, and any other form."""
    script = stand_in(tmp_path, nativeunpack.RM, passes_to="#!/bin/sh\necho passed on \"$@\"\n")
    done = subprocess.run([script, *call], capture_output=True, text=True)
    assert done.stdout == "passed on " + " ".join(call) + "\n"


@pytest.mark.parametrize("call", [["/usr/bin/dpkg-maintscript-helper"], ["/var/lib/dpkg/info/x.postinst"],
                                  ["x/"], ["//"], ["/"], ["a//b//"], ["/a/b.c", ".c"], ["a.c", "a.c"], ["/x/y/", "y"],
                                  [".c", ".c"], ["name with space"]])
def test_basename_answers_as_gnu_basename(tmp_path, call):
    script = stand_in(tmp_path, nativeunpack.BASENAME, passes_to="#!/bin/sh\necho passed on\n")
    gnu, ours = (subprocess.run([tool, *call], capture_output=True) for tool in ("basename", script))
    assert (ours.returncode, ours.stdout) == (gnu.returncode, gnu.stdout) and ours.stdout != b"passed on\n"


@pytest.mark.parametrize("call", [[], ["-a", "x", "y"], ["--", "x"], ["x", "-s"], [""], ["x", ""], ["a", "b", "c"]])
def test_any_other_basename_is_the_image_s_own(tmp_path, call):
    script = stand_in(tmp_path, nativeunpack.BASENAME, passes_to="#!/bin/sh\necho passed on \"$#\"\n")
    done = subprocess.run([script, *call], capture_output=True, text=True)
    assert done.stdout == f"passed on {len(call)}\n"


def test_only_a_statically_linked_busybox_serves(tmp_path):
    assert nativeunpack.is_static(BUSYBOX)
    assert not nativeunpack.is_static(Path(sys.executable).resolve())  # has an ELF interpreter
    (tmp_path / "script").write_text("#!/bin/sh\n")
    assert not nativeunpack.is_static(tmp_path / "script")
    assert not nativeunpack.is_static(tmp_path / "absent")


def test_divert_and_restore_leave_the_tree_as_it_was(tmp_path):
    (tmp_path / "usr/bin").mkdir(parents=True)
    (tmp_path / "bin").symlink_to("usr/bin")  # a merged /usr: grep's own path is /bin/grep
    for tool in ("dpkg-deb", "dpkg-split", "grep", "rm", "basename"):
        (tmp_path / "usr/bin" / tool).write_text(f"the image's {tool}\n")
    (tmp_path / "var/lib/dpkg").mkdir(parents=True)
    said = nativeunpack.divert(tmp_path, BUSYBOX)
    assert said.startswith("dpkg helpers: ")
    assert (tmp_path / nativeunpack.BUSYBOX.lstrip("/")).read_bytes() == BUSYBOX.read_bytes()
    for tool, stand_in in nativeunpack.STAND_INS.items():
        assert (tmp_path / tool.lstrip("/")).read_text() == stand_in
    assert nativeunpack.restore(tmp_path).startswith("dpkg helpers: ")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == \
        ["bin", "usr", "usr/bin", "usr/bin/basename", "usr/bin/dpkg-deb", "usr/bin/dpkg-split", "usr/bin/grep",
         "usr/bin/rm", "var", "var/lib", "var/lib/dpkg"]
    assert (tmp_path / "usr/bin/dpkg-deb").read_text() == "the image's dpkg-deb\n"
