"""lab.image.nativeperl: during an emulated bootstrap, the maintainer scripts' Perl is run by the
host's perl of the same version, with the same arguments, as long as the tree has no Perl modules
of its own arch beyond perl-base.

The stand-in is run here on the host, with its paths pointed at tmp_path: the "host's perl" goes
through a loader that says it was called, and the "image's perl" is a fake that says it was
passed on. The bootstrap that uses it, and the base it leaves, are in tests/test_e2e.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from lab.image import diversion, nativeperl

PERL = nativeperl.host_perl()
pytestmark = pytest.mark.skipif(PERL is None, reason="needs the host's Debian perl and ldd")
VERSION, MODULES = nativeperl._host(PERL) if PERL else ("", Path())
SCRIPT = r"""#!{interpreter} -w
use strict;
use POSIX qw(floor);
use Getopt::Long;
my $quiet = 0;
GetOptions("quiet" => \$quiet) or exit 2;
printf "%s warn=%d quiet=%d floor=%d args=%s\n", $0, $^W, $quiet, floor(2.7), join("|", @ARGV);
exit 3;
"""


@pytest.fixture
def setup(tmp_path: Path) -> dict:
    """The stand-in, its paths in tmp_path: the host's perl behind a loader that logs its call,
    the image's perl a fake, the tree's arch folder empty."""
    loader, _ = diversion.native_libraries([PERL])
    log = tmp_path / "loader.log"
    logging_loader = tmp_path / "ld.so"
    logging_loader.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {log}\nexec {loader} "$@"\n')
    logging_loader.chmod(0o755)
    home, own = tmp_path / "home", tmp_path / "own"
    home.mkdir()
    own.mkdir()
    (home / "perl").symlink_to(PERL)
    image = tmp_path / "image-perl"
    image.write_text('#!/bin/sh\necho "passed on $*"\n')
    image.chmod(0o755)
    text = (nativeperl.stand_in(VERSION, "aarch64-linux-gnu", str(logging_loader))
            .replace(nativeperl.HOME + "/perl", str(home / "perl"))
            .replace("/usr/lib/aarch64-linux-gnu", str(own))
            .replace(nativeperl.PERL + diversion.SUFFIX, str(image)))
    stand_in = tmp_path / "perl"
    stand_in.write_text(text)
    stand_in.chmod(0o755)
    return {"stand_in": stand_in, "log": log, "own": own, "tmp": tmp_path}


def script(setup: dict, interpreter: Path) -> Path:
    path = setup["tmp"] / f"script-{interpreter.name}"
    path.write_text(SCRIPT.format(interpreter=interpreter))
    path.chmod(0o755)
    return path


def test_a_script_runs_as_with_the_image_s_perl_of_the_same_version(setup):
    """Started by its #! line, as dpkg starts a maintainer script: the #! switch (-w), the options,
    the arguments, the output and the exit code are those of perl itself on the same script."""
    ours = subprocess.run([script(setup, setup["stand_in"]), "--quiet", "configure", "1.0 2"],
                          capture_output=True, text=True)
    theirs = subprocess.run([script(setup, PERL), "--quiet", "configure", "1.0 2"], capture_output=True, text=True)
    assert (ours.returncode, ours.stdout.split(" ", 1)[1]) == (theirs.returncode, theirs.stdout.split(" ", 1)[1])
    assert ours.stdout.split(" ", 1)[1] == "warn=1 quiet=1 floor=2 args=configure|1.0 2\n" and ours.returncode == 3
    called = setup["log"].read_text().splitlines()
    assert called == ["--library-path", nativeperl._LIB, str(setup["tmp"] / "home" / "perl"), "-w",  # the #! switch
                      str(script(setup, setup["stand_in"])), "--quiet", "configure", "1.0 2"]


def test_perl_minus_e_and_stdin_go_along(setup):
    done = subprocess.run([setup["stand_in"], "-ne", "print uc"], input="debconf\n", capture_output=True, text=True)
    assert done.stdout == "DEBCONF\n" and setup["log"].exists()


@pytest.mark.parametrize("folder", ["perl5", "perl"])
def test_with_perl_modules_of_the_image_s_arch_it_is_the_image_s_own_perl(setup, folder):
    """A package put compiled modules of the tree's arch beside perl-base (libperl5.36, an XS
    module): the host's perl would not load them, so the image's own perl runs."""
    (setup["own"] / folder).mkdir()
    done = subprocess.run([setup["stand_in"], "-e", "print 1"], capture_output=True, text=True)
    assert done.stdout == "passed on -e print 1\n" and not setup["log"].exists()


def tree(tmp_path: Path, version: str) -> Path:
    """A tree as mmdebstrap has extracted it: perl-base's perl (with its hard link) and Config.pm."""
    root = tmp_path / "root"
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/perl").write_text("the image's perl\n")
    os.link(root / "usr/bin/perl", root / "usr/bin/perl5.36.0")
    config = root / "usr/lib/aarch64-linux-gnu/perl-base/Config.pm"
    config.parent.mkdir(parents=True)
    config.write_text(f"our %Config = (\n    archname => 'aarch64-linux-gnu-thread-multi',\n"
                      f"    version => '{version}',\n);\n")
    return root


def snapshot(root: Path) -> dict[str, tuple[int, int, bytes | str | None]]:
    return {str(p.relative_to(root)): (p.lstat().st_mode, p.lstat().st_nlink, os.readlink(p) if p.is_symlink()
                                       else p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


def test_divert_and_restore_leave_the_tree_as_it_was(tmp_path):
    """The host's perl, its libraries and its perl-base modules (at their own path) are in the tree
    meanwhile, perl's stand-in in perl-base's place; after, all is as before, the hard link too."""
    root = tree(tmp_path, VERSION)
    before = snapshot(root)
    said = nativeperl.divert(root, PERL)
    assert "runs natively" in said and VERSION in said
    assert "torch-repro-lab" in (root / "usr/bin/perl").read_text()
    assert (root / "usr/bin/perl.lab-native").read_text() == "the image's perl\n"
    assert (root / nativeperl.HOME.lstrip("/") / "perl").read_bytes() == PERL.read_bytes()
    assert any((root / nativeperl._LIB.lstrip("/")).glob("libc.so*"))
    assert (root / MODULES.relative_to("/") / "POSIX.pm").is_file()
    assert ("/usr/bin/perl", "/usr/bin/perl.lab-native", ":") in diversion._read(root / "var/lib/dpkg/diversions")
    assert nativeperl.restore(root) == "perl: the image's own again"
    assert snapshot(root) == before


def test_perl_base_unpacked_meanwhile_comes_back_in_its_place(tmp_path):
    """dpkg unpacks perl-base's perl at the diverted name: that is the file restore puts back."""
    root = tree(tmp_path, VERSION)
    nativeperl.divert(root, PERL)
    (root / "usr/bin/perl.lab-native").unlink()
    (root / "usr/bin/perl.lab-native").write_text("perl-base's perl, from dpkg\n")
    nativeperl.restore(root)
    assert (root / "usr/bin/perl").read_text() == "perl-base's perl, from dpkg\n"
    assert not (root / nativeperl.HOME.lstrip("/")).exists() and not (root / "var/lib/dpkg/diversions").exists()
    assert not (root / MODULES.relative_to("/")).exists()


@pytest.mark.parametrize("version", ["5.40.1", None])
def test_another_version_or_no_perl_base_stays_emulated(tmp_path, version):
    root = tree(tmp_path, version or VERSION)
    if version is None:
        (root / "usr/lib/aarch64-linux-gnu/perl-base/Config.pm").unlink()
    before = snapshot(root)
    said = nativeperl.divert(root, PERL)
    assert said.startswith("perl: emulated") and (version or "no perl-base") in said
    assert snapshot(root) == before
    assert nativeperl.restore(root) == "perl: the image's own" and snapshot(root) == before


def test_a_perl_with_no_perl_base_folder_does_not_serve(tmp_path, monkeypatch):
    """Not Debian's layout (a perl of another distribution): the bootstrap keeps the image's perl."""
    other = tmp_path / "perl"
    other.write_text('#!/bin/sh\nprintf "5.36.0\\n/usr/lib64/perl5\\n/usr/share/perl5\\n"\n')
    other.chmod(0o755)
    monkeypatch.setattr(nativeperl, "PERL", str(other))
    assert nativeperl.host_perl() is None
    monkeypatch.setattr(nativeperl, "PERL", str(PERL))
    assert nativeperl.host_perl() == PERL


def test_a_tree_that_has_the_host_s_module_folder_already_stays_emulated(tmp_path):
    root = tree(tmp_path, VERSION)
    (root / MODULES.relative_to("/")).mkdir(parents=True)
    before = snapshot(root)
    assert nativeperl.divert(root, PERL).startswith("perl: emulated (the tree has ")
    assert snapshot(root) == before
