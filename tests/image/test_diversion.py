"""lab.image.diversion: a file replaced for the length of a bootstrap, as dpkg diverts it, and no
trace of it afterwards, in dpkg's diversions or in dpkg-divert's backup. The bootstrap itself is
in tests/test_e2e.py (`dpkg-divert --list` and `dpkg --verify` in the arm64 base)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.image import diversion

DASH = "/bin/sh\n/bin/sh.distrib\ndash\n"
TOOL = "/usr/bin/dpkg-deb"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "usr/bin").mkdir(parents=True)
    (tmp_path / "usr/sbin").mkdir()
    (tmp_path / "usr/bin/dpkg-deb").write_text("the package's\n")
    (tmp_path / "var/lib/dpkg").mkdir(parents=True)
    return tmp_path


def table(root: Path, name: str = "diversions") -> str | None:
    f = root / "var/lib/dpkg" / name
    return f.read_text() if f.is_file() else None


def test_dpkg_sees_a_local_diversion_and_the_stand_in_takes_the_place(root):
    (root / "var/lib/dpkg/diversions").write_text(DASH)
    assert diversion.add(root, TOOL, "#!/bin/sh\nexit 0\n") == TOOL + ".lab-native"
    assert table(root) == f"{DASH}{TOOL}\n{TOOL}.lab-native\n:\n"  # dpkg-divert --local writes this
    assert (root / "usr/bin/dpkg-deb.lab-native").read_text() == "the package's\n"
    assert (root / "usr/bin/dpkg-deb").read_text() == "#!/bin/sh\nexit 0\n"
    assert (root / "usr/bin/dpkg-deb").stat().st_mode & 0o777 == 0o755
    assert table(root, "diversions-old") is None  # dpkg-divert's backup is not touched


def test_removed_the_tree_is_as_before_even_when_a_package_diverted_meanwhile(root):
    """dash's preinst runs dpkg-divert while the lab's diversion is in place: its backup then holds
    the lab's entry, which must not stay in the base."""
    diversion.add(root, TOOL, "stand-in\n")
    ours = f"{TOOL}\n{TOOL}.lab-native\n:\n"
    (root / "var/lib/dpkg/diversions-old").write_text(ours)  # what dpkg-divert in dash's preinst does
    (root / "var/lib/dpkg/diversions").write_text(ours + DASH)
    (root / "usr/bin/dpkg-deb.lab-native").write_text("unpacked by dpkg\n")
    diversion.remove(root, TOOL)
    assert (root / "usr/bin/dpkg-deb").read_text() == "unpacked by dpkg\n"
    assert not (root / "usr/bin/dpkg-deb.lab-native").exists()
    assert table(root) == DASH and table(root, "diversions-old") == ""
    assert sorted(p.name for p in (root / "var/lib/dpkg").iterdir()) == ["diversions", "diversions-old"]


def test_with_no_diversion_before_or_since_no_diversions_file_is_left(root):
    diversion.add(root, TOOL, "stand-in\n")
    diversion.add(root, "/usr/sbin/update-ca-certificates", "stand-in\n")  # absent yet: nothing to move
    diversion.remove(root, "/usr/sbin/update-ca-certificates")
    assert table(root) == f"{TOOL}\n{TOOL}.lab-native\n:\n"
    diversion.remove(root, TOOL)
    assert list((root / "var/lib/dpkg").iterdir()) == []
    assert (root / "usr/bin/dpkg-deb").read_text() == "the package's\n"
    assert not (root / "usr/sbin/update-ca-certificates").exists()


def test_a_packages_own_diversion_of_the_same_path_is_kept(root):
    theirs = f"{TOOL}\n{TOOL}.distrib\nsome-package\n"
    (root / "var/lib/dpkg/diversions").write_text(theirs)
    diversion.add(root, TOOL, "stand-in\n")
    diversion.remove(root, TOOL)
    assert table(root) == theirs
