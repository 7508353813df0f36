"""The maintainer scripts' Perl in a base bootstrapped under QEMU, run by the host's own perl.

    python3 nativeperl.py divert ROOT PERL    (mmdebstrap's --extract-hook)
    python3 nativeperl.py restore ROOT        (mmdebstrap's --customize-hook)

Debconf (every package's config script and postinst that asks a question, through
/usr/share/debconf/frontend), deb-systemd-helper (the postinst of apt, dpkg, e2fsprogs and
util-linux, several calls each), update-rc.d and pam-auth-update are Perl. Under QEMU each start
of perl with its modules costs 0.5 to 1 s, about 15 s of an arm64 bootstrap; the host's perl starts
in 50 ms. A Perl script does the same on either CPU when the interpreter and its modules are the
same version: Debian's perl-base, the only Perl of a bootstrapped base, is the same package for
every arch, and its compiled parts (POSIX, Fcntl...) are called by a perl of their own arch.

`divert` runs when the tree has the image's perl-base (mmdebstrap's extract hook) and the host's
perl is the same version (5.36.0 against 5.36.0): it copies the host's /usr/bin/perl, the
libraries it loads and the host's perl-base module folder (at its own path, e.g.
/usr/lib/x86_64-linux-gnu/perl-base, so the host's perl finds its modules in its own order, among
the tree's arch-independent ones) into the tree, and puts a stand-in in place of /usr/bin/perl
(dpkg-divert's way: perl-base's own is kept aside, lab.image.diversion). The stand-in runs the
host's perl through its own dynamic loader, natively, with the same arguments, while the tree has
no Perl modules of its arch beyond perl-base (as in a minbase with compilers and Python); once a
package has put others there (libperl, an XS module), the image's own perl, in place. `restore`
puts perl back and removes the rest: nothing of it is left in the base.
The standard library only: mmdebstrap runs this file with the lab's Python.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

if __package__:
    from lab.image import diversion
else:  # run as a file by mmdebstrap's hook: its folder is on sys.path
    import diversion  # type: ignore[no-redef]

HOME = "/var/lib/torch-repro-lab-perl"
_LIB = HOME + "/lib"
_MADE = HOME + "/made"  # what the host's perl needed that the tree did not have: gone after
PERL = "/usr/bin/perl"  # perl-base's own path
_VERSION = re.compile(r"^\s*version => '([0-9.]+)',$", re.M)


def stand_in(version: str, triplet: str, loader: str) -> str:
    """/usr/bin/perl's stand-in: the host's perl `version` while the tree has no Perl modules of
    its arch (`triplet`) beyond perl-base, the image's own perl otherwise."""
    own = f"/usr/lib/{triplet}"
    return f'''\
#!/bin/sh
# torch-repro-lab: in place of perl while the base is bootstrapped, removed after it
# (lab/image/nativeperl.py). While {own} has no Perl modules beyond perl-base, the same
# arguments go to the host's perl {version} (the image's version), run natively by its own loader.
if [ ! -e {own}/perl5 ] && [ ! -e {own}/perl ] && [ -x {HOME}/perl ]; then
    exec {loader} --library-path {_LIB} {HOME}/perl "$@"
fi
exec {PERL}{diversion.SUFFIX} "$@"
'''


def host_perl() -> Path | None:
    """The host's Debian perl (its modules in a perl-base folder), when ldd can name the libraries
    that go into the tree with it."""
    perl = Path(PERL)
    if shutil.which("ldd") is None or not perl.is_file() or perl.is_symlink():
        return None
    try:
        _host(perl)
    except (OSError, RuntimeError, subprocess.CalledProcessError):
        return None
    return perl


def hooks(perl: Path, python: str = sys.executable) -> tuple[list[str], list[str]]:
    """mmdebstrap's options: (the extract hook that diverts, the customize hook that restores)."""
    run = diversion.hook_command(__file__, python)
    return [f'--extract-hook={run} divert "$1" {perl}'], [f'--customize-hook={run} restore "$1"']


def _host(perl: Path) -> tuple[str, Path]:
    """The host perl's version and its perl-base module folder."""
    out = subprocess.run([str(perl), "-e", 'print join("\\n", sprintf("%vd", $^V), @INC), "\\n"'],
                         capture_output=True, text=True, check=True).stdout.split("\n")
    base = [Path(p) for p in out[1:] if p.endswith("/perl-base") and Path(p).is_dir()]
    if not base:
        raise RuntimeError(f"{perl}: no perl-base folder in @INC")
    return out[0], base[0]


def _image(root: Path) -> tuple[str, str] | None:
    """The tree's perl-base: its version and its arch's triplet, or None."""
    for config in sorted(root.glob("usr/lib/*/perl-base/Config.pm")):
        found = _VERSION.search(config.read_text(errors="replace"))
        if found:
            return found.group(1), config.parent.parent.name
    return None


def divert(root: Path, perl: Path) -> str:
    """Before the essential packages are installed: the host's perl, its libraries and modules
    into the tree, and the stand-in in place of /usr/bin/perl, when the versions agree."""
    version, modules = _host(perl)
    image = _image(root)
    if image is None or image[0] != version:
        found = f"the image's is {image[0]}" if image else "the tree has no perl-base"
        return f"perl: emulated (the host's perl is {version}, {found})"
    target = root / modules.relative_to("/")
    if target.exists() or target.is_symlink():
        return f"perl: emulated (the tree has {modules} already)"
    try:
        loader, libs = diversion.native_libraries([perl, *sorted(modules.rglob("*.so"))])
    except (OSError, RuntimeError) as exc:
        return f"perl: emulated ({exc})"
    home, lib = root / HOME.lstrip("/"), root / _LIB.lstrip("/")
    lib.mkdir(parents=True)
    for file in (loader, *sorted(libs)):
        shutil.copy2(file, lib / file.name)
    shutil.copy2(perl, home / "perl")
    made = [str(folder) for folder in modules.parents[:-1]
            if not (root / folder.relative_to("/")).exists() and not (root / folder.relative_to("/")).is_symlink()]
    shutil.copytree(modules, target, symlinks=True)
    (root / _MADE.lstrip("/")).write_text("".join(f"{m}\n" for m in [str(modules), *made]))
    diversion.add(root, PERL, stand_in(version, image[1], f"{_LIB}/{loader.name}"))
    return (f"perl: the maintainer scripts' Perl runs natively (the host's perl {version}) until every "
            "package is installed")


def restore(root: Path) -> str:
    """perl is perl-base's own again, and the host's perl and its modules are gone."""
    home = root / HOME.lstrip("/")
    if not home.is_dir():
        return "perl: the image's own"
    diversion.remove(root, PERL)
    made = root / _MADE.lstrip("/")
    modules, *folders = made.read_text().split("\n")[:-1] if made.is_file() else [""]
    if modules:
        shutil.rmtree(root / modules.lstrip("/"))
    for folder in folders:  # the deepest first; a folder a package has filled since stays
        with contextlib.suppress(OSError):
            (root / folder.lstrip("/")).rmdir()
    shutil.rmtree(home)
    return "perl: the image's own again"


if __name__ == "__main__":
    if sys.argv[1] == "divert":
        print(divert(Path(sys.argv[2]), Path(sys.argv[3])), flush=True)
    else:
        print(restore(Path(sys.argv[2])), flush=True)
