"""dpkg's unpacking in a base bootstrapped under QEMU, with the xz decompression on the host's CPU.

    python3 nativeunpack.py divert ROOT BUSYBOX    (mmdebstrap's --extract-hook)
    python3 nativeunpack.py restore ROOT           (mmdebstrap's --customize-hook)

dpkg unpacks each package through `dpkg-deb --fsys-tarfile`, which decompresses the package's
data.tar.xz: under QEMU, about 28 s of a 150 s arm64 bootstrap (natively, about 4 s). Before
the essential packages are installed, `divert` copies a statically linked busybox of the host's
arch into the tree and puts a busybox script in place of `dpkg-deb` (dpkg-divert keeps the
image's own). The kernel runs that busybox natively, chroot or not, so no QEMU is involved: for
`--fsys-tarfile` of a package whose data is data.tar.xz, busybox's ar and unxz give dpkg the
same tar stream; every other call goes to the image's own dpkg-deb. dpkg does the rest as
always. `restore` puts dpkg-deb back and removes busybox: nothing of it is left in the base.
"""

from __future__ import annotations

import shlex
import shutil
import struct
import sys
from pathlib import Path

if __package__:
    from lab.build import diversion
else:  # run as a file by mmdebstrap's hook: its folder is on sys.path
    import diversion  # type: ignore[no-redef]

TOOL = "/usr/bin/dpkg-deb"
DIVERTED = TOOL + diversion.SUFFIX
HOME = "/var/lib/torch-repro-lab-bootstrap"
BUSYBOX = HOME + "/busybox"
STAND_IN = f"""#!{BUSYBOX} sh
# torch-repro-lab: data.tar.xz decompressed natively while the base is bootstrapped; removed after
# it (lab/build/nativeunpack.py). Any other use goes to dpkg-deb itself.
if [ "$#" -eq 2 ] && [ "$1" = --fsys-tarfile ]; then
    case "$({BUSYBOX} ar t "$2")" in
        *data.tar.xz*)
            set -o pipefail
            {BUSYBOX} ar p "$2" data.tar.xz | {BUSYBOX} unxz
            exit ;;
    esac
fi
exec {DIVERTED} "$@"
"""


def hooks(busybox: Path, python: str = sys.executable) -> tuple[list[str], list[str]]:
    """mmdebstrap's options: (the extract hook that diverts, the customize hook that restores)."""
    run = f"{shlex.quote(python)} {shlex.quote(str(Path(__file__).resolve()))}"
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
    """Before the essential packages are installed: busybox into the tree, the script in place of dpkg-deb."""
    home = root / HOME.lstrip("/")
    home.mkdir(parents=True, exist_ok=True)
    shutil.copy2(busybox, root / BUSYBOX.lstrip("/"))
    diversion.add(root, TOOL, STAND_IN)
    return "xz: packages' data decompressed natively (busybox) until every package is installed"


def restore(root: Path) -> str:
    """dpkg-deb is the image's own again, and busybox is gone."""
    diversion.remove(root, TOOL)
    shutil.rmtree(root / HOME.lstrip("/"))
    return "xz: dpkg-deb is the image's own again"


if __name__ == "__main__":
    if sys.argv[1] == "divert":
        print(divert(Path(sys.argv[2]), Path(sys.argv[3])), flush=True)
    else:
        print(restore(Path(sys.argv[2])), flush=True)
