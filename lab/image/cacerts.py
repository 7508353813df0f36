"""ca-certificates' update for a base bootstrapped under QEMU, done on the host.

    python3 cacerts.py divert ROOT    (mmdebstrap's --essential-hook)
    python3 cacerts.py update ROOT    (mmdebstrap's --customize-hook; the standard library only)

`update-ca-certificates` is a shell loop that starts four or five processes per certificate.
Emulated, each costs about 25 ms, so the package's postinst and its trigger, which both run it,
took 45 to 60 s of a 200 s arm64 bootstrap. While mmdebstrap installs the packages, the lab
diverts the tool to a no-op (`divert`, the essential hook); the customize hook (`update`) then
puts it back and runs the image's own script once with the host's shell, sed and openssl
(native), on the image's folders, and makes the links it wrote point where they point inside
the image. The result is the one the emulated run gives: the same `.pem` links, hash links and
`ca-certificates.crt`. When the image has update hooks (`/etc/ca-certificates/update.d`, Java's
keystore, say), they need the image's own programs, so the whole update runs emulated instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

if __package__:
    from lab.image import diversion
else:  # run as a file by mmdebstrap's hook: its folder is on sys.path
    import diversion  # type: ignore[no-redef]

TOOL = "/usr/sbin/update-ca-certificates"
DIVERTED = TOOL + diversion.SUFFIX
STUB = "#!/bin/sh\n# torch-repro-lab: made on the host after the bootstrap (lab/image/cacerts.py)\nexit 0\n"


def hooks(python: str = sys.executable) -> tuple[list[str], list[str]]:
    """mmdebstrap's options: (divert the tool before the packages are installed, update after)."""
    run = diversion.hook_command(__file__, python)
    return [f'--essential-hook={run} divert "$1"'], [f'--customize-hook={run} update "$1"']


def divert(root: Path) -> str:
    """Before ca-certificates is unpacked: its tool goes to DIVERTED, and a no-op stands in its place."""
    diversion.add(root, TOOL, STUB)
    return f"ca-certificates: {TOOL} is a no-op until every package is installed"


def update(root: Path) -> str:
    """Put the tool back, then update /etc/ssl/certs under `root`; what was done, in one line."""
    diversion.remove(root, TOOL)
    update_d = root / "etc/ca-certificates/update.d"
    if update_d.is_dir() and any(update_d.iterdir()):
        _chroot(root, TOOL)
        return f"ca-certificates: updated in the image (emulated), for the hooks in {update_d}"
    certs = root / "etc/ssl/certs"
    subprocess.run(["sh", str(root / TOOL.lstrip("/")), "--certsconf", str(root / "etc/ca-certificates.conf"),
                    "--certsdir", str(root / "usr/share/ca-certificates"),
                    "--localcertsdir", str(root / "usr/local/share/ca-certificates"),
                    "--etccertsdir", str(certs), "--hooksdir", ""],
                   check=True, stdout=subprocess.DEVNULL, env={**os.environ, "LC_ALL": "C.UTF-8"})
    prefix = str(root).rstrip("/") + "/"
    relinked = 0
    for link in sorted(certs.iterdir()):
        if link.is_symlink() and (target := os.readlink(link)).startswith(prefix):
            link.unlink()
            link.symlink_to("/" + target[len(prefix):])
            relinked += 1
    return f"ca-certificates: {relinked} certificates linked in /etc/ssl/certs on the host"


def _chroot(root: Path, *cmd: str) -> None:
    subprocess.run(["chroot", str(root), *cmd], check=True)


if __name__ == "__main__":
    print({"divert": divert, "update": update}[sys.argv[1]](Path(sys.argv[2])), flush=True)
