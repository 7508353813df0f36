"""dpkg's unpacking in a base bootstrapped under QEMU, its helper programs run on the host's CPU.

    python3 nativeunpack.py divert ROOT BUSYBOX    (mmdebstrap's --extract-hook)
    python3 nativeunpack.py restore ROOT           (mmdebstrap's --customize-hook)

For each package, dpkg starts three helpers: `dpkg-split -Qao` (is it a part of a split package?),
`dpkg-deb --control` (which starts tar) and `dpkg-deb --fsys-tarfile` (which decompresses the
data.tar.xz). Under QEMU each start costs 50 to 170 ms whatever the package's size, and the xz
decompression more (about 28 s of a 150 s arm64 bootstrap; natively, 4 s). Before the essential
packages are installed, `divert` copies a statically linked busybox of the host's arch into the
tree and puts busybox scripts in place of dpkg-split and dpkg-deb (dpkg-divert's way: the image's
own are kept aside). The kernel runs that busybox natively, chroot or not, so QEMU is not involved:
busybox's ar, unxz and tar give dpkg the same answers, the same tar stream and the same control
files (modes and times kept, as dpkg-deb's tar keeps them). Anything else, and any package not of
the standard layout (format 2.0, xz members), goes to the image's own tool. dpkg does the rest as
always. The packages' scripts' `grep -F` (fixed strings, a byte comparison) goes to busybox's grep
as well: ca-certificates' config script runs 292 of them (16 s with the image's grep, 4 s with
busybox's), and dpkg's `rm -rf -- DIR` of its control-file folder and dpkg-maintscript-helper's
`basename "$0"` go to busybox's (6 s and 2 s of starts under QEMU). `restore` puts the tools
back and removes busybox: nothing of it is left in the base.
"""

from __future__ import annotations

import shlex
import shutil
import struct
import sys
from pathlib import Path

if __package__:
    from lab.image import diversion
else:  # run as a file by mmdebstrap's hook: its folder is on sys.path
    import diversion  # type: ignore[no-redef]

HOME = "/var/lib/torch-repro-lab-bootstrap"
BUSYBOX = HOME + "/busybox"
DPKG_DEB, DPKG_SPLIT = "/usr/bin/dpkg-deb", "/usr/bin/dpkg-split"
GREP = "/bin/grep"  # the grep package's own path (/bin is /usr/bin in a merged /usr)
RM, BASENAME = "/bin/rm", "/usr/bin/basename"  # coreutils' own paths
_HEAD = f"""#!{BUSYBOX} sh
# torch-repro-lab: run natively by the host's busybox while the base is bootstrapped, and removed
# after it (lab/image/nativeunpack.py). What it does not do itself goes to the image's own tool.
bb={BUSYBOX}
"""
# `dpkg-deb --fsys-tarfile DEB` and `--control DEB DIR`, as dpkg runs them for each package, for a
# .deb of the standard layout (format 2.0, xz members); dpkg-deb's --control runs tar, which keeps
# the files' modes and times
STAND_INS = {DPKG_DEB: _HEAD + f"""\
members=
[ "$#" -ge 2 ] && members=$($bb ar t "$2" 2>/dev/null | $bb tr '\\n' ' ')
if [ "$members" = "debian-binary control.tar.xz data.tar.xz " ] && [ "$($bb ar p "$2" debian-binary)" = 2.0 ]; then
    set -o pipefail
    case "$1 $#" in
        "--fsys-tarfile 2")
            $bb ar p "$2" data.tar.xz | $bb unxz
            exit ;;
        "--control 3")
            $bb mkdir "$3" 2>/dev/null || [ -d "$3" ] || exit 2
            $bb ar p "$2" control.tar.xz | $bb unxz | $bb tar -x -f - -C "$3"
            exit ;;
    esac
fi
exec {DPKG_DEB}{diversion.SUFFIX} "$@"
""",
             # dpkg asks `dpkg-split -Qao PART DEB` of every package whether it is part of a split
             # one: a .deb whose first member is debian-binary is not, and the answer is exit 1
             DPKG_SPLIT: _HEAD + f"""\
if [ "$#" -eq 3 ] && [ "$1" = -Qao ] && [ "$($bb ar t "$3" 2>/dev/null | $bb head -n 1)" = debian-binary ]; then
    exit 1
fi
exec {DPKG_SPLIT}{diversion.SUFFIX} "$@"
""",
             # a maintainer script's `grep -F` (fixed strings): a byte comparison, the same in busybox
             # and GNU grep. ca-certificates' config script runs two per certificate (`grep -F -q -x
             # "$crt"`, 292 in all); anything else, such as a regular expression, whose reading could
             # differ, goes to the image's own grep
             GREP: _HEAD + f"""\
fixed=
for a; do
    case $a in
        -) ;;
        -*[!Fqsvx]*) exec {GREP}{diversion.SUFFIX} "$@" ;;
        -*F*) fixed=1 ;;
    esac
done
[ -n "$fixed" ] && exec $bb grep "$@"
exec {GREP}{diversion.SUFFIX} "$@"
""",
             # dpkg removes its control-file folder with `rm -rf -- /var/lib/dpkg/tmp.ci` before and
             # after each package (about 300 starts of the image's rm, 6 s under QEMU). Only an
             # absolute path with no empty, . or .. part: nothing that GNU rm refuses or reads otherwise
             RM: _HEAD + f"""\
if [ "$#" -eq 3 ] && [ "$1" = -rf ] && [ "$2" = -- ]; then
    case $3 in
        *//*|*/|*/.|*/..|*/./*|*/../*) ;;
        /?*) exec $bb rm -rf -- "$3" ;;
    esac
fi
exec {RM}{diversion.SUFFIX} "$@"
""",
             # dpkg-maintscript-helper's `basename "$0"` in each script that calls it: a name and an
             # optional suffix, neither an option, POSIX's basename in both
             BASENAME: _HEAD + f"""\
case $# in
    1|2) case "$1" in ""|-*) ;; *) case "${{2-x}}" in ""|-*) ;; *) exec $bb basename "$@" ;; esac ;; esac ;;
esac
exec {BASENAME}{diversion.SUFFIX} "$@"
"""}


def hooks(busybox: Path, python: str = sys.executable) -> tuple[list[str], list[str]]:
    """mmdebstrap's options: (the extract hook that diverts, the customize hook that restores)."""
    run = diversion.hook_command(__file__, python)
    return [f'--extract-hook={run} divert "$1" {shlex.quote(str(busybox))}'], [f'--customize-hook={run} restore "$1"']


def static_busybox() -> Path | None:
    """The host's busybox when it is statically linked (Debian's busybox-static): that is what
    runs inside a tree of another arch."""
    found = shutil.which("busybox")
    return Path(found) if found and is_static(Path(found)) else None


def is_static(path: Path) -> bool:
    """A 64-bit little-endian ELF executable with no interpreter (PT_INTERP) to load it."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF" or head[4:6] != b"\x02\x01":
                return False
            phoff, = struct.unpack_from("<Q", head, 0x20)
            size, count = struct.unpack_from("<HH", head, 0x36)
            f.seek(phoff)
            table = f.read(size * count)
    except (OSError, struct.error):
        return False
    return len(table) == size * count and all(struct.unpack_from("<I", table, i * size)[0] != 3 for i in range(count))


def divert(root: Path, busybox: Path) -> str:
    """Before the essential packages are installed: busybox into the tree, the stand-ins in place
    of dpkg-deb, dpkg-split, grep, rm and basename."""
    home = root / HOME.lstrip("/")
    home.mkdir(parents=True, exist_ok=True)
    shutil.copy2(busybox, root / BUSYBOX.lstrip("/"))
    for tool, stand_in in STAND_INS.items():
        diversion.add(root, tool, stand_in)
    return ("dpkg helpers: dpkg-deb, dpkg-split, grep -F, rm -rf and basename run natively (busybox) until "
            "every package is installed")


def restore(root: Path) -> str:
    """dpkg-deb, dpkg-split, grep, rm and basename are the image's own again, and busybox is gone."""
    for tool in reversed(STAND_INS):
        diversion.remove(root, tool)
    shutil.rmtree(root / HOME.lstrip("/"))
    return "dpkg helpers: dpkg-deb, dpkg-split, grep, rm and basename are the image's own again"


if __name__ == "__main__":
    if sys.argv[1] == "divert":
        print(divert(Path(sys.argv[2]), Path(sys.argv[3])), flush=True)
    else:
        print(restore(Path(sys.argv[2])), flush=True)
